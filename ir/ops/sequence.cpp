// Sequence and optional ops: SequenceEmpty/Construct/Insert/At/Erase/Length, SplitToSequence,
// ConcatFromSequence, Optional, OptionalHasElement, OptionalGetElement. A sequence's info is
// its element type and common element shape, and the list of element infos where positions are
// constants (TensorInfo::elements), so that SequenceAt and ConcatFromSequence shapes are static.

#include "ir/ops/families.hpp"
#include "ir/ops/helpers.hpp"
#include <popart/error.hpp>

namespace popart::ir {

namespace {

const TensorInfo &sequenceInput(const Op &op, size_t i) {
  const TensorInfo &info = op.inInfo(i);
  if (info.valueKind() != ValueKind::Sequence)
    throw error(op.debugName(), ": input ", i, " must be a sequence, got ", info.toString());
  return info;
}

/// A constant position input, or null when it is computed at run time.
const TensorData *constPosition(const Op &op, size_t i) {
  return op.hasInput(i) && op.input(i).isConst() ? op.input(i).data().get() : nullptr;
}

/// \p pos made non-negative for a sequence of \p n (n + 1 slots when inserting); throws naming
/// \p op if it is out of range.
int64_t normalizePosition(const Op &op, int64_t pos, int64_t n, bool insert) {
  int64_t limit = insert ? n + 1 : n;
  int64_t p = pos < 0 ? pos + n : pos;
  if (p < 0 || p >= limit)
    throw error(op.debugName(), ": position ", pos, " is out of range for a sequence of ", n, " tensors");
  return p;
}

TensorInfo unknownList(const TensorInfo &seq, const Shape &shape) {
  return TensorInfo(ValueKind::Sequence, seq.dataType(), shape);
}

void setupSequenceEmpty(Op &op) {
  DataType type = static_cast<DataType>(op.attrs.getInt("dtype", static_cast<int64_t>(DataType::FLOAT)));
  op.setOutInfo(0, sequenceInfoOf({}, type));
}

void setupSequenceConstruct(Op &op) {
  requireInputCount(op, 1, 1 << 20);
  std::vector<TensorInfo> infos;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    const TensorInfo &t = op.inInfo(i);
    if (!t.isTensor()) throw error(op.debugName(), ": input ", i, " must be a tensor, got ", t.toString());
    if (t.dataType() != op.inInfo(0).dataType())
      throw error(op.debugName(), ": input ", i, " has type ", toString(t.dataType()), ", input 0 has ",
                  toString(op.inInfo(0).dataType()));
    infos.push_back(t);
  }
  op.setOutInfo(0, sequenceInfoOf(infos, infos[0].dataType()));
}

void setupSequenceInsert(Op &op) {
  const TensorInfo &seq = sequenceInput(op, 0);
  const TensorInfo &t = op.inInfo(1);
  if (!t.isTensor() || t.dataType() != seq.dataType())
    throw error(op.debugName(), ": inserts ", t.toString(), " into ", seq.toString(), "; types must match");
  const TensorData *pos = constPosition(op, 2);
  if (seq.elementsKnown() && (!op.hasInput(2) || pos)) {
    std::vector<TensorInfo> e = seq.elements();
    int64_t n = static_cast<int64_t>(e.size());
    int64_t p = pos ? normalizePosition(op, pos->valueAsInt64(0), n, true) : n;
    e.insert(e.begin() + p, t);
    op.setOutInfo(0, sequenceInfoOf(e, seq.dataType()));
    return;
  }
  bool empty = seq.elementsKnown() && seq.elements().empty();
  op.setOutInfo(0, unknownList(seq, empty ? t.shape() : mergeShapes(seq.shape(), t.shape())));
}

void setupSequenceErase(Op &op) {
  const TensorInfo &seq = sequenceInput(op, 0);
  const TensorData *pos = constPosition(op, 1);
  if (seq.elementsKnown() && (!op.hasInput(1) || pos)) {
    std::vector<TensorInfo> e = seq.elements();
    int64_t n = static_cast<int64_t>(e.size());
    int64_t p = pos ? normalizePosition(op, pos->valueAsInt64(0), n, false) : n - 1;
    if (n == 0) throw error(op.debugName(), ": erases from an empty sequence");
    e.erase(e.begin() + p);
    op.setOutInfo(0, sequenceInfoOf(e, seq.dataType()));
    return;
  }
  op.setOutInfo(0, unknownList(seq, seq.shape()));
}

void setupSequenceAt(Op &op) {
  const TensorInfo &seq = sequenceInput(op, 0);
  requireType(op, 1, {DataType::INT32, DataType::INT64});
  const TensorData *pos = constPosition(op, 1);
  if (seq.elementsKnown() && pos) {
    int64_t n = static_cast<int64_t>(seq.elements().size());
    op.setOutInfo(0, seq.elements()[static_cast<size_t>(
                         normalizePosition(op, pos->valueAsInt64(0), n, false))]);
    return;
  }
  TensorInfo e = seq.elementInfo();
  if (!e.isKnown())
    throw error(op.debugName(), ": the elements of ", seq.toString(),
                " differ in shape, so the shape of the one taken must be known before running");
  op.setOutInfo(0, e);
}

void setupSequenceLength(Op &op) {
  const TensorInfo &seq = sequenceInput(op, 0);
  op.setOutInfo(0, TensorInfo(DataType::INT64, {}));
  if (seq.elementsKnown() && op.hasOutput(0)) { // known from the info alone, as Shape's value is
    op.output(0).setKind(TensorKind::Const);
    op.output(0).setData(
        std::make_shared<TensorData>(TensorData::fromInt64({}, {static_cast<int64_t>(seq.elements().size())})));
  }
}

void setupSplitToSequence(Op &op) {
  const TensorInfo &in = op.inInfo(0);
  int64_t axis = normalizeAxis(op.attrs.getInt("axis", 0), in.rank(), op);
  bool keepdims = op.attrs.getInt("keepdims", 1) != 0;
  int64_t len = in.shape()[static_cast<size_t>(axis)];
  auto piece = [&](int64_t size, bool keep) {
    Shape s = in.shape();
    if (keep)
      s[static_cast<size_t>(axis)] = size;
    else
      s.erase(s.begin() + axis);
    return TensorInfo(in.dataType(), s);
  };
  std::vector<TensorInfo> e;
  if (!op.hasInput(1)) {
    for (int64_t i = 0; i < len; ++i)
      e.push_back(piece(1, keepdims));
  } else if (const TensorData *split = constPosition(op, 1)) {
    std::vector<int64_t> sizes = split->toInt64Vector();
    if (split->info().rank() == 0) {
      int64_t chunk = sizes.at(0);
      if (chunk <= 0) throw error(op.debugName(), ": split size ", chunk, " must be positive");
      sizes.clear();
      for (int64_t at = 0; at < len; at += chunk)
        sizes.push_back(std::min(chunk, len - at));
    }
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0) throw error(op.debugName(), ": split size ", s, " is negative");
      total = checkedAdd(op, total, s, "the sum of the split sizes");
    }
    if (total != len) throw error(op.debugName(), ": split sizes add up to ", total, " but axis ", axis, " has ", len);
    for (int64_t s : sizes)
      e.push_back(piece(s, true));
  } else if (op.inInfo(1).rank() == 1) {
    for (int64_t i = 0; i < op.inInfo(1).dim(0); ++i)
      e.push_back(piece(-1, true));
  } else {
    op.setOutInfo(0, TensorInfo(ValueKind::Sequence, in.dataType(), piece(-1, true).shape()));
    return;
  }
  op.setOutInfo(0, sequenceInfoOf(e, in.dataType()));
}

void setupConcatFromSequence(Op &op) {
  const TensorInfo &seq = sequenceInput(op, 0);
  bool newAxis = op.attrs.getInt("new_axis", 0) != 0;
  if (!seq.elementsKnown() || seq.elements().empty())
    throw error(op.debugName(), ": the number of tensors in ", seq.toString(),
                " must be known before running (and not zero)");
  const Shape &first = seq.elements()[0].shape();
  int64_t rank = static_cast<int64_t>(first.size()) + (newAxis ? 1 : 0);
  int64_t axis = normalizeAxis(op.attrs.getInt("axis"), rank, op);
  // Every element's rank is checked before its size along the axis is read (the model fuzzer
  // found an element of lower rank read past its shape's end), and the sum cannot overflow.
  for (const TensorInfo &e : seq.elements()) {
    Shape s = e.shape();
    if (s.size() != first.size()) throw error(op.debugName(), ": elements have different ranks");
    for (size_t d = 0; d < s.size(); ++d)
      if ((newAxis || static_cast<int64_t>(d) != axis) && s[d] != first[d])
        throw error(op.debugName(), ": element ", e.toString(), " does not match ", seq.elements()[0].toString(),
                    " outside axis ", axis);
  }
  Shape out = first;
  if (newAxis) {
    out.insert(out.begin() + axis, static_cast<int64_t>(seq.elements().size()));
  } else {
    out[static_cast<size_t>(axis)] = 0;
    for (const TensorInfo &e : seq.elements())
      if (__builtin_add_overflow(out[static_cast<size_t>(axis)], e.shape()[static_cast<size_t>(axis)],
                                 &out[static_cast<size_t>(axis)]))
        throw error(op.debugName(), ": the elements' sizes along axis ", axis, " add up past 2^63");
  }
  op.setOutInfo(0, TensorInfo(seq.dataType(), out));
}

/// The "type" attribute of Optional: the importer stores a TypeProto as ints {kind, elem_type,
/// dims...} (ValueKind, DataType, -1 for a symbolic dimension).
TensorInfo typeAttribute(const Op &op) {
  std::vector<int64_t> v = op.attrs.getInts("type", {});
  if (v.size() < 2) throw error(op.debugName(), ": needs an input or a 'type' attribute");
  return TensorInfo(static_cast<ValueKind>(v[0]), static_cast<DataType>(v[1]), Shape(v.begin() + 2, v.end()));
}

void setupOptional(Op &op) {
  TensorInfo in = op.hasInput(0) ? op.inInfo(0) : typeAttribute(op);
  if (in.valueKind() == ValueKind::OptionalTensor || in.valueKind() == ValueKind::OptionalSequence)
    throw error(op.debugName(), ": input is already optional (", in.toString(), ")");
  TensorInfo out(in.isTensor() ? ValueKind::OptionalTensor : ValueKind::OptionalSequence, in.dataType(), in.shape());
  if (in.elementsKnown()) out.setElements(in.elements());
  op.setOutInfo(0, out);
}

void setupOptionalHasElement(Op &op) { op.setOutInfo(0, TensorInfo(DataType::BOOL, {})); }

void setupOptionalGetElement(Op &op) {
  const TensorInfo &in = op.inInfo(0);
  switch (in.valueKind()) {
  case ValueKind::Tensor:
  case ValueKind::Sequence: op.setOutInfo(0, in); return;
  case ValueKind::OptionalTensor:
    if (!in.elementInfo().isKnown())
      throw error(op.debugName(), ": the shape of ", in.toString(), " must be known before running");
    op.setOutInfo(0, in.elementInfo());
    return;
  case ValueKind::OptionalSequence: {
    TensorInfo out(ValueKind::Sequence, in.dataType(), in.shape());
    if (in.elementsKnown()) out.setElements(in.elements());
    op.setOutInfo(0, out);
    return;
  }
  }
}

} // namespace

void registerSequenceOps(OpRegistry &r) {
  for (auto [type, setup] : std::initializer_list<std::pair<const char *, void (*)(Op &)>>{
           {"SequenceEmpty", setupSequenceEmpty},
           {"SequenceConstruct", setupSequenceConstruct},
           {"SequenceInsert", setupSequenceInsert},
           {"SequenceErase", setupSequenceErase},
           {"SequenceAt", setupSequenceAt},
           {"SequenceLength", setupSequenceLength},
           {"SplitToSequence", setupSplitToSequence},
           {"ConcatFromSequence", setupConcatFromSequence}}) {
    OpDef d = makeDef(type, 11, 1000, setup);
    d.foldable = false; // sequences are not constants (TensorData holds tensors only)
    r.add(d);
  }
  for (auto [type, setup] : std::initializer_list<std::pair<const char *, void (*)(Op &)>>{
           {"Optional", setupOptional},
           {"OptionalHasElement", setupOptionalHasElement},
           {"OptionalGetElement", setupOptionalGetElement}}) {
    OpDef d = makeDef(type, 15, 1000, setup);
    d.foldable = false;
    r.add(d);
  }
}

} // namespace popart::ir
