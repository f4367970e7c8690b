// unrollControlFlow: If with a constant condition, Loop with a trip count known at compile time
// and Scan become ordinary ops of the enclosing graph, so that autodiff differentiates them with
// the rules of the ops inside (docs/training.md, "Control flow").

#include "core/log.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/controlflow.hpp"
#include "ir/passes/pass_manager.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <set>

namespace popart::ir {

namespace {

bool isControlFlow(const Op &op) {
  return op.domain == "ai.onnx" && (op.type == "If" || op.type == "Loop" || op.type == "Scan");
}

/// What replaces one control-flow op: the specialised subgraph of each step (If: one branch;
/// Loop: one per iteration, with its iteration number and condition baked in; Scan: one, run
/// for every position), or why the op cannot be replaced.
struct Expansion {
  std::string obstacle;
  std::vector<std::unique_ptr<Graph>> steps;
  std::vector<int64_t> iterations; ///< Loop: the iteration number of each step
  int64_t ops = 0;                 ///< ops the expansion adds (of the folded copies)
};

int64_t scalarInt(const Tensor &t) { return t.data()->valueAsInt64(0); }

std::string limitObstacle(int64_t needed, int64_t steps, int64_t limit) {
  return "unrolling it needs at least " + std::to_string(needed) + " ops (" + std::to_string(steps) +
         " iterations), over the limit of " + std::to_string(limit) +
         " (UnrollOptions::maxOps, SessionOptions::maxUnrolledOps)";
}

/// Values to bake into \p body: \p formal for its formal inputs in order, and the value of
/// each captured tensor that is a constant of the outer graph (a Constant node folded after
/// import), so that what the body computes from it folds too (a condition output that is an
/// Identity of an outer `true`).
std::vector<const TensorData *> bodyValues(const Op &op, const Graph &body, std::vector<const TensorData *> formal) {
  std::vector<const TensorData *> values;
  size_t f = 0;
  for (int source : subgraphInputSources(op, body)) {
    if (source < 0) {
      values.push_back(f < formal.size() ? formal[f] : nullptr);
      ++f;
      continue;
    }
    const Tensor &t = op.input(static_cast<size_t>(source));
    values.push_back(t.isConst() ? t.data().get() : nullptr);
  }
  return values;
}

Expansion planIf(const Op &op) {
  Expansion e;
  const Tensor &cond = op.input(0);
  if (!cond.isConst()) {
    e.obstacle = "its condition '" + cond.id() +
                 "' is known only at run time, so the branch to differentiate is not known when the backward graph "
                 "is built";
    return e;
  }
  const char *attr = cond.data()->valueAsDouble(0) != 0 ? "then_branch" : "else_branch";
  auto branch = op.attrs.getGraph(attr);
  if (!branch) throw error(op.debugName(), ": subgraph attribute '", attr, "' is missing");
  e.steps.push_back(specialiseSubgraph(op.debugName(), attr, *branch, subgraphInputInfos(op, *branch, {}),
                                       bodyValues(op, *branch, {})));
  e.ops = static_cast<int64_t>(e.steps[0]->ops().size());
  return e;
}

Expansion planLoop(const Op &op, int64_t budget) {
  Expansion e;
  auto body = op.attrs.getGraph("body");
  if (!body) throw error(op.debugName(), ": subgraph attribute 'body' is missing");
  size_t carried = ownInputCount(op) - 2;
  std::optional<int64_t> trips;
  if (op.hasInput(0)) {
    if (!op.input(0).isConst()) {
      e.obstacle = "its trip count M ('" + op.input(0).id() + "') is known only at run time";
      return e;
    }
    trips = scalarInt(op.input(0));
  }
  bool cond = true;
  if (op.hasInput(1)) {
    if (!op.input(1).isConst()) {
      e.obstacle = "its initial condition ('" + op.input(1).id() + "') is known only at run time";
      return e;
    }
    cond = op.input(1).data()->valueAsDouble(0) != 0;
  } else if (!trips) {
    e.obstacle = "it has neither a trip count nor a condition";
    return e;
  }
  std::vector<TensorInfo> infos{TensorInfo(DataType::INT64, {}), TensorInfo(DataType::BOOL, {})};
  for (size_t i = 0; i < carried; ++i) {
    if (!op.hasInput(2 + i)) {
      e.obstacle = "loop-carried value " + std::to_string(i) + " has no initial value";
      return e;
    }
    infos.push_back(op.inInfo(2 + i));
  }
  TensorData condTrue = TensorData::fromDoubles(DataType::BOOL, {}, {1.0});
  for (int64_t t = 0; cond && (!trips || t < *trips); ++t) {
    TensorData iteration = TensorData::fromInt64({}, {t});
    auto step = specialiseSubgraph(op.debugName(), "body", *body, subgraphInputInfos(op, *body, infos),
                                   bodyValues(op, *body, {&iteration, &condTrue}));
    e.ops += static_cast<int64_t>(step->ops().size()) + 1;
    if (e.ops > budget) {
      e.obstacle = limitObstacle(e.ops, t + 1, budget);
      e.steps.clear();
      return e;
    }
    if (!trips || t + 1 < *trips) {
      const Tensor &next = step->tensor(step->outputs()[0]);
      if (!next.isConst()) {
        e.obstacle = "its condition (body output '" + next.id() +
                     "') is computed from values known only at run time, so the number of iterations is not known "
                     "when the backward graph is built";
        e.steps.clear();
        return e;
      }
      cond = next.data()->valueAsDouble(0) != 0;
    }
    for (size_t i = 0; i < carried; ++i)
      infos[2 + i] = step->tensor(step->outputs()[1 + i]).info();
    e.steps.push_back(std::move(step));
    e.iterations.push_back(t);
  }
  return e;
}

Expansion planScan(const Op &op, int64_t budget) {
  Expansion e;
  ScanLayout l = scanLayout(op);
  if (l.batched) {
    e.obstacle = "Scan-8 (with a batch axis) is not unrolled";
    return e;
  }
  if (l.length < 1) {
    e.obstacle = "its scan inputs are empty";
    return e;
  }
  auto body = op.attrs.getGraph("body");
  if (!body) throw error(op.debugName(), ": subgraph attribute 'body' is missing");
  std::vector<TensorInfo> formal;
  for (size_t i = 0; i < l.states; ++i)
    formal.push_back(op.inInfo(l.firstState + i));
  for (size_t j = 0; j < l.scanInputs; ++j) {
    const TensorInfo &in = op.inInfo(l.firstState + l.states + j);
    Shape s = in.shape();
    s.erase(s.begin() + l.inputAxes[j]);
    formal.emplace_back(in.dataType(), s);
  }
  e.steps.push_back(specialiseSubgraph(op.debugName(), "body", *body, subgraphInputInfos(op, *body, formal),
                                       bodyValues(op, *body, {})));
  int64_t perStep = static_cast<int64_t>(e.steps[0]->ops().size() + l.scanInputs + l.scanOutputs);
  e.ops = perStep * l.length;
  if (e.ops > budget) {
    e.obstacle = limitObstacle(e.ops, l.length, budget);
    e.steps.clear();
  }
  return e;
}

Expansion plan(const Op &op, int64_t budget) {
  if (op.type == "If") return planIf(op);
  if (op.type == "Loop") return planLoop(op, budget);
  return planScan(op, budget);
}

/// Adds ops to \p g that compute \p body's outputs from the tensors \p inputs (one per input of
/// \p body), with new tensor ids starting with \p prefix; returns the ids of the outputs. The
/// body's constants are shared into \p g under new ids.
std::vector<TensorId> inlineGraph(Graph &g, const Graph &body, const std::vector<TensorId> &inputs,
                                  const std::string &prefix) {
  std::map<const Tensor *, TensorId> names;
  for (size_t i = 0; i < body.inputs().size(); ++i)
    names[&body.tensor(body.inputs()[i])] = inputs[i];
  auto nameOf = [&](const Tensor *t) -> TensorId {
    if (auto it = names.find(t); it != names.end()) return it->second;
    if (!t->isConst())
      throw error("inlining subgraph: tensor '", t->id(), "' is neither an input, a constant nor produced by an op");
    TensorId id = g.uniqueId(prefix + t->id());
    g.addTensor(id, TensorKind::Const, t->info()).setData(t->data());
    names[t] = id;
    return id;
  };
  for (const Op *op : body.schedule()) {
    std::vector<TensorId> ins, outs;
    for (const Tensor *t : op->inputs)
      ins.push_back(t ? nameOf(t) : "");
    for (const Tensor *t : op->outputs) {
      if (!t) {
        outs.emplace_back();
        continue;
      }
      outs.push_back(g.uniqueId(prefix + t->id()));
      names[t] = outs.back();
    }
    Op &added =
        g.addOp(op->type, op->domain, op->version, op->name.empty() ? "" : prefix + op->name, op->attrs, ins, outs);
    added.fusion = op->fusion;
    added.def->setup(added);
  }
  std::vector<TensorId> outputs;
  for (const TensorId &id : body.outputs())
    outputs.push_back(nameOf(&body.tensor(id)));
  return outputs;
}

/// Adds a default-domain op (opset 13 forms) with one output named after \p prefix.
TensorId addOnnx(Graph &g, const std::string &type, const std::vector<TensorId> &inputs, Attributes attrs,
                 const std::string &prefix, const TensorId &out = "") {
  TensorId id = out.empty() ? g.uniqueId(prefix + type) : out;
  Op &op = g.addOp(type, "ai.onnx", 13, "", std::move(attrs), inputs, {id});
  op.def->setup(op);
  return id;
}

Attributes axisAttr(int64_t axis) {
  Attributes a;
  a.set("axis", axis);
  return a;
}

/// \p parts (each of the same info) stacked along a new axis \p axis, written to \p out.
void stack(Graph &g, const std::vector<TensorId> &parts, int64_t axis, const std::string &prefix, const TensorId &out) {
  TensorId axes = g.uniqueId(prefix + "axes");
  g.addConst(axes, TensorData::fromInt64({1}, {axis}));
  std::vector<TensorId> unsqueezed;
  unsqueezed.reserve(parts.size());
  for (const TensorId &p : parts)
    unsqueezed.push_back(addOnnx(g, "Unsqueeze", {p, axes}, {}, prefix));
  if (unsqueezed.size() == 1)
    addOnnx(g, "Identity", unsqueezed, {}, prefix, out);
  else
    addOnnx(g, "Concat", unsqueezed, axisAttr(axis), prefix, out);
}

/// The ids of the op inputs that \p body's captured inputs read, in the body's input order
/// (formal inputs get "").
std::vector<TensorId> capturedIds(const Op &op, const Graph &body) {
  std::vector<TensorId> ids;
  for (int source : subgraphInputSources(op, body))
    ids.push_back(source < 0 ? "" : op.input(static_cast<size_t>(source)).id());
  return ids;
}

/// The body inputs: \p formal for the formal inputs in order, the captured tensors for the rest.
std::vector<TensorId> bodyInputs(const std::vector<TensorId> &captured, const std::vector<TensorId> &formal) {
  std::vector<TensorId> ids;
  ids.reserve(captured.size());
  size_t f = 0;
  for (const TensorId &c : captured)
    ids.push_back(c.empty() ? formal.at(f++) : c);
  return ids;
}

std::string prefixOf(const Op &op) { return (op.name.empty() ? op.type + std::to_string(op.id) : op.name) + "/"; }

void expandIf(Graph &g, Op &op, Expansion &e) {
  auto branch = op.attrs.getGraph(op.input(0).data()->valueAsDouble(0) != 0 ? "then_branch" : "else_branch");
  std::vector<TensorId> inputs = capturedIds(op, *branch);
  std::vector<TensorId> outs;
  for (const Tensor *t : op.outputs)
    outs.push_back(t ? t->id() : "");
  std::string prefix = prefixOf(op);
  g.removeOp(op);
  std::vector<TensorId> results = inlineGraph(g, *e.steps[0], inputs, prefix);
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].empty()) addOnnx(g, "Identity", {results[i]}, {}, prefix, outs[i]);
}

void expandLoop(Graph &g, Op &op, Expansion &e) {
  auto body = op.attrs.getGraph("body");
  size_t carried = ownInputCount(op) - 2;
  size_t scans = op.outputCount() - carried;
  std::vector<TensorId> captured = capturedIds(op, *body);
  std::vector<TensorId> state;
  for (size_t i = 0; i < carried; ++i)
    state.push_back(op.input(2 + i).id());
  std::vector<TensorId> outs;
  std::vector<TensorInfo> outInfos;
  for (const Tensor *t : op.outputs) {
    outs.push_back(t ? t->id() : "");
    outInfos.push_back(t ? t->info() : TensorInfo());
  }
  std::string prefix = prefixOf(op);
  g.removeOp(op);
  std::vector<std::vector<TensorId>> scanned(scans);
  for (size_t s = 0; s < e.steps.size(); ++s) {
    std::string stepPrefix = prefix + std::to_string(e.iterations[s]) + "/";
    TensorId iteration = g.uniqueId(stepPrefix + "iteration");
    g.addConst(iteration, TensorData::fromInt64({}, {e.iterations[s]}));
    TensorId cond = g.uniqueId(stepPrefix + "cond");
    g.addConst(cond, TensorData::fromDoubles(DataType::BOOL, {}, {1.0}));
    std::vector<TensorId> formal{iteration, cond};
    formal.insert(formal.end(), state.begin(), state.end());
    std::vector<TensorId> results = inlineGraph(g, *e.steps[s], bodyInputs(captured, formal), stepPrefix);
    for (size_t i = 0; i < carried; ++i)
      state[i] = results[1 + i];
    for (size_t k = 0; k < scans; ++k)
      scanned[k].push_back(results[1 + carried + k]);
  }
  for (size_t i = 0; i < carried; ++i)
    if (!outs[i].empty()) addOnnx(g, "Identity", {state[i]}, {}, prefix, outs[i]);
  for (size_t k = 0; k < scans; ++k) {
    const TensorId &out = outs[carried + k];
    if (out.empty()) continue;
    if (scanned[k].empty()) {
      // No iteration ran: an empty [0, ...] tensor, as the loop would give.
      TensorId empty = g.uniqueId(prefix + "empty");
      g.addConst(empty, TensorData(outInfos[carried + k]));
      addOnnx(g, "Identity", {empty}, {}, prefix, out);
      continue;
    }
    stack(g, scanned[k], 0, prefix, out);
  }
}

void expandScan(Graph &g, Op &op, Expansion &e) {
  ScanLayout l = scanLayout(op);
  auto body = op.attrs.getGraph("body");
  std::vector<TensorId> captured = capturedIds(op, *body);
  std::vector<TensorId> state, scanInputs;
  for (size_t i = 0; i < l.states; ++i)
    state.push_back(op.input(l.firstState + i).id());
  for (size_t j = 0; j < l.scanInputs; ++j)
    scanInputs.push_back(op.input(l.firstState + l.states + j).id());
  std::vector<TensorId> outs;
  for (const Tensor *t : op.outputs)
    outs.push_back(t ? t->id() : "");
  std::string prefix = prefixOf(op);
  g.removeOp(op);
  std::vector<std::vector<TensorId>> scanned(l.scanOutputs);
  for (int64_t t = 0; t < l.length; ++t) {
    std::string stepPrefix = prefix + std::to_string(t) + "/";
    std::vector<TensorId> formal = state;
    for (size_t j = 0; j < l.scanInputs; ++j) {
      int64_t position = l.inputReverse[j] ? l.length - 1 - t : t;
      TensorId index = g.uniqueId(stepPrefix + "index");
      g.addConst(index, TensorData::fromInt64({}, {position}));
      formal.push_back(addOnnx(g, "Gather", {scanInputs[j], index}, axisAttr(l.inputAxes[j]), stepPrefix));
    }
    std::vector<TensorId> results = inlineGraph(g, *e.steps[0], bodyInputs(captured, formal), stepPrefix);
    for (size_t i = 0; i < l.states; ++i)
      state[i] = results[i];
    for (size_t k = 0; k < l.scanOutputs; ++k)
      scanned[k].push_back(results[l.states + k]);
  }
  for (size_t i = 0; i < l.states; ++i)
    if (!outs[i].empty()) addOnnx(g, "Identity", {state[i]}, {}, prefix, outs[i]);
  for (size_t k = 0; k < l.scanOutputs; ++k) {
    const TensorId &out = outs[l.states + k];
    if (out.empty()) continue;
    std::vector<TensorId> parts = scanned[k];
    if (l.outputReverse[k]) std::reverse(parts.begin(), parts.end());
    int64_t rank = g.tensor(parts[0]).info().rank();
    int64_t axis = l.outputAxes[k] < 0 ? l.outputAxes[k] + rank + 1 : l.outputAxes[k];
    stack(g, parts, axis, prefix, out);
  }
}

} // namespace

std::string unrollObstacle(const Op &op, const UnrollOptions &options) {
  if (!isControlFlow(op)) return op.debugName() + " is not an If, Loop or Scan";
  return plan(op, options.maxOps).obstacle;
}

int unrollControlFlow(Graph &graph, const std::vector<TensorId> &roots, const UnrollOptions &options) {
  int count = 0;
  int64_t budget = options.maxOps;
  std::set<const Op *> blocked;
  while (true) {
    std::set<const Op *> needed;
    std::vector<const Tensor *> stack;
    for (const TensorId &id : roots.empty() ? graph.outputs() : roots)
      stack.push_back(&graph.tensor(id));
    while (!stack.empty()) {
      const Tensor *t = stack.back();
      stack.pop_back();
      if (const Op *p = t->producer(); p && needed.insert(p).second)
        for (const Tensor *in : p->inputs)
          if (in) stack.push_back(in);
    }
    Op *target = nullptr;
    Expansion e;
    for (Op *op : graph.schedule()) {
      if (!isControlFlow(*op) || !needed.count(op) || blocked.count(op)) continue;
      e = plan(*op, budget);
      if (e.obstacle.empty()) {
        target = op;
        break;
      }
      blocked.insert(op);
      // For the error autodiff gives if the loss needs a gradient through it (under this pass's
      // limit, which the gradient rule does not know); nothing else reads it.
      op->attrs.set(ir::internal_attr::kNotUnrolled, e.obstacle);
    }
    if (!target) return count;
    budget -= e.ops;
    if (target->type == "If")
      expandIf(graph, *target, e);
    else if (target->type == "Loop")
      expandLoop(graph, *target, e);
    else
      expandScan(graph, *target, e);
    ++count;
  }
}

void registerUnrollPasses(PassRegistry &r) {
  r.add({
      .name = "unrollControlFlow",
      .purpose = "replaces the If, Loop and Scan ops the loss depends on by the ops they run, where it can",
      .needs = ShapesInferred,
      .before = GradientsBuilt,
      .establishes = ControlFlowUnrolled,
      .run =
          [](Graph &g, PassContext &c) {
            if (c.loss.empty() || !g.hasTensor(c.loss)) return 0;
            int unrolled = unrollControlFlow(g, {c.loss}, c.state<UnrollOptions>());
            if (unrolled > 0) {
              logging::logger().info("unrolled {} If, Loop and Scan ops for the backward graph", unrolled);
              inferShapes(g, c.folder);
            }
            return unrolled;
          },
  });
}

} // namespace popart::ir
