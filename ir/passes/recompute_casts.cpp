// recomputeCasts: a Cast is memory-bound and cheap next to holding its result across a training
// step, and the tensor it reads is live all step anyway; so a weight's 16-bit copy read in the
// forward and again in the backward is made twice rather than kept, where keeping it would add to
// the step's peak of live tensors.

#include "ir/passes/recompute_casts.hpp"
#include "ir/internal_attributes.hpp"
#include "ir/passes/pass_manager.hpp"
#include "ir/passes/precision.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace popart::ir {

namespace {

bool modifiedInPlace(const Tensor &t) {
  for (const Op *reader : t.consumers())
    if (reader->def)
      for (const OpDef::InPlace &m : reader->def->modifies)
        if (reader->hasInput(static_cast<size_t>(m.input)) && &reader->input(static_cast<size_t>(m.input)) == &t)
          return true;
  return false;
}

bool recomputable(const Op &op) {
  if (op.type != "Cast" || op.domain != "ai.onnx" || !op.hasInput(0) || !op.hasOutput(0)) return false;
  if (op.input(0).producer()) return false;
  const Tensor &out = op.output(0);
  if (modifiedInPlace(out)) return false;
  // Subgraph ops name their captured tensors in an attribute, which a new input would not match.
  return std::none_of(out.consumers().begin(), out.consumers().end(),
                      [](const Op *reader) { return reader->attrs.has(internal_attr::kCaptures); });
}

/// A recomputable Cast and its readers in schedule order.
struct CastReaders {
  Op *cast = nullptr;
  size_t castAt = 0;
  std::vector<Op *> readers;
  std::vector<size_t> at;        ///< schedule positions of readers
  std::vector<bool> splitBefore; ///< reader i starts a cluster with a Cast of its own
  std::vector<bool> candidate;   ///< reader i is far enough from reader i - 1 to start one
};

/// Bytes of the tensors the ops produce, live from their producer to their last reader, at each
/// step of \p order, with each Cast of \p casts split as it says. Outputs that alias an input
/// updated in place are the input's memory, not new tensors.
std::vector<int64_t> liveBytes(const std::vector<Op *> &order, const std::map<const Op *, size_t> &position,
                               const std::map<const Op *, const CastReaders *> &casts) {
  std::vector<int64_t> delta(order.size() + 1, 0);
  auto hold = [&](size_t from, size_t to, int64_t bytes) {
    delta[from] += bytes;
    delta[to + 1] -= bytes;
  };
  for (size_t i = 0; i < order.size(); ++i) {
    const Op *op = order[i];
    std::set<size_t> aliases;
    if (op->def)
      for (const OpDef::InPlace &m : op->def->modifies)
        aliases.insert(static_cast<size_t>(m.output));
    for (size_t k = 0; k < op->outputCount(); ++k) {
      const Tensor *t = op->outputs[k];
      if (!t || aliases.count(k) || !t->info().isKnown()) continue;
      const int64_t bytes = t->info().byteCount();
      auto split = casts.find(op);
      if (split != casts.end() && k == 0) {
        const CastReaders &c = *split->second;
        size_t from = c.castAt;
        for (size_t r = 0; r < c.readers.size(); ++r) {
          if (c.splitBefore[r]) {
            hold(from, c.at[r - 1], bytes);
            from = c.at[r] - 1; // the new Cast runs just before its first reader
          }
        }
        hold(from, c.readers.empty() ? from : std::max(from, c.at.back()), bytes);
        continue;
      }
      size_t last = i;
      for (const Op *reader : t->consumers())
        last = std::max(last, position.at(reader));
      hold(i, last, bytes);
    }
  }
  std::vector<int64_t> live(order.size());
  int64_t sum = 0;
  for (size_t i = 0; i < order.size(); ++i)
    live[i] = sum += delta[i];
  return live;
}

} // namespace

int recomputeCasts(Graph &graph, const RecomputeCastOptions &options) {
  const std::vector<Op *> order = graph.schedule();
  std::map<const Op *, size_t> position;
  for (size_t i = 0; i < order.size(); ++i)
    position[order[i]] = i;
  const size_t far = static_cast<size_t>(std::max(0, options.maxOpsBetweenReaders));
  std::vector<CastReaders> casts;
  for (Op *cast : order) {
    if (!recomputable(*cast)) continue;
    CastReaders c;
    c.cast = cast;
    c.castAt = position[cast];
    for (Op *reader : cast->output(0).consumers())
      if (std::find(c.readers.begin(), c.readers.end(), reader) == c.readers.end()) c.readers.push_back(reader);
    std::sort(c.readers.begin(), c.readers.end(), [&](const Op *a, const Op *b) { return position[a] < position[b]; });
    for (const Op *reader : c.readers)
      c.at.push_back(position[reader]);
    c.splitBefore.assign(c.readers.size(), false);
    c.candidate.assign(c.readers.size(), false);
    for (size_t i = 1; i < c.readers.size(); ++i)
      c.candidate[i] = c.at[i] - c.at[i - 1] - 1 > far;
    if (std::find(c.candidate.begin(), c.candidate.end(), true) != c.candidate.end()) casts.push_back(std::move(c));
  }
  std::map<const Op *, const CastReaders *> byCast;
  for (const CastReaders &c : casts)
    byCast[c.cast] = &c;
  if (!options.onlyAcrossThePeak)
    for (CastReaders &c : casts)
      c.splitBefore = c.candidate;
  // A copy held where the live bytes peak adds to the arena; held elsewhere, it fits in the
  // memory the peak reserves anyway, and a second Cast would only cost time. So split the
  // copies held across the peak, find the new peak, and repeat until none is held across it.
  bool split = options.onlyAcrossThePeak;
  while (split) {
    const std::vector<int64_t> live = liveBytes(order, position, byCast);
    const size_t peak = static_cast<size_t>(std::max_element(live.begin(), live.end()) - live.begin());
    split = false;
    for (CastReaders &c : casts)
      for (size_t i = 1; i < c.readers.size(); ++i)
        if (c.candidate[i] && !c.splitBefore[i] && c.at[i - 1] < peak && peak + 1 < c.at[i]) {
          c.splitBefore[i] = true;
          split = true;
        }
  }
  int added = 0;
  for (CastReaders &c : casts) {
    Tensor &out = c.cast->output(0);
    Tensor *copy = &out;
    for (size_t i = 1; i < c.readers.size(); ++i) {
      Op *reader = c.readers[i];
      if (c.splitBefore[i]) {
        TensorId id = graph.uniqueId(out.id() + "_recomputed");
        std::string name = c.cast->name.empty() ? "" : c.cast->name + "_recomputed";
        Op &recast =
            graph.addOp("Cast", c.cast->domain, c.cast->version, name, c.cast->attrs, {c.cast->input(0).id()}, {id});
        recast.phase = reader->phase;
        recast.def->setup(recast);
        copy = &recast.output(0);
        ++added;
      }
      if (copy == &out) continue;
      for (size_t k = 0; k < reader->inputCount(); ++k)
        if (reader->inputs[k] == &out) graph.setOpInput(*reader, k, copy);
    }
  }
  return added;
}

void registerRecomputeCastPasses(PassRegistry &r) {
  r.add(optionalPass(
      "recomputeCasts",
      "fp16/bf16 training: a weight's or graph input's 16-bit copy held across the peak of live tensors is "
      "cast again from the fp32 tensor for its later readers (the backward pass)",
      OptimizerApplied, [](Graph &g, PassContext &c) {
        if (c.state<PrecisionPolicy>().low == DataType::UNDEFINED) return 0;
        return recomputeCasts(g, c.state<RecomputeCastOptions>());
      }));
}

} // namespace popart::ir
