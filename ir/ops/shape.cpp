// Shape and data-movement ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat, Split,
// Slice, Expand, Tile, Pad, Shape, Size, ConstantOfShape, Constant, Range, DepthToSpace,
// SpaceToDepth, EyeLike, Trilu, ReverseSequence.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace popart::ir {

namespace {

std::vector<int64_t> intsInput(const Op &op, size_t i, const char *role) {
  const TensorData &d = op.constInput(i, role);
  if (!isInteger(d.info().dataType()))
    throw error(op.debugName(), ": input ", i, " (", role, ") must be an integer tensor, got ", d.info().toString());
  if (d.info().rank() > 1)
    throw error(op.debugName(), ": input ", i, " (", role, ") must be 1-D, got ", d.info().toString());
  return d.toInt64Vector();
}

void requireRankAtLeast(const Op &op, size_t i, int64_t rank) {
  if (op.inInfo(i).rank() < rank)
    throw error(op.debugName(), ": input ", i, " ('", op.input(i).id(), "') has shape ", toString(op.inInfo(i).shape()),
                ", expected rank at least ", rank);
}

// ---------------------------------------------------------------------------------------------
// Reshape family

void setupReshape(Op &op) {
  requireInputCount(op, 2, 2);
  const Shape &in = op.inInfo(0).shape();
  std::vector<int64_t> spec = intsInput(op, 1, "shape");
  bool allowZero = op.attrs.getInt("allowzero", 0) != 0;
  Shape out(spec.size());
  int64_t inferred = -1, known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t s = spec[i];
    if (s == -1) {
      if (inferred >= 0) throw error(op.debugName(), ": shape ", intsToString(spec), " has more than one -1");
      inferred = static_cast<int64_t>(i);
      continue;
    }
    if (s < -1) throw error(op.debugName(), ": shape ", intsToString(spec), " has invalid dimension ", s);
    if (s == 0 && !allowZero) {
      if (i >= in.size())
        throw error(op.debugName(), ": shape ", intsToString(spec), " copies dimension ", i, " (0) but the input ",
                    toString(in), " has rank ", in.size());
      s = in[i];
    }
    out[i] = s;
    if (__builtin_mul_overflow(known, s, &known))
      throw error(op.debugName(), ": shape ", intsToString(spec), " has too many elements (more than 2^63)");
  }
  int64_t total = shapeElementCount(in);
  if (inferred >= 0) {
    if (known == 0) {
      if (total != 0)
        throw error(op.debugName(), ": cannot infer the -1 of shape ", intsToString(spec), " for input ", toString(in));
      out[static_cast<size_t>(inferred)] = 0;
    } else {
      if (total % known != 0)
        throw error(op.debugName(), ": input ", toString(in), " cannot be reshaped to ", intsToString(spec));
      out[static_cast<size_t>(inferred)] = total / known;
    }
  } else if (known != total) {
    throw error(op.debugName(), ": input ", toString(in), " has ", total, " elements, shape ", intsToString(spec), " has ",
                known);
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void canonicalizeReshape(Op &op, Graph &graph) { moveIntsAttributeToInput(op, graph, "shape", 1); }

void setupFlatten(Op &op) {
  requireInputCount(op, 1, 1);
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  int64_t axis = op.attrs.getInt("axis", 1);
  if (axis < -rank || axis > rank)
    throw error(op.debugName(), ": axis ", axis, " is out of range [", -rank, ", ", rank, "] for input ", toString(in));
  if (axis < 0) axis += rank;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < rank; ++i)
    (i < axis ? a : b) *= in[static_cast<size_t>(i)];
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {a, b}));
}

void setupSqueeze(Op &op) {
  requireInputCount(op, 1, 2);
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<bool> drop(in.size(), false);
  if (op.hasInput(1)) {
    for (int64_t a : normalizeAxes(intsInput(op, 1, "axes"), rank, op)) {
      if (in[static_cast<size_t>(a)] != 1)
        throw error(op.debugName(), ": cannot squeeze axis ", a, " of size ", in[static_cast<size_t>(a)], " in input ",
                    toString(in));
      drop[static_cast<size_t>(a)] = true;
    }
  } else {
    for (size_t i = 0; i < in.size(); ++i)
      drop[i] = in[i] == 1;
  }
  Shape out;
  for (size_t i = 0; i < in.size(); ++i)
    if (!drop[i]) out.push_back(in[i]);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void setupUnsqueeze(Op &op) {
  requireInputCount(op, 2, 2);
  const Shape &in = op.inInfo(0).shape();
  std::vector<int64_t> axes = intsInput(op, 1, "axes");
  int64_t outRank = static_cast<int64_t>(in.size() + axes.size());
  std::vector<bool> isNew(static_cast<size_t>(outRank), false);
  for (int64_t a : normalizeAxes(axes, outRank, op))
    isNew[static_cast<size_t>(a)] = true;
  Shape out;
  size_t k = 0;
  for (int64_t i = 0; i < outRank; ++i)
    out.push_back(isNew[static_cast<size_t>(i)] ? 1 : in[k++]);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void canonicalizeAxes(Op &op, Graph &graph) { moveIntsAttributeToInput(op, graph, "axes", 1); }

// ---------------------------------------------------------------------------------------------
// Transpose, Concat, Split

void setupTranspose(Op &op) {
  requireInputCount(op, 1, 1);
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> perm;
  if (op.attrs.has("perm")) {
    perm = op.attrs.getInts("perm");
    if (static_cast<int64_t>(perm.size()) != rank)
      throw error(op.debugName(), ": perm ", intsToString(perm), " has ", perm.size(), " entries for input of rank ", rank);
    perm = normalizeAxes(perm, rank, op);
  } else {
    for (int64_t i = rank - 1; i >= 0; --i)
      perm.push_back(i);
  }
  Shape out;
  for (int64_t p : perm)
    out.push_back(in[static_cast<size_t>(p)]);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void setupConcat(Op &op) {
  requireInputCount(op, 1, 100000);
  const TensorInfo &first = op.inInfo(0);
  int64_t rank = first.rank();
  if (rank == 0) throw error(op.debugName(), ": cannot concatenate scalars");
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", 1), rank, op);
  Shape out = first.shape();
  out[static_cast<size_t>(axis)] = 0;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    const TensorInfo &info = op.inInfo(i);
    if (info.dataType() != first.dataType())
      throw error(op.debugName(), ": input ", i, " has type ", toString(info.dataType()), " but input 0 has type ",
                  toString(first.dataType()));
    if (info.rank() != rank)
      throw error(op.debugName(), ": input ", i, " has shape ", toString(info.shape()), " but input 0 has shape ",
                  toString(first.shape()));
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis && info.shape()[static_cast<size_t>(d)] != first.shape()[static_cast<size_t>(d)])
        throw error(op.debugName(), ": input ", i, " has shape ", toString(info.shape()),
                    ", incompatible with input 0 ", toString(first.shape()), " outside axis ", axis);
    out[static_cast<size_t>(axis)] += info.shape()[static_cast<size_t>(axis)];
  }
  op.setOutInfo(0, TensorInfo(first.dataType(), out));
}

/// ai.graphcore ChannelShuffle (formed by fuseChannelShuffle from ShuffleNet's Concat → Reshape
/// [N, g, C/g, ...] → Transpose → Reshape [N, C, ...] → Slices): the inputs concatenated along
/// axis 1 (C channels), channels shuffled in \p group groups (shuffled channel s is concatenated
/// channel (s mod g)·C/g + s div g), and the result split into the outputs, equal consecutive
/// chunks of axis 1.
void setupChannelShuffle(Op &op) {
  requireInputCount(op, 1, 100000);
  const TensorInfo &first = op.inInfo(0);
  if (first.rank() < 2) throw error(op.debugName(), ": inputs need a channel axis, input 0 has rank ", first.rank());
  int64_t channels = 0;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    const TensorInfo &info = op.inInfo(i);
    bool same = info.dataType() == first.dataType() && info.rank() == first.rank();
    for (int64_t d = 0; same && d < first.rank(); ++d)
      same = d == 1 || info.shape()[static_cast<size_t>(d)] == first.shape()[static_cast<size_t>(d)];
    if (!same)
      throw error(op.debugName(), ": input ", i, " is ", toString(info.dataType()), toString(info.shape()),
                  ", incompatible with input 0 ", toString(first.dataType()), toString(first.shape()),
                  " outside axis 1");
    channels += info.shape()[1];
  }
  int64_t group = op.attrs.getInt("group");
  auto parts = static_cast<int64_t>(op.outputCount());
  if (group < 1 || channels % group != 0)
    throw error(op.debugName(), ": group ", group, " does not divide the ", channels, " channels");
  if (parts < 1 || channels % parts != 0)
    throw error(op.debugName(), ": ", parts, " outputs do not split the ", channels, " channels evenly");
  Shape out = first.shape();
  out[1] = channels / parts;
  for (size_t i = 0; i < op.outputCount(); ++i)
    op.setOutInfo(i, TensorInfo(first.dataType(), out));
}

/// Sizes of Split's outputs along the axis (shared by setup and, through the output infos, the kernel).
std::vector<int64_t> splitSizes(const Op &op, int64_t dim) {
  size_t n = op.outputCount();
  if (n == 0) throw error(op.debugName(), ": has no outputs");
  std::vector<int64_t> sizes;
  if (op.hasInput(1)) {
    sizes = intsInput(op, 1, "split");
    if (sizes.size() != n)
      throw error(op.debugName(), ": split ", intsToString(sizes), " has ", sizes.size(), " entries for ", n, " outputs");
    int64_t sum = 0;
    for (int64_t s : sizes) {
      if (s < 0) throw error(op.debugName(), ": split ", intsToString(sizes), " has a negative size");
      sum = checkedAdd(op, sum, s, "the sum of split " + intsToString(sizes) + ",");
    }
    if (sum != dim)
      throw error(op.debugName(), ": split ", intsToString(sizes), " sums to ", sum, " but the axis has size ", dim);
    return sizes;
  }
  int64_t count = static_cast<int64_t>(n);
  if (op.attrs.has("num_outputs")) {
    if (op.attrs.getInt("num_outputs") != count)
      throw error(op.debugName(), ": num_outputs is ", op.attrs.getInt("num_outputs"), " but the node has ", n,
                  " outputs");
    // Opset 18: chunks of ceil(dim / n), the last one smaller.
    int64_t chunk = (dim + count - 1) / count;
    for (int64_t i = 0; i < count; ++i)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
    return sizes;
  }
  if (dim % count != 0)
    throw error(op.debugName(), ": axis of size ", dim, " cannot be split into ", n, " equal parts");
  return std::vector<int64_t>(n, dim / count);
}

void setupSplit(Op &op) {
  requireInputCount(op, 1, 2);
  const TensorInfo &in = op.inInfo(0);
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", 0), in.rank(), op);
  std::vector<int64_t> sizes = splitSizes(op, in.shape()[static_cast<size_t>(axis)]);
  for (size_t i = 0; i < op.outputCount(); ++i) {
    Shape s = in.shape();
    s[static_cast<size_t>(axis)] = sizes[i];
    op.setOutInfo(i, TensorInfo(in.dataType(), s));
  }
}

void canonicalizeSplit(Op &op, Graph &graph) { moveIntsAttributeToInput(op, graph, "split", 1); }

// ---------------------------------------------------------------------------------------------
// Slice, Expand, Tile, Pad

void setupSlice(Op &op) {
  requireInputCount(op, 3, 5);
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> starts = intsInput(op, 1, "starts"), ends = intsInput(op, 2, "ends");
  if (starts.size() != ends.size())
    throw error(op.debugName(), ": starts ", intsToString(starts), " and ends ", intsToString(ends), " differ in length");
  std::vector<int64_t> axes;
  if (op.hasInput(3))
    axes = intsInput(op, 3, "axes");
  else
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(static_cast<int64_t>(i));
  std::vector<int64_t> steps(starts.size(), 1);
  if (op.hasInput(4)) steps = intsInput(op, 4, "steps");
  if (axes.size() != starts.size() || steps.size() != starts.size())
    throw error(op.debugName(), ": starts, ends, axes and steps must have the same length");
  axes = normalizeAxes(axes, rank, op);
  Shape out = in;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t dim = in[static_cast<size_t>(axes[i])];
    int64_t step = steps[i];
    if (step == 0) throw error(op.debugName(), ": step of axis ", axes[i], " is 0");
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t count;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      count = e > s ? (e - s - 1) / step + 1 : 0; // not (e - s + step - 1) / step: step may be near 2^63
    } else if (dim == 0) {
      count = 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      // s - e <= dim: a step of magnitude dim or more takes one element (and -step may overflow).
      const int64_t magnitude = step <= -dim ? dim : -step;
      count = s > e ? (s - e - 1) / magnitude + 1 : 0;
    }
    out[static_cast<size_t>(axes[i])] = count;
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void canonicalizeSlice(Op &op, Graph &graph) {
  // Slice-1 keeps starts, ends and axes as attributes; from opset 10 they are inputs 1..3.
  if (!op.attrs.has("starts")) return;
  moveIntsAttributeToInput(op, graph, "starts", 1);
  moveIntsAttributeToInput(op, graph, "ends", 2);
  moveIntsAttributeToInput(op, graph, "axes", 3);
}

void setupExpand(Op &op) {
  requireInputCount(op, 2, 2);
  std::vector<int64_t> shape = intsInput(op, 1, "shape");
  for (int64_t d : shape)
    if (d < 0) throw error(op.debugName(), ": shape ", toString(shape), " has a negative dimension");
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), broadcastShapes(op.inInfo(0).shape(), shape, op)));
}

void setupTile(Op &op) {
  requireInputCount(op, 2, 2);
  const Shape &in = op.inInfo(0).shape();
  std::vector<int64_t> repeats = intsInput(op, 1, "repeats");
  if (repeats.size() != in.size())
    throw error(op.debugName(), ": repeats ", intsToString(repeats), " must have one entry per dimension of input ",
                toString(in));
  Shape out = in;
  for (size_t i = 0; i < in.size(); ++i) {
    if (repeats[i] < 0) throw error(op.debugName(), ": repeats ", intsToString(repeats), " has a negative entry");
    if (__builtin_mul_overflow(out[i], repeats[i], &out[i])) // found by the model fuzzer
      throw error(op.debugName(), ": repeats ", intsToString(repeats), " of input ", toString(in),
                  " give a dimension past 2^63");
  }
  try {
    (void)shapeElementCount(out);
  } catch (const error &e) {
    throw error(op.debugName(), ": ", e.what());
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void setupPad(Op &op) {
  requireInputCount(op, 2, 4);
  const Shape &in = op.inInfo(0).shape();
  int64_t rank = static_cast<int64_t>(in.size());
  std::string mode = op.attrs.getString("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    throw error(op.debugName(), ": mode '", mode, "' is not one of constant, reflect, edge, wrap");
  std::vector<int64_t> pads = intsInput(op, 1, "pads");
  std::vector<int64_t> axes;
  if (op.hasInput(3))
    axes = normalizeAxes(intsInput(op, 3, "axes"), rank, op);
  else
    for (int64_t i = 0; i < rank; ++i)
      axes.push_back(i);
  if (pads.size() != 2 * axes.size())
    throw error(op.debugName(), ": pads ", intsToString(pads), " must have ", 2 * axes.size(), " entries for input ",
                toString(in));
  if (op.hasInput(2) && op.inInfo(2).elementCount() != 1)
    throw error(op.debugName(), ": constant_value must be a single value, got ", op.inInfo(2).toString());
  Shape out = in;
  size_t n = axes.size();
  for (size_t i = 0; i < n; ++i) {
    size_t a = static_cast<size_t>(axes[i]);
    int64_t begin = pads[i], end = pads[i + n];
    // Either pad alone may not remove more than the axis holds (the kernels index from the start
    // of the input less the begin pad), and the padded size is checked against int64.
    if (begin < -in[a] || end < -in[a])
      throw error(op.debugName(), ": pads ", intsToString(pads), " remove more than the ", in[a], " elements of axis ", a);
    out[a] = checkedAdd(op, checkedAdd(op, in[a], begin, "the padded axis"), end, "the padded axis");
    if (out[a] < 0)
      throw error(op.debugName(), ": pads ", intsToString(pads), " remove more than the ", in[a], " elements of axis ", a);
    bool padded = begin > 0 || end > 0;
    if (padded && mode != "constant" && in[a] == 0)
      throw error(op.debugName(), ": mode '", mode, "' cannot pad empty axis ", a);
  }
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), out));
}

void canonicalizePad(Op &op, Graph &graph) {
  // Pad-1 calls its pads "paddings"; Pad-2 keeps pads and value as attributes; from 11 inputs.
  if (op.attrs.has("paddings")) {
    op.attrs.set("pads", op.attrs.getInts("paddings"));
    op.attrs.erase("paddings");
  }
  if (!op.attrs.has("pads")) return;
  moveIntsAttributeToInput(op, graph, "pads", 1);
  // The input type may not be known yet: the kernel converts constant_value of any type.
  DataType type =
      op.hasInput(0) && op.inInfo(0).dataType() != DataType::UNDEFINED ? op.inInfo(0).dataType() : DataType::FLOAT;
  if (op.attrs.has("value")) moveFloatAttributeToInput(op, graph, "value", 2, type);
}

/// Shape and Size depend only on the input's shape, which is known when setup runs, although
/// the input's values are not. Setup publishes the output as a constant so that consumers
/// (Reshape's shape, ConstantOfShape...) can read it; inferShapes then drops the op.
void publishKnownValue(Op &op, TensorData value) {
  op.setOutInfo(0, value.info());
  if (!op.hasOutput(0)) return;
  Tensor &out = op.output(0);
  out.setKind(TensorKind::Const);
  out.setData(std::make_shared<TensorData>(std::move(value)));
}

// ---------------------------------------------------------------------------------------------
// Shape, Size, ConstantOfShape, Constant, Range, EyeLike

void setupShape(Op &op) {
  requireInputCount(op, 1, 1);
  int64_t rank = op.inInfo(0).rank();
  int64_t start = op.attrs.getInt("start", 0), end = op.attrs.getInt("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  std::vector<int64_t> dims(op.inInfo(0).shape().begin() + start, op.inInfo(0).shape().begin() + std::max(start, end));
  publishKnownValue(op, TensorData::fromInt64({static_cast<int64_t>(dims.size())}, dims));
}

void setupSize(Op &op) {
  requireInputCount(op, 1, 1);
  publishKnownValue(op, TensorData::fromInt64({}, {op.inInfo(0).elementCount()}));
}

void setupConstantOfShape(Op &op) {
  requireInputCount(op, 1, 1);
  std::vector<int64_t> shape = intsInput(op, 0, "shape");
  for (int64_t d : shape)
    if (d < 0) throw error(op.debugName(), ": shape ", toString(shape), " has a negative dimension");
  DataType type = DataType::FLOAT;
  if (auto v = op.attrs.getTensor("value")) {
    if (v->info().elementCount() != 1)
      throw error(op.debugName(), ": value must hold one element, got ", v->info().toString());
    type = v->info().dataType();
    if (type == DataType::STRING) throw error(op.debugName(), ": STRING values are not supported");
  }
  op.setOutInfo(0, TensorInfo(type, shape));
}

void setupConstant(Op &op) {
  requireInputCount(op, 0, 0);
  auto v = op.attrs.getTensor("value");
  if (!v) throw error(op.debugName(), ": has no tensor attribute 'value' (sparse_value is not supported)");
  op.setOutInfo(0, v->info());
}

void setupRange(Op &op) {
  requireInputCount(op, 3, 3);
  DataType type = op.inInfo(0).dataType();
  for (size_t i = 0; i < 3; ++i) {
    if (op.inInfo(i).elementCount() != 1 || op.inInfo(i).rank() > 1)
      throw error(op.debugName(), ": input ", i, " must be a scalar, got ", op.inInfo(i).toString());
    if (op.inInfo(i).dataType() != type)
      throw error(op.debugName(), ": input ", i, " has type ", toString(op.inInfo(i).dataType()),
                  " but start has type ", toString(type));
  }
  requireType(op, 0, {DataType::FLOAT, DataType::DOUBLE, DataType::INT16, DataType::INT32, DataType::INT64});
  double start = op.constInput(0, "start").valueAsDouble(0);
  double limit = op.constInput(1, "limit").valueAsDouble(0);
  double delta = op.constInput(2, "delta").valueAsDouble(0);
  if (delta == 0) throw error(op.debugName(), ": delta is 0");
  double n = std::ceil((limit - start) / delta);
  if (!(n < 1e12)) throw error(op.debugName(), ": range (", start, ", ", limit, ", ", delta, ") is too long");
  op.setOutInfo(0, TensorInfo(type, {n > 0 ? static_cast<int64_t>(n) : 0}));
}

void setupEyeLike(Op &op) {
  requireInputCount(op, 1, 1);
  if (op.inInfo(0).rank() != 2) throw error(op.debugName(), ": input must be 2-D, got ", op.inInfo(0).toString());
  DataType type = op.inInfo(0).dataType();
  if (op.attrs.has("dtype")) type = dataTypeFromOnnx(static_cast<int>(op.attrs.getInt("dtype")));
  if (type == DataType::STRING) throw error(op.debugName(), ": STRING output is not supported");
  op.setOutInfo(0, TensorInfo(type, op.inInfo(0).shape()));
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace, SpaceToDepth, Trilu, ReverseSequence

void setupDepthToSpace(Op &op) {
  requireInputCount(op, 1, 1);
  const Shape &in = op.inInfo(0).shape();
  if (in.size() != 4) throw error(op.debugName(), ": input must be 4-D (N, C, H, W), got ", toString(in));
  int64_t b = op.attrs.getInt("blocksize");
  if (b <= 0) throw error(op.debugName(), ": blocksize ", b, " must be positive");
  std::string mode = op.attrs.getString("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") throw error(op.debugName(), ": mode '", mode, "' is not DCR or CRD");
  const int64_t bb = checkedMul(op, b, b, "blocksize^2");
  if (in[1] % bb != 0)
    throw error(op.debugName(), ": channels ", in[1], " are not divisible by blocksize^2 = ", bb);
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {in[0], in[1] / bb, checkedMul(op, in[2], b, "the height"),
                                                        checkedMul(op, in[3], b, "the width")}));
}

void setupSpaceToDepth(Op &op) {
  requireInputCount(op, 1, 1);
  const Shape &in = op.inInfo(0).shape();
  if (in.size() != 4) throw error(op.debugName(), ": input must be 4-D (N, C, H, W), got ", toString(in));
  int64_t b = op.attrs.getInt("blocksize");
  if (b <= 0) throw error(op.debugName(), ": blocksize ", b, " must be positive");
  if (in[2] % b != 0 || in[3] % b != 0)
    throw error(op.debugName(), ": spatial dimensions of ", toString(in), " are not divisible by blocksize ", b);
  const int64_t channels = checkedMul(op, checkedMul(op, in[1], b, "the channels"), b, "the channels");
  op.setOutInfo(0, TensorInfo(op.inInfo(0).dataType(), {in[0], channels, in[2] / b, in[3] / b}));
}

void setupTrilu(Op &op) {
  requireInputCount(op, 1, 2);
  requireRankAtLeast(op, 0, 2);
  if (op.hasInput(1) && (op.inInfo(1).elementCount() != 1 || op.inInfo(1).dataType() != DataType::INT64))
    throw error(op.debugName(), ": k must be an INT64 scalar, got ", op.inInfo(1).toString());
  setupSameAsInput0(op);
}

void setupReverseSequence(Op &op) {
  requireInputCount(op, 2, 2);
  requireRankAtLeast(op, 0, 2);
  int64_t batch = op.attrs.getInt("batch_axis", 1), time = op.attrs.getInt("time_axis", 0);
  if ((batch != 0 && batch != 1) || (time != 0 && time != 1) || batch == time)
    throw error(op.debugName(), ": batch_axis ", batch, " and time_axis ", time, " must be 0 and 1 in some order");
  requireType(op, 1, {DataType::INT64, DataType::INT32});
  const TensorInfo &lens = op.inInfo(1);
  if (lens.rank() != 1 || lens.shape()[0] != op.inInfo(0).shape()[static_cast<size_t>(batch)])
    throw error(op.debugName(), ": sequence_lens ", lens.toString(), " must have one entry per batch element of ",
                op.inInfo(0).toString());
  setupSameAsInput0(op);
}

OpDef withShapeOnlyInputs(OpDef d, std::vector<int> inputs) {
  d.shapeOnlyInputs = std::move(inputs);
  return d;
}

OpDef withValueInputs(OpDef d, std::vector<int> inputs, void (*canonicalize)(Op &, Graph &) = nullptr) {
  d.valueInputs = std::move(inputs);
  d.canonicalize = canonicalize;
  return d;
}

} // namespace

void registerShapeOps(OpRegistry &r) {
  r.add(withValueInputs(makeDef("Reshape", 1, 1000, setupReshape), {1}, canonicalizeReshape));
  r.add(makeDef("Flatten", 1, 1000, setupFlatten));
  r.add(makeDef("Transpose", 1, 1000, setupTranspose));
  r.add(withValueInputs(makeDef("Squeeze", 1, 1000, setupSqueeze), {1}, canonicalizeAxes));
  r.add(withValueInputs(makeDef("Unsqueeze", 1, 1000, setupUnsqueeze), {1}, canonicalizeAxes));
  r.add(makeDef("Concat", 1, 1000, setupConcat));
  OpDef shuffle = makeDef("ChannelShuffle", 1, 1000, setupChannelShuffle);
  shuffle.domain = "ai.graphcore";
  r.add(shuffle);
  r.add(withValueInputs(makeDef("Split", 1, 1000, setupSplit), {1}, canonicalizeSplit));
  r.add(withValueInputs(makeDef("Slice", 1, 1000, setupSlice), {1, 2, 3, 4}, canonicalizeSlice));
  r.add(withValueInputs(makeDef("Expand", 8, 1000, setupExpand), {1}));
  r.add(withValueInputs(makeDef("Tile", 6, 1000, setupTile), {1}));
  r.add(withValueInputs(makeDef("Pad", 1, 1000, setupPad), {1, 3}, canonicalizePad));
  r.add(withShapeOnlyInputs(makeDef("Shape", 1, 1000, setupShape), {0}));
  r.add(withShapeOnlyInputs(makeDef("Size", 1, 1000, setupSize), {0}));
  r.add(withValueInputs(makeDef("ConstantOfShape", 9, 1000, setupConstantOfShape), {0}));
  r.add(makeDef("Constant", 1, 1000, setupConstant));
  OpDef range = makeDef("Range", 11, 1000, setupRange);
  range.allInputsAreValueInputs = true;
  r.add(range);
  r.add(makeDef("DepthToSpace", 1, 1000, setupDepthToSpace));
  r.add(makeDef("SpaceToDepth", 1, 1000, setupSpaceToDepth));
  r.add(withShapeOnlyInputs(makeDef("EyeLike", 9, 1000, setupEyeLike), {0}));
  r.add(makeDef("Trilu", 14, 1000, setupTrilu));
  r.add(makeDef("ReverseSequence", 10, 1000, setupReverseSequence));
}

} // namespace popart::ir
