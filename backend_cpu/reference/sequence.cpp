// Kernels of the sequence and optional ops. Their values are SequenceData objects that the plan
// owns (KernelArgs points at them); their elements are host tensors, so these kernels allocate.

#include "backend_cpu/kernel_families.hpp"
#include "ir/ops/helpers.hpp"
#include <popart/error.hpp>

#include <cstring>

namespace popart::backend_cpu {

namespace {

const SequenceData &seqIn(const KernelArgs &a, size_t i) { return *static_cast<const SequenceData *>(a.inputs[i]); }
SequenceData &seqOut(const KernelArgs &a, size_t i) { return *static_cast<SequenceData *>(a.outputs[i]); }

/// A tensor input as a TensorData (a copy).
TensorData tensorIn(const KernelArgs &a, size_t i, const TensorInfo &info) { return TensorData(info, a.inputs[i]); }

/// Copies \p t into a tensor output whose info the plan fixed; throws naming \p what if \p t
/// does not have it (its shape depended on run-time values and changed).
void writeTensor(const TensorData &t, const TensorInfo &planned, void *out, const std::string &what) {
  if (t.info() != planned)
    throw error(what, ": the value is ", t.info().toString(), " but the plan was compiled for ", planned.toString());
  if (t.byteCount()) std::memcpy(out, t.data(), static_cast<size_t>(t.byteCount()));
}

int64_t position(const KernelArgs &a, size_t i, DataType type, int64_t n, bool insert, const std::string &name) {
  int64_t pos = type == DataType::INT32 ? *a.in<int32_t>(i) : *a.in<int64_t>(i);
  int64_t p = pos < 0 ? pos + n : pos;
  if (p < 0 || p >= (insert ? n + 1 : n))
    throw error(name, ": position ", pos, " is out of range for a sequence of ", n, " tensors");
  return p;
}

class SequenceKernel : public Kernel {
public:
  explicit SequenceKernel(const ir::Op &op) : type_(op.type), name_(op.debugName()) {
    for (const ir::Tensor *t : op.inputs)
      inInfos_.push_back(t ? t->info() : TensorInfo());
    for (const ir::Tensor *t : op.outputs)
      outInfos_.push_back(t ? t->info() : TensorInfo());
    axis_ = op.attrs.getInt("axis", 0);
    keepdims_ = op.attrs.getInt("keepdims", 1) != 0;
    newAxis_ = op.attrs.getInt("new_axis", 0) != 0;
  }

  void run(const KernelArgs &a) override {
    if (type_ == "SequenceEmpty") {
      seqOut(a, 0) = SequenceData{};
    } else if (type_ == "SequenceConstruct") {
      SequenceData s;
      for (size_t i = 0; i < a.inputCount; ++i)
        s.items.push_back(tensorIn(a, i, inInfos_[i]));
      seqOut(a, 0) = std::move(s);
    } else if (type_ == "SequenceInsert") {
      SequenceData s = seqIn(a, 0);
      int64_t n = static_cast<int64_t>(s.items.size());
      int64_t p = a.hasInput(2) ? position(a, 2, inInfos_[2].dataType(), n, true, name_) : n;
      s.items.insert(s.items.begin() + p, tensorIn(a, 1, inInfos_[1]));
      seqOut(a, 0) = std::move(s);
    } else if (type_ == "SequenceErase") {
      SequenceData s = seqIn(a, 0);
      int64_t n = static_cast<int64_t>(s.items.size());
      if (n == 0) throw error(name_, ": erases from an empty sequence");
      int64_t p = a.hasInput(1) ? position(a, 1, inInfos_[1].dataType(), n, false, name_) : n - 1;
      s.items.erase(s.items.begin() + p);
      seqOut(a, 0) = std::move(s);
    } else if (type_ == "SequenceAt") {
      const SequenceData &s = seqIn(a, 0);
      int64_t p = position(a, 1, inInfos_[1].dataType(), static_cast<int64_t>(s.items.size()), false, name_);
      writeTensor(s.items[static_cast<size_t>(p)], outInfos_[0], a.outputs[0], name_);
    } else if (type_ == "SequenceLength") {
      *a.out<int64_t>(0) = static_cast<int64_t>(seqIn(a, 0).items.size());
    } else if (type_ == "SplitToSequence") {
      splitToSequence(a);
    } else if (type_ == "ConcatFromSequence") {
      concatFromSequence(a);
    } else if (type_ == "Optional") {
      SequenceData s;
      if (a.hasInput(0)) {
        if (inInfos_[0].isTensor())
          s.items.push_back(tensorIn(a, 0, inInfos_[0]));
        else
          s = seqIn(a, 0);
      } else {
        s.present = false;
      }
      seqOut(a, 0) = std::move(s);
    } else if (type_ == "OptionalHasElement") {
      *a.out<bool>(0) = a.hasInput(0) && (inInfos_[0].isTensor() || seqIn(a, 0).present);
    } else if (type_ == "OptionalGetElement") {
      optionalGetElement(a);
    } else if (type_ == "Identity") {
      seqOut(a, 0) = seqIn(a, 0);
    } else {
      throw error(name_, ": no sequence kernel for ", type_);
    }
  }

private:
  void optionalGetElement(const KernelArgs &a) {
    const TensorInfo &in = inInfos_[0];
    if (in.isTensor()) {
      std::memcpy(a.outputs[0], a.inputs[0], static_cast<size_t>(in.byteCount()));
      return;
    }
    const SequenceData &s = seqIn(a, 0);
    if (in.valueKind() == ValueKind::Sequence) {
      seqOut(a, 0) = s;
      return;
    }
    if (!s.present) throw error(name_, ": the optional holds no value");
    if (in.valueKind() == ValueKind::OptionalTensor) {
      writeTensor(s.items.at(0), outInfos_[0], a.outputs[0], name_);
    } else {
      seqOut(a, 0) = SequenceData{s.items, true};
    }
  }

  void splitToSequence(const KernelArgs &a) {
    const TensorInfo &in = inInfos_[0];
    int64_t rank = in.rank(), axis = axis_ < 0 ? axis_ + rank : axis_;
    int64_t len = in.shape()[static_cast<size_t>(axis)];
    std::vector<int64_t> sizes;
    bool keep = true;
    if (!a.hasInput(1)) {
      sizes.assign(static_cast<size_t>(len), 1);
      keep = keepdims_;
    } else {
      const TensorInfo &si = inInfos_[1];
      auto value = [&](int64_t i) {
        return si.dataType() == DataType::INT32 ? a.in<int32_t>(1)[i] : a.in<int64_t>(1)[i];
      };
      if (si.rank() == 0) {
        int64_t chunk = value(0);
        if (chunk <= 0) throw error(name_, ": split size ", chunk, " must be positive");
        for (int64_t at = 0; at < len; at += chunk)
          sizes.push_back(std::min(chunk, len - at));
      } else {
        int64_t total = 0;
        for (int64_t i = 0; i < si.elementCount(); ++i) {
          sizes.push_back(value(i));
          total += sizes.back();
          if (sizes.back() < 0) throw error(name_, ": negative split size ", sizes.back());
        }
        if (total != len) throw error(name_, ": split sizes add up to ", total, " but the axis has ", len);
      }
    }
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= in.shape()[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < rank; ++d)
      inner *= in.shape()[static_cast<size_t>(d)];
    size_t es = dataTypeSize(in.dataType());
    SequenceData s;
    int64_t start = 0;
    for (int64_t size : sizes) {
      Shape shape = in.shape();
      shape[static_cast<size_t>(axis)] = size;
      if (!keep) shape.erase(shape.begin() + axis);
      TensorData t(TensorInfo(in.dataType(), shape));
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(static_cast<uint8_t *>(t.data()) + static_cast<size_t>(o * size * inner) * es,
                    static_cast<const uint8_t *>(a.inputs[0]) + static_cast<size_t>((o * len + start) * inner) * es,
                    static_cast<size_t>(size * inner) * es);
      s.items.push_back(std::move(t));
      start += size;
    }
    seqOut(a, 0) = std::move(s);
  }

  void concatFromSequence(const KernelArgs &a) {
    const SequenceData &s = seqIn(a, 0);
    const TensorInfo &out = outInfos_[0];
    if (s.items.empty()) throw error(name_, ": concatenates an empty sequence");
    int64_t rank = out.rank(), axis = axis_ < 0 ? axis_ + rank : axis_;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= out.shape()[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < rank; ++d)
      inner *= out.shape()[static_cast<size_t>(d)];
    int64_t outLen = out.shape()[static_cast<size_t>(axis)], total = 0;
    size_t es = dataTypeSize(out.dataType());
    for (const TensorData &t : s.items) {
      int64_t len = newAxis_ ? 1 : t.info().shape()[static_cast<size_t>(axis)];
      if (t.info().elementCount() != outer * len * inner || t.info().dataType() != out.dataType())
        throw error(name_, ": element ", t.info().toString(), " does not fit the compiled output ", out.toString());
      total += len;
    }
    if (total != outLen)
      throw error(name_, ": the elements give ", total, " along axis ", axis, " but the plan was compiled for ",
                  outLen);
    int64_t at = 0;
    for (const TensorData &t : s.items) {
      int64_t len = newAxis_ ? 1 : t.info().shape()[static_cast<size_t>(axis)];
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(static_cast<uint8_t *>(a.outputs[0]) + static_cast<size_t>((o * outLen + at) * inner) * es,
                    static_cast<const uint8_t *>(t.data()) + static_cast<size_t>(o * len * inner) * es,
                    static_cast<size_t>(len * inner) * es);
      at += len;
    }
  }

  std::string type_, name_;
  std::vector<TensorInfo> inInfos_, outInfos_;
  int64_t axis_ = 0;
  bool keepdims_ = true, newAxis_ = false;
};

bool isSequenceIdentity(const ir::Op &op) { return op.hasInput(0) && !op.inInfo(0).isTensor(); }

} // namespace

void registerReferenceSequenceKernels(KernelRegistry &r) {
  for (const char *type :
       {"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt", "SequenceLength",
        "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalHasElement", "OptionalGetElement"})
    r.add({"ai.onnx", type, KernelProvider::Reference, nullptr, makeKernel<SequenceKernel>});
  r.add({"ai.onnx", "Identity", KernelProvider::Reference, isSequenceIdentity, makeKernel<SequenceKernel>});
}

} // namespace popart::backend_cpu
