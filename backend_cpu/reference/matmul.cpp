// Reference MatMul (numpy batching and broadcasting) and Gemm.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "core/dispatch.hpp"

namespace popart::backend_cpu {

namespace {

class MatMulKernel : public Kernel {
public:
  explicit MatMulKernel(const ir::Op &op) : type_(op.outInfo(0).dataType()) {
    Shape a = op.inInfo(0).shape(), b = op.inInfo(1).shape();
    // Stored transposed (popart_transA/B): element (i, p) of A is at p·m + i instead of i·k + p.
    transA_ = op.attrs.getInt("popart_transA", 0) != 0 && a.size() >= 2;
    transB_ = op.attrs.getInt("popart_transB", 0) != 0 && b.size() >= 2;
    scale_ = op.attrs.getFloat("popart_scale", 1.f);
    relu_ = op.attrs.getString("popart_activation", "") == "Relu";
    if (transA_) std::swap(a[a.size() - 1], a[a.size() - 2]);
    if (transB_) std::swap(b[b.size() - 1], b[b.size() - 2]);
    if (a.size() == 1) a.insert(a.begin(), 1);
    if (b.size() == 1) b.push_back(1);
    m_ = a[a.size() - 2];
    k_ = a.back();
    n_ = b.back();
    Shape batchA(a.begin(), a.end() - 2), batchB(b.begin(), b.end() - 2);
    size_t rank = std::max(batchA.size(), batchB.size());
    while (batchA.size() < rank)
      batchA.insert(batchA.begin(), 1);
    while (batchB.size() < rank)
      batchB.insert(batchB.begin(), 1);
    Shape batch(rank);
    for (size_t i = 0; i < rank; ++i)
      batch[i] = std::max(batchA[i], batchB[i]);
    batches_ = shapeElementCount(batch);
    // Offsets of each batch's A and B matrix, computed once.
    BroadcastWalker w(batch, {batchA, batchB});
    for (int64_t i = 0; i < batches_; ++i, w.next()) {
      offsetA_.push_back(w.offset(0) * m_ * k_);
      offsetB_.push_back(w.offset(1) * k_ * n_);
    }
  }

  void run(const KernelArgs &args) override {
    dispatchNumeric(type_, "MatMul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T *a = args.in<T>(0);
      const T *b = args.in<T>(1);
      T *y = args.out<T>(0);
      const T *bias = args.hasInput(2) ? args.in<T>(2) : nullptr;     // fused by fuseMatMulBias
      const T *residual = args.hasInput(3) ? args.in<T>(3) : nullptr; // fused by fuseMatMulResidual
      const auto scale = static_cast<C>(scale_);                    // fused by fuseMatMulScale
      for (int64_t bi = 0; bi < batches_; ++bi) {
        const T *pa = a + offsetA_[bi];
        const T *pb = b + offsetB_[bi];
        T *py = y + bi * m_ * n_;
        for (int64_t i = 0; i < m_; ++i)
          for (int64_t j = 0; j < n_; ++j) {
            C acc = bias ? static_cast<C>(bias[j]) : C(0);
            for (int64_t p = 0; p < k_; ++p)
              acc += static_cast<C>(pa[transA_ ? p * m_ + i : i * k_ + p]) *
                     static_cast<C>(pb[transB_ ? j * k_ + p : p * n_ + j]);
            C v = scale_ == 1.f ? acc : acc * scale;
            if (relu_ && v < C(0)) v = C(0); // fused by fuseRelu; NaN stays NaN
            if (residual) v += static_cast<C>(residual[bi * m_ * n_ + i * n_ + j]);
            py[i * n_ + j] = static_cast<T>(v);
          }
      }
    });
  }

private:
  DataType type_;
  float scale_ = 1.f;
  bool relu_ = false; ///< fuseRelu
  bool transA_ = false, transB_ = false;
  int64_t m_, k_, n_, batches_;
  std::vector<int64_t> offsetA_, offsetB_;
};

class GemmKernel : public Kernel {
public:
  explicit GemmKernel(const ir::Op &op)
      : type_(op.outInfo(0).dataType()), transA_(op.attrs.getInt("transA", 0) != 0),
        transB_(op.attrs.getInt("transB", 0) != 0), alpha_(op.attrs.getFloat("alpha", 1.f)),
        beta_(op.attrs.getFloat("beta", 1.f)), relu_(op.attrs.getString("popart_activation", "") == "Relu") {
    m_ = op.outInfo(0).dim(0);
    n_ = op.outInfo(0).dim(1);
    k_ = transA_ ? op.inInfo(0).dim(0) : op.inInfo(0).dim(1);
    if (op.hasInput(2)) cStrides_ = broadcastStrides(op.inInfo(2).shape(), {m_, n_});
  }

  void run(const KernelArgs &args) override {
    dispatchNumeric(type_, "Gemm", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      const T *a = args.in<T>(0);
      const T *b = args.in<T>(1);
      const T *c = args.hasInput(2) ? args.in<T>(2) : nullptr;
      T *y = args.out<T>(0);
      for (int64_t i = 0; i < m_; ++i)
        for (int64_t j = 0; j < n_; ++j) {
          C acc = 0;
          for (int64_t p = 0; p < k_; ++p) {
            C av = static_cast<C>(transA_ ? a[p * m_ + i] : a[i * k_ + p]);
            C bv = static_cast<C>(transB_ ? b[j * k_ + p] : b[p * n_ + j]);
            acc += av * bv;
          }
          C v = static_cast<C>(alpha_) * acc;
          if (c) v += static_cast<C>(beta_) * static_cast<C>(c[i * cStrides_[0] + j * cStrides_[1]]);
          if (relu_ && v < C(0)) v = C(0); // fused by fuseRelu; NaN stays NaN
          y[i * n_ + j] = static_cast<T>(v);
        }
    });
  }

private:
  DataType type_;
  bool transA_, transB_;
  float alpha_, beta_;
  bool relu_;
  int64_t m_, n_, k_;
  std::vector<int64_t> cStrides_;
};

} // namespace

void registerReferenceMatMulKernels(KernelRegistry &r) {
  r.add({"ai.onnx", "MatMul", KernelProvider::Reference, nullptr, makeKernel<MatMulKernel>});
  r.add({"ai.onnx", "Gemm", KernelProvider::Reference, nullptr, makeKernel<GemmKernel>});
}

} // namespace popart::backend_cpu
