// popart::Builder: builds an onnx::ModelProto node by node.

#include <popart/builder.hpp>
#include <popart/error.hpp>

#include "core/log.hpp"
#include "ir/passes/passes.hpp"
#include "onnx_import/onnx_import.hpp"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>

namespace popart {

namespace detail {

struct BuilderImpl {
  onnx::ModelProto model;
  // Element type of every tensor, so that graph outputs get a type even where ONNX shape
  // inference cannot decide one (the checker requires typed graph outputs).
  std::map<TensorId, DataType> types;
  std::set<std::string> nodeNames;
  std::vector<TensorId> inputs, outputs;
  int counter = 0;

  BuilderImpl() {
    model.set_ir_version(8);
    model.set_producer_name("popart-cpu Builder");
    auto *op = model.add_opset_import();
    op->set_domain("");
    op->set_version(13);
    model.mutable_graph()->set_name("BuilderGraph");
  }

  onnx::GraphProto &graph() { return *model.mutable_graph(); }

  std::string uniqueName(const std::string &base) {
    if (!base.empty() && !nodeNames.count(base) && !types.count(base)) {
      nodeNames.insert(base);
      return base;
    }
    std::string stem = base.empty() ? "t" : base;
    for (;;) {
      std::string n = stem + "_" + std::to_string(counter++);
      if (!nodeNames.count(n) && !types.count(n)) {
        nodeNames.insert(n);
        return n;
      }
    }
  }

  DataType typeOf(const TensorId &id) const {
    auto it = types.find(id);
    return it == types.end() ? DataType::UNDEFINED : it->second;
  }

  TensorId addInitializer(const void *data, const TensorInfo &info, const std::string &debugName) {
    if (info.dataType() == DataType::UNDEFINED || info.dataType() == DataType::STRING)
      throw error("Builder::addInitializedInputTensor '", debugName, "': unsupported type ", toString(info.dataType()));
    if (!isShapeKnown(info.shape()))
      throw error("Builder::addInitializedInputTensor '", debugName, "': shape ", popart::toString(info.shape()),
                  " must be fully known");
    TensorId id = uniqueName(debugName.empty() ? "init_input" : debugName);
    auto *t = graph().add_initializer();
    t->set_name(id);
    t->set_data_type(static_cast<int>(info.dataType()));
    for (auto d : info.shape())
      t->add_dims(d);
    const auto bytes = static_cast<size_t>(info.byteCount());
    if (bytes != 0 && data == nullptr)
      throw error("Builder::addInitializedInputTensor '", id, "': null data for ", info.toString());
    t->set_raw_data(std::string(static_cast<const char *>(data), bytes));
    types[id] = info.dataType();
    return id;
  }

  TensorId constInt64s(const std::vector<int64_t> &values, const std::string &what) {
    return addInitializer(values.data(), TensorInfo(DataType::INT64, {static_cast<int64_t>(values.size())}), what);
  }
  TensorId constScalar(float value, DataType type, const std::string &what) {
    if (type == DataType::DOUBLE) {
      double v = value;
      return addInitializer(&v, TensorInfo(type, {}), what);
    }
    if (type != DataType::FLOAT && type != DataType::UNDEFINED)
      throw error("Builder: '", what, "' needs a FLOAT or DOUBLE input, not ", toString(type));
    return addInitializer(&value, TensorInfo(DataType::FLOAT, {}), what);
  }

  // Adds a node; \p outType decides each output's element type from the inputs' types.
  std::vector<TensorId> addNode(const std::string &opType, const std::vector<TensorId> &args, unsigned numOutputs,
                                const std::string &name, size_t minInputs, size_t maxInputs,
                                const std::vector<DataType> &outTypes = {}) {
    std::string nodeName = uniqueName(name.empty() ? opType : name);
    if (args.size() < minInputs || args.size() > maxInputs)
      throw error("Builder: ", opType, " '", nodeName, "' takes ", minInputs, minInputs == maxInputs ? "" : " to ",
                  minInputs == maxInputs ? std::string() : std::to_string(maxInputs), " inputs, got ", args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      // "" is ONNX's marker for an omitted optional input; the first input is never optional.
      if (args[i].empty() && i > 0) continue;
      if (!types.count(args[i]))
        throw error("Builder: ", opType, " '", nodeName, "': unknown input tensor '", args[i], "' (input ", i, ")");
    }
    auto *node = graph().add_node();
    node->set_name(nodeName);
    node->set_op_type(opType);
    for (const auto &a : args)
      node->add_input(a);
    std::vector<TensorId> outs;
    for (unsigned i = 0; i < numOutputs; ++i) {
      TensorId out = nodeName + ":" + std::to_string(i);
      while (types.count(out) || nodeNames.count(out))
        out = nodeName + ":" + std::to_string(i) + "_" + std::to_string(counter++);
      node->add_output(out);
      DataType t = i < outTypes.size() && outTypes[i] != DataType::UNDEFINED ? outTypes[i] : typeOf(args[0]);
      types[out] = t;
      outs.push_back(out);
    }
    return outs;
  }

  onnx::NodeProto &lastNode() { return *graph().mutable_node(graph().node_size() - 1); }

  /// Puts the last node in domain ai.graphcore, importing opset 1 of it once.
  void inGraphcoreDomain() {
    lastNode().set_domain("ai.graphcore");
    for (const auto &o : model.opset_import())
      if (o.domain() == "ai.graphcore") return;
    auto *op = model.add_opset_import();
    op->set_domain("ai.graphcore");
    op->set_version(1);
  }

  void attrInt(const std::string &n, int64_t v) {
    auto *a = lastNode().add_attribute();
    a->set_name(n);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  void attrFloat(const std::string &n, float v) {
    auto *a = lastNode().add_attribute();
    a->set_name(n);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  void attrInts(const std::string &n, const std::vector<int64_t> &v, bool skipEmpty = true) {
    if (skipEmpty && v.empty()) return;
    auto *a = lastNode().add_attribute();
    a->set_name(n);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v)
      a->add_ints(x);
  }
  void attrString(const std::string &n, const std::string &v) {
    auto *a = lastNode().add_attribute();
    a->set_name(n);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }

  TensorId one(const std::string &opType, const std::vector<TensorId> &args, const std::string &name, size_t minIn,
               size_t maxIn, DataType outType = DataType::UNDEFINED) {
    return addNode(opType, args, 1, name, minIn, maxIn, {outType})[0];
  }

  TensorId reduce(const std::string &what, const TensorId &x, ReductionType r, const std::string &name) {
    switch (r) {
    case ReductionType::Sum:
      // Opset 13 ReduceSum takes its axes as an input; none means every axis.
      {
        TensorId out = one("ReduceSum", {x}, name, 1, 1);
        attrInt("keepdims", 0);
        return out;
      }
    case ReductionType::Mean: {
      TensorId out = one("ReduceMean", {x}, name, 1, 1);
      attrInt("keepdims", 0);
      return out;
    }
    case ReductionType::NoReduction: return one("Identity", {x}, name, 1, 1);
    }
    throw error("Builder: ", what, ": unknown ReductionType");
  }
};

} // namespace detail

using detail::BuilderImpl;

// ---- AiOnnxOpset13 ----

#define POPART_BINARY(fn, Type)                                                                                        \
  TensorId AiOnnxOpset13::fn(const std::vector<TensorId> &args, const std::string &name) {                             \
    return impl_->one(Type, args, name, 2, 2);                                                                         \
  }
#define POPART_UNARY(fn, Type)                                                                                         \
  TensorId AiOnnxOpset13::fn(const std::vector<TensorId> &args, const std::string &name) {                             \
    return impl_->one(Type, args, name, 1, 1);                                                                         \
  }
POPART_BINARY(add, "Add")
POPART_BINARY(sub, "Sub")
POPART_BINARY(mul, "Mul")
POPART_BINARY(div, "Div")
POPART_BINARY(matmul, "MatMul")
POPART_UNARY(relu, "Relu")
POPART_UNARY(sigmoid, "Sigmoid")
POPART_UNARY(tanh, "Tanh")
POPART_UNARY(abs, "Abs")
POPART_UNARY(log, "Log")
POPART_UNARY(exp, "Exp")
POPART_UNARY(identity, "Identity")
POPART_UNARY(globalaveragepool, "GlobalAveragePool")
#undef POPART_BINARY
#undef POPART_UNARY

TensorId AiOnnxOpset13::gemm(const std::vector<TensorId> &args, float alpha, float beta, int64_t transA, int64_t transB,
                             const std::string &name) {
  TensorId out = impl_->one("Gemm", args, name, 2, 3);
  impl_->attrFloat("alpha", alpha);
  impl_->attrFloat("beta", beta);
  impl_->attrInt("transA", transA);
  impl_->attrInt("transB", transB);
  return out;
}

TensorId AiOnnxOpset13::softmax(const std::vector<TensorId> &args, int64_t axis, const std::string &name) {
  TensorId out = impl_->one("Softmax", args, name, 1, 1);
  impl_->attrInt("axis", axis);
  return out;
}

TensorId AiOnnxOpset13::logsoftmax(const std::vector<TensorId> &args, int64_t axis, const std::string &name) {
  TensorId out = impl_->one("LogSoftmax", args, name, 1, 1);
  impl_->attrInt("axis", axis);
  return out;
}

TensorId AiOnnxOpset13::reshape(const std::vector<TensorId> &args, const std::string &name) {
  return impl_->one("Reshape", args, name, 2, 2);
}

TensorId AiOnnxOpset13::transpose(const std::vector<TensorId> &args, const std::vector<int64_t> &perm,
                                  const std::string &name) {
  TensorId out = impl_->one("Transpose", args, name, 1, 1);
  impl_->attrInts("perm", perm);
  return out;
}

TensorId AiOnnxOpset13::conv(const std::vector<TensorId> &args, const std::vector<int64_t> &dilations, int64_t group,
                             const std::vector<int64_t> &kernel_shape, const std::vector<int64_t> &pads,
                             const std::vector<int64_t> &strides, const std::string &name) {
  TensorId out = impl_->one("Conv", args, name, 2, 3);
  impl_->attrInts("dilations", dilations);
  impl_->attrInt("group", group);
  impl_->attrInts("kernel_shape", kernel_shape);
  impl_->attrInts("pads", pads);
  impl_->attrInts("strides", strides);
  return out;
}

std::vector<TensorId> AiOnnxOpset13::maxpool(const std::vector<TensorId> &args, unsigned num_outputs,
                                             const std::vector<int64_t> &kernel_shape, const std::vector<int64_t> &pads,
                                             const std::vector<int64_t> &strides, const std::string &name) {
  if (num_outputs < 1 || num_outputs > 2)
    throw error("Builder: MaxPool '", name, "': num_outputs must be 1 or 2, got ", num_outputs);
  auto outs = impl_->addNode("MaxPool", args, num_outputs, name, 1, 1, {DataType::UNDEFINED, DataType::INT64});
  impl_->attrInts("kernel_shape", kernel_shape, false);
  impl_->attrInts("pads", pads);
  impl_->attrInts("strides", strides);
  return outs;
}

TensorId AiOnnxOpset13::averagepool(const std::vector<TensorId> &args, const std::vector<int64_t> &kernel_shape,
                                    int64_t count_include_pad, const std::vector<int64_t> &pads,
                                    const std::vector<int64_t> &strides, const std::string &name) {
  TensorId out = impl_->one("AveragePool", args, name, 1, 1);
  impl_->attrInts("kernel_shape", kernel_shape, false);
  impl_->attrInt("count_include_pad", count_include_pad);
  impl_->attrInts("pads", pads);
  impl_->attrInts("strides", strides);
  return out;
}

std::vector<TensorId> AiOnnxOpset13::batchnormalization(const std::vector<TensorId> &args, unsigned num_outputs,
                                                        float epsilon, float momentum, const std::string &name) {
  if (num_outputs != 1 && num_outputs != 5)
    throw error("Builder: BatchNormalization '", name, "': num_outputs must be 1 or 5, got ", num_outputs);
  auto outs = impl_->addNode("BatchNormalization", args, num_outputs, name, 5, 5);
  impl_->attrFloat("epsilon", epsilon);
  impl_->attrFloat("momentum", momentum);
  return outs;
}

TensorId AiOnnxOpset13::flatten(const std::vector<TensorId> &args, int64_t axis, const std::string &name) {
  TensorId out = impl_->one("Flatten", args, name, 1, 1);
  impl_->attrInt("axis", axis);
  return out;
}

TensorId AiOnnxOpset13::gather(const std::vector<TensorId> &args, int64_t axis, const std::string &name) {
  TensorId out = impl_->one("Gather", args, name, 2, 2);
  impl_->attrInt("axis", axis);
  return out;
}

TensorId AiOnnxOpset13::reducemean(const std::vector<TensorId> &args, const std::optional<std::vector<int64_t>> &axes,
                                   int64_t keepdims, const std::string &name) {
  TensorId out = impl_->one("ReduceMean", args, name, 1, 1);
  if (axes) impl_->attrInts("axes", *axes, false);
  impl_->attrInt("keepdims", keepdims);
  return out;
}

TensorId AiOnnxOpset13::reducesum(const std::vector<TensorId> &args, const std::optional<std::vector<int64_t>> &axes,
                                  int64_t keepdims, const std::string &name) {
  std::vector<TensorId> in = args;
  // Opset 13 moved ReduceSum's axes into an input; check the data input before adding it.
  if (in.size() != 1) throw error("Builder: ReduceSum '", name, "' takes 1 input, got ", in.size());
  if (axes) in.push_back(impl_->constInt64s(*axes, (name.empty() ? "ReduceSum" : name) + "_axes"));
  TensorId out = impl_->one("ReduceSum", in, name, 1, 2);
  impl_->attrInt("keepdims", keepdims);
  return out;
}

std::vector<TensorId> AiOnnxOpset13::dropout(const std::vector<TensorId> &args, unsigned num_outputs, float ratio,
                                             const std::string &name) {
  if (num_outputs < 1 || num_outputs > 2)
    throw error("Builder: Dropout '", name, "': num_outputs must be 1 or 2, got ", num_outputs);
  if (args.size() != 1) throw error("Builder: Dropout '", name, "' takes 1 input, got ", args.size());
  if (!impl_->types.count(args[0]))
    throw error("Builder: Dropout '", name, "': unknown input tensor '", args[0], "' (input 0)");
  // Opset 13 takes the ratio as an input of the data's floating type.
  TensorId r = impl_->constScalar(ratio, impl_->typeOf(args[0]), (name.empty() ? "Dropout" : name) + "_ratio");
  return impl_->addNode("Dropout", {args[0], r}, num_outputs, name, 2, 2, {DataType::UNDEFINED, DataType::BOOL});
}

TensorId AiOnnxOpset13::shape(const std::vector<TensorId> &args, const std::string &name) {
  return impl_->one("Shape", args, name, 1, 1, DataType::INT64);
}

TensorId AiOnnxOpset13::argmax(const std::vector<TensorId> &args, int64_t axis, int64_t keepdims,
                               const std::string &name) {
  TensorId out = impl_->one("ArgMax", args, name, 1, 1, DataType::INT64);
  impl_->attrInt("axis", axis);
  impl_->attrInt("keepdims", keepdims);
  return out;
}

TensorId AiOnnxOpset13::cast(const std::vector<TensorId> &args, const std::string &to, const std::string &name) {
  DataType t = dataTypeFromString(to);
  TensorId out = impl_->one("Cast", args, name, 1, 1, t);
  impl_->attrInt("to", static_cast<int64_t>(t));
  return out;
}

namespace {
const char *onnxReduction(ReductionType r) {
  return r == ReductionType::Sum ? "sum" : r == ReductionType::Mean ? "mean" : "none";
}
} // namespace

TensorId AiOnnxOpset13::softmaxcrossentropyloss(const std::vector<TensorId> &args, ReductionType reduction,
                                                std::optional<int64_t> ignore_index, const std::string &name) {
  TensorId out = impl_->one("SoftmaxCrossEntropyLoss", args, name, 2, 3);
  impl_->attrString("reduction", onnxReduction(reduction));
  if (ignore_index) impl_->attrInt("ignore_index", *ignore_index);
  return out;
}

TensorId AiOnnxOpset13::negativeloglikelihoodloss(const std::vector<TensorId> &args, ReductionType reduction,
                                                  std::optional<int64_t> ignore_index, const std::string &name) {
  TensorId out = impl_->one("NegativeLogLikelihoodLoss", args, name, 2, 3);
  impl_->attrString("reduction", onnxReduction(reduction));
  if (ignore_index) impl_->attrInt("ignore_index", *ignore_index);
  return out;
}

// ---- Builder ----

Builder::Builder() : impl_(std::make_unique<BuilderImpl>()) {}
Builder::~Builder() = default;

std::unique_ptr<Builder> Builder::create() { return std::unique_ptr<Builder>(new Builder()); }

TensorId Builder::addInputTensor(const TensorInfo &info, const std::string &debugName) {
  if (info.dataType() == DataType::UNDEFINED)
    throw error("Builder::addInputTensor '", debugName, "': the data type is UNDEFINED");
  TensorId id = impl_->uniqueName(debugName.empty() ? "input" : debugName);
  auto *v = impl_->graph().add_input();
  v->set_name(id);
  auto *tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int>(info.dataType()));
  auto *shape = tt->mutable_shape();
  for (auto d : info.shape()) {
    auto *dim = shape->add_dim();
    if (d >= 0)
      dim->set_dim_value(d);
    else
      dim->set_dim_param(id + "_dim" + std::to_string(shape->dim_size() - 1));
  }
  impl_->types[id] = info.dataType();
  impl_->inputs.push_back(id);
  return id;
}

TensorId Builder::addInitializedInputTensor(const void *data, const TensorInfo &info, const std::string &debugName) {
  return impl_->addInitializer(data, info, debugName);
}

void Builder::checkInitializerSize(int64_t count, const TensorInfo &info, const std::string &debugName) const {
  if (!isShapeKnown(info.shape()) || count != info.elementCount())
    throw error("Builder::addInitializedInputTensor '", debugName, "': ", count, " values do not fill shape ",
                popart::toString(info.shape()));
}

namespace {

/// Sets INT attribute \p name of the node that produces \p output to \p value.
void annotateProducer(onnx::GraphProto &g, const TensorId &output, const char *name, int64_t value,
                      const char *method) {
  for (onnx::NodeProto &node : *g.mutable_node())
    for (const std::string &o : node.output())
      if (o == output) {
        for (onnx::AttributeProto &a : *node.mutable_attribute())
          if (a.name() == name) {
            a.set_i(value);
            return;
          }
        onnx::AttributeProto *a = node.add_attribute();
        a->set_name(name);
        a->set_type(onnx::AttributeProto::INT);
        a->set_i(value);
        return;
      }
  throw error("Builder::", method, ": no node produces '", output, "'");
}

} // namespace

void Builder::virtualGraph(const TensorId &nodeOutputName, int64_t value) {
  if (value < 0) throw error("Builder::virtualGraph: '", nodeOutputName, "': virtual graph ", value, " is negative");
  annotateProducer(impl_->graph(), nodeOutputName, "__ipu_number", value, "virtualGraph");
}

void Builder::pipelineStage(const TensorId &nodeOutputName, int64_t value) {
  if (value < 0) throw error("Builder::pipelineStage: '", nodeOutputName, "': pipeline stage ", value, " is negative");
  annotateProducer(impl_->graph(), nodeOutputName, "__pipeline_stage", value, "pipelineStage");
}

void Builder::recomputeOutputInBackwardPass(const TensorId &nodeOutputName, RecomputeType value) {
  annotateProducer(impl_->graph(), nodeOutputName, "__recompute_output_in_backward_pass", static_cast<int64_t>(value),
                   "recomputeOutputInBackwardPass");
}

void Builder::addOutputTensor(const TensorId &id) {
  if (!impl_->types.count(id)) throw error("Builder::addOutputTensor: unknown tensor '", id, "'");
  for (const auto &o : impl_->outputs)
    if (o == id) throw error("Builder::addOutputTensor: '", id, "' is already an output");
  impl_->outputs.push_back(id);
}

AiOnnxOpset13 Builder::aiOnnxOpset13() { return AiOnnxOpset13(impl_.get()); }

TensorId Builder::nllloss(const std::vector<TensorId> &args, ReductionType reduction, std::optional<int> ignoreIndex,
                          const std::string &debugName) {
  if (args.size() != 2)
    throw error("Builder::nllloss '", debugName, "' takes {probs, label}, got ", args.size(), " inputs");
  std::string base = debugName.empty() ? "NllLoss" : debugName;
  // PopART's nllloss takes probabilities; ONNX's NegativeLogLikelihoodLoss takes log-probabilities.
  TensorId logp = impl_->one("Log", {args[0]}, base + "_log", 1, 1);
  TensorId out = impl_->one("NegativeLogLikelihoodLoss", {logp, args[1]}, base, 2, 2);
  impl_->attrString("reduction", reduction == ReductionType::Sum    ? "sum"
                                 : reduction == ReductionType::Mean ? "mean"
                                                                    : "none");
  if (ignoreIndex) impl_->attrInt("ignore_index", *ignoreIndex);
  return out;
}

TensorId Builder::l1loss(const TensorId &input, float lambda, ReductionType reduction, const std::string &debugName) {
  std::string base = debugName.empty() ? "L1Loss" : debugName;
  TensorId a = impl_->one("Abs", {input}, base + "_abs", 1, 1);
  TensorId r = impl_->reduce("l1loss", a, reduction, base + "_reduce");
  TensorId l = impl_->constScalar(lambda, impl_->typeOf(input), base + "_lambda");
  return impl_->one("Mul", {r, l}, base, 2, 2);
}

TensorId Builder::identityloss(const TensorId &input, ReductionType reduction, const std::string &debugName) {
  if (!impl_->types.count(input)) throw error("Builder::identityloss: unknown input tensor '", input, "'");
  return impl_->reduce("identityloss", input, reduction, debugName.empty() ? "IdentityLoss" : debugName);
}

// ---- AiGraphcoreOpset1 (ai.graphcore opset 1) ----

namespace {

/// PopART's spelling of a loss reduction in the "reduction" attribute.
const char *graphcoreReduction(ReductionType r) {
  switch (r) {
  case ReductionType::Sum: return "Sum";
  case ReductionType::Mean: return "Mean";
  case ReductionType::NoReduction: return "None";
  }
  throw error("Builder: unknown ReductionType");
}

} // namespace

AiGraphcoreOpset1 Builder::aiGraphcoreOpset1() { return AiGraphcoreOpset1(impl_.get()); }

std::vector<TensorId> AiGraphcoreOpset1::groupnormalization(const std::vector<TensorId> &args, int64_t num_groups,
                                                            float epsilon, const std::string &name) {
  auto outs = impl_->addNode("GroupNormalization", args, 3, name, 3, 3);
  impl_->inGraphcoreDomain();
  impl_->attrInt("num_groups", num_groups);
  impl_->attrFloat("epsilon", epsilon);
  return outs;
}

TensorId AiGraphcoreOpset1::gelu(const std::vector<TensorId> &args, const std::string &name) {
  TensorId out = impl_->one("Gelu", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  return out;
}

TensorId AiGraphcoreOpset1::scale(const std::vector<TensorId> &args, float scale, const std::string &name) {
  TensorId out = impl_->one("Scale", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  impl_->attrFloat("scale", scale);
  return out;
}

TensorId AiGraphcoreOpset1::subsample(const std::vector<TensorId> &args, const std::vector<int64_t> &strides,
                                      const std::string &name) {
  TensorId out = impl_->one("Subsample", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  impl_->attrInts("strides", strides, false);
  return out;
}

TensorId AiGraphcoreOpset1::detach(const std::vector<TensorId> &args, const std::string &name) {
  TensorId out = impl_->one("Detach", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  return out;
}

TensorId AiGraphcoreOpset1::init(const std::vector<int64_t> &shape, int64_t data_type, int64_t init_type,
                                 int64_t batch_axis, const std::string &name) {
  DataType type = dataTypeFromOnnx(static_cast<int>(data_type));
  TensorId out = impl_->one("Init", {}, name, 0, 0, type);
  impl_->inGraphcoreDomain();
  impl_->attrInts("shape", shape, false);
  impl_->attrInt("data_type", data_type);
  impl_->attrInt("tensor_type", 0); // PopART's TensorType::ActGrad, as its builder writes
  impl_->attrInt("init_type", init_type);
  impl_->attrInt("batch_axis", batch_axis);
  return out;
}

TensorId AiGraphcoreOpset1::init(const std::vector<int64_t> &shape, int64_t data_type, int64_t init_type,
                                 const std::string &name) {
  return init(shape, data_type, init_type, -1, name);
}

TensorId AiGraphcoreOpset1::identityloss(const std::vector<TensorId> &args, ReductionType reduction,
                                         const std::string &name) {
  TensorId out = impl_->one("IdentityLoss", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  impl_->attrString("reduction", graphcoreReduction(reduction));
  return out;
}

TensorId AiGraphcoreOpset1::nllloss(const std::vector<TensorId> &args, ReductionType reduction,
                                    std::optional<int> ignoreIndex, bool inputIsLogProbability,
                                    const std::string &name) {
  TensorId out = impl_->one("Nll", args, name, 2, 2);
  impl_->inGraphcoreDomain();
  impl_->attrString("reduction", graphcoreReduction(reduction));
  if (ignoreIndex) impl_->attrInt("ignoreIndex", *ignoreIndex);
  impl_->attrInt("inputIsLogProbability", inputIsLogProbability ? 1 : 0);
  return out;
}

TensorId AiGraphcoreOpset1::l1loss(const std::vector<TensorId> &args, float lambda, ReductionType reduction,
                                   const std::string &name) {
  TensorId out = impl_->one("L1", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  impl_->attrFloat("lambda", lambda);
  impl_->attrString("reduction", graphcoreReduction(reduction));
  return out;
}

TensorId AiGraphcoreOpset1::printtensor(const std::vector<TensorId> &args, int64_t print_gradient,
                                        const std::string &name, const std::string &title, int summariseThreshold,
                                        int edgeItems) {
  TensorId out = impl_->one("PrintTensor", args, name, 1, 1);
  impl_->inGraphcoreDomain();
  impl_->attrInt("print_gradient", print_gradient);
  impl_->attrString("title", title);
  impl_->attrInt("summariseThreshold", summariseThreshold);
  impl_->attrInt("edgeItems", edgeItems);
  return out;
}

std::vector<TensorId> AiGraphcoreOpset1::multiconv(
    const std::vector<std::vector<TensorId>> &tensors, const std::vector<std::vector<int64_t>> &dilations,
    const std::vector<std::vector<int64_t>> &inDilations, const std::vector<std::vector<int64_t>> &pads,
    const std::vector<std::vector<int64_t>> &outPads, const std::vector<std::vector<int64_t>> &strides,
    const std::vector<float> &availableMemoryProportions, const std::vector<std::string> &partialsTypes,
    const std::optional<std::string> &planType, const std::optional<int64_t> &perConvReservedTiles,
    const std::optional<float> &cycleBackOff, const std::vector<int64_t> &enableConvDithering,
    const std::string &name) {
  const size_t k = tensors.size();
  if (k == 0) throw error("Builder: MultiConv '", name, "' needs at least one convolution");
  // PopART's node layout: per-convolution lists concatenated.
  auto flatten = [&](const std::vector<std::vector<int64_t>> &lists, const char *what) {
    if (!lists.empty() && lists.size() != k)
      throw error("Builder: MultiConv '", name, "': ", what, " has ", lists.size(),
                  " lists, expected one per convolution (", k, ")");
    std::vector<int64_t> flat;
    for (const auto &l : lists)
      flat.insert(flat.end(), l.begin(), l.end());
    return flat;
  };
  std::vector<TensorId> args;
  std::vector<DataType> outTypes;
  for (size_t i = 0; i < k; ++i) {
    if (tensors[i].size() != 2 && tensors[i].size() != 3)
      throw error("Builder: MultiConv '", name, "': convolution ", i, " has ", tensors[i].size(),
                  " tensors, expected {x, w} or {x, w, b}");
    args.insert(args.end(), tensors[i].begin(), tensors[i].end());
    if (tensors[i].size() == 2) args.emplace_back(); // no bias
    outTypes.push_back(impl_->typeOf(tensors[i][0]));
  }
  auto outs = impl_->addNode("MultiConv", args, static_cast<unsigned>(k), name, 3 * k, 3 * k, outTypes);
  impl_->inGraphcoreDomain();
  impl_->attrInts("dilations", flatten(dilations, "dilations"));
  impl_->attrInts("inDilations", flatten(inDilations, "inDilations"));
  impl_->attrInts("pads", flatten(pads, "pads"));
  impl_->attrInts("outPads", flatten(outPads, "outPads"));
  impl_->attrInts("strides", flatten(strides, "strides"));
  if (!availableMemoryProportions.empty()) {
    auto *a = impl_->lastNode().add_attribute();
    a->set_name("availableMemoryProportions");
    a->set_type(onnx::AttributeProto::FLOATS);
    for (float f : availableMemoryProportions)
      a->add_floats(f);
  }
  if (!partialsTypes.empty()) {
    auto *a = impl_->lastNode().add_attribute();
    a->set_name("partialsTypes");
    a->set_type(onnx::AttributeProto::STRINGS);
    for (const auto &t : partialsTypes)
      a->add_strings(t);
  }
  if (planType) impl_->attrString("planType", *planType);
  if (perConvReservedTiles) impl_->attrInt("perConvReservedTiles", *perConvReservedTiles);
  if (cycleBackOff) impl_->attrFloat("cycleBackOff", *cycleBackOff);
  impl_->attrInts("enableConvDithering", enableConvDithering);
  impl_->attrInt("numConvs", static_cast<int64_t>(k));
  return outs;
}

// ---- end of AiGraphcoreOpset1 ----

std::vector<TensorId> Builder::getInputTensorIds() const { return impl_->inputs; }
std::vector<TensorId> Builder::getOutputTensorIds() const { return impl_->outputs; }

namespace {

/// Gives the graph outputs of \p m that ONNX's inference left without a shape (outputs of nodes it
/// has no schema for: ai.graphcore's) the shapes this runtime's own inference finds; the checker
/// requires a shape on every graph output.
void inferOutputShapesOfCustomOps(onnx::ModelProto &m) {
  auto *g = m.mutable_graph();
  bool missing = false;
  for (const auto &out : g->output())
    missing = missing || !out.type().tensor_type().has_shape();
  if (!missing) return;
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw error("Builder::getModelProto: serialization failed");
  onnx_import::ImportOptions options;
  options.check = false; // the model is not complete yet: the shapes are what is missing
  std::unique_ptr<ir::Graph> graph;
  try {
    graph = onnx_import::importModelBytes(bytes, ".", options, "Builder");
    ir::inferShapes(*graph, nullptr);
  } catch (const error &e) {
    // Best effort, as ONNX's own: shapes that depend on values computed at run time stay unknown
    // (loading then names the problem), but the reason is worth a line in the log.
    logging::logger().warn("Builder::getModelProto: output shapes that ONNX cannot infer stay unknown: {}", e.what());
    return;
  }
  for (auto &out : *g->mutable_output()) {
    if (out.type().tensor_type().has_shape() || !graph->hasTensor(out.name())) continue;
    const TensorInfo &info = graph->tensor(out.name()).info();
    if (!info.isKnown()) continue;
    auto *shape = out.mutable_type()->mutable_tensor_type()->mutable_shape();
    for (int64_t d : info.shape())
      shape->add_dim()->set_dim_value(d);
  }
}

} // namespace

std::string Builder::getModelProto() const {
  onnx::ModelProto m = impl_->model;
  auto *g = m.mutable_graph();
  for (const auto &o : impl_->outputs) {
    auto *v = g->add_output();
    v->set_name(o);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(static_cast<int>(impl_->typeOf(o)));
  }
  // Shapes of graph outputs come from ONNX's own inference. A node it cannot infer (an op it has
  // no schema for, attributes it rejects) only leaves shapes unknown: error mode 0 reports those
  // by not inferring, not by throwing. The copy's outputs carry no type, so nothing the builder
  // declared is merged with (and could conflict with) what ONNX infers; an inferred type other
  // than the builder's is not taken.
  onnx::ModelProto inferred = m;
  for (auto &out : *inferred.mutable_graph()->mutable_output())
    out.clear_type();
  onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                     onnx::ShapeInferenceOptions(/*check_type=*/false, /*error_mode=*/0));
  std::map<std::string, const onnx::ValueInfoProto *> infos;
  for (const auto &v : inferred.graph().value_info())
    infos[v.name()] = &v;
  for (const auto &v : inferred.graph().output())
    infos[v.name()] = &v;
  for (auto &out : *g->mutable_output()) {
    auto it = infos.find(out.name());
    if (it != infos.end() && it->second->type().has_tensor_type() &&
        it->second->type().tensor_type().elem_type() == out.type().tensor_type().elem_type())
      *out.mutable_type() = it->second->type();
  }
  inferOutputShapesOfCustomOps(m);
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw error("Builder::getModelProto: serialization failed");
  return bytes;
}

void Builder::saveModelProto(const std::string &path) const {
  std::string bytes = getModelProto();
  std::ofstream f(path, std::ios::binary);
  if (!f) throw error("Builder::saveModelProto: cannot open '", path, "' for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw error("Builder::saveModelProto: writing '", path, "' failed");
}

} // namespace popart
