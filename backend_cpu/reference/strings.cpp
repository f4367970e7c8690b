// Reference StringNormalizer. STRING tensors are passed to kernels as std::string arrays.

#include "ir/ops/strings.hpp"
#include "backend_cpu/kernel_families.hpp"
#include <popart/error.hpp>

#include <algorithm>
#include <map>

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

void registerReferenceTfIdfKernels(KernelRegistry &r);

void registerReferenceStringKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "StringNormalizer", KernelProvider::Reference, nullptr, makeKernel<StringNormalizerKernel>});
  registerReferenceTfIdfKernels(r);
}

} // namespace popart::backend_cpu

namespace popart::backend_cpu {

namespace {

/// TfIdfVectorizer over int32/int64 tokens; the pool's n-grams are hashed once at creation.
class TfIdfKernel : public Kernel {
public:
  explicit TfIdfKernel(const ir::Op &op) : type_(op.inInfo(0).dataType()) {
    if (type_ == DataType::STRING) throw error(op.debugName(), ": STRING input is not supported at run time");
    const Shape &s = op.inInfo(0).shape();
    rows_ = s.size() == 2 ? s[0] : 1;
    cols_ = s.back();
    width_ = op.outInfo(0).shape().back();
    minGram_ = op.attrs.getInt("min_gram_length");
    maxGram_ = op.attrs.getInt("max_gram_length");
    maxSkip_ = op.attrs.getInt("max_skip_count");
    mode_ = op.attrs.getString("mode");
    std::vector<int64_t> counts = op.attrs.getInts("ngram_counts");
    std::vector<int64_t> indexes = op.attrs.getInts("ngram_indexes");
    std::vector<int64_t> pool = op.attrs.getInts("pool_int64s", {});
    weights_ = op.attrs.getFloats("weights", {});
    int64_t gram = 0;
    // ngram_counts are the pool offsets where the n-grams of each length start: from the model,
    // so checked before they index the pool (a fuzzed count past the pool read out of bounds).
    for (size_t n = 0; n < counts.size(); ++n)
      if (counts[n] < 0 || counts[n] > static_cast<int64_t>(pool.size()) || (n > 0 && counts[n] < counts[n - 1]))
        throw error(op.debugName(), ": ngram_counts ", toString(counts), " must be non-decreasing offsets into a pool of ",
                    pool.size(), " values");
    for (size_t n = 0; n < counts.size(); ++n) {
      int64_t begin = counts[n], end = n + 1 < counts.size() ? counts[n + 1] : static_cast<int64_t>(pool.size());
      int64_t len = static_cast<int64_t>(n) + 1;
      for (int64_t p = begin; p + len <= end; p += len, ++gram) {
        if (gram >= static_cast<int64_t>(indexes.size()))
          throw error(op.debugName(), ": ngram_indexes is shorter than the pool");
        pool_[std::vector<int64_t>(pool.begin() + p, pool.begin() + p + len)] = gram;
      }
    }
    gramIndex_ = indexes;
    // From the model, so bounded by what can match before they size or drive a loop: no n-gram
    // of the pool is longer than counts.size(), and a skip past the row leaves no window.
    maxGram_ = std::min(maxGram_, static_cast<int64_t>(counts.size()));
    maxSkip_ = std::min(maxSkip_, cols_);
    key_.reserve(static_cast<size_t>(std::max<int64_t>(maxGram_, 0)));
    counts_.resize(static_cast<size_t>(width_));
  }

  void run(const KernelArgs &args) override {
    float *y = args.out<float>(0);
    for (int64_t r = 0; r < rows_; ++r) {
      std::fill(counts_.begin(), counts_.end(), 0.f);
      for (int64_t n = std::max<int64_t>(minGram_, 1); n <= maxGram_; ++n)
        for (int64_t skip = 0; skip <= (n == 1 ? 0 : maxSkip_); ++skip)
          for (int64_t i = 0; i + (n - 1) * (skip + 1) < cols_; ++i) {
            key_.clear();
            for (int64_t k = 0; k < n; ++k)
              key_.push_back(token(args, r * cols_ + i + k * (skip + 1)));
            auto it = pool_.find(key_);
            if (it != pool_.end()) counts_[static_cast<size_t>(gramIndex_[static_cast<size_t>(it->second)])] += 1.f;
          }
      for (int64_t j = 0; j < width_; ++j) {
        float c = counts_[static_cast<size_t>(j)];
        float w = weights_.empty() ? 1.f : weightFor(j);
        float v = mode_ == "TF" ? c : mode_ == "IDF" ? (c > 0 ? w : 0.f) : c * w;
        y[r * width_ + j] = v;
      }
    }
  }

private:
  int64_t token(const KernelArgs &args, int64_t i) const {
    return type_ == DataType::INT64 ? args.in<int64_t>(0)[i] : args.in<int32_t>(0)[i];
  }
  float weightFor(int64_t outIndex) const {
    // weights are per pool n-gram; find the n-gram mapped to this output.
    for (size_t g = 0; g < gramIndex_.size(); ++g)
      if (gramIndex_[g] == outIndex && g < weights_.size()) return weights_[g];
    return 1.f;
  }
  DataType type_;
  int64_t rows_, cols_, width_, minGram_, maxGram_, maxSkip_;
  std::string mode_;
  std::map<std::vector<int64_t>, int64_t> pool_;
  std::vector<int64_t> gramIndex_;
  std::vector<float> weights_, counts_;
  std::vector<int64_t> key_;
};

} // namespace

void registerReferenceTfIdfKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "TfIdfVectorizer", KernelProvider::Reference, nullptr, makeKernel<TfIdfKernel>});
}

} // namespace popart::backend_cpu
