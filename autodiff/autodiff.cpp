#include "autodiff/autodiff.hpp"
#include "autodiff/grad_rules.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <set>

namespace popart::autodiff {

void registerConvRules(std::map<std::string, GradRule> &rules);

namespace {

bool differentiable(const ir::Tensor &t) { return isFloatingPoint(t.info().dataType()); }

} // namespace

std::map<std::string, GradRule> &gradRules() {
  static std::map<std::string, GradRule> rules;
  return rules;
}

void registerBuiltinRules() {
  static std::once_flag once;
  std::call_once(once, [] {
    registerElementwiseRules(gradRules());
    registerMatMulReduceRules(gradRules());
    registerShapeRules(gradRules());
    registerLossNormRules(gradRules());
    registerConvRules(gradRules());
  });
}

bool hasGradient(const std::string &opType) {
  registerBuiltinRules();
  return gradRules().count(opType) != 0;
}

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
      outGrads.push_back(t ? total(t->id()) : "");
      any = any || !outGrads.back().empty();
    }
    if (!any) continue;
    bool needed = false;
    for (ir::Tensor *t : op.inputs)
      needed = needed || (t && differentiable(*t));
    if (!needed) continue;
    auto rule = gradRules().find(op.type);
    if (rule == gradRules().end()) throw error(op.debugName(), ": no gradient rule for ", op.type);
    GradContext ctx(graph, op, outGrads);
    rule->second(ctx);
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
