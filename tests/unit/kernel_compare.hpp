#pragma once
// oneDNN and fast kernels checked against the reference kernels of the same op on random fp32 data,
// and kernels of ops in FLOAT16/BFLOAT16 against the fp32 reference kernel of the op's fp32 twin.

#include "backend_cpu/kernel.hpp"
#include "ir/graph.hpp"
#include "ir/op.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>

namespace popart::kernel_compare {

/// |got − want| / (1 + |want|): relative, absolute near 0. NaN if either is NaN or an infinity.
inline double relDiff(double got, double want) { return std::fabs(got - want) / (1.0 + std::fabs(want)); }

/// The larger of \p worst and \p diff, where a NaN \p diff (a NaN or infinite value compared) is
/// infinitely large: std::max(worst, NaN) returns worst, so a kernel writing NaN would pass.
inline double worseOf(double worst, double diff) {
  return std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
}

/// max relDiff(a, b) over two tensors of any floating-point type; infinite if any element of either
/// is NaN or infinite, or if their element counts differ, so that every comparison against a
/// tolerance fails then.
double maxRelDiff(const TensorData &a, const TensorData &b);

/// Runs \p op (set up, fp32; omitted inputs and outputs are null) with the reference kernel and with \p provider's
/// (oneDNN's or a fast one) on the same inputs, input i's values drawn by \p fill(i, rng); the tested kernel runs
/// twice (a second run must not accumulate) and both kernels' outputs start as garbage. Expects every output to
/// agree within \p tolerance relative; fails if \p provider has no kernel that accepts the op.
void expectProviderMatchesReference(backend_cpu::KernelProvider provider, const ir::Op &op, std::mt19937 &rng,
                                    const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                    double tolerance = 1e-4);

/// expectProviderMatchesReference for oneDNN.
inline void expectDnnlMatchesReference(const ir::Op &op, std::mt19937 &rng,
                                       const std::function<float(size_t input, std::mt19937 &rng)> &fill) {
  expectProviderMatchesReference(backend_cpu::KernelProvider::Dnnl, op, rng, fill);
}

/// The unit roundoff of a 16-bit floating-point type: 2^-8 for BFLOAT16 (8 significant bits),
/// 2^-11 for FLOAT16 (11); 2^-24 for FLOAT.
double unitRoundoff(DataType type);

/// Tolerance of a \p type result against fp32 where each output sums \p reductionLength rounded
/// terms (the 16-bit inputs are exact in both, so the error is the kernel's own: fp32 accumulation of
/// products, and 16-bit intermediates for kernels that round between steps, which grow about as
/// √K when they are independent): \p c · ε · √K, plus ε twice for the rounding of the output and
/// of one intermediate.
inline double sixteenBitTolerance(DataType type, int64_t reductionLength = 1, double c = 2.0) {
  double eps = unitRoundoff(type);
  return c * eps * std::sqrt(static_cast<double>(std::max<int64_t>(reductionLength, 1))) + 2 * eps;
}

/// The fp32 twin of \p op: the same op (type, domain, version, attributes, fusion) in a graph of its
/// own, in which every FLOAT16 or BFLOAT16 tensor is FLOAT (constants widened exactly), every other
/// tensor as in \p op.
struct Fp32Twin {
  std::unique_ptr<ir::Graph> graph;
  ir::Op *op = nullptr;
};
Fp32Twin fp32Twin(const ir::Op &op);

/// Runs \p op (set up; some of its tensors FLOAT16 or BFLOAT16) with \p provider's kernel, and its
/// fp32 twin with the reference kernel on the same inputs widened exactly (input i's values drawn by
/// \p fill(i, rng) and rounded to the input's type first); the tested kernel runs twice and both
/// kernels' outputs start as garbage. Expects every output, widened, to agree with the twin's within
/// \p tolerance relative (maxRelDiff: NaN and infinities fail); fails if \p provider has no kernel
/// that accepts \p op.
void expectSixteenBitMatchesFp32Reference(backend_cpu::KernelProvider provider, const ir::Op &op, std::mt19937 &rng,
                                          const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                          double tolerance);

/// The reasons \p choice gives for each provider it passed over, joined by "; ".
std::string declinedReasons(const backend_cpu::KernelChoice &choice);

/// Expects oneDNN to decline \p op because it does not compute in \p type on this CPU: its reasons
/// name the type as oneDNN does ("bf16") and "on this CPU" (an AVX2-only CPU, where
/// backend_cpu::dnnlComputesIn(\p type) says no). \returns the reasons.
std::string expectDnnlDeclinesOnThisCpu(const ir::Op &op, DataType type);

/// The check of a 16-bit oneDNN kernel on every CPU. Where oneDNN computes in \p op's input 0 type
/// here (backend_cpu::dnnlComputesIn): expects oneDNN's kernel to take \p op and match the fp32
/// reference (expectSixteenBitMatchesFp32Reference). Where it does not: expects oneDNN to decline
/// saying so (expectDnnlDeclinesOnThisCpu), and the kernel a session runs instead (fast or
/// reference) to match the fp32 reference within the same \p tolerance.
void expectDnnlOrItsFallbackMatchesFp32Reference(const ir::Op &op, std::mt19937 &rng,
                                                 const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                                 double tolerance);

} // namespace popart::kernel_compare
