#include "autodiff/autodiff.hpp"
#include "ir/passes/passes.hpp"
#include <popart/error.hpp>

#include <functional>
#include <map>
#include <set>

namespace popart::autodiff {

namespace {

/// What a gradient rule sees: the forward op, its output gradients, and ways to add ops.
class GradContext {
public:
  GradContext(ir::Graph &graph, const ir::Op &op, std::vector<TensorId> outGrads)
      : graph_(graph), op_(op), outGrads_(std::move(outGrads)), inGrads_(op.inputCount()) {}

  const ir::Op &op() const { return op_; }
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
    TensorId out = graph_.uniqueId(op_.outputs.empty() || !op_.outputs[0] ? type : op_.outputs[0]->id() + "_grad_" + type);
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

  TensorId unbroadcast(const TensorId &grad, const Shape &target) {
    const Shape &shape = graph_.tensor(grad).info().shape();
    if (shape == target) return grad;
    std::vector<int64_t> axes;
    size_t offset = shape.size() - target.size();
    for (size_t d = 0; d < shape.size(); ++d)
      if (d < offset || (target[d - offset] == 1 && shape[d] != 1)) axes.push_back(static_cast<int64_t>(d));
    TensorId summed = add("ReduceSum", {grad, constant(TensorData::fromInt64({static_cast<int64_t>(axes.size())}, axes))},
                          [] {
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

using GradRule = std::function<void(GradContext &)>;

const std::map<std::string, GradRule> &rules() {
  static const std::map<std::string, GradRule> r{
      {"Identity", [](GradContext &c) { c.setInGrad(0, c.outGrad(0)); }},
      {"Add",
       [](GradContext &c) {
         c.setInGrad(0, c.outGrad(0));
         c.setInGrad(1, c.outGrad(0));
       }},
      {"Sub",
       [](GradContext &c) {
         c.setInGrad(0, c.outGrad(0));
         c.setInGrad(1, c.add("Neg", {c.outGrad(0)}));
       }},
      {"Mul",
       [](GradContext &c) {
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.in(1)}));
         c.setInGrad(1, c.add("Mul", {c.outGrad(0), c.in(0)}));
       }},
      {"Div",
       [](GradContext &c) { // d(a/b) = g/b, -g·a/b²
         c.setInGrad(0, c.add("Div", {c.outGrad(0), c.in(1)}));
         TensorId q = c.add("Div", {c.out(0), c.in(1)});
         c.setInGrad(1, c.add("Neg", {c.add("Mul", {c.outGrad(0), q})}));
       }},
      {"Neg", [](GradContext &c) { c.setInGrad(0, c.add("Neg", {c.outGrad(0)})); }},
      {"Exp", [](GradContext &c) { c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.out(0)})); }},
      {"Tanh",
       [](GradContext &c) { // g·(1 − y²)
         TensorId y2 = c.add("Mul", {c.out(0), c.out(0)});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Sub", {c.scalar(1), y2})}));
       }},
      {"Sigmoid",
       [](GradContext &c) { // g·y·(1 − y)
         TensorId oneMinus = c.add("Sub", {c.scalar(1), c.out(0)});
         c.setInGrad(0, c.add("Mul", {c.outGrad(0), c.add("Mul", {c.out(0), oneMinus})}));
       }},
      {"Relu",
       [](GradContext &c) { // g where x > 0
         TensorId positive = c.add("Greater", {c.in(0), c.scalar(0)});
         c.setInGrad(0, c.add("Where", {positive, c.outGrad(0), c.scalar(0)}));
       }},
  };
  return r;
}

bool differentiable(const ir::Tensor &t) { return isFloatingPoint(t.info().dataType()); }

} // namespace

bool hasGradient(const std::string &opType) { return rules().count(opType) != 0; }

std::vector<TensorId> buildGradients(ir::Graph &graph, const TensorId &y, const std::vector<TensorId> &xs) {
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
    for (ir::Tensor *t : op.inputs) needed = needed || (t && differentiable(*t));
    if (!needed) continue;
    auto rule = rules().find(op.type);
    if (rule == rules().end()) throw error(op.debugName(), ": no gradient rule for ", op.type);
    GradContext ctx(graph, op, outGrads);
    rule->second(ctx);
    for (size_t i = 0; i < op.inputCount(); ++i)
      if (op.hasInput(i) && !ctx.inGrads()[i].empty() && differentiable(op.input(i)))
        partials[op.input(i).id()].push_back(ctx.inGrads()[i]);
  }
  std::vector<TensorId> result;
  for (const auto &x : xs) {
    TensorId g = total(x);
    if (g.empty()) {
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
