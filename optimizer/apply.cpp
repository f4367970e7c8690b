#include "optimizer/apply.hpp"
#include "core/dispatch.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace popart::optimizer {

namespace {

/// Adds an op of \p phase with one output (or none when \p out is empty) and runs its setup.
TensorId addOp(ir::Graph &g, int phase, const std::string &domain, const std::string &type,
               const std::vector<TensorId> &inputs, std::vector<TensorId> outputs, ir::Attributes attrs = {},
               const std::string &name = "") {
  int version = domain == "ai.onnx" ? (g.opsets().count("ai.onnx") ? g.opsets().at("ai.onnx") : 17) : 1;
  ir::Op &op = g.addOp(type, domain, version, name, std::move(attrs), inputs, outputs);
  op.phase = phase;
  op.def->setup(op);
  return outputs.empty() ? "" : outputs[0];
}

TensorId onnxOp(ir::Graph &g, int phase, const std::string &type, const std::vector<TensorId> &inputs,
                const std::string &hint, ir::Attributes attrs = {}) {
  return addOp(g, phase, "ai.onnx", type, inputs, {g.uniqueId(hint)}, std::move(attrs));
}

TensorId variable(ir::Graph &g, const std::string &hint, const TensorInfo &info, float fill = 0.0f) {
  TensorId id = g.uniqueId(hint);
  ir::Tensor &t = g.addTensor(id, ir::TensorKind::Variable, info);
  auto data = std::make_shared<TensorData>(info);
  if (fill != 0.0f)
    dispatchFloat(info.dataType(), "optimiser state", [&](auto tag) {
      using T = typename decltype(tag)::type;
      std::fill_n(data->as<T>(), info.elementCount(), static_cast<T>(fill));
    });
  t.setData(std::move(data));
  return id;
}

bool trainableType(DataType t) { return t == DataType::FLOAT || t == DataType::FLOAT16 || t == DataType::BFLOAT16; }

/// The info of \p weight's first-order state and gradient accumulator: its shape, in
/// options.stateType if that is set, else in the weight's type.
TensorInfo stateInfo(const TensorInfo &weight, const ApplyOptions &options) {
  return {options.stateType == DataType::UNDEFINED ? weight.dataType() : options.stateType, weight.shape()};
}

/// The info of \p weight's second-order state: in options.secondMomentType if that is set, else
/// as stateInfo.
TensorInfo secondMomentInfo(const TensorInfo &weight, const ApplyOptions &options) {
  if (options.secondMomentType == DataType::UNDEFINED) return stateInfo(weight, options);
  return {options.secondMomentType, weight.shape()};
}

size_t hyperParameterCount(const Optimizer &o) {
  if (dynamic_cast<const Adam *>(&o)) return 8;
  return 6;
}

} // namespace

AppliedOptimizer applyOptimizer(ir::Graph &g, const Optimizer &opt,
                                const std::vector<std::pair<TensorId, TensorId>> &weightGrads,
                                const ApplyOptions &options) {
  if (options.accumulationFactor < 1) throw error("the accumulation factor must be at least 1");
  if (options.stateType != DataType::UNDEFINED && options.stateType != DataType::FLOAT)
    throw error("the optimiser state type must be UNDEFINED (the weight's type) or FLOAT, not ",
                toString(options.stateType));
  if (options.secondMomentType != DataType::UNDEFINED && options.secondMomentType != DataType::FLOAT)
    throw error("the optimiser's second-moment type must be UNDEFINED (as the state type) or FLOAT, not ",
                toString(options.secondMomentType));
  AppliedOptimizer result;
  const TensorInfo scalar(DataType::FLOAT, {});
  result.gradScale = variable(g, "popart_grad_scale", scalar, 1.0f);

  const ShardingOptions &sharding = options.sharding;
  if (sharding.enabled() && options.binEdgeLocation > 0.0f)
    throw error("replicated tensor sharding of the optimiser state does not support the histogram method of "
                "automatic loss scaling yet (its gradient statistics would count one shard); use the default "
                "dynamic loss scaling or no sharding");

  // Effective gradients: accumulated over the micro-batches when accumulating; for a sharded
  // weight, this replica's shard of the accumulated gradient, reduce-scattered once per step.
  std::vector<TensorId> grads, accumulated;
  std::vector<ShardLayout> layouts;
  std::vector<WeightUpdate> updates;
  for (const auto &[w, grad] : weightGrads) {
    const TensorInfo &info = g.tensor(w).info();
    if (!trainableType(info.dataType()))
      throw error("weight '", w, "' is ", toString(info.dataType()),
                  ": only FLOAT, FLOAT16 and BFLOAT16 weights can be trained");
    WeightUpdate u;
    u.weight = w;
    TensorId eff = grad;
    if (options.accumulationFactor > 1) {
      u.accumulator = variable(g, "accum_" + w, stateInfo(info, options));
      eff = addOp(g, MicroBatch, "ai.graphcore", "Accumulate", {u.accumulator, grad},
                  {g.uniqueId(u.accumulator + "_sum")});
    }
    accumulated.push_back(eff);
    layouts.push_back({});
    if (sharding.shards(info.elementCount())) {
      layouts.back() = shardLayout(info.elementCount(), sharding);
      eff = reduceScatterGradient(g, eff, layouts.back(), sharding);
    }
    grads.push_back(eff);
    updates.push_back(u);
  }

  // Clipping by global norm: one scale per group, computed from the unscaled gradients.
  std::map<TensorId, TensorId> scaleOf;
  for (size_t c = 0; c < opt.clipNormSettings().size(); ++c) {
    const ClipNormSettings &clip = opt.clipNormSettings()[c];
    std::vector<size_t> members;
    for (size_t i = 0; i < updates.size(); ++i)
      if (clip.weightIds.empty() ||
          std::find(clip.weightIds.begin(), clip.weightIds.end(), updates[i].weight) != clip.weightIds.end())
        members.push_back(i);
    for (const auto &id : clip.weightIds)
      if (std::none_of(updates.begin(), updates.end(), [&](const WeightUpdate &u) { return u.weight == id; }))
        throw error("gradient clipping names '", id, "', which is not a trained weight");
    if (members.empty()) continue;
    std::vector<TensorId> squares, shardSquares;
    for (size_t i : members) {
      ir::Attributes keep;
      keep.set("keepdims", int64_t{0});
      // 16-bit gradients are squared and summed in fp32: an fp16 sum of squares overflows at 65504.
      TensorId grad = grads[i];
      if (g.tensor(grad).info().dataType() != DataType::FLOAT) {
        ir::Attributes to;
        to.set("to", int64_t{static_cast<int64_t>(DataType::FLOAT)});
        grad = onnxOp(g, PreUpdate, "Cast", {grad}, "clip_grad_float", to);
      }
      (layouts[i].shard ? shardSquares : squares)
          .push_back(onnxOp(g, PreUpdate, "ReduceSumSquare", {grad}, "clip_sumsq", keep));
    }
    // A shard's squares are part of its weight's: their sum over the shards, added up over the
    // replicas, is the sum over the whole gradients.
    if (!shardSquares.empty())
      squares.push_back(allReduceSum(
          g, shardSquares.size() == 1 ? shardSquares[0] : onnxOp(g, PreUpdate, "Sum", shardSquares, "clip_shards"),
          PreUpdate));
    TensorId total = squares.size() == 1 ? squares[0] : onnxOp(g, PreUpdate, "Sum", squares, "clip_total");
    TensorId norm = onnxOp(g, PreUpdate, "Mul", {onnxOp(g, PreUpdate, "Sqrt", {total}, "clip_norm"), result.gradScale},
                           "clip_norm_unscaled");
    TensorId maxNorm = g.uniqueId("clip_max");
    g.addConst(maxNorm, TensorData::scalarFloat(clip.maxNorm));
    TensorId tiny = g.uniqueId("clip_eps");
    g.addConst(tiny, TensorData::scalarFloat(1e-6f));
    TensorId one = g.uniqueId("clip_one");
    g.addConst(one, TensorData::scalarFloat(1.0f));
    TensorId coef =
        onnxOp(g, PreUpdate, "Div", {maxNorm, onnxOp(g, PreUpdate, "Add", {norm, tiny}, "clip_denom")}, "clip_coef");
    TensorId factor = onnxOp(g, PreUpdate, "Min", {coef, one}, "clip_factor");
    TensorId scale = onnxOp(g, PreUpdate, "Mul", {factor, result.gradScale}, "clip_grad_scale");
    for (size_t i : members) {
      if (scaleOf.count(updates[i].weight))
        throw error("weight '", updates[i].weight, "' is in more than one gradient clipping group");
      scaleOf[updates[i].weight] = scale;
    }
  }

  if (options.checkFinite && !grads.empty())
    result.allFinite = addOp(g, PreUpdate, "ai.graphcore", "AllFinite", grads, {g.uniqueId("popart_all_finite")});
  if (!(options.binEdgeLocation >= 0.0f && options.binEdgeLocation <= 1.0f))
    throw error("the gradient statistics' bin edge location must be in (0, 1] (or 0 for none), got ",
                options.binEdgeLocation);
  if (options.binEdgeLocation > 0.0f && !grads.empty()) {
    float largest = options.binEdgeOfHalf ? 65504.0f : std::numeric_limits<float>::max();
    for (const TensorId &grad : grads) {
      DataType t = g.tensor(grad).info().dataType();
      if (t == DataType::FLOAT16) largest = std::min(largest, 65504.0f);
      if (t == DataType::BFLOAT16) largest = std::min(largest, 0x1.fep127f); // bf16's largest finite value
    }
    result.binEdge = options.binEdgeLocation * largest;
    // The counts go into a Variable: the host reads them after the PreUpdate phase, when the
    // arena may already hold other tensors, and an in-place update survives dead-code removal.
    result.gradientStatistics = g.uniqueId("popart_gradient_statistics");
    g.addTensor(result.gradientStatistics, ir::TensorKind::Variable, TensorInfo(DataType::INT64, {2}))
        .setData(std::make_shared<TensorData>(TensorInfo(DataType::INT64, {2})));
    std::vector<TensorId> inputs{result.gradientStatistics};
    inputs.insert(inputs.end(), grads.begin(), grads.end());
    ir::Attributes edge;
    edge.set("edge", result.binEdge);
    addOp(g, PreUpdate, "ai.graphcore", "GradientStatistics", inputs,
          {g.uniqueId(result.gradientStatistics + "_updated")}, std::move(edge));
  }

  const auto *sgd = dynamic_cast<const SGD *>(&opt);
  const auto *adam = dynamic_cast<const Adam *>(&opt);
  const auto *adaptive = dynamic_cast<const Adaptive *>(&opt);
  for (size_t i = 0; i < updates.size(); ++i) {
    WeightUpdate &u = updates[i];
    const bool sharded = layouts[i].shard > 0;
    const TensorInfo info =
        sharded ? TensorInfo(g.tensor(u.weight).info().dataType(), {layouts[i].shard}) : g.tensor(u.weight).info();
    TensorId target = u.weight;
    if (sharded) std::tie(u.shard, target) = weightShard(g, u.weight, layouts[i]);
    u.hyperParameters = variable(g, "hp_" + u.weight, TensorInfo(DataType::FLOAT, {int64_t(hyperParameterCount(opt))}));
    auto hp = hyperParameters(opt, u.weight, 1);
    std::copy(hp.begin(), hp.end(), g.tensor(u.hyperParameters).data()->as<float>());
    TensorId gs = scaleOf.count(u.weight) ? scaleOf.at(u.weight) : result.gradScale;
    std::vector<TensorId> in{target, grads[i], u.hyperParameters, gs};
    std::vector<TensorId> out{g.uniqueId((sharded ? u.shard : u.weight) + "_updated")};
    ir::Attributes attrs;
    std::string type;
    enum Order { First, Second };
    auto addState = [&](const std::string &prefix, Order order, float fill = 0.0f) {
      TensorId s = variable(g, prefix + "_" + u.weight,
                            order == Second ? secondMomentInfo(info, options) : stateInfo(info, options), fill);
      u.state.push_back(s);
      in.push_back(s);
      out.push_back(g.uniqueId(s + "_updated"));
    };
    auto skipState = [&] {
      in.push_back("");
      out.push_back("");
    };
    if (sgd) {
      type = "SGDUpdate";
      OptimizerValue mom = opt.get("momentum", u.weight);
      bool nesterov = opt.get("nesterov", u.weight).val() != 0.0f;
      if (!opt.get("nesterov", u.weight).isConst()) throw error("SGD: nesterov must be const");
      if (nesterov && (mom.val() <= 0.0f || opt.get("dampening", u.weight).val() != 0.0f))
        throw error("SGD: Nesterov momentum needs a positive momentum and zero dampening (weight '", u.weight, "')");
      if (!opt.get("velocityScaling", u.weight).isConst() || opt.get("velocityScaling", u.weight).val() <= 0.0f)
        throw error("SGD: velocityScaling must be const and positive");
      attrs.set("nesterov", int64_t{nesterov ? 1 : 0});
      if (!mom.isConst() || mom.val() != 0.0f) addState("velocity", First);
    } else if (adam) {
      type = "AdamUpdate";
      AdamMode mode = adam->mode();
      attrs.set("mode", std::string(mode == AdamMode::AdaMax                                 ? "adamax"
                                    : mode == AdamMode::Lamb || mode == AdamMode::LambNoBias ? "lamb"
                                                                                             : "adam"));
      attrs.set("decoupled", int64_t{adam->decayMode() == WeightDecayMode::Decay ? 1 : 0});
      addState("adam_m", First);
      addState(mode == AdamMode::AdaMax ? "adamax_u" : "adam_v", Second);
    } else if (adaptive) {
      type = "AdaptiveUpdate";
      AdaptiveMode mode = adaptive->mode();
      attrs.set("mode", adaptive->name());
      if (mode == AdaptiveMode::AdaGrad) {
        addState("adagrad_sum", Second, opt.get("initialAccumulator", u.weight).val());
      } else {
        addState("rmsprop_sq", Second);
        if (mode == AdaptiveMode::CenteredRMSProp)
          addState("rmsprop_avg", Second);
        else
          skipState();
        OptimizerValue mom = opt.get("momentum", u.weight);
        if (!mom.isConst() || mom.val() != 0.0f) addState("rmsprop_buf", First);
      }
    } else {
      throw error("unsupported optimiser '", opt.name(), "'");
    }
    while (!out.empty() && out.back().empty()) {
      out.pop_back();
      in.pop_back();
    }
    if (sharded && type == "AdamUpdate" && attrs.getString("mode", "") == "lamb") {
      // LAMB's trust ratio needs the norms of the whole weight and update, not the shard's.
      attrs.set("normsOverReplicas", int64_t{1});
    }
    addOp(g, Update, "ai.graphcore", type, in, out, std::move(attrs), "update_" + u.weight);
    if (sharded) gatherWeight(g, u.weight, out[0], layouts[i], sharding);
    if (!u.accumulator.empty())
      addOp(g, PostUpdate, "ai.graphcore", "ResetVar", {accumulated[i]}, {g.uniqueId(u.accumulator + "_reset")});
  }
  result.updates = std::move(updates);
  return result;
}

std::vector<float> resolveHyperParameters(const Optimizer &opt, const TensorId &w) {
  std::vector<float> values;
  for (const auto &name : opt.hyperParameterNames())
    values.push_back(opt.get(name, w).val());
  return values;
}

void writeHyperParameters(const Optimizer &opt, const std::vector<float> &r, int64_t step, float *out) {
  // r follows hyperParameterNames(): SGD lr, momentum, dampening, wd, velocityScaling, nesterov;
  // Adam lr, beta1, beta2, eps, wd, maxWeightNorm; Adaptive lr, alpha, momentum, eps, wd,
  // lrDecay, initialAccumulator. The layouts written are in docs/training.md.
  if (dynamic_cast<const SGD *>(&opt)) {
    const float hp[] = {r[0], r[1], r[2], r[3], r[4], step == 1 ? 1.0f : 0.0f};
    std::copy(std::begin(hp), std::end(hp), out);
    return;
  }
  if (const auto *adam = dynamic_cast<const Adam *>(&opt)) {
    bool bias = adam->mode() == AdamMode::Adam || adam->mode() == AdamMode::AdaMax || adam->mode() == AdamMode::Lamb;
    double t = static_cast<double>(step);
    float bc1 = bias ? static_cast<float>(1.0 - std::pow(double(r[1]), t)) : 1.0f;
    float bc2 = bias && adam->mode() != AdamMode::AdaMax ? static_cast<float>(1.0 - std::pow(double(r[2]), t)) : 1.0f;
    const float hp[] = {r[0], r[1], r[2], r[3], r[4], bc1, bc2, r[5]};
    std::copy(std::begin(hp), std::end(hp), out);
    return;
  }
  if (const auto *ad = dynamic_cast<const Adaptive *>(&opt)) {
    float lr = r[0];
    if (ad->mode() == AdaptiveMode::AdaGrad)
      lr = static_cast<float>(double(lr) / (1.0 + double(step - 1) * double(r[5])));
    const float hp[] = {lr, r[1], r[2], r[3], r[4], 0.0f};
    std::copy(std::begin(hp), std::end(hp), out);
    return;
  }
  throw error("unsupported optimiser '", opt.name(), "'");
}

std::vector<float> hyperParameters(const Optimizer &opt, const TensorId &w, int64_t step) {
  std::vector<float> hp(hyperParameterCount(opt));
  writeHyperParameters(opt, resolveHyperParameters(opt, w), step, hp.data());
  return hp;
}

void checkReplaceable(const Optimizer &current, const Optimizer &next, const std::vector<TensorId> &weights) {
  if (current.name() != next.name())
    throw error("updateOptimizerFromHost: the session was compiled for ", current.name(), ", not ", next.name());
  if (current.clipNormSettings().size() != next.clipNormSettings().size())
    throw error("updateOptimizerFromHost: gradient clipping cannot be added or removed after compilation");
  if (current.lossScaling().isConst() && !(current.lossScaling() == next.lossScaling()))
    throw error("updateOptimizerFromHost: lossScaling is const (", current.lossScaling().val(), ")");
  std::vector<TensorId> ids = weights;
  ids.insert(ids.begin(), "");
  for (const auto &name : current.hyperParameterNames())
    for (const auto &w : ids) {
      OptimizerValue a = current.get(name, w), b = next.get(name, w);
      if (a.isConst() != b.isConst() || (a.isConst() && a.val() != b.val()))
        throw error("updateOptimizerFromHost: hyperparameter '", name, "'", w.empty() ? "" : " of '" + w + "'",
                    " is const in the compiled session (", a.val(), ") and cannot change to ", b.val(),
                    b.isConst() ? " (const)" : " (non-const)");
    }
}

} // namespace popart::optimizer
