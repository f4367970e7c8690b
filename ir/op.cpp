#include "ir/op.hpp"
#include "ir/graph.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <charconv>
#include <mutex>

namespace popart::ir {

const char *toString(TensorKind kind) {
  switch (kind) {
  case TensorKind::Stream: return "Stream";
  case TensorKind::Const: return "Const";
  case TensorKind::Variable: return "Variable";
  case TensorKind::ActGrad: return "ActGrad";
  }
  return "?";
}

void Tensor::removeConsumer(Op *op) {
  auto it = std::find(consumers_.begin(), consumers_.end(), op);
  if (it != consumers_.end()) consumers_.erase(it);
}

std::string Op::debugName() const {
  if (!name.empty()) return type + " '" + name + "'";
  return type + " #" + std::to_string(id);
}

Tensor &Op::input(size_t i) const {
  if (!hasInput(i)) throw error(debugName(), ": input ", i, " is required but missing");
  return *inputs[i];
}

Tensor &Op::output(size_t i) const {
  if (!hasOutput(i)) throw error(debugName(), ": output ", i, " is missing");
  return *outputs[i];
}

void Op::setOutInfo(size_t i, const TensorInfo &info) {
  if (hasOutput(i)) outputs[i]->setInfo(info);
}

const TensorData &Op::constInput(size_t i, const char *role) const {
  Tensor &t = input(i);
  if (!t.isConst())
    throw error(debugName(), ": input ", i, " (", role, ", tensor '", t.id(),
                "') must be known before running, but it is computed at run time");
  return *t.data();
}

const TensorData *Op::optionalConstInput(size_t i, const char *role) const {
  if (!hasInput(i)) return nullptr;
  return &constInput(i, role);
}

std::string canonicalDomain(const std::string &domain) { return domain.empty() ? "ai.onnx" : domain; }

OpRegistry &OpRegistry::instance() {
  static OpRegistry registry;
  return registry;
}

void OpRegistry::add(OpDef def) {
  def.domain = canonicalDomain(def.domain);
  std::unique_lock lock(mutex_);
  for (const auto &d : defs_)
    if (d.domain == def.domain && d.type == def.type &&
        !(def.maxVersion < d.minVersion || def.minVersion > d.maxVersion))
      throw error("op registry: ", def.domain, "::", def.type, " versions ", def.minVersion, "-", def.maxVersion,
                  " overlap an earlier registration");
  defs_.push_back(std::move(def));
}

const OpDef *OpRegistry::find(const std::string &domain, const std::string &type, int version) const {
  std::string dom = canonicalDomain(domain);
  std::shared_lock lock(mutex_);
  for (const auto &d : defs_)
    if (d.domain == dom && d.type == type && version >= d.minVersion && version <= d.maxVersion) return &d;
  return nullptr;
}

bool OpRegistry::knowsType(const std::string &domain, const std::string &type) const {
  std::string dom = canonicalDomain(domain);
  std::shared_lock lock(mutex_);
  for (const auto &d : defs_)
    if (d.domain == dom && d.type == type) return true;
  return false;
}

double outputElementCount(const Op &op) {
  double n = 0;
  for (const Tensor *t : op.outputs)
    n += t ? static_cast<double>(t->info().elementCount()) : 0.0;
  return n;
}

double estimateFlops(const Op &op) { return op.def && op.def->flops ? op.def->flops(op) : outputElementCount(op); }

} // namespace popart::ir
