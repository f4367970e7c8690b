#include "ir/annotations.hpp"
#include <popart/error.hpp>

namespace popart::ir {

namespace {

std::optional<int64_t> annotation(const Op &op, const char *name) {
  if (!op.attrs.has(name)) return std::nullopt;
  try {
    return op.attrs.getInt(name);
  } catch (const error &) {
    throw error(op.debugName(), ": annotation '", name, "' must be an INT attribute");
  }
}

} // namespace

bool isAnnotation(const std::string &attribute) {
  return attribute == kVirtualGraphAttribute || attribute == kPipelineStageAttribute ||
         attribute == kRecomputeAttribute;
}

std::optional<int64_t> virtualGraphOf(const Op &op) { return annotation(op, kVirtualGraphAttribute); }
std::optional<int64_t> pipelineStageOf(const Op &op) { return annotation(op, kPipelineStageAttribute); }
int64_t recomputeOf(const Op &op) { return annotation(op, kRecomputeAttribute).value_or(0); }

void checkAnnotations(const Graph &g) {
  for (const auto &op : g.ops()) {
    for (const char *name : {kVirtualGraphAttribute, kPipelineStageAttribute})
      if (auto v = annotation(*op, name); v && *v < 0)
        throw error(op->debugName(), ": ", name, " is ", *v, "; virtual graphs and pipeline stages count from 0");
    if (const int64_t r = recomputeOf(*op); r < 0 || r > 3)
      throw error(op->debugName(), ": ", kRecomputeAttribute, " is ", r,
                  "; expected a RecomputeType (0 Undefined, 1 Checkpoint, 2 Recompute, 3 Recomputed)");
    const std::optional<int64_t> stage = pipelineStageOf(*op);
    if (!stage) continue;
    for (const Tensor *t : op->inputs) {
      const Op *producer = t ? t->producer() : nullptr;
      const std::optional<int64_t> from = producer ? pipelineStageOf(*producer) : std::nullopt;
      if (from && *from > *stage)
        throw error(op->debugName(), " of pipeline stage ", *stage, " reads tensor '", t->id(), "', which ",
                    producer->debugName(), " of the later stage ", *from,
                    " produces: a stage may only read the outputs of its own and earlier stages");
    }
  }
}

} // namespace popart::ir
