#pragma once
// The names of the runtime's internal attributes (see OpDef::internalAttributes): code reads and
// writes them through these constants, so a misspelt name fails to compile; the verifier
// rejects one an op's definition does not declare, and the importer refuses them on a model.

namespace popart::ir::internal_attr {

/// If, Loop, Scan, SequenceMap (the importer): the outer-scope tensors their subgraphs read,
/// appended as inputs after the op's own.
inline constexpr const char *kCaptures = "popart_captures";
/// Loop (unrollLoops): why the Loop was kept, for autodiff's error message.
inline constexpr const char *kNotUnrolled = "popart_not_unrolled";
/// Dropout (its gradient rule): the forward op's salt, so the gradient redraws the same mask.
inline constexpr const char *kSalt = "popart_salt";
/// BatchNormalization (training): 1 updates the running variance with the unbiased variance.
inline constexpr const char *kUnbiasedRunningVar = "popart_unbiased_running_var";
/// RNN, GRU, LSTM (training): bytes of the saved-state output the grad op reads.
inline constexpr const char *kSavedBytes = "popart_saved_bytes";
/// MatMul, Gemm (convertPrecision, fp16.16): 1 rounds the partial sums of the product to the
/// operands' 16-bit type after every addition (PopART's partialsType half).
inline constexpr const char *kHalfPartials = "popart_half_partials";
/// RNNGrad, GRUGrad, LSTMGrad: the id of their forward op.
inline constexpr const char *kForward = "popart_forward";

} // namespace popart::ir::internal_attr
