#include "autodiff/autodiff.hpp"
#include "backend_cpu/plan.hpp"
#include "comm/communicator.hpp"
#include "core/dispatch.hpp"
#include "core/log.hpp"
#include "ir/passes/passes.hpp"
#include "ir/passes/pipeline_stages.hpp"
#include "onnx_import/onnx_import.hpp"
#include "session/pipeline_run.hpp"
#include "session/pipelines.hpp"
#include "session/profile.hpp"
#include "session/session_common.hpp"
#include "session/threads.hpp"
#include <popart/error.hpp>
#include <popart/session.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace popart {

struct InferenceSession::Impl {
  std::string modelBytes;
  std::string baseDir;
  std::string sourceName;
  DataFlow dataFlow;
  SessionOptions options;
  InputShapeInfo inputShapes;

  std::unique_ptr<ir::Graph> declared; ///< the model as imported, never specialised
  std::vector<TensorId> inputIds, outputIds;
  std::set<TensorId> valueInputs; ///< stream inputs whose values decide shapes

  std::unique_ptr<ir::Graph> graph;         ///< specialised for the current input shapes
  backend_cpu::KernelContext kernelContext; ///< what the plan's kernels are created with
  std::unique_ptr<backend_cpu::ExecutionPlan> plan;
  /// With enablePipelining: the job's process groups, and this stage's side of a run.
  std::optional<session::PipelineGroups> pipelineGroups;
  std::unique_ptr<session::PipelineRun> pipeline;
  std::map<TensorId, TensorInfo> compiledInfos;
  std::map<TensorId, TensorData> compiledValues;
  bool profiling = false;
  int64_t batchesRun = 0;                  ///< batches run so far: the step numbers of the numeric checks
  std::vector<ir::PassRecord> passRecords; ///< what each pass of the last compile did, and its time
  session::Streams streams;                ///< inputs and anchors the device keeps in 16 bits

  /// The parts of the memory report and of the memory limit's check.
  static session::MemoryParts memoryParts(const backend_cpu::PlannedMemory &planned) {
    return {{session::arenaPartName(planned), planned.arenaBytes},
            {"kernels", planned.kernelBytes},
            {"weights and constants", planned.constBytes + planned.variableBytes}};
  }

  std::unique_ptr<ir::Graph> import() const {
    onnx_import::ImportOptions io;
    io.check = options.checkModel;
    io.initializersFrom = declared.get(); // compiles share the declared model's weights
    return onnx_import::importModelBytes(modelBytes, baseDir, io, sourceName);
  }

  TensorInfo resolvedInfo(const TensorId &id) const {
    return session::resolvedInputInfo(*declared, id, inputShapes, options);
  }

  void compile(const std::map<TensorId, TensorInfo> &infos, const std::map<TensorId, const IArray *> &values) {
    auto g = import();
    for (const auto &id : inputIds) {
      ir::Tensor &t = g->tensor(id);
      t.setInfo(infos.at(id));
      if (valueInputs.count(id)) {
        const IArray *arr = values.at(id);
        TensorData data(infos.at(id), const_cast<IArray *>(arr)->data());
        if (infos.at(id).dataType() == DataType::STRING) {
          const auto *s = static_cast<const std::string *>(const_cast<IArray *>(arr)->data());
          std::copy(s, s + infos.at(id).elementCount(), data.strings().begin());
        }
        t.setKind(ir::TensorKind::Const);
        t.setData(std::make_shared<TensorData>(std::move(data)));
      }
    }
    session::registerAllPasses();
    backend_cpu::ReferenceEvaluator evaluator;
    ir::PassContext context;
    context.folder = options.constantFolding ? &evaluator : nullptr;
    context.keep = outputIds;
    for (const auto &a : dataFlow.anchors())
      if (std::find(context.keep.begin(), context.keep.end(), a) == context.keep.end()) {
        if (!g->hasTensor(a)) throw error("anchor '", a, "' is not a tensor of the model");
        context.keep.push_back(a);
      }
    context.state<ir::PrecisionPolicy>() = session::precisionPolicy(options, false);
    pipeline.reset();
    if (pipelineGroups) context.state<ir::PipelineSettings>() = session::pipelineSettings(*pipelineGroups, options);
    passRecords =
        ir::runPipeline("inference", session::inferencePipeline(), *g, context, session::pipelineOptions(options));
    streams.host = context.state<ir::StreamTypes>().host;
    backend_cpu::CompileOptions compile = session::compileOptions(options);
    compile.checkMemory = [&](const backend_cpu::PlannedMemory &planned) {
      session::checkMemoryLimit(memoryParts(planned), planned, options, sourceName);
    };
    plan = std::make_unique<backend_cpu::ExecutionPlan>(*g, compile, kernelContext);
    if (pipelineGroups) // no backward: nothing to hold between runs
      pipeline =
          std::make_unique<session::PipelineRun>(*pipelineGroups, context.state<ir::PipelineStages>(), *g, *plan, 0);
    if (profiling) plan->enableProfiling();
    if (options.enableFloatingPointChecks) plan->enableNumericChecks();
    graph = std::move(g);
    compiledInfos = infos;
    compiledValues.clear();
    for (const auto &id : valueInputs)
      compiledValues.emplace(id, *graph->tensor(id).data());
  }

  bool matchesCompiled(const std::map<TensorId, TensorInfo> &infos,
                       const std::map<TensorId, const IArray *> &values) const {
    if (!plan || infos != compiledInfos) return false;
    for (const auto &[id, data] : compiledValues) {
      if (data.info().dataType() == DataType::STRING) {
        const auto *s = static_cast<const std::string *>(const_cast<IArray *>(values.at(id))->data());
        if (!std::equal(data.strings().begin(), data.strings().end(), s)) return false;
        continue;
      }
      if (std::memcmp(data.data(), const_cast<IArray *>(values.at(id))->data(),
                      static_cast<size_t>(data.byteCount())) != 0)
        return false;
    }
    return true;
  }
};

InferenceSession::InferenceSession() : impl_(std::make_unique<Impl>()) {}
InferenceSession::~InferenceSession() = default;

std::unique_ptr<InferenceSession> InferenceSession::createFromOnnxModel(const std::string &model,
                                                                        const DataFlow &dataFlow,
                                                                        const SessionOptions &options) {
  return createFromOnnxModel(model, dataFlow, InputShapeInfo(), options);
}

std::unique_ptr<InferenceSession> InferenceSession::createFromOnnxModel(const std::string &model,
                                                                        const DataFlow &dataFlow,
                                                                        const InputShapeInfo &inputShapes,
                                                                        const SessionOptions &options) {
  std::unique_ptr<InferenceSession> s(new InferenceSession());
  Impl &m = *s->impl_;
  m.dataFlow = dataFlow;
  m.options = options;
  m.inputShapes = inputShapes;
  setThreadCount(options.numThreads);
  m.kernelContext = session::kernelContext(options);
  // Replicas of an inference session each run their own inputs; the communicator serves the
  // collective ops a model may hold, and getReplicationIndex.
  if (options.enablePipelining) {
    // Pipelined inference: the batches of a step flow through the stages, one process each.
    m.pipelineGroups = session::pipelineGroups(options);
    m.kernelContext.communicator = m.pipelineGroups->replicas;
  } else {
    m.kernelContext.communicator = session::replicationCommunicator(options);
  }
  session::precisionPolicy(options, false); // a bad mode is an error now, not at prepareDevice
  session::ModelSource src = session::loadModel(model);
  m.modelBytes = std::move(src.bytes);
  m.baseDir = std::move(src.baseDir);
  m.sourceName = std::move(src.sourceName);
  session::checkPassOptions("inference", session::inferencePipeline(), options);
  m.declared = m.import();
  m.inputIds = m.declared->inputs();
  m.outputIds = m.declared->outputs();
  for (const auto &[id, info] : inputShapes.getAll())
    if (std::find(m.inputIds.begin(), m.inputIds.end(), id) == m.inputIds.end())
      throw error("InputShapeInfo names '", id, "', which is not an input of the model");
  // A value input computed from fed inputs (Cast, Add, ...) needs those fed inputs' values.
  for (const auto &[t, use] : ir::shapeDecidingTensors(*m.declared))
    // A sequence input's element infos are part of what a plan is compiled for already.
    if (t->kind() == ir::TensorKind::Stream && t->info().isTensor()) m.valueInputs.insert(t->id());
  for (const auto &a : dataFlow.anchors())
    if (!m.declared->hasTensor(a)) throw error("anchor '", a, "' is not a tensor of model '", m.sourceName, "'");
  return s;
}

void InferenceSession::prepareDevice() {
  Impl &m = *impl_;
  if (!m.valueInputs.empty()) return; // needs the fed values: compiled by the first run
  std::map<TensorId, TensorInfo> infos;
  for (const auto &id : m.inputIds) {
    TensorInfo info = m.resolvedInfo(id);
    if (!info.isKnown() || !info.isTensor()) return; // symbolic dimensions, sequences: compiled by the first run
    infos[id] = info;
  }
  m.compile(infos, {});
}

void InferenceSession::run(StepIO &stepio) {
  Impl &m = *impl_;
  int bps = m.dataFlow.batchesPerStep();
  std::map<TensorId, TensorInfo> infos;
  std::map<TensorId, const IArray *> arrays;
  for (const auto &[id, arr] : stepio.inputs())
    if (std::find(m.inputIds.begin(), m.inputIds.end(), id) == m.inputIds.end())
      throw error("StepIO input '", id, "' is not an input of the model (inputs: ", session::joinIds(m.inputIds), ")");
  for (const auto &[id, value] : stepio.sequenceInputs())
    if (std::find(m.inputIds.begin(), m.inputIds.end(), id) == m.inputIds.end() ||
        m.declared->tensor(id).info().isTensor())
      throw error("StepIO sequence input '", id, "' is not a sequence or optional input of the model");
  for (const auto &id : m.inputIds) {
    if (!m.declared->tensor(id).info().isTensor()) {
      auto seq = stepio.sequenceInputs().find(id);
      if (seq == stepio.sequenceInputs().end())
        throw error("sequence input '", id, "' is missing from the StepIO (StepIO::setSequenceInput)");
      if (bps > 1) throw error("sequence input '", id, "' needs batchesPerStep 1");
      const TensorInfo &declared = m.declared->tensor(id).info();
      std::vector<TensorInfo> elements;
      for (IArray *e : seq->second.elements) {
        if (e->dataType() != declared.dataType())
          throw error("sequence input '", id, "' has an element of type ", toString(e->dataType()),
                      " but the model expects ", toString(declared.dataType()));
        elements.emplace_back(e->dataType(), e->shape());
      }
      if (declared.valueKind() == ValueKind::OptionalTensor && elements.size() != (seq->second.present ? 1u : 0u))
        throw error("optional input '", id, "' needs one element when present and none otherwise");
      TensorInfo fed = sequenceInfoOf(elements, declared.dataType());
      TensorInfo info(declared.valueKind(), declared.dataType(), fed.shape());
      if (declared.valueKind() != ValueKind::OptionalTensor) info.setElements(elements);
      infos[id] = info;
      continue;
    }
    auto it = stepio.inputs().find(id);
    if (it == stepio.inputs().end()) throw error("input '", id, "' is missing from the StepIO");
    IArray &arr = it->second;
    TensorInfo declared = m.resolvedInfo(id);
    Shape fed = arr.shape();
    if (bps > 1) {
      if (fed.empty() || fed[0] != bps)
        throw error("input '", id, "': with batchesPerStep ", bps, " the array needs a leading dimension of ", bps,
                    ", got shape ", toString(fed));
      fed.erase(fed.begin());
    }
    if (arr.dataType() != declared.dataType())
      throw error("input '", id, "' has type ", toString(arr.dataType()), " but the model expects ",
                  toString(declared.dataType()));
    bool ok = fed.size() == declared.shape().size();
    for (size_t i = 0; ok && i < fed.size(); ++i)
      ok = declared.shape()[i] < 0 || declared.shape()[i] == fed[i];
    if (!ok)
      throw error("input '", id, "' has shape ", toString(fed), " but the model expects ", toString(declared.shape()));
    infos[id] = TensorInfo(arr.dataType(), fed);
    arrays[id] = &arr;
  }
  if (bps > 1 && !m.valueInputs.empty())
    throw error("inputs whose values decide shapes (", *m.valueInputs.begin(), ") need batchesPerStep 1");
  if (!m.matchesCompiled(infos, arrays)) {
    if (m.plan) logging::logger().info("input shapes or shape values changed: recompiling");
    m.compile(infos, arrays);
  }
  if (m.pipeline && !m.valueInputs.empty())
    throw error("pipelined inference needs input shapes that do not depend on input values (", *m.valueInputs.begin(),
                ")");
  for (const auto &[id, arr] : stepio.outputs()) {
    if (!m.dataFlow.isAnchored(id)) throw error("StepIO output '", id, "' is not an anchor of the DataFlow");
    if (m.pipeline && !m.graph->hasTensor(id)) continue; // another stage's, which sends it (shareAnchors)
    const TensorInfo info = m.streams.hostInfo(id, m.plan->info(id));
    Shape expected = info.shape();
    int count = m.dataFlow.returnedCount(id);
    if (count > 1 || (bps > 1 && m.dataFlow.art(id).id() != AnchorReturnTypeId::Final &&
                      m.dataFlow.art(id).id() != AnchorReturnTypeId::Sum))
      expected.insert(expected.begin(), count);
    if (arr.dataType() != info.dataType())
      throw error("output buffer for anchor '", id, "' has type ", toString(arr.dataType()), ", expected ",
                  toString(info.dataType()));
    if (arr.nelms() != shapeElementCount(expected))
      throw error("output buffer for anchor '", id, "' has shape ", toString(arr.shape()), ", expected ",
                  toString(expected));
  }
  for (int b = 0; b < bps; ++b) {
    for (const auto &id : m.inputIds) {
      if (m.valueInputs.count(id)) continue;
      if (!m.plan->info(id).isTensor()) {
        const SequenceInput &in = stepio.sequenceInputs().at(id);
        SequenceData value;
        value.present = in.present;
        for (IArray *e : in.elements)
          value.items.emplace_back(TensorInfo(e->dataType(), e->shape()), e->data());
        *static_cast<SequenceData *>(m.plan->address(id)) = std::move(value);
        continue;
      }
      IArray &arr = stepio.inputs().at(id);
      const TensorInfo &device = m.plan->info(id);
      int64_t bytes = m.streams.hostInfo(id, device).byteCount();
      if (bytes == 0) continue;
      m.streams.copyIn(id, device, static_cast<uint8_t *>(arr.data()) + b * bytes, m.plan->address(id));
    }
    if (m.pipeline) m.pipeline->receive(true);
    ++m.batchesRun;
    try {
      m.plan->run();
    } catch (const error &) {
      session::throwIfNumericFault(*m.plan, m.batchesRun);
      throw;
    }
    if (m.pipeline) m.pipeline->send(true);
    for (const auto &[id, arr] : stepio.outputs()) {
      if (m.pipeline && !m.graph->hasTensor(id)) continue;
      const AnchorReturnType &art = m.dataFlow.art(id);
      const TensorInfo &info = m.plan->info(id);
      const void *src = m.plan->address(id);
      if (info.dataType() == DataType::STRING) {
        const TensorData *c = m.plan->constData(id);
        if (!c) throw error("anchor '", id, "': STRING tensors must be constant");
        std::copy(c->strings().begin(), c->strings().end(), static_cast<std::string *>(arr.data()));
        continue;
      }
      session::writeAnchor(art, m.streams.hostInfo(id, info), info.dataType(), src, arr, b, bps);
    }
  }
  if (m.pipeline) {
    m.pipeline->finishSends();
    m.pipeline->shareAnchors(stepio.outputs());
  }
}

std::vector<TensorId> InferenceSession::getInputIds() const { return impl_->inputIds; }
std::vector<TensorId> InferenceSession::getOutputIds() const { return impl_->outputIds; }

TensorInfo InferenceSession::getInfo(const TensorId &id) const {
  if (const auto &p = impl_->pipeline; p && !impl_->graph->hasTensor(id)) {
    auto it = p->stages().producedInfo.find(id);
    if (it != p->stages().producedInfo.end()) return impl_->streams.hostInfo(id, it->second);
  }
  if (impl_->plan) return impl_->streams.hostInfo(id, impl_->plan->info(id));
  if (std::find(impl_->inputIds.begin(), impl_->inputIds.end(), id) != impl_->inputIds.end())
    return impl_->resolvedInfo(id);
  return impl_->declared->tensor(id).info();
}

SequenceOutput InferenceSession::getSequenceOutput(const TensorId &id) const {
  if (!impl_->plan) throw error("getSequenceOutput: the session has not run");
  if (impl_->plan->info(id).isTensor()) throw error("getSequenceOutput: '", id, "' is a tensor");
  const auto &value = *static_cast<const SequenceData *>(impl_->plan->address(id));
  SequenceOutput out;
  out.present = value.present;
  for (const TensorData &t : value.items) {
    out.infos.push_back(t.info());
    const auto *b = static_cast<const uint8_t *>(t.data());
    out.bytes.emplace_back(b, b + t.byteCount());
  }
  return out;
}

std::string InferenceSession::dumpIr() const { return (impl_->graph ? impl_->graph : impl_->declared)->dump(); }

int64_t InferenceSession::plannedArenaBytes() const { return impl_->plan ? impl_->plan->memoryPlan().arenaBytes : 0; }

int InferenceSession::getReplicationIndex() const {
  if (impl_->pipelineGroups) return impl_->pipelineGroups->replica;
  const auto &communicator = impl_->kernelContext.communicator;
  return communicator ? communicator->rank() : 0;
}

std::string InferenceSession::explainKernels() const {
  if (!impl_->plan) throw error("explainKernels: the plan is not compiled yet (call prepareDevice() or run() first)");
  return session::kernelReport(*impl_->plan);
}

void InferenceSession::enableProfiling() {
  impl_->profiling = true;
  if (impl_->plan) impl_->plan->enableProfiling();
}

void InferenceSession::writeProfileTrace(const std::string &path) const {
  if (!impl_->plan) throw error("writeProfileTrace: the session has not run");
  session::writeChromeTrace(*impl_->plan, path);
}

std::string InferenceSession::profileSummary() const {
  if (!impl_->plan) throw error("profileSummary: the session has not run");
  const auto &p = *impl_->plan;
  return session::profileSummary(p, Impl::memoryParts(session::plannedMemory(p))) +
         session::passTimes(impl_->passRecords);
}

} // namespace popart
