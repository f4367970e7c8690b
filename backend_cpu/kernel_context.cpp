#include "backend_cpu/kernel_context.hpp"
#include <popart/error.hpp>

#include <array>
#include <utility>

namespace popart::backend_cpu {

namespace {
struct WayName {
  MatMulOperands way;
  const char *name;
  const char *option; ///< SessionOptions::matmulTuning's value forcing it
};
constexpr std::array<WayName, 10> kWays{{{MatMulOperands::Auto, "Auto", "auto"},
                                         {MatMulOperands::AsStored, "AsStored", "0"},
                                         {MatMulOperands::FlippedA, "FlippedA", "a"},
                                         {MatMulOperands::FlippedB, "FlippedB", "b"},
                                         {MatMulOperands::ShiftedB, "ShiftedB", "s"},
                                         {MatMulOperands::Pointwise, "Pointwise", "p"},
                                         {MatMulOperands::Swapped, "Swapped", "t"},
                                         {MatMulOperands::SwappedCopy, "SwappedCopy", "tc"},
                                         {MatMulOperands::FlippedPointwise, "FlippedPointwise", "ap"},
                                         {MatMulOperands::Unpermuted, "Unpermuted", "u"}}};
} // namespace

MatMulOperands parseMatMulTuning(const std::string &mode) {
  if (mode == "1") return MatMulOperands::Auto;
  for (const WayName &w : kWays)
    if (mode == w.option) return w.way;
  throw error("SessionOptions.matmulTuning must be auto (or 1), 0, a, b, s, p, t, tc, ap or u, got '", mode, "'");
}

const char *matMulOperandsName(MatMulOperands way) {
  for (const WayName &w : kWays)
    if (w.way == way) return w.name;
  return "?";
}

MatMulOperands matMulOperandsNamed(const std::string &name) {
  for (const WayName &w : kWays)
    if (name == w.name) return w.way;
  throw error("'", name, "' is not a MatMul operand way");
}

MatMulOperands MatMulTuningCache::choose(const std::string &key, const std::function<MatMulOperands()> &decide) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chosen_.find(key);
  if (it != chosen_.end()) return it->second;
  return chosen_[key] = decide();
}

std::map<std::string, MatMulOperands> MatMulTuningCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return chosen_;
}

void MatMulTuningCache::preset(const std::map<std::string, MatMulOperands> &ways) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto &[key, way] : ways)
    chosen_[key] = way;
}

} // namespace popart::backend_cpu
