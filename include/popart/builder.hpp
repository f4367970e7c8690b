#pragma once
/// \file Builder: build an ONNX model in code, as PopART's popart::Builder does.
///
/// The ONNX protobuf classes stay behind a pimpl so that users of this header need
/// neither onnx nor protobuf headers.

#include <popart/tensorinfo.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace popart {

/// How a loss reduces its per-element values.
enum class ReductionType { Sum, Mean, NoReduction };

/// Whether an op's output is kept for the backward pass or recomputed there (PopART's values).
enum class RecomputeType { Undefined = 0, Checkpoint = 1, Recompute = 2, Recomputed = 3 };

namespace detail {
struct BuilderImpl;
} // namespace detail

/// The ai.onnx opset-13 operators. Each method adds one node and returns its output id(s).
/// \p name is an optional node name (made unique by the builder).
class AiOnnxOpset13 {
public:
  explicit AiOnnxOpset13(detail::BuilderImpl *impl) : impl_(impl) {}

  TensorId add(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId sub(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId mul(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId div(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId matmul(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId gemm(const std::vector<TensorId> &args, float alpha = 1.0f, float beta = 1.0f, int64_t transA = 0,
                int64_t transB = 0, const std::string &name = "");
  TensorId relu(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId sigmoid(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId tanh(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId abs(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId log(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId exp(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId identity(const std::vector<TensorId> &args, const std::string &name = "");
  TensorId softmax(const std::vector<TensorId> &args, int64_t axis = -1, const std::string &name = "");
  TensorId logsoftmax(const std::vector<TensorId> &args, int64_t axis = -1, const std::string &name = "");
  /// \p args is {data, shape}; shape is an INT64 tensor id.
  TensorId reshape(const std::vector<TensorId> &args, const std::string &name = "");
  /// An empty \p perm reverses the dimensions.
  TensorId transpose(const std::vector<TensorId> &args, const std::vector<int64_t> &perm = {},
                     const std::string &name = "");
  /// Empty attribute vectors are left out of the node (ONNX defaults apply).
  TensorId conv(const std::vector<TensorId> &args, const std::vector<int64_t> &dilations = {}, int64_t group = 1,
                const std::vector<int64_t> &kernel_shape = {}, const std::vector<int64_t> &pads = {},
                const std::vector<int64_t> &strides = {}, const std::string &name = "");
  /// \p num_outputs is 1 (Y) or 2 (Y, Indices).
  std::vector<TensorId> maxpool(const std::vector<TensorId> &args, unsigned num_outputs,
                                const std::vector<int64_t> &kernel_shape, const std::vector<int64_t> &pads = {},
                                const std::vector<int64_t> &strides = {}, const std::string &name = "");
  TensorId averagepool(const std::vector<TensorId> &args, const std::vector<int64_t> &kernel_shape,
                       int64_t count_include_pad = 0, const std::vector<int64_t> &pads = {},
                       const std::vector<int64_t> &strides = {}, const std::string &name = "");
  TensorId globalaveragepool(const std::vector<TensorId> &args, const std::string &name = "");
  /// \p args is {X, scale, B, mean, var}; \p num_outputs is 1 or 5.
  std::vector<TensorId> batchnormalization(const std::vector<TensorId> &args, unsigned num_outputs,
                                           float epsilon = 1e-5f, float momentum = 0.9f, const std::string &name = "");
  TensorId flatten(const std::vector<TensorId> &args, int64_t axis = 1, const std::string &name = "");
  TensorId gather(const std::vector<TensorId> &args, int64_t axis = 0, const std::string &name = "");
  /// No \p axes reduces over every dimension.
  TensorId reducemean(const std::vector<TensorId> &args, const std::optional<std::vector<int64_t>> &axes = {},
                      int64_t keepdims = 1, const std::string &name = "");
  TensorId reducesum(const std::vector<TensorId> &args, const std::optional<std::vector<int64_t>> &axes = {},
                     int64_t keepdims = 1, const std::string &name = "");
  /// \p num_outputs is 1 (output) or 2 (output, mask).
  std::vector<TensorId> dropout(const std::vector<TensorId> &args, unsigned num_outputs, float ratio = 0.5f,
                                const std::string &name = "");
  /// \p to is an ONNX type name such as "FLOAT" or "INT32".
  TensorId cast(const std::vector<TensorId> &args, const std::string &to, const std::string &name = "");
  /// The shape of args[0] as an INT64 vector.
  TensorId shape(const std::vector<TensorId> &args, const std::string &name = "");
  /// Indices (INT64) of the largest elements along \p axis.
  TensorId argmax(const std::vector<TensorId> &args, int64_t axis = 0, int64_t keepdims = 1,
                  const std::string &name = "");
  /// {scores, labels[, weights]} -> the loss (scalar unless NoReduction); \p scores are
  /// unnormalised [N, C, ...], \p labels INT32 or INT64 class indices [N, ...].
  TensorId softmaxcrossentropyloss(const std::vector<TensorId> &args, ReductionType reduction = ReductionType::Mean,
                                   std::optional<int64_t> ignore_index = std::nullopt, const std::string &name = "");
  /// {log_probs, labels[, weights]} -> the loss (ONNX NegativeLogLikelihoodLoss: the input holds
  /// log-probabilities, unlike Builder::nllloss).
  TensorId negativeloglikelihoodloss(const std::vector<TensorId> &args, ReductionType reduction = ReductionType::Mean,
                                     std::optional<int64_t> ignore_index = std::nullopt, const std::string &name = "");

private:
  detail::BuilderImpl *impl_;
};

// ---- ai.graphcore opset 1 (AiGraphcoreOpset1) -------------------------------------------------
// PopART's own operators (docs/ops.md, "ai.graphcore opset 1"). New methods are appended at the
// end of the class; the block ends at the matching "end of ai.graphcore opset 1" line.

/// The ai.graphcore opset-1 operators, with PopART's method names. Each method adds one node of
/// domain "ai.graphcore" (importing that opset into the model) and returns its output id(s);
/// \p name is an optional node name (made unique by the builder).
class AiGraphcoreOpset1 {
public:
  explicit AiGraphcoreOpset1(detail::BuilderImpl *impl) : impl_(impl) {}

  /// {x [N, C, ...], scale [C], bias [C]} -> {y, mean, invStdDev}, the statistics [N·num_groups]
  /// per (sample, group of C/num_groups consecutive channels).
  std::vector<TensorId> groupnormalization(const std::vector<TensorId> &args, int64_t num_groups, float epsilon = 1e-5f,
                                           const std::string &name = "");
  /// Exact GELU, 0.5·x·(1 + erf(x/√2)).
  TensorId gelu(const std::vector<TensorId> &args, const std::string &name = "");
  /// x · \p scale.
  TensorId scale(const std::vector<TensorId> &args, float scale, const std::string &name = "");
  /// Every strides[d]-th element of each dimension d (one stride per dimension).
  TensorId subsample(const std::vector<TensorId> &args, const std::vector<int64_t> &strides,
                     const std::string &name = "");
  /// The identity, through which no gradient flows.
  TensorId detach(const std::vector<TensorId> &args, const std::string &name = "");
  /// A zero tensor of \p shape and \p data_type (a popart::DataType value); \p init_type 0 (NoInit)
  /// or 1 (Zero) both give zeros; \p batch_axis is checked and otherwise unused.
  TensorId init(const std::vector<int64_t> &shape, int64_t data_type, int64_t init_type, int64_t batch_axis,
                const std::string &name = "");
  TensorId init(const std::vector<int64_t> &shape, int64_t data_type, int64_t init_type, const std::string &name = "");
  /// The (reduced) value of args[0] itself.
  TensorId identityloss(const std::vector<TensorId> &args, ReductionType reduction = ReductionType::Mean,
                        const std::string &name = "");
  /// {probs [..., C], label [...]} -> −log(probs[label]) per position (−probs[label] with
  /// \p inputIsLogProbability), labels equal to \p ignoreIndex left out; Mean divides by the
  /// positions not ignored.
  TensorId nllloss(const std::vector<TensorId> &args, ReductionType reduction = ReductionType::Mean,
                   std::optional<int> ignoreIndex = std::nullopt, bool inputIsLogProbability = false,
                   const std::string &name = "");
  /// \p lambda · |args[0]|, reduced.
  TensorId l1loss(const std::vector<TensorId> &args, float lambda, ReductionType reduction = ReductionType::Mean,
                  const std::string &name = "");
  /// The identity, which logs args[0] at info level (POPART_LOG_LEVEL=info) under \p title, and its
  /// gradient too if \p print_gradient is 1; tensors of more than \p summariseThreshold elements
  /// (0: no limit) show their first and last \p edgeItems.
  TensorId printtensor(const std::vector<TensorId> &args, int64_t print_gradient = 1, const std::string &name = "",
                       const std::string &title = "", int summariseThreshold = 1000, int edgeItems = 3);
  /// MultiConv: the convolutions \p tensors ({x, w} or {x, w, b} each) as one op whose kernels run
  /// them concurrently (docs/performance.md, "MultiConv"). \p dilations, \p inDilations, \p pads,
  /// \p outPads, \p strides: empty (defaults) or one list per convolution; inDilations and outPads
  /// only at their defaults. The IPU planning options are recorded and have no effect on the CPU.
  /// \returns one output per convolution.
  std::vector<TensorId> multiconv(
      const std::vector<std::vector<TensorId>> &tensors, const std::vector<std::vector<int64_t>> &dilations = {},
      const std::vector<std::vector<int64_t>> &inDilations = {}, const std::vector<std::vector<int64_t>> &pads = {},
      const std::vector<std::vector<int64_t>> &outPads = {}, const std::vector<std::vector<int64_t>> &strides = {},
      const std::vector<float> &availableMemoryProportions = {}, const std::vector<std::string> &partialsTypes = {},
      const std::optional<std::string> &planType = std::nullopt,
      const std::optional<int64_t> &perConvReservedTiles = std::nullopt,
      const std::optional<float> &cycleBackOff = std::nullopt, const std::vector<int64_t> &enableConvDithering = {},
      const std::string &name = "");

private:
  detail::BuilderImpl *impl_;
};

// ---- end of ai.graphcore opset 1 ---------------------------------------------------------------

/// Builds one ONNX graph (opset 13) in code.
class Builder {
public:
  static std::unique_ptr<Builder> create();
  ~Builder();
  Builder(const Builder &) = delete;
  Builder &operator=(const Builder &) = delete;

  /// Adds a graph input fed from the host.
  TensorId addInputTensor(const TensorInfo &info, const std::string &debugName = "");
  /// Adds an initializer holding \p info.byteCount() bytes copied from \p data.
  TensorId addInitializedInputTensor(const void *data, const TensorInfo &info, const std::string &debugName = "");
  template <typename T>
  TensorId addInitializedInputTensor(const std::vector<T> &data, const Shape &shape,
                                     const std::string &debugName = "") {
    TensorInfo info(hostDataType<T>(), shape);
    checkInitializerSize(static_cast<int64_t>(data.size()), info, debugName);
    return addInitializedInputTensor(data.data(), info, debugName);
  }
  /// Marks \p id as a graph output.
  void addOutputTensor(const TensorId &id);

  AiOnnxOpset13 aiOnnxOpset13();
  /// PopART's ai.graphcore operators (opset 1).
  AiGraphcoreOpset1 aiGraphcoreOpset1();

  /// -log(probs[label]) per sample, from {probs, label}; \p probs are probabilities (e.g. a
  /// softmax), \p label holds INT32 or INT64 class indices.
  TensorId nllloss(const std::vector<TensorId> &args, ReductionType reduction = ReductionType::Mean,
                   std::optional<int> ignoreIndex = std::nullopt, const std::string &debugName = "");
  /// \p lambda times the (reduced) absolute value of \p input.
  TensorId l1loss(const TensorId &input, float lambda, ReductionType reduction = ReductionType::Mean,
                  const std::string &debugName = "");
  /// The (reduced) value of \p input itself.
  TensorId identityloss(const TensorId &input, ReductionType reduction = ReductionType::Mean,
                        const std::string &debugName = "");

  /// Places the node that produces \p nodeOutputName on virtual graph \p value (PopART's
  /// `__ipu_number` attribute; docs/distributed.md, "Annotations").
  void virtualGraph(const TensorId &nodeOutputName, int64_t value = 0);
  /// Puts the node that produces \p nodeOutputName in pipeline stage \p value
  /// (`__pipeline_stage`).
  void pipelineStage(const TensorId &nodeOutputName, int64_t value);
  /// Marks the output of the node that produces \p nodeOutputName for recomputation in the
  /// backward pass (`__recompute_output_in_backward_pass`).
  void recomputeOutputInBackwardPass(const TensorId &nodeOutputName, RecomputeType value = RecomputeType::Recompute);

  std::vector<TensorId> getInputTensorIds() const;
  std::vector<TensorId> getOutputTensorIds() const;

  /// The serialized ModelProto.
  std::string getModelProto() const;
  /// Writes getModelProto() to \p path.
  void saveModelProto(const std::string &path) const;

private:
  Builder();
  void checkInitializerSize(int64_t count, const TensorInfo &info, const std::string &debugName) const;
  std::unique_ptr<detail::BuilderImpl> impl_;
};

} // namespace popart
