// fuseChannelShuffle: ShuffleNet's channel shuffle, exported as Concat → Reshape [N, g, C/g, ...]
// → Transpose (swap axes 1 and 2) → Reshape [N, C, ...], often followed by the next block's
// chunk into equal halves (Slices along axis 1), becomes one ai.graphcore ChannelShuffle that
// moves every element once instead of three times.

#include "ir/passes/pass_manager.hpp"
#include "ir/passes/rewrite.hpp"

#include <algorithm>
#include <map>
#include <optional>

namespace popart::ir {

namespace {

/// The only op reading \p t, when \p t is not also a graph output; null otherwise.
Op *soleReader(const Graph &graph, const Tensor &t) {
  if (t.consumers().size() != 1 || isGraphOutput(graph, t)) return nullptr;
  return t.consumers()[0];
}

/// A constant integer input \p i of \p op with one entry; nullopt when absent or not that.
std::optional<int64_t> oneInt(const Op &op, size_t i) {
  if (!op.hasInput(i) || !op.input(i).isConst() || op.inInfo(i).elementCount() != 1) return std::nullopt;
  return op.input(i).data()->valueAsInt64(0);
}

/// The Slices that read \p t, keyed by their first channel, when they are its only readers and
/// cut axis 1 into equal consecutive chunks with step 1; empty otherwise.
std::vector<Op *> equalChunks(const Graph &graph, const Tensor &t) {
  if (t.consumers().empty() || isGraphOutput(graph, t)) return {};
  int64_t rank = t.info().rank(), channels = t.info().shape()[1];
  std::map<int64_t, Op *> byStart;
  for (Op *s : t.consumers()) {
    if (!isOnnxOp(s, "Slice") || &s->input(0) != &t || !s->hasOutput(0) || s->outputCount() != 1) return {};
    std::optional<int64_t> start = oneInt(*s, 1), axis = oneInt(*s, 3);
    std::optional<int64_t> step = s->hasInput(4) ? oneInt(*s, 4) : std::optional<int64_t>(1);
    if (!start || !axis || !step || *step != 1 || (*axis != 1 && *axis != 1 - rank)) return {};
    int64_t first = *start < 0 ? *start + channels : *start;
    first = std::clamp<int64_t>(first, 0, channels);
    if (!byStart.emplace(first, s).second) return {};
  }
  int64_t chunk = channels / static_cast<int64_t>(byStart.size()), next = 0;
  if (chunk * static_cast<int64_t>(byStart.size()) != channels) return {};
  std::vector<Op *> slices;
  for (auto &[first, s] : byStart) {
    if (first != next || s->outInfo(0).shape()[1] != chunk) return {};
    next += chunk;
    slices.push_back(s);
  }
  return slices;
}

} // namespace

int fuseChannelShuffle(Graph &graph) {
  return rewriteAll(graph, [&](Op &concat) {
    if (!isOnnxOp(&concat, "Concat") || !concat.hasOutput(0)) return false;
    const Tensor &joined = concat.output(0);
    const Shape &shape = joined.info().shape();
    auto rank = static_cast<int64_t>(shape.size());
    int64_t axis = concat.attrs.getInt("axis", 1);
    if (rank < 2 || (axis != 1 && axis != 1 - rank)) return false;
    for (const Tensor *t : concat.inputs)
      if (!t) return false;
    Op *split = soleReader(graph, joined);
    if (!isOnnxOp(split, "Reshape") || !split->hasOutput(0)) return false;
    const Shape &grouped = split->outInfo(0).shape();
    if (static_cast<int64_t>(grouped.size()) != rank + 1 || grouped[0] != shape[0] ||
        grouped[1] * grouped[2] != shape[1] || !std::equal(shape.begin() + 2, shape.end(), grouped.begin() + 3))
      return false;
    Op *transpose = soleReader(graph, split->output(0));
    if (!isOnnxOp(transpose, "Transpose") || !transpose->hasOutput(0)) return false;
    std::vector<int64_t> perm = transpose->attrs.getInts("perm", {}), swapped;
    for (int64_t d = 0; d <= rank; ++d)
      swapped.push_back(d == 1 ? 2 : d == 2 ? 1 : d);
    if (perm != swapped) return false;
    Op *merge = soleReader(graph, transpose->output(0));
    if (!isOnnxOp(merge, "Reshape") || !merge->hasOutput(0) || merge->outInfo(0).shape() != shape) return false;
    const Tensor &shuffled = merge->output(0);
    std::vector<Op *> slices = equalChunks(graph, shuffled);

    std::vector<TensorId> inputs, outputs, gone{joined.id(), split->output(0).id(), transpose->output(0).id()};
    for (const Tensor *t : concat.inputs)
      inputs.push_back(t->id());
    for (Op *s : slices)
      outputs.push_back(s->output(0).id());
    if (slices.empty())
      outputs.push_back(shuffled.id());
    else
      gone.push_back(shuffled.id());
    Attributes attrs;
    attrs.set("group", grouped[1]);
    std::string name = concat.name;
    int phase = concat.phase;
    for (Op *s : slices)
      graph.removeOp(*s);
    graph.removeOp(*merge);
    graph.removeOp(*transpose);
    graph.removeOp(*split);
    graph.removeOp(concat);
    for (const TensorId &id : gone)
      graph.removeTensor(id);
    addRewrittenOp(graph, phase, "ChannelShuffle", "ai.graphcore", 1, name, std::move(attrs), inputs, outputs);
    return true;
  });
}

void registerChannelShufflePasses(PassRegistry &r) {
  r.add(optionalPass("fuseChannelShuffle",
                     "ShuffleNet's Concat/Reshape/Transpose/Reshape (and chunks) as one ChannelShuffle", OutputsFixed,
                     [](Graph &g, PassContext &) { return fuseChannelShuffle(g); }));
}

} // namespace popart::ir
