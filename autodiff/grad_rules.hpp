#pragma once
// Gradient rules: per (domain, op type, opset range), how to compute the input gradients from the
// output gradients with ordinary IR ops. One file per op family (autodiff/rules_<family>.cpp)
// registers its rules.

#include "ir/graph.hpp"

#include <deque>
#include <functional>
#include <map>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

namespace popart::autodiff {

/// What a gradient rule sees: the forward op, its output gradients, and ways to add ops.
class GradContext {
public:
  GradContext(ir::Graph &graph, const ir::Op &op, std::vector<TensorId> outGrads)
      : graph_(graph), op_(op), outGrads_(std::move(outGrads)), inGrads_(op.inputCount()) {}

  const ir::Op &op() const { return op_; }
  /// The graph being extended, for rules that add ops with several outputs.
  ir::Graph &graph() { return graph_; }
  /// Forward input \p i, output \p i, and the gradient arriving at output \p i ("" if none).
  TensorId in(size_t i) const { return op_.input(i).id(); }
  TensorId out(size_t i) const { return op_.output(i).id(); }
  TensorId outGrad(size_t i) const { return i < outGrads_.size() ? outGrads_[i] : ""; }
  const Shape &inShape(size_t i) const { return op_.inInfo(i).shape(); }
  /// Sets the gradient of input \p i, summed back over broadcast dimensions to its shape.
  void setInGrad(size_t i, const TensorId &grad) { inGrads_[i] = unbroadcast(grad, inShape(i)); }
  const std::vector<TensorId> &inGrads() const { return inGrads_; }

  /// Adds a default-domain op with one output and returns that output; its info is set now.
  TensorId add(const std::string &type, const std::vector<TensorId> &inputs, ir::Attributes attrs = {}) {
    TensorId out =
        graph_.uniqueId(op_.outputs.empty() || !op_.outputs[0] ? type : op_.outputs[0]->id() + "_grad_" + type);
    int version = graph_.opsets().count("ai.onnx") ? graph_.opsets().at("ai.onnx") : 17;
    ir::Op &added = graph_.addOp(type, "ai.onnx", version, "", std::move(attrs), inputs, {out});
    added.def->setup(added);
    return out;
  }
  TensorId constant(TensorData data) {
    TensorId id = graph_.uniqueId("grad_const");
    graph_.addConst(id, std::move(data));
    return id;
  }
  /// A scalar of input 0's type.
  TensorId scalar(double v) { return constant(TensorData::fromDoubles(op_.inInfo(0).dataType(), {}, {v})); }

  /// Sums \p grad over the dimensions broadcast to reach its shape from \p target.
  TensorId unbroadcast(const TensorId &grad, const Shape &target) {
    const Shape &shape = graph_.tensor(grad).info().shape();
    if (shape == target) return grad;
    std::vector<int64_t> axes;
    size_t offset = shape.size() - target.size();
    for (size_t d = 0; d < shape.size(); ++d)
      if (d < offset || (target[d - offset] == 1 && shape[d] != 1)) axes.push_back(static_cast<int64_t>(d));
    TensorId summed =
        add("ReduceSum", {grad, constant(TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes))}, [] {
          ir::Attributes a;
          a.set("keepdims", int64_t{1});
          return a;
        }());
    return add("Reshape", {summed, constant(TensorData::fromInt64({static_cast<int64_t>(target.size())}, target))});
  }

private:
  ir::Graph &graph_;
  const ir::Op &op_;
  std::vector<TensorId> outGrads_;
  std::vector<TensorId> inGrads_;
};

/// Attributes holding the one int \p name = \p v.
inline ir::Attributes intAttr(const std::string &name, int64_t v) {
  ir::Attributes a;
  a.set(name, v);
  return a;
}

/// A constant 1-D INT64 tensor holding \p s (a Reshape or Expand shape).
inline TensorId shapeConst(GradContext &c, const Shape &s) {
  return c.constant(TensorData::fromInt64({static_cast<int64_t>(s.size())}, std::vector<int64_t>(s.begin(), s.end())));
}

/// A constant 1-D INT64 tensor of axes (Reduce*, Squeeze, Unsqueeze).
inline TensorId axesConst(GradContext &c, const std::vector<int64_t> &axes) {
  return c.constant(TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes));
}

using GradRule = std::function<void(GradContext &)>;

/// A gradient rule and the ops it differentiates: \p type in \p domain at opsets
/// [minVersion, maxVersion], the key ir::OpRegistry gives op definitions.
struct GradRuleDef {
  std::string domain; ///< "ai.onnx" for the default domain, "ai.graphcore", a plugin's
  std::string type;
  int minVersion = 1;
  int maxVersion = 1000; ///< 1000: no upper bound, as in ir::OpDef
  GradRule rule;
};

/// The gradient rules by (domain, op type, opset range), filled once by registerBuiltinRules().
/// An op shares a rule only with ops of its own domain: ai.graphcore Gelu's rule is not ai.onnx Gelu's.
/// Custom-op libraries add rules later, possibly while other threads look rules up; rules never
/// move once added.
class GradRuleRegistry {
public:
  static GradRuleRegistry &instance();
  /// Adds \p def; throws if a rule already registered for its domain and type covers one of its opsets.
  void add(GradRuleDef def);
  /// The rule for \p type in \p domain ("" is ai.onnx) at opset \p version; null if none.
  const GradRule *find(const std::string &domain, const std::string &type, int version) const;
  /// Every rule; not to be read while another thread adds one.
  const std::deque<GradRuleDef> &all() const { return defs_; }

private:
  mutable std::shared_mutex mutex_;
  std::deque<GradRuleDef> defs_;
};

/// How \p registry's rules for \p type in \p domain cover the opset ranges \p opsets ([min, max]):
/// "yes" (all), "no" (none), or the covered part as "opsets 1-5, 9+".
std::string ruleCoverage(const GradRuleRegistry &registry, const std::string &domain, const std::string &type,
                         const std::vector<std::pair<int, int>> &opsets);

/// Registers the built-in rules; safe to call more than once.
void registerBuiltinRules();

/// Registers \p rules, by op type, for the ai.onnx ops of those types at every opset: a rule reads
/// the form that import canonicalises every opset into, and handles what canonicalisation leaves
/// (Softmax's flattened axis before opset 13, ...).
void addOnnxRules(GradRuleRegistry &registry, const std::map<std::string, GradRule> &rules);

void registerElementwiseRules(GradRuleRegistry &registry);
void registerMatMulReduceRules(GradRuleRegistry &registry);
void registerShapeRules(GradRuleRegistry &registry);
void registerLossNormRules(GradRuleRegistry &registry);
void registerConvRules(GradRuleRegistry &registry);
void registerRnnRules(GradRuleRegistry &registry);
void registerControlFlowRules(GradRuleRegistry &registry);
/// The ai.graphcore opset-1 ops' rules (autodiff/rules_graphcore.cpp).
void registerGraphcoreRules(GradRuleRegistry &registry);

} // namespace popart::autodiff
