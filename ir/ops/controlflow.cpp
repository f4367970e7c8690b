// If, Loop, Scan and SequenceMap: ops that run a subgraph. Their setup specialises the subgraph
// for the op's input infos to learn the output infos; the backend's kernels compile the same
// specialisation into a nested plan (see docs/architecture.md, "Subgraphs and sequences").

#include "ir/ops/controlflow.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"
#include <popart/error.hpp>

#include <algorithm>

namespace popart::ir {

namespace {
const ConstEvaluator *folder_ = nullptr;
} // namespace

void setSubgraphFolder(const ConstEvaluator *folder) { folder_ = folder; }
const ConstEvaluator *subgraphFolder() { return folder_; }

size_t ownInputCount(const Op &op) {
  size_t captured = op.attrs.getStrings(ir::internal_attr::kCaptures).size();
  return op.inputs.size() >= captured ? op.inputs.size() - captured : 0;
}

std::vector<int> subgraphInputSources(const Op &op, const Graph &body) {
  std::vector<std::string> captures = op.attrs.getStrings(ir::internal_attr::kCaptures);
  size_t own = ownInputCount(op);
  std::vector<int> sources;
  for (const TensorId &id : body.inputs()) {
    auto it = std::find(captures.begin(), captures.end(), id);
    sources.push_back(it == captures.end() ? -1 : static_cast<int>(own + static_cast<size_t>(it - captures.begin())));
  }
  return sources;
}

size_t formalInputCount(const Op &op, const Graph &body) {
  std::vector<int> s = subgraphInputSources(op, body);
  return static_cast<size_t>(std::count(s.begin(), s.end(), -1));
}

std::vector<TensorInfo> subgraphInputInfos(const Op &op, const Graph &body, const std::vector<TensorInfo> &formal) {
  std::vector<int> sources = subgraphInputSources(op, body);
  std::vector<TensorInfo> infos;
  size_t f = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i] >= 0) {
      if (!op.hasInput(static_cast<size_t>(sources[i])))
        throw error(op.debugName(), ": captured tensor '", body.inputs()[i], "' is not connected");
      infos.push_back(op.inInfo(static_cast<size_t>(sources[i])));
      continue;
    }
    if (f >= formal.size())
      throw error(op.debugName(), ": its subgraph has more inputs (", sources.size(), ") than the op provides (",
                  formal.size(), " and ", op.attrs.getStrings(ir::internal_attr::kCaptures).size(), " captured)");
    infos.push_back(formal[f++]);
  }
  if (f != formal.size())
    throw error(op.debugName(), ": its subgraph takes ", f, " inputs but the op provides ", formal.size());
  return infos;
}

std::unique_ptr<Graph> specialiseSubgraph(const std::string &opName, const char *attr, const Graph &body,
                                          const std::vector<TensorInfo> &infos,
                                          const std::vector<const TensorData *> &values) {
  auto g = body.clone();
  if (infos.size() != g->inputs().size())
    throw error(opName, ": subgraph '", attr, "' has ", g->inputs().size(), " inputs, given ", infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    Tensor &t = g->tensor(g->inputs()[i]);
    t.setInfo(infos[i]);
    if (i < values.size() && values[i]) {
      t.setKind(TensorKind::Const);
      t.setData(std::make_shared<TensorData>(*values[i]));
    }
  }
  try {
    inferShapes(*g, folder_);
  } catch (const error &e) {
    throw error(opName, ", subgraph '", attr, "': ", e.what());
  }
  return g;
}

std::optional<std::vector<TensorInfo>> subgraphOutputInfos(const Op &op, const char *attr, const Graph &body,
                                                           const std::vector<TensorInfo> &formal) {
  std::vector<TensorInfo> infos = subgraphInputInfos(op, body, formal);
  bool allKnown = std::all_of(infos.begin(), infos.end(), [](const TensorInfo &i) { return i.isKnown(); });
  if (allKnown) {
    try {
      auto g = specialiseSubgraph(op.debugName(), attr, body, infos);
      std::vector<TensorInfo> out;
      for (const TensorId &id : g->outputs())
        out.push_back(g->tensor(id).info());
      if (std::all_of(out.begin(), out.end(), [](const TensorInfo &i) { return i.isKnown(); })) return out;
    } catch (const error &) {
      // Shapes that depend on values known only at run time: the kernel specialises per run.
    }
  }
  std::vector<TensorInfo> declared;
  for (const TensorId &id : body.outputs()) {
    // An output that is an input of the subgraph has the info that input is given.
    auto in = std::find(body.inputs().begin(), body.inputs().end(), id);
    declared.push_back(in != body.inputs().end() ? infos[static_cast<size_t>(in - body.inputs().begin())]
                                                 : body.tensor(id).info());
  }
  if (std::all_of(declared.begin(), declared.end(), [](const TensorInfo &i) { return i.isKnown(); })) return declared;
  return std::nullopt;
}

TensorInfo mergeInfos(const TensorInfo &a, const TensorInfo &b) {
  if (a == b) return a;
  if (a.dataType() == DataType::UNDEFINED) return b;
  if (b.dataType() == DataType::UNDEFINED) return a;
  // A sequence known to be empty says nothing about its elements' shape.
  Shape shape = a.elementsKnown() && a.elements().empty()   ? b.shape()
                : b.elementsKnown() && b.elements().empty() ? a.shape()
                                                            : mergeShapes(a.shape(), b.shape());
  return TensorInfo(a.valueKind(), a.dataType(), shape);
}

namespace {

const Graph &requireGraph(const Op &op, const char *attr) {
  auto g = op.attrs.getGraph(attr);
  if (!g) throw error(op.debugName(), ": subgraph attribute '", attr, "' is missing");
  return *g;
}

void requireOutputCount(const Op &op, const char *attr, const Graph &body, size_t expected) {
  if (body.outputs().size() != expected)
    throw error(op.debugName(), ": subgraph '", attr, "' has ", body.outputs().size(), " outputs, expected ", expected);
}

void setupIf(Op &op) {
  const Graph &thenG = requireGraph(op, "then_branch"), &elseG = requireGraph(op, "else_branch");
  requireType(op, 0, {DataType::BOOL});
  if (op.inInfo(0).elementCount() != 1)
    throw error(op.debugName(), ": condition must have one element, got ", op.inInfo(0).toString());
  requireOutputCount(op, "then_branch", thenG, op.outputCount());
  requireOutputCount(op, "else_branch", elseG, op.outputCount());
  auto thenOut = subgraphOutputInfos(op, "then_branch", thenG, {});
  auto elseOut = subgraphOutputInfos(op, "else_branch", elseG, {});
  std::optional<bool> cond;
  if (op.input(0).isConst()) cond = op.input(0).data()->valueAsDouble(0) != 0;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    const auto &chosen = cond ? (*cond ? thenOut : elseOut) : thenOut;
    if (!chosen || (!cond && !elseOut))
      throw error(op.debugName(), ": the type or shape of output ", i, " is not known before running");
    TensorInfo info = cond ? (*chosen)[i] : mergeInfos((*thenOut)[i], (*elseOut)[i]);
    if (!cond && (*thenOut)[i].valueKind() != (*elseOut)[i].valueKind())
      throw error(op.debugName(), ": output ", i, " is ", (*thenOut)[i].toString(), " in then_branch but ",
                  (*elseOut)[i].toString(), " in else_branch");
    if (!info.isKnown())
      throw error(op.debugName(), ": output ", i, " has shape ", (*thenOut)[i].toString(), " in then_branch but ",
                  (*elseOut)[i].toString(), " in else_branch; branches must agree");
    op.setOutInfo(i, info);
  }
}

void setupLoop(Op &op) {
  const Graph &body = requireGraph(op, "body");
  size_t own = ownInputCount(op);
  if (own < 2) throw error(op.debugName(), ": expected inputs M, cond and the loop-carried values");
  size_t carried = own - 2;
  if (body.outputs().size() < 1 + carried)
    throw error(op.debugName(), ": subgraph 'body' has ", body.outputs().size(), " outputs, expected at least ",
                1 + carried, " (cond and ", carried, " loop-carried values)");
  size_t scans = body.outputs().size() - 1 - carried;
  if (op.outputCount() != carried + scans)
    throw error(op.debugName(), ": has ", op.outputCount(), " outputs, its body gives ", carried + scans);
  if (formalInputCount(op, body) != 2 + carried)
    throw error(op.debugName(), ": subgraph 'body' takes ", formalInputCount(op, body), " inputs, expected ",
                2 + carried, " (iteration number, cond and ", carried, " loop-carried values)");
  std::vector<TensorInfo> formal{TensorInfo(DataType::INT64, {}), TensorInfo(DataType::BOOL, {})};
  for (size_t i = 0; i < carried; ++i)
    formal.push_back(op.hasInput(2 + i) ? op.inInfo(2 + i) : TensorInfo());
  std::optional<std::vector<TensorInfo>> out;
  // Loop-carried infos are what the body gives for what it is given: iterate to a fixed point.
  for (int round = 0; round < 4; ++round) {
    out = subgraphOutputInfos(op, "body", body, formal);
    if (!out) break;
    bool changed = false;
    for (size_t i = 0; i < carried; ++i) {
      TensorInfo merged = mergeInfos(formal[2 + i], (*out)[1 + i]);
      if (merged != formal[2 + i]) changed = true;
      formal[2 + i] = merged;
    }
    if (!changed) break;
  }
  if (!out) throw error(op.debugName(), ": the types or shapes of the body's outputs are not known before running");
  for (size_t i = 0; i < carried; ++i) {
    if (!formal[2 + i].isKnown())
      throw error(op.debugName(), ": loop-carried value ", i, " changes shape between iterations (",
                  formal[2 + i].toString(), "); only sequences may");
    // A value may start optional and continue as what the body makes of it (Loop-16's opt_seq).
    TensorInfo info = formal[2 + i];
    if ((*out)[1 + i].valueKind() != info.valueKind())
      info = TensorInfo((*out)[1 + i].valueKind(), info.dataType(), info.shape());
    op.setOutInfo(i, info);
  }
  if (scans == 0) return;
  // A negative trip count runs no iteration (the loop runs while the iteration number is below it).
  int64_t trips = std::max<int64_t>(0, op.constInput(0, "trip count M, which sizes the scan outputs").valueAsInt64(0));
  for (size_t k = 0; k < scans; ++k) {
    TensorInfo e = (*out)[1 + carried + k];
    if (!e.isTensor()) throw error(op.debugName(), ": scan output ", k, " must be a tensor, got ", e.toString());
    Shape s = e.shape();
    s.insert(s.begin(), trips);
    op.setOutInfo(carried + k, TensorInfo(e.dataType(), s));
  }
}

std::vector<int> loopValueInputs(const Op &op) {
  auto body = op.attrs.getGraph("body");
  size_t own = ownInputCount(op);
  if (!body || own < 2) return {};
  // The trip count sizes the scan outputs.
  return body->outputs().size() > own - 1 ? std::vector<int>{0} : std::vector<int>{};
}

void setupScan(Op &op) {
  const Graph &body = requireGraph(op, "body");
  ScanLayout l = scanLayout(op);
  std::vector<TensorInfo> formal;
  for (size_t i = 0; i < l.states; ++i) {
    Shape s = op.inInfo(l.firstState + i).shape();
    if (l.batched) s.erase(s.begin());
    formal.emplace_back(op.inInfo(l.firstState + i).dataType(), s);
  }
  for (size_t j = 0; j < l.scanInputs; ++j) {
    const TensorInfo &in = op.inInfo(l.firstState + l.states + j);
    Shape s = in.shape();
    s.erase(s.begin() + l.inputAxes[j]);
    if (l.batched) s.erase(s.begin());
    formal.emplace_back(in.dataType(), s);
  }
  if (formalInputCount(op, body) != formal.size())
    throw error(op.debugName(), ": subgraph 'body' takes ", formalInputCount(op, body), " inputs, expected ",
                formal.size(), " (", l.states, " states and ", l.scanInputs, " scan inputs)");
  requireOutputCount(op, "body", body, op.outputCount());
  auto out = subgraphOutputInfos(op, "body", body, formal);
  if (!out) throw error(op.debugName(), ": the types or shapes of the body's outputs are not known before running");
  for (size_t i = 0; i < l.states; ++i) {
    if ((*out)[i] != formal[i])
      throw error(op.debugName(), ": state ", i, " is ", formal[i].toString(), " but the body returns ",
                  (*out)[i].toString());
    op.setOutInfo(i, op.inInfo(l.firstState + i));
  }
  for (size_t k = 0; k < l.scanOutputs; ++k) {
    const TensorInfo &e = (*out)[l.states + k];
    Shape s = e.shape();
    int64_t axis = l.outputAxes[k] < 0 ? l.outputAxes[k] + e.rank() + 1 : l.outputAxes[k];
    if (axis < 0 || axis > static_cast<int64_t>(s.size()))
      throw error(op.debugName(), ": scan output axis ", axis, " is out of range for ", e.toString());
    s.insert(s.begin() + axis, l.length);
    if (l.batched) s.insert(s.begin(), l.batch);
    op.setOutInfo(l.states + k, TensorInfo(e.dataType(), s));
  }
}

void setupSequenceMap(Op &op) {
  const Graph &body = requireGraph(op, "body");
  size_t own = ownInputCount(op);
  if (own < 1 || !op.inInfo(0).isSequence() || op.inInfo(0).valueKind() != ValueKind::Sequence)
    throw error(op.debugName(), ": input 0 must be a sequence");
  std::vector<TensorInfo> formal;
  for (size_t i = 0; i < own; ++i)
    formal.push_back(op.inInfo(i).isTensor() ? op.inInfo(i) : op.inInfo(i).elementInfo());
  if (formalInputCount(op, body) != own)
    throw error(op.debugName(), ": subgraph 'body' takes ", formalInputCount(op, body), " inputs, expected ", own);
  requireOutputCount(op, "body", body, op.outputCount());
  auto out = subgraphOutputInfos(op, "body", body, formal);
  for (size_t k = 0; k < op.outputCount(); ++k) {
    // Element shapes may differ per element: only the type must be known.
    TensorInfo e = out ? (*out)[k] : body.tensor(body.outputs()[k]).info();
    if (e.dataType() == DataType::UNDEFINED)
      throw error(op.debugName(), ": the type of output ", k, " is not known before running");
    op.setOutInfo(k, TensorInfo(ValueKind::Sequence, e.dataType(), e.shape()));
  }
}

} // namespace

ScanLayout scanLayout(const Op &op) {
  ScanLayout l;
  l.batched = op.version < 9;
  l.firstState = l.batched ? 1 : 0;
  auto body = op.attrs.getGraph("body");
  size_t own = ownInputCount(op);
  int64_t m = op.attrs.getInt("num_scan_inputs");
  if (m < 1 || static_cast<size_t>(m) + l.firstState > own)
    throw error(op.debugName(), ": num_scan_inputs ", m, " does not fit its ", own, " inputs");
  l.scanInputs = static_cast<size_t>(m);
  l.states = own - l.firstState - l.scanInputs;
  if (op.outputCount() < l.states)
    throw error(op.debugName(), ": has ", op.outputCount(), " outputs, fewer than its ", l.states, " states");
  l.scanOutputs = op.outputCount() - l.states;
  auto ints = [&](const char *name, size_t n, int64_t fill) {
    std::vector<int64_t> v = op.attrs.getInts(name, std::vector<int64_t>(n, fill));
    if (v.size() != n) throw error(op.debugName(), ": attribute '", name, "' has ", v.size(), " values, expected ", n);
    return v;
  };
  if (l.batched) {
    l.inputAxes.assign(l.scanInputs, 0);
    l.inputReverse = ints("directions", l.scanInputs, 0);
    l.outputAxes.assign(l.scanOutputs, 0);
    l.outputReverse.assign(l.scanOutputs, 0);
  } else {
    l.inputAxes = ints("scan_input_axes", l.scanInputs, 0);
    l.inputReverse = ints("scan_input_directions", l.scanInputs, 0);
    l.outputAxes = ints("scan_output_axes", l.scanOutputs, 0);
    l.outputReverse = ints("scan_output_directions", l.scanOutputs, 0);
  }
  for (size_t j = 0; j < l.scanInputs; ++j) {
    const TensorInfo &in = op.inInfo(l.firstState + l.states + j);
    int64_t rank = in.rank() - (l.batched ? 1 : 0);
    l.inputAxes[j] = normalizeAxis(l.inputAxes[j], rank, op);
    int64_t len = in.shape()[static_cast<size_t>(l.inputAxes[j] + (l.batched ? 1 : 0))];
    if (j == 0) l.length = len;
    if (len != l.length)
      throw error(op.debugName(), ": scan inputs have different lengths (", l.length, " and ", len, ")");
    if (l.batched) {
      if (j > 0 && in.shape()[0] != l.batch)
        throw error(op.debugName(), ": scan inputs have different batch sizes (", l.batch, " and ", in.shape()[0], ")");
      l.batch = in.shape()[0];
    }
  }
  // Scan-8's states carry the batch axis first too (setup drops it: a scalar state was erased from).
  for (size_t i = 0; l.batched && i < l.states; ++i) {
    const TensorInfo &state = op.inInfo(l.firstState + i);
    if (state.rank() < 1 || state.shape()[0] != l.batch)
      throw error(op.debugName(), ": state ", i, " is ", state.toString(), ", expected the batch axis (", l.batch,
                  ") first");
  }
  if (l.batched && op.hasInput(0))
    throw error(op.debugName(), ": sequence_lens is not supported (every batch entry runs the full length)");
  (void)body;
  return l;
}

void registerControlFlowOps(OpRegistry &r) {
  // popart_captures (the importer): the outer-scope tensors the subgraphs read, appended as inputs.
  for (OpDef d : {makeDef("If", 1, 1000, setupIf), makeDef("Scan", 8, 1000, setupScan),
                  makeDef("SequenceMap", 17, 1000, setupSequenceMap)}) {
    d.internalAttributes = {ir::internal_attr::kCaptures};
    r.add(d);
  }
  OpDef loop = makeDef("Loop", 1, 1000, setupLoop);
  loop.valueInputsOf = loopValueInputs;
  // popart_not_unrolled (unrollLoops): why the Loop was kept, for autodiff's error message.
  loop.internalAttributes = {ir::internal_attr::kCaptures, ir::internal_attr::kNotUnrolled};
  r.add(loop);
}

} // namespace popart::ir
