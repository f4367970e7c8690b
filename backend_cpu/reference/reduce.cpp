// Reference kernels: Reduce family (Reduce*, ArgMax/ArgMin, CumSum, TopK), every numeric dtype:
// one row-major walk over the input, floats accumulated in double (the fast family has the f32
// ReduceSum/ReduceMean over [A, R, B]).

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/reduced_axes.hpp"
#include "core/dispatch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace popart::backend_cpu {

namespace {

/// Splits a shape around \p axis into [outer, n, inner] element counts.
void splitAt(const Shape &s, size_t axis, int64_t &outer, int64_t &n, int64_t &inner) {
  outer = 1;
  inner = 1;
  for (size_t d = 0; d < axis; ++d)
    outer *= s[d];
  n = s[axis];
  for (size_t d = axis + 1; d < s.size(); ++d)
    inner *= s[d];
}

/// Accumulator type: double for floats (accuracy), 64-bit integers for integers.
template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double,
                                 std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

enum class ReduceKind { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

ReduceKind reduceKind(const std::string &type) {
  if (type == "ReduceSum") return ReduceKind::Sum;
  if (type == "ReduceMean") return ReduceKind::Mean;
  if (type == "ReduceMax") return ReduceKind::Max;
  if (type == "ReduceMin") return ReduceKind::Min;
  if (type == "ReduceProd") return ReduceKind::Prod;
  if (type == "ReduceL1") return ReduceKind::L1;
  if (type == "ReduceL2") return ReduceKind::L2;
  if (type == "ReduceLogSum") return ReduceKind::LogSum;
  if (type == "ReduceLogSumExp") return ReduceKind::LogSumExp;
  if (type == "ReduceSumSquare") return ReduceKind::SumSquare;
  throw error("reference kernel: unknown reduction ", type);
}

template <typename T> class ReduceKernel : public Kernel {
  using A = acc_t<T>;

public:
  explicit ReduceKernel(const ir::Op &op) : kind_(reduceKind(op.type)) {
    bool identity = false;
    std::vector<bool> reduced = reducedAxes(op, identity);
    identity_ = identity;
    shape_ = op.inInfo(0).shape();
    inCount_ = op.inInfo(0).elementCount();
    outCount_ = op.outInfo(0).elementCount();
    // Output strides over the input's dimensions: 0 along reduced axes.
    outStrides_.assign(shape_.size(), 0);
    int64_t stride = 1;
    for (size_t d = shape_.size(); d-- > 0;) {
      if (reduced[d]) continue;
      outStrides_[d] = stride;
      stride *= shape_[d];
    }
    reducedCount_ = 1;
    for (size_t d = 0; d < shape_.size(); ++d)
      if (reduced[d]) reducedCount_ *= shape_[d];
    acc_.resize(static_cast<size_t>(outCount_));
    if (kind_ == ReduceKind::LogSumExp) maxes_.resize(static_cast<size_t>(outCount_));
    index_.resize(shape_.size());
  }

  void run(const KernelArgs &args) override {
    const T *x = args.in<T>(0);
    T *y = args.out<T>(0);
    if (identity_) {
      // noop_with_empty_axes: the spec makes the output the input, whatever the reduction.
      if (outCount_ > 0) std::memcpy(y, x, static_cast<size_t>(outCount_) * sizeof(T));
      return;
    }
    std::fill(acc_.begin(), acc_.end(), initial());
    if (kind_ == ReduceKind::LogSumExp) {
      std::fill(maxes_.begin(), maxes_.end(), lowest());
      walk([&](int64_t i, int64_t o) { maxes_[o] = combineMax(maxes_[o], load(x[i])); });
      walk([&](int64_t i, int64_t o) {
        A m = maxes_[o];
        if (!std::isinf(static_cast<double>(m)))
          acc_[o] += static_cast<A>(std::exp(static_cast<double>(load(x[i]) - m)));
      });
    } else {
      walk([&](int64_t i, int64_t o) { acc_[o] = accumulate(acc_[o], load(x[i])); });
    }
    for (int64_t o = 0; o < outCount_; ++o)
      y[o] = store(finish(o));
  }

private:
  static A load(T v) { return static_cast<A>(static_cast<compute_t<T>>(v)); }
  static T store(double v) {
    if constexpr (std::is_floating_point_v<compute_t<T>>)
      return static_cast<T>(static_cast<compute_t<T>>(v));
    else
      return static_cast<T>(static_cast<A>(v));
  }
  static A lowest() {
    if constexpr (std::is_floating_point_v<A>)
      return -std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<T>::lowest();
  }
  static A highest() {
    if constexpr (std::is_floating_point_v<A>)
      return std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<T>::max();
  }
  static A combineMax(A acc, A v) {
    if constexpr (std::is_floating_point_v<A>)
      if (std::isnan(v)) return v;
    return v > acc ? v : acc;
  }
  static A combineMin(A acc, A v) {
    if constexpr (std::is_floating_point_v<A>)
      if (std::isnan(v)) return v;
    return v < acc ? v : acc;
  }

  A initial() const {
    switch (kind_) {
    case ReduceKind::Max: return lowest();
    case ReduceKind::Min: return highest();
    case ReduceKind::Prod: return A(1);
    default: return A(0);
    }
  }

  A accumulate(A acc, A v) const {
    switch (kind_) {
    case ReduceKind::Max: return combineMax(acc, v);
    case ReduceKind::Min: return combineMin(acc, v);
    case ReduceKind::Prod: return acc * v;
    case ReduceKind::L1:
      if constexpr (std::is_signed_v<A>)
        return acc + (v < 0 ? -v : v);
      else
        return acc + v;
    case ReduceKind::L2:
    case ReduceKind::SumSquare: return acc + v * v;
    default: return acc + v;
    }
  }

  double finish(int64_t o) const {
    A a = acc_[static_cast<size_t>(o)];
    switch (kind_) {
    case ReduceKind::Mean:
      if constexpr (std::is_floating_point_v<A>)
        return a / static_cast<double>(reducedCount_);
      else if (reducedCount_ == 0)
        return 0.0;
      else {
        A mean = a / static_cast<A>(reducedCount_); // integer types: the truncated mean, as ONNX Runtime
        return static_cast<double>(mean);
      }
    case ReduceKind::L2: return std::sqrt(static_cast<double>(a));
    case ReduceKind::LogSum: return std::log(static_cast<double>(a));
    case ReduceKind::LogSumExp: {
      double m = static_cast<double>(maxes_[static_cast<size_t>(o)]);
      if (std::isinf(m)) return m; // all -inf (or empty), or some +inf
      return m + std::log(static_cast<double>(a));
    }
    default: return static_cast<double>(a);
    }
  }

  /// Calls f(inputOffset, outputOffset) for every input element, in row-major order.
  template <typename F> void walk(F &&f) {
    if (inCount_ == 0) return;
    size_t rank = shape_.size();
    if (rank == 0) {
      f(0, 0);
      return;
    }
    std::fill(index_.begin(), index_.end(), 0);
    int64_t inner = shape_[rank - 1], innerStride = outStrides_[rank - 1];
    int64_t in = 0, out = 0;
    while (true) {
      for (int64_t j = 0; j < inner; ++j)
        f(in + j, out + j * innerStride);
      in += inner;
      int64_t d = static_cast<int64_t>(rank) - 2;
      for (; d >= 0; --d) {
        size_t u = static_cast<size_t>(d);
        out += outStrides_[u];
        if (++index_[u] < shape_[u]) break;
        out -= outStrides_[u] * shape_[u];
        index_[u] = 0;
      }
      if (d < 0) break;
    }
  }

  ReduceKind kind_;
  bool identity_ = false;
  Shape shape_;
  std::vector<int64_t> outStrides_;
  int64_t inCount_ = 0, outCount_ = 0, reducedCount_ = 1;
  std::vector<A> acc_, maxes_;
  std::vector<int64_t> index_;
};

std::unique_ptr<Kernel> createReduce(const ir::Op &op) {
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<ReduceKernel<T>>(op);
  });
}

/// Orders values for the arg-extremum and TopK: NaN above everything, as numpy sorts it last.
template <typename C> bool greaterThan(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a)) return !std::isnan(b);
    if (std::isnan(b)) return false;
  }
  return a > b;
}

template <typename T> class ArgKernel : public Kernel {
  using C = compute_t<T>;

public:
  explicit ArgKernel(const ir::Op &op) {
    const Shape &s = op.inInfo(0).shape();
    int64_t axis = op.attrs.getInt("axis", 0);
    if (axis < 0) axis += static_cast<int64_t>(s.size());
    splitAt(s, static_cast<size_t>(axis), outer_, n_, inner_);
    max_ = op.type == "ArgMax";
    last_ = op.attrs.getInt("select_last_index", 0) != 0;
  }
  void run(const KernelArgs &args) override {
    const T *x = args.in<T>(0);
    int64_t *y = args.out<int64_t>(0);
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < inner_; ++i) {
        const T *p = x + o * n_ * inner_ + i;
        int64_t best = 0;
        C bv = static_cast<C>(p[0]);
        for (int64_t k = 1; k < n_; ++k) {
          C v = static_cast<C>(p[k * inner_]);
          bool better = max_ ? greaterThan(v, bv) : greaterThan(bv, v);
          bool tie = !greaterThan(v, bv) && !greaterThan(bv, v);
          if (better || (last_ && tie)) {
            best = k;
            bv = v;
          }
        }
        y[o * inner_ + i] = best;
      }
  }

private:
  int64_t outer_ = 1, n_ = 1, inner_ = 1;
  bool max_ = true, last_ = false;
};

std::unique_ptr<Kernel> createArg(const ir::Op &op) {
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<ArgKernel<T>>(op);
  });
}

template <typename T> class CumSumKernel : public Kernel {
  using A = acc_t<T>;

public:
  explicit CumSumKernel(const ir::Op &op)
      : shape_(op.inInfo(0).shape()), axisType_(op.inInfo(1).dataType()), name_(op.debugName()) {
    exclusive_ = op.attrs.getInt("exclusive", 0) != 0;
    reverse_ = op.attrs.getInt("reverse", 0) != 0;
  }
  void run(const KernelArgs &args) override {
    // The axis is a run-time input: it does not change the output shape.
    int64_t axis = axisType_ == DataType::INT32 ? args.in<int32_t>(1)[0] : args.in<int64_t>(1)[0];
    int64_t rank = static_cast<int64_t>(shape_.size());
    if (axis < -rank || axis >= rank) throw error(name_, ": axis ", axis, " is out of range for rank ", rank);
    if (axis < 0) axis += rank;
    int64_t outer, n, inner;
    splitAt(shape_, static_cast<size_t>(axis), outer, n, inner);
    const T *x = args.in<T>(0);
    T *y = args.out<T>(0);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t base = o * n * inner + i;
        A acc = 0;
        for (int64_t j = 0; j < n; ++j) {
          int64_t k = reverse_ ? n - 1 - j : j;
          A v = static_cast<A>(static_cast<compute_t<T>>(x[base + k * inner]));
          if (!exclusive_) acc += v;
          y[base + k * inner] = static_cast<T>(static_cast<compute_t<T>>(acc));
          if (exclusive_) acc += v;
        }
      }
  }

private:
  Shape shape_;
  DataType axisType_;
  std::string name_;
  bool exclusive_ = false, reverse_ = false;
};

std::unique_ptr<Kernel> createCumSum(const ir::Op &op) {
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<CumSumKernel<T>>(op);
  });
}

template <typename T> class TopKKernel : public Kernel {
  using C = compute_t<T>;

public:
  explicit TopKKernel(const ir::Op &op) {
    const Shape &s = op.inInfo(0).shape();
    int64_t axis = op.attrs.getInt("axis", -1);
    if (axis < 0) axis += static_cast<int64_t>(s.size());
    splitAt(s, static_cast<size_t>(axis), outer_, n_, inner_);
    k_ = op.outInfo(0).shape()[static_cast<size_t>(axis)];
    largest_ = op.attrs.getInt("largest", 1) != 0;
    order_.resize(static_cast<size_t>(n_));
    values_.resize(static_cast<size_t>(n_));
  }
  void run(const KernelArgs &args) override {
    const T *x = args.in<T>(0);
    T *values = args.out<T>(0);
    int64_t *indices = args.hasOutput(1) ? args.out<int64_t>(1) : nullptr;
    // Ties keep the lower index first, so the order is total and the result deterministic.
    auto before = [&](int64_t a, int64_t b) {
      C va = values_[static_cast<size_t>(a)], vb = values_[static_cast<size_t>(b)];
      if (largest_ ? greaterThan(va, vb) : greaterThan(vb, va)) return true;
      if (largest_ ? greaterThan(vb, va) : greaterThan(va, vb)) return false;
      return a < b;
    };
    for (int64_t o = 0; o < outer_; ++o)
      for (int64_t i = 0; i < inner_; ++i) {
        const T *p = x + o * n_ * inner_ + i;
        for (int64_t j = 0; j < n_; ++j) {
          values_[static_cast<size_t>(j)] = static_cast<C>(p[j * inner_]);
          order_[static_cast<size_t>(j)] = j;
        }
        std::partial_sort(order_.begin(), order_.begin() + k_, order_.end(), before);
        int64_t base = o * k_ * inner_ + i;
        for (int64_t j = 0; j < k_; ++j) {
          int64_t src = order_[static_cast<size_t>(j)];
          values[base + j * inner_] = p[src * inner_];
          if (indices) indices[base + j * inner_] = src;
        }
      }
  }

private:
  int64_t outer_ = 1, n_ = 1, inner_ = 1, k_ = 0;
  bool largest_ = true;
  std::vector<int64_t> order_;
  std::vector<C> values_;
};

std::unique_ptr<Kernel> createTopK(const ir::Op &op) {
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<TopKKernel<T>>(op);
  });
}

} // namespace

void registerReferenceReduceKernels(KernelRegistry &r) {
  for (const char *t : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, createReduce});
  for (const char *t : {"ArgMax", "ArgMin"})
    r.add({"ai.onnx", t, KernelProvider::Reference, nullptr, createArg});
  r.add({"ai.onnx", "CumSum", KernelProvider::Reference, nullptr, createCumSum});
  r.add({"ai.onnx", "TopK", KernelProvider::Reference, nullptr, createTopK});
}

} // namespace popart::backend_cpu
