#pragma once
// Shared oneDNN engine and stream, and helpers to describe tensors to oneDNN.

#include "backend_cpu/kernel.hpp"

#include <oneapi/dnnl/dnnl.hpp>
#include <popart/tensorinfo.hpp>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace popart::ir {
struct FusedActivation;
}

namespace popart::backend_cpu::dnnl_util {

/// The CPU engine, created once.
dnnl::engine &engine();
/// The stream all primitives run on; thread-local so concurrent sessions do not share it.
dnnl::stream &stream();
/// oneDNN dims of \p shape (a scalar becomes {1}).
dnnl::memory::dims toDims(const Shape &shape);
/// Plain row-major strides for \p dims.
dnnl::memory::dims plainStrides(const dnnl::memory::dims &dims);
/// ONNX convolution weights of shape \p w as oneDNN's ([g,] oc, ic, k...) of \p type over the
/// same buffer: a Conv's (M, C/g, k...), already (g, M/g, C/g, k...) row-major, or (\p transposed)
/// a ConvTranspose's (C, M/g, k...), whose oc and ic axes are swapped.
dnnl::memory::desc convWeightsDesc(const Shape &w, int64_t group, bool transposed, dnnl::memory::data_type type);
/// \p act as oneDNN eltwise post-ops appended to \p po (oneDNN 2.6 has no hard sigmoid: a linear
/// one, then a clip).
void appendActivation(dnnl::post_ops &po, const ir::FusedActivation &act);
/// Executes \p prim with \p args. The C++ API builds an argument vector on every call; this
/// builds it into \p cache on the first call only (the memories are handles whose data
/// pointers kernels update), so later runs allocate nothing.
void execute(const dnnl::primitive &prim, std::vector<dnnl_exec_arg_t> &cache,
             std::initializer_list<std::pair<int, dnnl::memory>> args);
/// Whether every present input of \p op is FLOAT.
bool inputsFloat(const ir::Op &op);
/// Whether every present input and output 0 of \p op are FLOAT.
bool allFloat(const ir::Op &op);

/// oneDNN's data type for \p type: FLOAT f32, BFLOAT16 bf16, FLOAT16 f16; none for the others.
std::optional<dnnl::memory::data_type> dnnlType(DataType type);
/// dnnlType of \p info, which a capability check accepted; throws naming the type otherwise.
dnnl::memory::data_type dnnlType(const TensorInfo &info);
/// oneDNN's name of \p type ("f32", "bf16", "f16").
const char *dnnlTypeName(dnnl::memory::data_type type);
/// Why \p op's present inputs (and its present outputs, with \p outputs) are not all of one
/// floating-point type oneDNN knows (FLOAT, BFLOAT16, FLOAT16); "" if they are.
std::string notOneFloatType(const ir::Op &op, bool outputs = true);
/// The decline for a primitive \p what ("matmul") of which oneDNN has no implementation for
/// \p type: "oneDNN 2.6 has no f16 matmul on this CPU".
Support noImplementation(const char *what, dnnl::memory::data_type type);
/// The decline for a pd (created with allow_empty) that is missing, or that is oneDNN's
/// reference code for a 16-bit \p type (as slow as ours, without its exact rounding); yes
/// otherwise.
template <typename PD> Support implementationFor(const PD &pd, const char *what, dnnl::memory::data_type type) {
  if (!pd) return noImplementation(what, type);
  if (type != dnnl::memory::data_type::f32 && std::string(pd.impl_info_str()).rfind("ref", 0) == 0)
    return Support::no(std::string("oneDNN 2.6 has only its reference ") + dnnlTypeName(type) + " " + what +
                       " on this CPU");
  return Support::yes();
}

/// A plain row-major f32 memory descriptor for \p shape, padded with leading 1s to \p rank.
dnnl::memory::desc plainDesc(const Shape &shape, size_t rank,
                             dnnl::memory::data_type type = dnnl::memory::data_type::f32);
/// plainDesc of \p info's shape in its data type.
inline dnnl::memory::desc plainDesc(const TensorInfo &info, size_t rank) {
  return plainDesc(info.shape(), rank, dnnlType(info));
}

/// A small tensor (scale, shift, statistics: per channel or per row) that oneDNN 2.6 takes in f32
/// only, while the op's tensor may be 16-bit: then it goes through f32 memory of the kernel's own,
/// allocated at creation. A FLOAT tensor is used in place.
class F32Staging {
public:
  F32Staging() = default;
  /// For a tensor of \p type with \p count elements.
  F32Staging(DataType type, int64_t count);
  /// Whether the tensor is 16-bit (it goes through the owned buffer).
  bool staged() const { return type_ != DataType::FLOAT; }
  /// The f32 values of input \p data: \p data itself, or widened into the owned buffer.
  float *widen(const void *data);
  /// Where oneDNN writes the f32 values of output \p data: \p data itself, or the owned
  /// buffer (narrow(data) stores it then).
  float *target(void *data);
  /// Stores the owned buffer into output \p data (nothing for a FLOAT one).
  void narrow(void *data) const;
  /// The owned buffer (empty for a FLOAT tensor).
  float *owned() { return buffer_.data(); }

private:
  DataType type_ = DataType::FLOAT;
  std::vector<float> buffer_;
};

/// The types of a MatMul or Gemm oneDNN can run: A and B both FLOAT, BFLOAT16 or FLOAT16, Y and
/// each present input of \p extraInputs (bias, residual, C) in their type or FLOAT, and no 16-bit
/// partial sums (fp16.16's internal_attr::kHalfPartials, which only the reference kernel rounds).
Support productTypes(const ir::Op &op, std::initializer_list<size_t> extraInputs);

/// Whether ONNX Conv weights of shape \p w with \p group groups make a pointwise convolution
/// (ungrouped, every kernel extent 1).
bool pointwiseWeights(const Shape &w, int64_t group);

/// \p md with its layout left to the primitive (format_tag::any).
dnnl::memory::desc anyLayout(const dnnl::memory::desc &md);

/// Whether \p pd's implementation name starts with \p prefix ("ref", "brg"...).
template <typename PD> bool implIs(const PD &pd, const char *prefix) {
  return std::string(pd.impl_info_str()).rfind(prefix, 0) == 0;
}

/// Steps \p pd past oneDNN 2.6's brgconv implementations, which allocate on every execution.
template <typename PD> void skipBrgconv(PD &pd) {
  while (implIs(pd, "brg") && pd.next_impl()) {
  }
}

/// The decline for a reorder \p pd of \p type data ("to f32" in \p what) that is oneDNN 2.6's C++
/// loop (simple:any, its only 16-bit reorder on CPUs without AVX-512): it goes through float and
/// turns −0 into +0, where a Cast or Transpose must move every bit pattern exactly. Yes otherwise.
template <typename PD> Support exactReorder(const PD &pd, dnnl::memory::data_type type, const std::string &what) {
  if (type != dnnl::memory::data_type::f32 && implIs(pd, "simple"))
    return Support::no(std::string("oneDNN 2.6 has only its C++ loop ") + dnnlTypeName(type) + " " + what +
                       " reorder on this CPU, which turns -0 into +0");
  return Support::yes();
}

/// A reorder from \p from to \p to that needs no scratchpad at run time (oneDNN's library
/// scratchpad mode would allocate one on every execution); throws if it would need one.
dnnl::reorder userScratchReorder(const dnnl::memory &from, const dnnl::memory &to);

/// Weights kept in the layout a primitive chose for them, in memory of the kernel's own: constant
/// ones are reordered from the op's buffer on the first run (and again only if the buffer moves),
/// others on every run.
class PackedWeights {
public:
  /// Packs when \p chosen differs from the desc of \p stored (the weights as stored).
  void init(const dnnl::memory &stored, const dnnl::memory::desc &chosen, bool constant);
  explicit operator bool() const { return static_cast<bool>(packed_); }
  /// The weights for DNNL_ARG_WEIGHTS; \p stored holds the op's buffer \p data.
  const dnnl::memory &get(const dnnl::memory &stored, const void *data);

private:
  dnnl::memory packed_;
  dnnl::reorder pack_;
  std::vector<dnnl_exec_arg_t> args_;
  const void *packedFrom_ = nullptr;
  bool constant_ = true;
};

/// A kernel that runs one primitive from input 0 (SRC) to output 0 (DST): eltwise, softmax,
/// reduction, pooling without indices...
class SrcDstKernel : public Kernel {
public:
  /// \p inPlace: the primitive may write dst over src (oneDNN's eltwise may).
  SrcDstKernel(dnnl::primitive prim, const dnnl::memory::desc &src, const dnnl::memory::desc &dst,
               bool inPlace = false);
  void run(const KernelArgs &args) override;
  int inPlaceInput() const override { return inPlace_ ? 0 : -1; }

private:
  dnnl::primitive prim_;
  std::vector<dnnl_exec_arg_t> args_;
  dnnl::memory src_, dst_;
  bool inPlace_ = false;
};

/// The channel block of \p md when it is plain NCHW f32 (1) or NCHW with channels blocked by 8
/// or 16 innermost (aBcd8b, aBcd16b) and nothing else padded; 0 for any other layout.
int64_t channelBlock(const dnnl::memory::desc &md);

} // namespace popart::backend_cpu::dnnl_util
