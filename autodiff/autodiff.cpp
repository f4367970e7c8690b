#include "autodiff/autodiff.hpp"
#include "autodiff/grad_rules.hpp"
#include "ir/annotations.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>

namespace popart::autodiff {

namespace {

bool differentiable(const ir::Tensor &t) { return isFloatingPoint(t.info().dataType()); }

bool isControlFlow(const std::string &domain, const std::string &type) {
  return ir::canonicalDomain(domain) == "ai.onnx" && (type == "If" || type == "Loop" || type == "Scan");
}

} // namespace

GradRuleRegistry &GradRuleRegistry::instance() {
  static GradRuleRegistry registry;
  return registry;
}

void GradRuleRegistry::add(GradRuleDef def) {
  def.domain = ir::canonicalDomain(def.domain);
  if (!def.rule) throw error("gradient rules: ", def.domain, "::", def.type, " has an empty rule");
  std::unique_lock lock(mutex_);
  for (const auto &d : defs_)
    if (d.domain == def.domain && d.type == def.type &&
        !(def.maxVersion < d.minVersion || def.minVersion > d.maxVersion))
      throw error("gradient rules: ", def.domain, "::", def.type, " opsets ", def.minVersion, "-", def.maxVersion,
                  " overlap an earlier rule (opsets ", d.minVersion, "-", d.maxVersion, ")");
  defs_.push_back(std::move(def));
}

const GradRule *GradRuleRegistry::find(const std::string &domain, const std::string &type, int version) const {
  std::string dom = ir::canonicalDomain(domain);
  std::shared_lock lock(mutex_);
  for (const auto &d : defs_)
    if (d.domain == dom && d.type == type && version >= d.minVersion && version <= d.maxVersion) return &d.rule;
  return nullptr;
}

void addOnnxRules(GradRuleRegistry &registry, const std::map<std::string, GradRule> &rules) {
  for (const auto &[type, rule] : rules)
    registry.add({"ai.onnx", type, 1, 1000, rule});
}

void registerBuiltinRules() {
  static std::once_flag once;
  std::call_once(once, [] {
    GradRuleRegistry &r = GradRuleRegistry::instance();
    registerElementwiseRules(r);
    registerMatMulReduceRules(r);
    registerShapeRules(r);
    registerLossNormRules(r);
    registerConvRules(r);
    registerRnnRules(r);
    registerControlFlowRules(r);
    registerGraphcoreRules(r);
  });
}

bool hasGradient(const std::string &domain, const std::string &type, int version) {
  registerBuiltinRules();
  return GradRuleRegistry::instance().find(domain, type, version) != nullptr;
}

std::string gradientSupport(const std::string &domain, const std::string &type,
                            const std::vector<std::pair<int, int>> &opsets) {
  if (isControlFlow(domain, type)) return "unrolled";
  registerBuiltinRules();
  return ruleCoverage(GradRuleRegistry::instance(), domain, type, opsets);
}

std::string ruleCoverage(const GradRuleRegistry &registry, const std::string &domain, const std::string &type,
                         const std::vector<std::pair<int, int>> &opsets) {
  // The parts of \p opsets that rules cover, as maximal ranges.
  std::string dom = ir::canonicalDomain(domain);
  std::vector<std::pair<int, int>> covered;
  int64_t versions = 0, coveredVersions = 0;
  for (auto [lo, hi] : opsets) {
    versions += hi - lo + 1;
    for (const auto &d : registry.all()) {
      if (d.domain != dom || d.type != type || d.maxVersion < lo || d.minVersion > hi) continue;
      covered.emplace_back(std::max(lo, d.minVersion), std::min(hi, d.maxVersion));
      coveredVersions += covered.back().second - covered.back().first + 1;
    }
  }
  std::sort(covered.begin(), covered.end());
  std::vector<std::pair<int, int>> merged;
  for (const auto &c : covered)
    if (!merged.empty() && merged.back().second + 1 >= c.first)
      merged.back().second = std::max(merged.back().second, c.second);
    else
      merged.push_back(c);
  covered = merged;
  if (coveredVersions == 0) return "no";
  if (coveredVersions == versions) return "yes";
  std::string s = "opsets ";
  for (size_t i = 0; i < covered.size(); ++i)
    s += (i ? ", " : "") + std::to_string(covered[i].first) +
         (covered[i].second >= 1000 ? "+" : "-" + std::to_string(covered[i].second));
  return s;
}

namespace {
/// Gives the ops of \p graph from id \p firstNew on (those a gradient rule of \p forward just
/// made) \p forward's virtual graph and pipeline stage: a gradient runs where its op does.
void copyPlacement(ir::Graph &graph, const ir::Op &forward, int64_t firstNew) {
  for (const char *name : {ir::kVirtualGraphAttribute, ir::kPipelineStageAttribute}) {
    if (!forward.attrs.has(name)) continue;
    const int64_t value = forward.attrs.getInt(name);
    for (auto it = graph.ops().rbegin(); it != graph.ops().rend() && (*it)->id >= firstNew; ++it)
      (*it)->attrs.set(name, value);
  }
}
} // namespace

std::vector<TensorId> buildGradients(ir::Graph &graph, const TensorId &y, const std::vector<TensorId> &xs,
                                     bool zeroForUnreached) {
  registerBuiltinRules();
  // The ops y depends on, in reverse schedule order.
  std::set<const ir::Op *> ancestors;
  std::vector<const ir::Tensor *> stack{&graph.tensor(y)};
  while (!stack.empty()) {
    const ir::Tensor *t = stack.back();
    stack.pop_back();
    if (ir::Op *p = t->producer(); p && ancestors.insert(p).second)
      for (const ir::Tensor *in : p->inputs)
        if (in) stack.push_back(in);
  }
  std::vector<ir::Op *> order;
  for (ir::Op *op : graph.schedule())
    if (ancestors.count(op)) order.push_back(op);
  // The tensors computed from some x: an op none of whose inputs is one needs no gradient rule
  // (a Loop over the input data whose trip count is known only at run time, a Floor of the input).
  std::set<const ir::Tensor *> fromXs;
  for (const auto &x : xs)
    fromXs.insert(&graph.tensor(x));
  for (ir::Op *op : order)
    for (const ir::Tensor *in : op->inputs)
      if (in && fromXs.count(in)) {
        for (const ir::Tensor *out : op->outputs)
          if (out) fromXs.insert(out);
        break;
      }

  std::map<TensorId, std::vector<TensorId>> partials;
  const TensorInfo &yInfo = graph.tensor(y).info();
  TensorData ones = TensorData::fromDoubles(yInfo.dataType(), yInfo.shape(),
                                            std::vector<double>(static_cast<size_t>(yInfo.elementCount()), 1.0));
  TensorId seed = graph.uniqueId(y + "_grad_seed");
  graph.addConst(seed, std::move(ones));
  partials[y].push_back(seed);

  auto total = [&](const TensorId &id) -> TensorId {
    auto it = partials.find(id);
    if (it == partials.end() || it->second.empty()) return "";
    if (it->second.size() == 1) return it->second[0];
    TensorId sum = graph.uniqueId(id + "_grad");
    int version = graph.opsets().count("ai.onnx") ? graph.opsets().at("ai.onnx") : 17;
    ir::Op &op = graph.addOp("Sum", "ai.onnx", version, "", {}, it->second, {sum});
    op.def->setup(op);
    it->second = {sum};
    return sum;
  };

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ir::Op &op = **it;
    std::vector<TensorId> outGrads;
    bool any = false;
    for (ir::Tensor *t : op.outputs) {
      const int64_t firstNew = graph.nextOpId();
      outGrads.push_back(t ? total(t->id()) : "");
      copyPlacement(graph, op, firstNew); // the sum of its output's partials runs where its gradient does
      any = any || !outGrads.back().empty();
    }
    if (!any) continue;
    bool needed = false;
    for (ir::Tensor *t : op.inputs)
      needed = needed || (t && differentiable(*t) && fromXs.count(t));
    if (!needed) continue;
    const GradRule *rule = GradRuleRegistry::instance().find(op.domain, op.type, op.version);
    if (!rule)
      throw error(op.debugName(), ": no gradient rule for ", op.domain, " ", op.type, " at opset ", op.version);
    const int64_t firstNew = graph.nextOpId();
    GradContext ctx(graph, op, outGrads);
    (*rule)(ctx);
    copyPlacement(graph, op, firstNew);
    for (size_t i = 0; i < op.inputCount(); ++i)
      if (op.hasInput(i) && !ctx.inGrads()[i].empty() && differentiable(op.input(i)))
        partials[op.input(i).id()].push_back(ctx.inGrads()[i]);
  }
  std::vector<TensorId> result;
  for (const auto &x : xs) {
    TensorId g = total(x);
    if (g.empty() && zeroForUnreached) {
      g = graph.uniqueId(x + "_grad_zero");
      graph.addConst(g, TensorData(graph.tensor(x).info()));
    }
    result.push_back(g);
  }
  return result;
}

void expandGradientOps(ir::Graph &graph) {
  std::vector<ir::Op *> gradientOps;
  for (const auto &op : graph.ops())
    if (op->type == "Gradient" && op->domain == "ai.onnx.preview.training") gradientOps.push_back(op.get());
  for (ir::Op *op : gradientOps) {
    std::vector<std::string> xs = op->attrs.getStrings("xs");
    std::string y = op->attrs.getString("y");
    if (!op->attrs.getStrings("zs").empty()) throw error(op->debugName(), ": the zs attribute is not supported");
    std::vector<ir::Tensor *> outs = op->outputs;
    graph.removeOp(*op);
    // As in training: control flow y depends on becomes ordinary ops where it can.
    ir::unrollControlFlow(graph, {y});
    std::vector<TensorId> grads = buildGradients(graph, y, xs);
    // Each output of the Gradient op becomes an Identity of the gradient built for it.
    int version = graph.opsets().count("ai.onnx") ? graph.opsets().at("ai.onnx") : 17;
    for (size_t i = 0; i < outs.size() && i < grads.size(); ++i)
      if (outs[i]) {
        ir::Op &id = graph.addOp("Identity", "ai.onnx", version, "", {}, {grads[i]}, {outs[i]->id()});
        id.def->setup(id);
      }
  }
}

} // namespace popart::autodiff
