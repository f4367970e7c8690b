#include "core/tensordata.hpp"
#include "core/dispatch.hpp"
#include "core/int_range.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>

namespace popart {

void TensorData::Free::operator()(void *p) const {
  if (mappedLength != 0)
    ::munmap(static_cast<uint8_t *>(p) - mappedDelta, mappedLength);
  else
    std::free(p);
}

std::optional<TensorData> TensorData::mapFile(const TensorInfo &info, const std::string &file, int64_t offset) {
  if (!info.isTensor() || info.dataType() == DataType::STRING || info.elementCount() <= 0)
    throw error("cannot map tensor ", info.toString(), " from '", file, "': only non-empty numeric tensors are mapped");
  const int64_t bytes = info.byteCount();
  if (offset < 0 || offset % 64 != 0) return std::nullopt; // the kernels expect 64-byte aligned data
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return std::nullopt;
  }
  if (bytes > st.st_size || offset > st.st_size - bytes) {
    ::close(fd);
    throw error("cannot map tensor ", info.toString(), " from '", file, "': bytes [", offset, ", ", offset + bytes,
                ") are outside the file of ", static_cast<int64_t>(st.st_size), " bytes");
  }
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t start = offset / page * page;
  const auto length = static_cast<size_t>(offset - start + bytes);
  // Private and writable: a training step updates its weights in place, in memory only.
  void *base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, start);
  ::close(fd); // the mapping keeps the file
  if (base == MAP_FAILED) return std::nullopt;
  TensorData data;
  data.info_ = info;
  data.bytes_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t *>(base) + (offset - start),
                                               Free{length, static_cast<size_t>(offset - start)});
  return data;
}

static uint8_t *allocateAligned(size_t bytes) {
  size_t rounded = ((bytes == 0 ? 1 : bytes) + 63) / 64 * 64;
  void *p = std::aligned_alloc(64, rounded);
  if (!p) throw error("out of memory allocating ", bytes, " bytes");
  std::memset(p, 0, rounded);
  return static_cast<uint8_t *>(p);
}

std::unique_ptr<uint8_t, void (*)(uint8_t *)> alignedBytes(size_t bytes) {
  return {allocateAligned(bytes), [](uint8_t *p) { std::free(p); }};
}

TensorData::TensorData(const TensorInfo &info) : info_(info) {
  if (info.elementCount() < 0) throw error("cannot allocate tensor of unknown shape ", info.toString());
  if (info.isTensor() && info.elementCount() > std::numeric_limits<int64_t>::max() / 16)
    throw error("cannot allocate tensor ", info.toString(), ": its size in bytes overflows");
  bytes_.reset(allocateAligned(static_cast<size_t>(info.byteCount())));
  if (info.dataType() == DataType::STRING) strings_.resize(static_cast<size_t>(info.elementCount()));
}

TensorData::TensorData(const TensorInfo &info, const void *bytes) : TensorData(info) {
  if (info.byteCount() > 0) std::memcpy(bytes_.get(), bytes, static_cast<size_t>(info.byteCount()));
}

TensorData::TensorData(const TensorData &other) : TensorData(other.info_, other.data()) { strings_ = other.strings_; }

TensorData &TensorData::operator=(const TensorData &other) {
  if (this != &other) {
    TensorData copy(other);
    *this = std::move(copy);
  }
  return *this;
}

double TensorData::valueAsDouble(int64_t i) const {
  return dispatchAll(info_.dataType(), "TensorData::valueAsDouble", [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    return static_cast<double>(static_cast<compute_t<T>>(as<T>()[i]));
  });
}

namespace {
/// \p v as int64, or an error naming the value and \p type if it is NaN or past int64's range.
template <typename C> int64_t checkedInt64(C v, DataType type) {
  if constexpr (std::is_floating_point_v<C>) {
    if (!fitsInt64(static_cast<double>(v)))
      throw error("a ", toString(type), " value ", static_cast<double>(v), " is read as an integer, which int64 cannot hold");
  }
  return static_cast<int64_t>(v);
}
} // namespace

int64_t TensorData::valueAsInt64(int64_t i) const {
  return dispatchAll(info_.dataType(), "TensorData::valueAsInt64", [&](auto tag) -> int64_t {
    using T = typename decltype(tag)::type;
    return checkedInt64(static_cast<compute_t<T>>(as<T>()[i]), info_.dataType());
  });
}

std::vector<int64_t> TensorData::toInt64Vector() const {
  std::vector<int64_t> out(static_cast<size_t>(info_.elementCount()));
  dispatchAll(info_.dataType(), "TensorData::toInt64Vector", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = checkedInt64(static_cast<compute_t<T>>(as<T>()[i]), info_.dataType());
  });
  return out;
}

std::vector<double> TensorData::toDoubleVector() const {
  std::vector<double> out(static_cast<size_t>(info_.elementCount()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = valueAsDouble(static_cast<int64_t>(i));
  return out;
}

void TensorData::reinterpretAs(DataType type) {
  if (dataTypeSize(type) != dataTypeSize(info_.dataType()))
    throw error("cannot reinterpret ", info_.toString(), " as ", toString(type), ": element sizes differ");
  info_.setDataType(type);
}

void TensorData::reshape(const Shape &shape) {
  if (shapeElementCount(shape) != info_.elementCount())
    throw error("cannot reshape ", info_.toString(), " to ", toString(shape));
  info_.setShape(shape);
}

TensorData TensorData::fromDoubles(DataType type, const Shape &shape, const std::vector<double> &values) {
  TensorData t(TensorInfo(type, shape));
  if (static_cast<int64_t>(values.size()) != t.info().elementCount())
    throw error("fromDoubles: ", values.size(), " values for shape ", toString(shape));
  dispatchAll(type, "TensorData::fromDoubles", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (size_t i = 0; i < values.size(); ++i)
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        t.as<T>()[i] = saturatingCast<T>(values[i]); // NaN or out of range: no UB
      else
        t.as<T>()[i] = static_cast<T>(static_cast<compute_t<T>>(values[i]));
  });
  return t;
}

TensorData TensorData::fromInt64(const Shape &shape, const std::vector<int64_t> &values) {
  TensorData t(TensorInfo(DataType::INT64, shape));
  if (static_cast<int64_t>(values.size()) != t.info().elementCount())
    throw error("fromInt64: ", values.size(), " values for shape ", toString(shape));
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

TensorData TensorData::scalarFloat(float value) {
  TensorData t(TensorInfo(DataType::FLOAT, {}));
  *t.as<float>() = value;
  return t;
}

TensorInfo SequenceData::info(ValueKind kind, DataType type) const {
  std::vector<TensorInfo> infos;
  for (const TensorData &t : items)
    infos.push_back(t.info());
  if (kind == ValueKind::OptionalTensor)
    return TensorInfo(kind, type, items.empty() ? Shape{-1} : items[0].info().shape());
  TensorInfo seq = sequenceInfoOf(infos, type);
  TensorInfo out(kind, seq.dataType(), seq.shape());
  out.setElements(std::move(infos));
  return out;
}

} // namespace popart
