// Reference StringNormalizer. STRING tensors are passed to kernels as std::string arrays.

#include "backend_cpu/kernel_families.hpp"
#include "ir/ops/strings.hpp"
#include <popart/error.hpp>

#include <algorithm>

namespace popart::backend_cpu {

namespace {

class StringNormalizerKernel : public Kernel {
public:
  explicit StringNormalizerKernel(const ir::Op &op)
      : attrs_(op.attrs), count_(op.inInfo(0).elementCount()), outCount_(op.outInfo(0).elementCount()) {}
  void run(const KernelArgs &args) override {
    // Runs at compile time only (the input is a value input), so building vectors is fine here.
    const auto *in = args.in<std::string>(0);
    auto out = ir::normalizeStrings(std::vector<std::string>(in, in + count_), attrs_);
    if (static_cast<int64_t>(out.size()) != outCount_) throw error("StringNormalizer: input changed after compilation");
    std::copy(out.begin(), out.end(), args.out<std::string>(0));
  }

private:
  ir::Attributes attrs_;
  int64_t count_, outCount_;
};

} // namespace

void registerReferenceStringKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "StringNormalizer", KernelProvider::Reference, nullptr, makeKernel<StringNormalizerKernel>});
}

} // namespace popart::backend_cpu
