// TrainingSession's weight I/O: reading and writing weights, running statistics and optimiser
// state, writing the trained model, and replacing the optimiser's hyperparameters.

#include "core/half.hpp"
#include "session/training_impl.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

namespace popart {

namespace {

bool isSixteenBit(DataType t) { return t == DataType::FLOAT16 || t == DataType::BFLOAT16; }

/// Whether the host buffer \p arr holds FLOAT values of the 16-bit tensor \p tensor, or 16-bit
/// values of a FLOAT one (the fp32 master copy of a model.half() weight): converted on the way
/// rather than refused.
bool converts(const IArray &arr, DataType tensor) {
  return (arr.dataType() == DataType::FLOAT && isSixteenBit(tensor)) ||
         (isSixteenBit(arr.dataType()) && tensor == DataType::FLOAT);
}

/// \p arr as Impl::checkedWeight should see it: a FLOAT buffer of the size of the 16-bit tensor
/// \p id of \p graph passes for one of the tensor's type; other buffers are refused as they are.
RawArray checkable(const ir::Graph &graph, const TensorId &id, const IArray &arr) {
  DataType type = arr.dataType();
  if (graph.hasTensor(id) && converts(arr, graph.tensor(id).info().dataType()) &&
      arr.nelms() == graph.tensor(id).info().elementCount())
    type = graph.tensor(id).info().dataType();
  return {const_cast<IArray &>(arr).data(), type, arr.shape()};
}

/// Copies \p n elements of \p type from \p from to \p to, where one side may be FLOAT and the
/// other 16-bit (\p toType, \p fromType): widened exactly, or rounded to nearest even.
void copyConverting(void *to, DataType toType, const void *from, DataType fromType, int64_t n) {
  if (toType == fromType) {
    std::memcpy(to, from, static_cast<size_t>(n) * dataTypeSize(toType));
    return;
  }
  if (toType == DataType::FLOAT) {
    const auto *src = static_cast<const uint16_t *>(from);
    auto *dst = static_cast<float *>(to);
    for (int64_t i = 0; i < n; ++i)
      dst[i] = fromType == DataType::FLOAT16 ? halfToFloat(src[i]) : bfloat16ToFloat(src[i]);
    return;
  }
  const auto *src = static_cast<const float *>(from);
  auto *dst = static_cast<uint16_t *>(to);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = toType == DataType::FLOAT16 ? floatToHalf(src[i]) : floatToBfloat16(src[i]);
}

} // namespace

void TrainingSession::readWeights(const WeightsIO &weights) const {
  const Impl &m = *impl_;
  if (!m.plan) throw error("readWeights: call prepareDevice() first");
  for (const auto &entry : weights.all()) {
    const TensorId &id = entry.first; // a plain reference: lambdas cannot capture bindings in clang 14
    IArray &arr = entry.second;
    // A float initializer that is not trained keeps the model's value.
    auto st = std::find_if(m.weightStatuses.begin(), m.weightStatuses.end(),
                           [&](const WeightStatus &w) { return w.id == id; });
    bool untrained = st != m.weightStatuses.end() && st->role != WeightStatus::Role::Trained &&
                     st->role != WeightStatus::Role::RunningStatistic;
    const TensorData &d =
        untrained ? *m.declared->tensor(id).data() : m.checkedWeight("readWeights", id, checkable(*m.graph, id, arr));
    if (untrained && ((arr.dataType() != d.info().dataType() && !converts(arr, d.info().dataType())) ||
                      arr.nelms() != d.info().elementCount()))
      throw error("readWeights: buffer for '", id, "' is ", toString(arr.dataType()), " ", toString(arr.shape()),
                  ", the tensor is ", d.info().toString());
    copyConverting(arr.data(), arr.dataType(), d.data(), d.info().dataType(), d.info().elementCount());
  }
}

void TrainingSession::writeWeights(const WeightsIO &weights) {
  Impl &m = *impl_;
  prepareDevice();
  for (const auto &[id, arr] : weights.all())
    m.checkedWeight("writeWeights", id, checkable(*m.graph, id, arr)); // all checked before any is written
  for (const auto &[id, arr] : weights.all()) {
    TensorData &d = m.variable(id);
    copyConverting(d.data(), d.info().dataType(), arr.data(), arr.dataType(), d.info().elementCount());
  }
}

namespace {

/// The 16-bit type the forward pass reads the FLOAT Variable \p t in (its master copy's one Cast,
/// convertPrecision), or UNDEFINED if it reads it as it is.
DataType forwardType(const ir::Tensor &t) {
  if (t.info().dataType() != DataType::FLOAT) return DataType::UNDEFINED;
  for (const ir::Op *op : t.consumers())
    if (op->type == "Cast" && op->hasOutput(0)) {
      DataType to = op->outInfo(0).dataType();
      if (to == DataType::FLOAT16 || to == DataType::BFLOAT16) return to;
    }
  return DataType::UNDEFINED;
}

} // namespace

void TrainingSession::modelToHost(const std::string &path, const std::string &precision) const {
  const Impl &m = *impl_;
  if (m.pipelineGroups)
    throw error("modelToHost: pipelined sessions hold each stage's weights in its own process; not supported yet");
  if (precision != "training" && precision != "fp32")
    throw error("modelToHost: precision is '", precision, "'; expected training or fp32");
  const bool training = precision == "training";
  std::map<TensorId, const TensorData *> values;
  std::vector<TensorData> rounded; // the 16-bit copies of master weights
  rounded.reserve(m.weightIds.size());
  if (m.plan) {
    for (const auto &id : m.weightIds) {
      values[id] = &m.variable(id);
      if (DataType low = training ? forwardType(m.graph->tensor(id)) : DataType::UNDEFINED;
          low != DataType::UNDEFINED) {
        const TensorData &master = m.variable(id);
        rounded.push_back(TensorData::fromDoubles(low, master.info().shape(), master.toDoubleVector()));
        values[id] = &rounded.back();
      }
    }
    for (const auto &id : m.runningStats)
      values[id] = &m.variable(id);
  }
  std::string bytes = onnx_import::withInitializers(m.model.bytes, values, training);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw error("modelToHost: cannot write '", tmp, "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw error("modelToHost: writing '", tmp, "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw error("modelToHost: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

void TrainingSession::updateOptimizerFromHost(const Optimizer *optimizer) {
  Impl &m = *impl_;
  if (!optimizer) throw error("updateOptimizerFromHost: null optimiser");
  optimizer::checkReplaceable(*m.optimizer, *optimizer, m.weightIds);
  for (const auto &[w, params] : optimizer->specifics())
    if (std::find(m.weightIds.begin(), m.weightIds.end(), w) == m.weightIds.end())
      throw error("updateOptimizerFromHost: insertSpecific names '", w, "', which is not a trained weight");
  m.optimizer = optimizer->clone();
  if (m.plan) m.resolveHyperParameters();
  if (!m.dynamicScaling()) m.lossScale = m.optimizer->lossScaling().val();
}

} // namespace popart
