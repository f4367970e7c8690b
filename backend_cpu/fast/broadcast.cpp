// Fast kernels: Add, Sub, Mul and Div of f32 with numpy broadcasting where oneDNN's binary
// declines (it would run its reference code: a broadcast over a middle axis, as in Swin's
// attention mask [1, 64, 3, 49, 49] + [1, 64, 1, 49, 49], took 29 ms that way), by contiguous
// runs of vec::binary.

#include "backend_cpu/fast/vecloops.hpp"
#include "backend_cpu/kernel_families.hpp"
#include <popart/error.hpp>

#include <string>
#include <vector>

namespace popart::backend_cpu {

namespace {

/// Below this many elements a kernel runs on one thread: a parallel region costs more than the
/// loop (and waits for every thread of the team, which a shared machine may not be running).
constexpr int64_t kThreadedElements = 32768;

/// How a broadcast binary op walks its output: runs of \p run contiguous elements of the output
/// and of input a, over the outer \p axes; b advances by \p bRunStride per element (0: one value
/// per run).
struct BroadcastPlan {
  struct Axis {
    int64_t size, a, b; ///< extent and the inputs' element strides (0: broadcast)
  };
  bool swapped = false; ///< a is input 1 (Add and Mul, whose input 0 broadcasts within a run)
  std::vector<Axis> axes;
  int64_t runs = 1, run = 1, bRunStride = 1;
};

/// 0 Add, 1 Sub, 2 Mul, 3 Div (vec::binary's codes).
int binaryCode(const std::string &type) { return type == "Add" ? 0 : type == "Sub" ? 1 : type == "Mul" ? 2 : 3; }

/// The plan of \p op's broadcast; false (and why, in \p why) if input 0 (after a swap for Add
/// and Mul) would be broadcast within a run.
bool planBroadcast(const ir::Op &op, BroadcastPlan &p, std::string &why) {
  const Shape &y = op.outInfo(0).shape();
  auto stridesOf = [&](const Shape &s) {
    std::vector<int64_t> st(y.size(), 0);
    int64_t acc = 1;
    for (size_t k = 0; k < s.size(); ++k) {
      size_t ax = y.size() - 1 - k, sk = s.size() - 1 - k;
      st[ax] = s[sk] == 1 ? 0 : acc;
      acc *= s[sk];
    }
    return st;
  };
  std::vector<int64_t> sa = stridesOf(op.inInfo(0).shape()), sb = stridesOf(op.inInfo(1).shape());
  // Input 0 must have the innermost axis (of extent > 1) in full.
  auto innerFull = [&](const std::vector<int64_t> &s) {
    for (size_t k = y.size(); k-- > 0;)
      if (y[k] > 1) return s[k] != 0;
    return true;
  };
  const int code = binaryCode(op.type);
  p.swapped = false;
  if (!innerFull(sa)) {
    if ((code != 0 && code != 2) || !innerFull(sb)) {
      why = "input 0 broadcasts along the innermost axis";
      return false;
    }
    std::swap(sa, sb);
    p.swapped = true;
  }
  // The run: innermost axes where a is contiguous and b either is contiguous too or is
  // broadcast throughout.
  p.run = 1;
  size_t k = y.size();
  int bMode = -1; // 1: b contiguous with a, 0: b broadcast over the run
  while (k > 0) {
    size_t ax = k - 1;
    if (y[ax] == 1) {
      --k;
      continue;
    }
    if (sa[ax] != p.run) break;
    int mode = sb[ax] == 0 ? 0 : sb[ax] == p.run ? 1 : -1;
    if (mode < 0 || (bMode >= 0 && mode != bMode)) break;
    bMode = mode;
    p.run *= y[ax];
    --k;
  }
  p.bRunStride = bMode == 0 ? 0 : 1;
  p.axes.clear();
  p.runs = 1;
  for (size_t ax = 0; ax < k; ++ax)
    if (y[ax] > 1) {
      p.axes.push_back({y[ax], sa[ax], sb[ax]});
      p.runs *= y[ax];
    }
  return true;
}

class BroadcastBinaryKernel : public Kernel {
public:
  explicit BroadcastBinaryKernel(const ir::Op &op) : op_(binaryCode(op.type)) {
    std::string why;
    if (!planBroadcast(op, plan_, why)) throw error(op.debugName(), ": the broadcast kernel cannot run it: ", why);
  }
  void run(const KernelArgs &args) override {
    const auto *a = static_cast<const float *>(args.inputs[plan_.swapped ? 1 : 0]);
    const auto *b = static_cast<const float *>(args.inputs[plan_.swapped ? 0 : 1]);
    auto *y = static_cast<float *>(args.outputs[0]);
    const int64_t runs = plan_.runs, run = plan_.run, bStride = plan_.bRunStride;
    const std::vector<BroadcastPlan::Axis> &axes = plan_.axes;
#pragma omp parallel for schedule(static) if (runs > 1 && runs * run > kThreadedElements)
    for (int64_t r = 0; r < runs; ++r) {
      int64_t ia = 0, ib = 0;
      for (int64_t rest = r, k = static_cast<int64_t>(axes.size()) - 1; k >= 0; --k) {
        const BroadcastPlan::Axis &ax = axes[static_cast<size_t>(k)];
        const int64_t i = rest % ax.size;
        rest /= ax.size;
        ia += i * ax.a;
        ib += i * ax.b;
      }
      vec::binary(op_, a + ia, b + ib, bStride, y + r * run, run);
    }
  }

private:
  int op_ = 0;
  BroadcastPlan plan_;
};

Support supportsBroadcastBinary(const ir::Op &op) {
  if (op.inputCount() != 2) return Support::no("not two inputs");
  for (size_t i = 0; i < 2; ++i)
    if (op.inInfo(i).dataType() != DataType::FLOAT) return Support::no("inputs not f32");
  if (op.outInfo(0).elementCount() == 0) return Support::no("empty output");
  BroadcastPlan plan;
  std::string why;
  if (!planBroadcast(op, plan, why)) return Support::no(why);
  return Support::yes();
}

} // namespace

void registerFastBroadcastKernels(KernelRegistry &r) {
  for (const char *t : {"Add", "Sub", "Mul", "Div"})
    r.add({"ai.onnx", t, KernelProvider::Fast, supportsBroadcastBinary, makeKernel<BroadcastBinaryKernel>});
}

} // namespace popart::backend_cpu
