// Reference kernels for the elementwise family: plain loops, every dtype the op allows.

#include "backend_cpu/kernel_families.hpp"
#include "backend_cpu/reference/broadcast.hpp"
#include "backend_cpu/reference/loop_kernel.hpp"
#include "core/dispatch.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

namespace popart::backend_cpu {

namespace {

// Op types are resolved to a Code once, when the kernel is created, so the per-element
// loops switch on an enum instead of comparing strings.
enum class Code {
  Unknown,
  Abs,
  Acos,
  Acosh,
  Add,
  And,
  Asin,
  Asinh,
  Atan,
  Atanh,
  Ceil,
  Celu,
  Cos,
  Cosh,
  Div,
  Elu,
  Equal,
  Erf,
  Exp,
  Gelu,
  Floor,
  Greater,
  GreaterOrEqual,
  HardSigmoid,
  HardSwish,
  Identity,
  IsNaN,
  LeakyRelu,
  Less,
  LessOrEqual,
  Log,
  Max,
  Mean,
  Min,
  Mod,
  Mul,
  Neg,
  Or,
  Reciprocal,
  Relu,
  Round,
  Selu,
  Shrink,
  Sigmoid,
  Sign,
  Sin,
  Sinh,
  Softplus,
  Softsign,
  Sqrt,
  Sub,
  Sum,
  Tan,
  Tanh,
  ThresholdedRelu
};

Code codeOf(const std::string &name) {
  static const std::map<std::string, Code> codes{
      {"Abs", Code::Abs},
      {"Acos", Code::Acos},
      {"Acosh", Code::Acosh},
      {"Add", Code::Add},
      {"And", Code::And},
      {"Asin", Code::Asin},
      {"Asinh", Code::Asinh},
      {"Atan", Code::Atan},
      {"Atanh", Code::Atanh},
      {"Ceil", Code::Ceil},
      {"Celu", Code::Celu},
      {"Cos", Code::Cos},
      {"Cosh", Code::Cosh},
      {"Div", Code::Div},
      {"Elu", Code::Elu},
      {"Equal", Code::Equal},
      {"Erf", Code::Erf},
      {"Gelu", Code::Gelu},
      {"Exp", Code::Exp},
      {"Floor", Code::Floor},
      {"Greater", Code::Greater},
      {"GreaterOrEqual", Code::GreaterOrEqual},
      {"HardSigmoid", Code::HardSigmoid},
      {"HardSwish", Code::HardSwish},
      {"Identity", Code::Identity},
      {"IsNaN", Code::IsNaN},
      {"LeakyRelu", Code::LeakyRelu},
      {"Less", Code::Less},
      {"LessOrEqual", Code::LessOrEqual},
      {"Log", Code::Log},
      {"Max", Code::Max},
      {"Mean", Code::Mean},
      {"Min", Code::Min},
      {"Mod", Code::Mod},
      {"Mul", Code::Mul},
      {"Neg", Code::Neg},
      {"Or", Code::Or},
      {"Reciprocal", Code::Reciprocal},
      {"Relu", Code::Relu},
      {"Round", Code::Round},
      {"Selu", Code::Selu},
      {"Shrink", Code::Shrink},
      {"Sigmoid", Code::Sigmoid},
      {"Sign", Code::Sign},
      {"Sin", Code::Sin},
      {"Sinh", Code::Sinh},
      {"Softplus", Code::Softplus},
      {"Softsign", Code::Softsign},
      {"Sqrt", Code::Sqrt},
      {"Sub", Code::Sub},
      {"Sum", Code::Sum},
      {"Tan", Code::Tan},
      {"Tanh", Code::Tanh},
      {"ThresholdedRelu", Code::ThresholdedRelu},
  };
  auto it = codes.find(name);
  return it == codes.end() ? Code::Unknown : it->second;
}

/// Attributes of the parametric activations, read once with each op's ONNX defaults.
struct UnaryParams {
  float alpha = 0, beta = 0, gamma = 0, bias = 0, lambd = 0;
};

UnaryParams unaryParams(const std::string &type, const ir::Attributes &a) {
  float alpha = type == "LeakyRelu"     ? 0.01f
                : type == "HardSigmoid" ? 0.2f
                : type == "Selu"        ? 1.67326319217681884765625f
                                        : 1.f;
  return {a.getFloat("alpha", alpha), a.getFloat("beta", 0.5f), a.getFloat("gamma", 1.05070102214813232421875f),
          a.getFloat("bias", 0.f), a.getFloat("lambd", 0.5f)};
}

/// \p x op \p y for op +, - or * (\p f), wrapping around for signed integers as numpy and ONNX
/// Runtime do: signed overflow is undefined behaviour in C++ (found by the model fuzzer, an int64
/// Add folded at compile). Unsigned arithmetic wraps; converting back is modular since C++20.
template <typename C, typename F> C wrapping(C x, C y, F f) {
  if constexpr (std::is_integral_v<C> && std::is_signed_v<C>) {
    using U = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;
    return static_cast<C>(f(static_cast<U>(x), static_cast<U>(y)));
  } else {
    return f(x, y);
  }
}

// Unary ops on the compute type C of element type T.
template <typename C> C unaryValue(Code type, C x, const UnaryParams &a) {
  if constexpr (std::is_floating_point_v<C>) {
    if (type == Code::Abs) return std::fabs(x);
    if (type == Code::Neg) return -x;
    if (type == Code::Sign) return static_cast<C>((x > 0) - (x < 0));
    if (type == Code::Identity) return x;
    if (type == Code::Reciprocal) return C(1) / x;
    if (type == Code::Floor) return std::floor(x);
    if (type == Code::Ceil) return std::ceil(x);
    if (type == Code::Sqrt) return std::sqrt(x);
    if (type == Code::Relu) return x > 0 ? x : C(0);
    if (type == Code::Exp) return std::exp(x);
    if (type == Code::Log) return std::log(x);
    if (type == Code::Tanh) return std::tanh(x);
    if (type == Code::Sigmoid) return x >= 0 ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x));
    if (type == Code::Erf) return std::erf(x);
    if (type == Code::Gelu) return C(0.5) * x * (C(1) + std::erf(x * C(M_SQRT1_2)));
    if (type == Code::Sin) return std::sin(x);
    if (type == Code::Cos) return std::cos(x);
    if (type == Code::Tan) return std::tan(x);
    if (type == Code::Asin) return std::asin(x);
    if (type == Code::Acos) return std::acos(x);
    if (type == Code::Atan) return std::atan(x);
    if (type == Code::Sinh) return std::sinh(x);
    if (type == Code::Cosh) return std::cosh(x);
    if (type == Code::Asinh) return std::asinh(x);
    if (type == Code::Acosh) return std::acosh(x);
    if (type == Code::Atanh) return std::atanh(x);
    if (type == Code::Round) return std::nearbyint(x); // current rounding mode: half to even
    if (type == Code::Softsign) return x / (C(1) + std::fabs(x));
    if (type == Code::Softplus) return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    if (type == Code::Elu) {
      C alpha = a.alpha;
      return x >= 0 ? x : alpha * (std::exp(x) - C(1));
    }
    if (type == Code::Celu) {
      C alpha = a.alpha;
      return std::max(C(0), x) + std::min(C(0), alpha * (std::exp(x / alpha) - C(1)));
    }
    if (type == Code::Selu) {
      C alpha = a.alpha;
      C gamma = a.gamma;
      return x > 0 ? gamma * x : gamma * (alpha * std::exp(x) - alpha);
    }
    if (type == Code::LeakyRelu) {
      C alpha = a.alpha;
      return x >= 0 ? x : alpha * x;
    }
    if (type == Code::ThresholdedRelu) {
      C alpha = a.alpha;
      return x > alpha ? x : C(0);
    }
    if (type == Code::HardSigmoid) {
      C alpha = a.alpha, beta = a.beta;
      return std::max(C(0), std::min(C(1), alpha * x + beta));
    }
    if (type == Code::HardSwish) return x * std::max(C(0), std::min(C(1), x / C(6) + C(0.5)));
  } else {
    // The smallest signed value negates to itself, as in numpy (-x would overflow: UB).
    if (type == Code::Abs) {
      if constexpr (std::is_signed_v<C>)
        return x < 0 ? wrapping(C(0), x, std::minus<>()) : x;
      else
        return x;
    }
    if (type == Code::Neg) return wrapping(C(0), x, std::minus<>());
    if (type == Code::Sign) return static_cast<C>((x > 0) - (x < C(0)));
    if (type == Code::Identity) return x;
    if (type == Code::Relu) return x > 0 ? x : C(0);
  }
  if (type == Code::Shrink) {
    double bias = a.bias, lambd = a.lambd;
    double v = static_cast<double>(x);
    const double r = v < -lambd ? v + bias : v > lambd ? v - bias : 0.0;
    if constexpr (std::is_integral_v<C>)
      return saturatingCast<C>(r); // a bias past the type's range
    else
      return static_cast<C>(r);
  }
  throw error("reference kernel: this unary op is not implemented for this type");
}

bool supportsUnary(const ir::Op &op) {
  if (!op.inInfo(0).isTensor()) return false; // Identity of a sequence: backend_cpu/reference/sequence.cpp
  DataType t = op.inInfo(0).dataType();
  if (t == DataType::STRING || t == DataType::BOOL) return op.type == "Identity";
  if (!isFloatingPoint(t)) {
    static const std::set<std::string> intOk{"Abs", "Neg", "Sign", "Identity", "Relu", "Shrink"};
    return intOk.count(op.type) != 0;
  }
  return true;
}

std::unique_ptr<Kernel> createUnary(const ir::Op &op) {
  int64_t n = op.inInfo(0).elementCount();
  DataType t = op.inInfo(0).dataType();
  if (t == DataType::BOOL || t == DataType::STRING) {
    int64_t bytes = op.inInfo(0).byteCount();
    return std::make_unique<LoopKernel>(
        [bytes](const KernelArgs &a) { std::memcpy(a.outputs[0], a.inputs[0], bytes); });
  }
  Code type = codeOf(op.type);
  UnaryParams attrs = unaryParams(op.type, op.attrs);
  if (type == Code::Unknown) throw error(op.debugName(), ": no reference kernel for unary op ", op.type);
  return dispatchNumeric(t, op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      const T *x = a.in<T>(0);
      T *y = a.out<T>(0);
      for (int64_t i = 0; i < n; ++i)
        y[i] = static_cast<T>(unaryValue<C>(type, static_cast<C>(x[i]), attrs));
    });
  });
}

template <typename C> C binaryValue(Code type, C x, C y, bool fmod) {
  if (type == Code::Add || type == Code::Sum) return wrapping(x, y, std::plus<>());
  if (type == Code::Sub) return wrapping(x, y, std::minus<>());
  if (type == Code::Mul) return wrapping(x, y, std::multiplies<>());
  if (type == Code::Div) {
    if constexpr (std::is_integral_v<C>) {
      if (y == 0) throw error("Div: integer division by zero");
      // The smallest signed value over -1 overflows (UB; x86 traps): it wraps to itself, as in numpy.
      if constexpr (std::is_signed_v<C>)
        if (y == C(-1)) return wrapping(C(0), x, std::minus<>());
    }
    return x / y;
  }
  if (type == Code::Max) {
    if constexpr (std::is_floating_point_v<C>)
      if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<C>::quiet_NaN();
    return x > y ? x : y;
  }
  if (type == Code::Min) {
    if constexpr (std::is_floating_point_v<C>)
      if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<C>::quiet_NaN();
    return x < y ? x : y;
  }
  if (type == Code::Mod) {
    if constexpr (std::is_floating_point_v<C>) {
      if (fmod) return std::fmod(x, y);
      C r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return r;
    } else {
      if (y == 0) throw error("Mod: integer division by zero");
      if constexpr (std::is_signed_v<C>)
        if (y == C(-1)) return C(0); // the smallest value % -1 would trap
      C r = static_cast<C>(x % y);
      if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<C>(r + y);
      return r;
    }
  }
  throw error("reference kernel: this binary op is not implemented");
}

/// Add/Sub/Mul/Div/Max/Min/Mod/Sum/Mean with numpy broadcasting over any number of inputs.
std::unique_ptr<Kernel> createBinary(const ir::Op &op) {
  std::vector<Shape> shapes;
  for (size_t i = 0; i < op.inputCount(); ++i)
    shapes.push_back(op.inInfo(i).shape());
  Shape out = op.outInfo(0).shape();
  int64_t n = op.outInfo(0).elementCount();
  Code type = codeOf(op.type == "Mean" ? "Sum" : op.type);
  bool mean = op.type == "Mean";
  bool fmod = op.attrs.getInt("fmod", 0) != 0;
  size_t count = op.inputCount();
  return dispatchNumeric(op.outInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=, w = BroadcastWalker(out, shapes)](const KernelArgs &a) mutable {
      T *y = a.out<T>(0);
      w.reset();
      for (int64_t i = 0; i < n; ++i, w.next()) {
        C acc = static_cast<C>(a.in<T>(0)[w.offset(0)]);
        for (size_t k = 1; k < count; ++k)
          acc = binaryValue<C>(type, acc, static_cast<C>(a.in<T>(k)[w.offset(k)]), fmod);
        if (mean) acc = static_cast<C>(acc / static_cast<C>(count));
        y[i] = static_cast<T>(acc);
      }
    });
  });
}

std::unique_ptr<Kernel> createPow(const ir::Op &op) {
  std::vector<Shape> shapes{op.inInfo(0).shape(), op.inInfo(1).shape()};
  Shape out = op.outInfo(0).shape();
  int64_t n = op.outInfo(0).elementCount();
  DataType yt = op.inInfo(1).dataType();
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=, w = BroadcastWalker(out, shapes)](const KernelArgs &a) mutable {
      T *z = a.out<T>(0);
      const T *x = a.in<T>(0);
      w.reset();
      dispatchNumeric(yt, "Pow exponent", [&](auto ytag) {
        using Y = typename decltype(ytag)::type;
        const Y *e = a.in<Y>(1);
        for (int64_t i = 0; i < n; ++i, w.next()) {
          double v = std::pow(static_cast<double>(static_cast<compute_t<T>>(x[w.offset(0)])),
                              static_cast<double>(static_cast<compute_t<Y>>(e[w.offset(1)])));
          if constexpr (std::is_integral_v<T>)
            z[i] = saturatingCast<T>(v); // an integer power past T's range
          else
            z[i] = static_cast<T>(static_cast<compute_t<T>>(v));
        }
      });
    });
  });
}

std::unique_ptr<Kernel> createCompare(const ir::Op &op) {
  std::vector<Shape> shapes{op.inInfo(0).shape(), op.inInfo(1).shape()};
  Shape out = op.outInfo(0).shape();
  int64_t n = op.outInfo(0).elementCount();
  Code type = codeOf(op.type);
  return dispatchAll(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=, w = BroadcastWalker(out, shapes)](const KernelArgs &a) mutable {
      bool *z = a.out<bool>(0);
      w.reset();
      for (int64_t i = 0; i < n; ++i, w.next()) {
        C x = static_cast<C>(a.in<T>(0)[w.offset(0)]), y = static_cast<C>(a.in<T>(1)[w.offset(1)]);
        bool r;
        if (type == Code::Equal)
          r = x == y;
        else if (type == Code::Less)
          r = x < y;
        else if (type == Code::Greater)
          r = x > y;
        else if (type == Code::LessOrEqual)
          r = x <= y;
        else if (type == Code::GreaterOrEqual)
          r = x >= y;
        else if (type == Code::And)
          r = x && y;
        else if (type == Code::Or)
          r = x || y;
        else
          r = (x != 0) != (y != 0); // Xor
        z[i] = r;
      }
    });
  });
}

std::unique_ptr<Kernel> createBitShift(const ir::Op &op) {
  std::vector<Shape> shapes{op.inInfo(0).shape(), op.inInfo(1).shape()};
  Shape out = op.outInfo(0).shape();
  int64_t n = op.outInfo(0).elementCount();
  bool left = op.attrs.getString("direction") == "LEFT";
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
      return std::make_unique<LoopKernel>([=, w = BroadcastWalker(out, shapes)](const KernelArgs &a) mutable {
        w.reset();
        for (int64_t i = 0; i < n; ++i, w.next()) {
          T x = a.in<T>(0)[w.offset(0)], s = a.in<T>(1)[w.offset(1)];
          a.out<T>(0)[i] = s >= sizeof(T) * 8 ? T(0) : static_cast<T>(left ? x << s : x >> s);
        }
      });
    } else {
      throw error("BitShift: only unsigned integer types are allowed");
    }
  });
}

std::unique_ptr<Kernel> createNot(const ir::Op &op) {
  int64_t n = op.inInfo(0).elementCount();
  return std::make_unique<LoopKernel>([n](const KernelArgs &a) {
    for (int64_t i = 0; i < n; ++i)
      a.out<bool>(0)[i] = !a.in<bool>(0)[i];
  });
}

std::unique_ptr<Kernel> createIsNanInf(const ir::Op &op) {
  int64_t n = op.inInfo(0).elementCount();
  bool isNan = op.type == "IsNaN";
  bool detectPos = op.attrs.getInt("detect_positive", 1) != 0, detectNeg = op.attrs.getInt("detect_negative", 1) != 0;
  return dispatchFloat(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      for (int64_t i = 0; i < n; ++i) {
        double x = static_cast<double>(static_cast<compute_t<T>>(a.in<T>(0)[i]));
        a.out<bool>(0)[i] = isNan ? std::isnan(x) : std::isinf(x) && ((x > 0 && detectPos) || (x < 0 && detectNeg));
      }
    });
  });
}

std::unique_ptr<Kernel> createPRelu(const ir::Op &op) {
  Shape slope = op.inInfo(1).shape();
  if (op.attrs.getInt("channel_slope", 0)) slope.resize(op.inInfo(0).shape().size() - 1, 1);
  std::vector<Shape> shapes{op.inInfo(0).shape(), slope};
  Shape out = op.outInfo(0).shape();
  int64_t n = op.outInfo(0).elementCount();
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=, w = BroadcastWalker(out, shapes)](const KernelArgs &a) mutable {
      w.reset();
      for (int64_t i = 0; i < n; ++i, w.next()) {
        C x = static_cast<C>(a.in<T>(0)[w.offset(0)]), s = static_cast<C>(a.in<T>(1)[w.offset(1)]);
        a.out<T>(0)[i] = static_cast<T>(x < 0 ? s * x : x);
      }
    });
  });
}

std::unique_ptr<Kernel> createWhere(const ir::Op &op) {
  std::vector<Shape> shapes{op.inInfo(0).shape(), op.inInfo(1).shape(), op.inInfo(2).shape()};
  Shape out = op.outInfo(0).shape();
  int64_t n = op.outInfo(0).elementCount();
  size_t size = dataTypeSize(op.outInfo(0).dataType());
  return std::make_unique<LoopKernel>([=, w = BroadcastWalker(out, shapes)](const KernelArgs &a) mutable {
    w.reset();
    const bool *c = a.in<bool>(0);
    const auto *x = static_cast<const uint8_t *>(a.inputs[1]);
    const auto *y = static_cast<const uint8_t *>(a.inputs[2]);
    auto *z = static_cast<uint8_t *>(a.outputs[0]);
    for (int64_t i = 0; i < n; ++i, w.next())
      std::memcpy(z + i * size, c[w.offset(0)] ? x + w.offset(1) * size : y + w.offset(2) * size, size);
  });
}

std::unique_ptr<Kernel> createClip(const ir::Op &op) {
  int64_t n = op.inInfo(0).elementCount();
  bool hasMin = op.hasInput(1), hasMax = op.hasInput(2);
  DataType minType = hasMin ? op.inInfo(1).dataType() : DataType::FLOAT;
  DataType maxType = hasMax ? op.inInfo(2).dataType() : DataType::FLOAT;
  return dispatchNumeric(op.inInfo(0).dataType(), op.debugName().c_str(), [&](auto tag) -> std::unique_ptr<Kernel> {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
      auto scalar = [&](size_t i, DataType t) {
        return dispatchNumeric(t, "Clip bound", [&](auto st) {
          using S = typename decltype(st)::type;
          return static_cast<C>(static_cast<compute_t<S>>(a.in<S>(i)[0]));
        });
      };
      C lo = a.hasInput(1) ? scalar(1, minType) : std::numeric_limits<C>::lowest();
      C hi = a.hasInput(2) ? scalar(2, maxType) : std::numeric_limits<C>::max();
      for (int64_t i = 0; i < n; ++i) {
        C x = static_cast<C>(a.in<T>(0)[i]);
        a.out<T>(0)[i] = static_cast<T>(x < lo ? lo : (x > hi ? hi : x));
      }
    });
  });
  (void)hasMin;
  (void)hasMax;
}

std::unique_ptr<Kernel> createCast(const ir::Op &op) {
  int64_t n = op.inInfo(0).elementCount();
  DataType from = op.inInfo(0).dataType(), to = op.outInfo(0).dataType();
  if (from == DataType::STRING || to == DataType::STRING)
    throw error(op.debugName(), ": casts to or from STRING are not supported");
  return dispatchAll(from, op.debugName().c_str(), [&](auto ftag) -> std::unique_ptr<Kernel> {
    using F = typename decltype(ftag)::type;
    return dispatchAll(to, "Cast target", [&](auto ttag) -> std::unique_ptr<Kernel> {
      using T = typename decltype(ttag)::type;
      return std::make_unique<LoopKernel>([=](const KernelArgs &a) {
        const F *x = a.in<F>(0);
        T *y = a.out<T>(0);
        for (int64_t i = 0; i < n; ++i) {
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_integral_v<F>) {
            y[i] = saturatingCast<T>(static_cast<compute_t<F>>(x[i]));
          } else if constexpr (std::is_same_v<F, Half> || std::is_same_v<F, BFloat16>) {
            y[i] = static_cast<T>(static_cast<compute_t<T>>(static_cast<float>(x[i])));
          } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
            y[i] = T(static_cast<float>(x[i]));
          } else {
            y[i] = static_cast<T>(x[i]);
          }
        }
      });
    });
  });
}

bool notString(const ir::Op &op) {
  for (const auto *t : op.inputs)
    if (t && t->info().dataType() == DataType::STRING) return false;
  return true;
}

} // namespace

void registerReferenceElementwiseKernels(KernelRegistry &r) {
  auto add = [&](const char *type, KernelFactory create, bool (*supports)(const ir::Op &)) {
    r.add({"ai.onnx", type, KernelProvider::Reference, supports, create});
  };
  for (const char *t : {"Abs",        "Neg",
                        "Sign",       "Identity",
                        "Reciprocal", "Floor",
                        "Ceil",       "Sqrt",
                        "Relu",       "Exp",
                        "Log",        "Tanh",
                        "Sigmoid",    "Erf",
                        "Sin",        "Cos",
                        "Tan",        "Asin",
                        "Acos",       "Atan",
                        "Sinh",       "Cosh",
                        "Asinh",      "Acosh",
                        "Atanh",      "Round",
                        "Softsign",   "Softplus",
                        "Elu",        "Selu",
                        "LeakyRelu",  "HardSigmoid",
                        "HardSwish",  "ThresholdedRelu",
                        "Celu",       "Shrink"})
    add(t, createUnary, supportsUnary);
  r.add({"ai.graphcore", "Gelu", KernelProvider::Reference, supportsUnary, createUnary});
  for (const char *t : {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Mod"})
    add(t, createBinary, notString);
  add("Pow", createPow, notString);
  for (const char *t : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"})
    add(t, createCompare, notString);
  add("BitShift", createBitShift, nullptr);
  add("Not", createNot, nullptr);
  add("IsNaN", createIsNanInf, nullptr);
  add("IsInf", createIsNanInf, nullptr);
  add("PRelu", createPRelu, nullptr);
  add("Where", createWhere, notString);
  add("Clip", createClip, nullptr);
  add("Cast", createCast, nullptr);
  add("CastLike", createCast, nullptr);
}

} // namespace popart::backend_cpu
