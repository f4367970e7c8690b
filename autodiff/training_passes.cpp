// The autodiff library's passes (see training_passes.hpp). Each reads and fills the pipeline's
// ir::TrainingTensors; the session only reads them afterwards.

#include "autodiff/training_passes.hpp"
#include "autodiff/autodiff.hpp"
#include "ir/internal_attributes.hpp"
#include <popart/error.hpp>

#include <mutex>

namespace popart::autodiff {

namespace {

/// Random ops draw from {seed, counter}, a Variable the session advances every micro-batch.
int seedDropout(ir::Graph &g, ir::PassContext &c) {
  ir::TrainingTensors &tt = c.state<ir::TrainingTensors>();
  tt.rngState = g.uniqueId("popart_rng_state");
  TensorInfo info(DataType::INT64, {2});
  g.addTensor(tt.rngState, ir::TensorKind::Variable, info).setData(std::make_shared<TensorData>(info));
  int seeded = 0;
  for (const auto &op : g.ops())
    if (op->def->randomInput >= 0) {
      g.setOpInput(*op, static_cast<size_t>(op->def->randomInput), &g.tensor(tt.rngState)); // pads with "absent"
      op->def->setup(*op);
      ++seeded;
    }
  return seeded;
}

/// Ops that keep training state (BatchNormalization's running statistics) write it back through
/// in-place copies.
int updateBatchNormStatistics(ir::Graph &g, ir::PassContext &c) {
  ir::TrainingTensors &tt = c.state<ir::TrainingTensors>();
  const TrainingPassOptions &options = c.state<TrainingPassOptions>();
  std::vector<ir::Op *> stateful;
  for (const auto &op : g.ops())
    if (op->def->trainingState && !op->def->trainingState(*op).empty()) stateful.push_back(op.get());
  for (ir::Op *op : stateful) {
    op->attrs.set(ir::internal_attr::kUnbiasedRunningVar, int64_t{options.unbiasedRunningVariance ? 1 : 0});
    for (const ir::OpDef::InPlace &kept : op->def->trainingState(*op)) {
      ir::Tensor &stat = op->input(static_cast<size_t>(kept.input));
      if (stat.kind() != ir::TensorKind::Variable) continue;
      auto k = static_cast<size_t>(kept.output);
      if (!op->hasOutput(k)) {
        while (op->outputs.size() <= k)
          op->outputs.push_back(nullptr);
        ir::Tensor &t = g.addTensor(g.uniqueId(stat.id() + "_batch"), ir::TensorKind::ActGrad, stat.info());
        t.setProducer(op);
        op->outputs[k] = &t;
      }
      TensorId updated = op->output(k).id();
      if (options.averageRunningStatistics) {
        // The running statistics are linear in the batch statistics, so averaging after every
        // micro-batch gives the mean of the replicas' statistics, as averaging once per step would.
        ir::Attributes mean;
        mean.set("op", std::string("Mean"));
        TensorId averaged = g.uniqueId(updated + "_allreduced");
        ir::Op &reduce =
            g.addOp("AllReduce", "ai.graphcore", 1, "allreduce_" + stat.id(), std::move(mean), {updated}, {averaged});
        reduce.def->setup(reduce);
        updated = averaged;
      }
      ir::Op &copy = g.addOp("CopyVar", "ai.graphcore", 1, "update_" + stat.id(), {}, {stat.id(), updated},
                             {g.uniqueId(stat.id() + "_updated")});
      copy.def->setup(copy);
      tt.runningStats.push_back(stat.id());
    }
    op->def->setup(*op);
  }
  return static_cast<int>(stateful.size());
}

/// The loss as a FLOAT scalar times the loss-scale Variable, so that the whole backward pass sees
/// scaled gradients.
int scaleLoss(ir::Graph &g, ir::PassContext &c) {
  ir::TrainingTensors &tt = c.state<ir::TrainingTensors>();
  const TensorId &loss = c.loss;
  const TensorInfo lossInfo = g.tensor(loss).info();
  tt.lossScale = g.uniqueId("popart_loss_scale");
  g.addTensor(tt.lossScale, ir::TensorKind::Variable, TensorInfo(DataType::FLOAT, {}))
      .setData(std::make_shared<TensorData>(TensorData::scalarFloat(1.0f)));
  TensorId lossF = loss;
  if (lossInfo.dataType() != DataType::FLOAT) {
    ir::Attributes to;
    to.set("to", int64_t{static_cast<int64_t>(DataType::FLOAT)});
    lossF = g.uniqueId(loss + "_float");
    ir::Op &cast = g.addOp("Cast", "ai.onnx", 13, "", to, {loss}, {lossF});
    cast.def->setup(cast);
  }
  TensorId reshaped = g.uniqueId(loss + "_scalar");
  TensorId emptyShape = g.uniqueId("popart_scalar_shape");
  g.addConst(emptyShape, TensorData::fromInt64({0}, {}));
  ir::Op &rs = g.addOp("Reshape", "ai.onnx", 13, "", {}, {lossF, emptyShape}, {reshaped});
  rs.def->setup(rs);
  tt.scaledLoss = g.uniqueId(loss + "_scaled");
  ir::Op &mul = g.addOp("Mul", "ai.onnx", 13, "", {}, {reshaped, tt.lossScale}, {tt.scaledLoss});
  mul.def->setup(mul);
  return 3;
}

/// The backward graph of the scaled loss for the weights found before it. A weight upstream of
/// the loss through ops without a gradient (ArgMax, comparisons...) gets none: PyTorch leaves such
/// a parameter alone, and so does the optimiser here.
int differentiate(ir::Graph &g, ir::PassContext &c) {
  ir::TrainingTensors &tt = c.state<ir::TrainingTensors>();
  std::vector<TensorId> grads = buildGradients(g, tt.scaledLoss, tt.weights, false);
  std::vector<TensorId> trained;
  for (size_t i = 0; i < tt.weights.size(); ++i) {
    if (grads[i].empty()) {
      tt.unreached.push_back(tt.weights[i]);
      tt.untrained.push_back("'" + tt.weights[i] + "' (no gradient reaches it from loss '" + c.loss +
                             "': only ops without one lie between)");
      continue;
    }
    tt.weightGrads.emplace_back(tt.weights[i], grads[i]);
    trained.push_back(tt.weights[i]);
  }
  tt.weights = std::move(trained);
  if (tt.weights.empty()) {
    std::string rest;
    for (const auto &u : tt.untrained)
      rest += (rest.empty() ? "; not trained: " : ", ") + u;
    throw error("loss '", c.loss, "' depends on no trainable weight: trained 0 of ", tt.floatInitializers, " weights",
                rest);
  }
  return static_cast<int>(tt.weightGrads.size());
}

} // namespace

void registerTrainingPasses() {
  static std::once_flag once;
  std::call_once(once, [] {
    ir::PassRegistry &r = ir::PassRegistry::instance();
    r.add({
        .name = "seedDropout",
        .purpose = "gives each random op (OpDef::randomInput) the {seed, counter} Variable the session advances",
        .needs = ir::ShapesInferred,
        .before = ir::GradientsBuilt,
        .run = seedDropout,
    });

    r.add({
        .name = "updateBatchNormStatistics",
        .purpose = "ops with training state (OpDef::trainingState) write their running statistics back in place",
        .needs = ir::ShapesInferred,
        .before = ir::GradientsBuilt,
        .run = updateBatchNormStatistics,
    });

    r.add({
        .name = "scaleLoss",
        .purpose = "the loss as a FLOAT scalar times the loss-scale Variable: what the gradients are of",
        .needs = ir::ShapesInferred,
        .before = ir::GradientsBuilt,
        .establishes = ir::TrainingPrepared,
        .run = scaleLoss,
    });

    r.add({
        .name = "buildGradients",
        .purpose = "the backward graph of the scaled loss for the weights to train",
        .needs = ir::ShapesInferred | ir::TrainingPrepared,
        .before = ir::GradientsBuilt,
        .establishes = ir::GradientsBuilt,
        .run = differentiate,
    });

    r.add({
        .name = "expandGradientOps",
        .purpose = "replaces each ai.onnx.preview.training Gradient op by the ops computing its outputs",
        .needs = ir::ShapesInferred,
        .run =
            [](ir::Graph &g, ir::PassContext &c) {
              int gradientOps = 0;
              for (const auto &op : g.ops())
                gradientOps += op->def->expandedBeforeLowering ? 1 : 0;
              if (gradientOps == 0) return 0;
              expandGradientOps(g);
              ir::inferShapes(g, c.folder);
              return gradientOps;
            },
    });
  });
}

} // namespace popart::autodiff
