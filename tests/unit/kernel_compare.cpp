#include "kernel_compare.hpp"

#include "backend_cpu/kernel.hpp"
#include "core/dispatch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace popart::kernel_compare {

double maxRelDiff(const TensorData &a, const TensorData &b) {
  if (a.info().elementCount() != b.info().elementCount()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t i = 0; i < a.info().elementCount(); ++i)
    worst = worseOf(worst, relDiff(a.valueAsDouble(i), b.valueAsDouble(i)));
  return worst;
}

void expectProviderMatchesReference(backend_cpu::KernelProvider provider, const ir::Op &op, std::mt19937 &rng,
                                    const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                    double tolerance) {
  using backend_cpu::KernelProvider;
  std::vector<TensorData> inputs;
  std::vector<const void *> in;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    inputs.emplace_back(op.hasInput(i) ? op.inInfo(i) : TensorInfo(DataType::FLOAT, {0}));
    for (int64_t k = 0; k < inputs.back().info().elementCount(); ++k)
      inputs.back().as<float>()[k] = fill(i, rng);
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    in.push_back(op.hasInput(i) ? inputs[i].data() : nullptr);
  std::vector<TensorData> ref, out;
  std::vector<void *> refp, outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    if (!op.hasOutput(i)) { // omitted
      ref.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      out.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      refp.push_back(nullptr);
      outp.push_back(nullptr);
      continue;
    }
    ref.emplace_back(op.outInfo(i));
    out.emplace_back(op.outInfo(i));
    // Stale output values must not leak into the result: fill both with garbage first.
    for (int64_t k = 0; k < ref.back().info().elementCount(); ++k)
      ref.back().as<float>()[k] = out.back().as<float>()[k] = 1e6f;
    refp.push_back(ref.back().data());
    outp.push_back(out.back().data());
  }
  backend_cpu::createKernel(op, KernelProvider::Reference)->run({in.data(), in.size(), refp.data(), refp.size()});
  auto kernel = backend_cpu::createKernel(op, provider);
  kernel->run({in.data(), in.size(), outp.data(), outp.size()});
  kernel->run({in.data(), in.size(), outp.data(), outp.size()}); // a second run must not accumulate
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i)) {
      EXPECT_LT(maxRelDiff(out[i], ref[i]), tolerance)
          << op.type << " output " << i << " (" << backend_cpu::kernelProviderName(provider) << ")";
    }
}

namespace {

bool sixteenBit(DataType type) { return type == DataType::FLOAT16 || type == DataType::BFLOAT16; }

/// \p type with the 16-bit floating-point types made FLOAT.
DataType widened(DataType type) { return sixteenBit(type) ? DataType::FLOAT : type; }

/// Sets element \p i of \p t (of any numeric type) to \p v, converted (rounded to nearest even for
/// the 16-bit types).
void setValue(TensorData &t, int64_t i, double v) {
  dispatchAll(t.info().dataType(), "setValue", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      t.as<T>()[i] = T(static_cast<float>(v));
    else
      t.as<T>()[i] = static_cast<T>(v);
  });
}

/// \p t converted element by element to \p type (exact for widening a 16-bit float to FLOAT).
TensorData convertedTo(const TensorData &t, DataType type) {
  if (t.info().dataType() == type) return t;
  TensorData out(TensorInfo(type, t.info().shape()));
  for (int64_t i = 0; i < t.info().elementCount(); ++i)
    setValue(out, i, t.valueAsDouble(i));
  return out;
}

} // namespace

double unitRoundoff(DataType type) {
  switch (type) {
  case DataType::BFLOAT16: return std::ldexp(1.0, -8);
  case DataType::FLOAT16: return std::ldexp(1.0, -11);
  default: return std::ldexp(1.0, -24);
  }
}

Fp32Twin fp32Twin(const ir::Op &op) {
  Fp32Twin twin;
  twin.graph = std::make_unique<ir::Graph>();
  ir::Graph &g = *twin.graph;
  if (op.graph) g.opsets() = op.graph->opsets();
  std::vector<TensorId> ins, outs;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) {
      ins.emplace_back();
      continue;
    }
    ins.push_back("in" + std::to_string(i));
    const ir::Tensor &t = op.input(i);
    if (t.isConst())
      g.addConst(ins.back(), convertedTo(*t.data(), widened(t.info().dataType())));
    else
      g.addTensor(ins.back(), ir::TensorKind::Stream, TensorInfo(widened(t.info().dataType()), t.info().shape()));
  }
  for (size_t i = 0; i < op.outputCount(); ++i)
    outs.push_back(op.hasOutput(i) ? "out" + std::to_string(i) : std::string());
  ir::Op &twinOp = g.addOp(op.type, op.domain, op.version, op.name, op.attrs, ins, outs);
  twinOp.fusion = op.fusion;
  twinOp.def->setup(twinOp);
  for (size_t i = 0; i < op.outputCount(); ++i) // as the op's (LayerNormalization's FLOAT statistics...)
    if (op.hasOutput(i)) twinOp.setOutInfo(i, TensorInfo(widened(op.outInfo(i).dataType()), op.outInfo(i).shape()));
  twin.op = &twinOp;
  return twin;
}

void expectSixteenBitMatchesFp32Reference(backend_cpu::KernelProvider provider, const ir::Op &op, std::mt19937 &rng,
                                          const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                          double tolerance) {
  using backend_cpu::KernelProvider;
  Fp32Twin twin = fp32Twin(op);
  std::vector<TensorData> inputs, wide;
  std::vector<const void *> in, inWide;
  for (size_t i = 0; i < op.inputCount(); ++i) {
    if (!op.hasInput(i)) {
      inputs.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      wide.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      continue;
    }
    if (op.input(i).isConst()) {
      inputs.push_back(*op.input(i).data());
    } else {
      inputs.emplace_back(op.inInfo(i));
      for (int64_t k = 0; k < inputs.back().info().elementCount(); ++k)
        setValue(inputs.back(), k, fill(i, rng));
    }
    wide.push_back(convertedTo(inputs.back(), widened(op.inInfo(i).dataType())));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    in.push_back(op.hasInput(i) ? inputs[i].data() : nullptr);
    inWide.push_back(op.hasInput(i) ? wide[i].data() : nullptr);
  }
  std::vector<TensorData> ref, out;
  std::vector<void *> refp, outp;
  for (size_t i = 0; i < op.outputCount(); ++i) {
    if (!op.hasOutput(i)) { // omitted
      ref.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      out.emplace_back(TensorInfo(DataType::FLOAT, {0}));
      refp.push_back(nullptr);
      outp.push_back(nullptr);
      continue;
    }
    ref.emplace_back(twin.op->outInfo(i));
    out.emplace_back(op.outInfo(i));
    // Stale output values must not leak into the result: fill both with garbage first.
    for (int64_t k = 0; k < ref.back().info().elementCount(); ++k) {
      setValue(ref.back(), k, 1e4);
      setValue(out.back(), k, 1e4);
    }
    refp.push_back(ref.back().data());
    outp.push_back(out.back().data());
  }
  backend_cpu::createKernel(*twin.op, KernelProvider::Reference)
      ->run({inWide.data(), inWide.size(), refp.data(), refp.size()});
  auto kernel = backend_cpu::createKernel(op, provider);
  kernel->run({in.data(), in.size(), outp.data(), outp.size()});
  kernel->run({in.data(), in.size(), outp.data(), outp.size()}); // a second run must not accumulate
  for (size_t i = 0; i < op.outputCount(); ++i)
    if (op.hasOutput(i)) {
      EXPECT_LT(maxRelDiff(out[i], ref[i]), tolerance)
          << op.type << " output " << i << " of " << toString(op.outInfo(i).dataType()) << " ("
          << backend_cpu::kernelProviderName(provider) << ")";
    }
}

std::string declinedReasons(const backend_cpu::KernelChoice &choice) {
  std::string reasons;
  for (const auto &d : choice.declined)
    reasons += d + "; ";
  return reasons;
}

std::string expectDnnlDeclinesOnThisCpu(const ir::Op &op, DataType type) {
  backend_cpu::KernelChoice choice =
      backend_cpu::KernelRegistry::instance().choose(op, backend_cpu::KernelProvider::Dnnl);
  EXPECT_EQ(choice.entry, nullptr) << op.type << ": oneDNN took it though " << backend_cpu::dnnlComputesIn(type).reason;
  std::string reasons = declinedReasons(choice);
  const char *name = type == DataType::BFLOAT16 ? "bf16" : type == DataType::FLOAT16 ? "f16" : "f32";
  EXPECT_NE(reasons.find(name), std::string::npos) << op.type << ": " << reasons;
  EXPECT_NE(reasons.find("on this CPU"), std::string::npos) << op.type << ": " << reasons;
  return reasons;
}

void expectDnnlOrItsFallbackMatchesFp32Reference(const ir::Op &op, std::mt19937 &rng,
                                                 const std::function<float(size_t input, std::mt19937 &rng)> &fill,
                                                 double tolerance) {
  DataType type = op.inInfo(0).dataType();
  if (backend_cpu::dnnlComputesIn(type)) {
    backend_cpu::KernelChoice choice =
        backend_cpu::KernelRegistry::instance().choose(op, backend_cpu::KernelProvider::Dnnl);
    ASSERT_NE(choice.entry, nullptr) << op.type << " in " << toString(type)
                                     << ": oneDNN declined: " << choice.explanation();
    expectSixteenBitMatchesFp32Reference(backend_cpu::KernelProvider::Dnnl, op, rng, fill, tolerance);
    return;
  }
  expectDnnlDeclinesOnThisCpu(op, type);
  const backend_cpu::KernelEntry *fallback = backend_cpu::KernelRegistry::instance().find(op);
  ASSERT_NE(fallback, nullptr) << op.type << " in " << toString(type) << ": no kernel at all";
  expectSixteenBitMatchesFp32Reference(fallback->provider, op, rng, fill, tolerance);
}

} // namespace popart::kernel_compare
