#pragma once
// Owned, 64-byte aligned host storage for one tensor's elements: allocated, or mapped from a file.

#include <popart/tensorinfo.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace popart {

/// Aligned bytes with the TensorInfo that describes them. STRING tensors keep their
/// elements in strings() instead of bytes.
class TensorData {
public:
  TensorData() = default;
  /// Zero-filled storage for \p info.
  explicit TensorData(const TensorInfo &info);
  /// Copies \p bytes (which must hold info.byteCount() bytes).
  TensorData(const TensorInfo &info, const void *bytes);
  TensorData(const TensorData &other);
  TensorData &operator=(const TensorData &other);
  TensorData(TensorData &&) noexcept = default;
  TensorData &operator=(TensorData &&) noexcept = default;

  const TensorInfo &info() const { return info_; }
  void *data() { return bytes_.get(); }
  const void *data() const { return bytes_.get(); }
  template <typename T> T *as() { return static_cast<T *>(data()); }
  template <typename T> const T *as() const { return static_cast<const T *>(data()); }
  int64_t byteCount() const { return info_.byteCount(); }
  std::vector<std::string> &strings() { return strings_; }
  const std::vector<std::string> &strings() const { return strings_; }

  /// Element \p i converted to double, whatever the type (for shape values, comparisons).
  double valueAsDouble(int64_t i) const;
  /// Element \p i as int64: integer types exactly, floating ones truncated toward zero; a NaN or a
  /// value past int64's range is an error (the cast would be undefined behaviour).
  int64_t valueAsInt64(int64_t i) const;
  /// All elements as int64, as valueAsInt64 (shape inputs: axes, sizes, pads).
  std::vector<int64_t> toInt64Vector() const;
  /// All elements as double.
  std::vector<double> toDoubleVector() const;
  /// Relabels the element type; the element size must match (bfloat16 test data stored as UINT16).
  void reinterpretAs(DataType type);
  /// Changes the shape without touching the bytes; the element count must match.
  void reshape(const Shape &shape);

  /// A tensor of \p type holding \p values converted element by element (to an integer type
  /// saturated, NaN as 0, as Cast does).
  static TensorData fromDoubles(DataType type, const Shape &shape, const std::vector<double> &values);
  static TensorData fromInt64(const Shape &shape, const std::vector<int64_t> &values);
  static TensorData scalarFloat(float value);

  /// \p info's elements mapped from bytes [offset, offset + info.byteCount()) of \p file,
  /// copy-on-write: writes to the tensor stay in memory and never reach the file, and pages not
  /// written remain the file's (the system can drop and re-read them). Nothing if the range cannot
  /// be mapped 64-byte aligned (an offset that is not a multiple of 64) or the mapping fails: the
  /// caller reads the file instead. Throws if the range is outside the file.
  static std::optional<TensorData> mapFile(const TensorInfo &info, const std::string &file, int64_t offset);
  /// Whether the bytes are mapped from a file (mapFile) rather than allocated.
  bool mapped() const { return bytes_.get_deleter().mappedLength != 0; }

private:
  struct Free {
    constexpr Free() noexcept : mappedLength(0), mappedDelta(0) {}
    constexpr Free(size_t length, size_t delta) noexcept : mappedLength(length), mappedDelta(delta) {}
    size_t mappedLength; ///< non-zero: munmap this many bytes from the data minus mappedDelta
    size_t mappedDelta;  ///< the data's offset into its mapping (the file offset's in-page part)
    void operator()(void *p) const;
  };
  TensorInfo info_;
  std::unique_ptr<uint8_t, Free> bytes_;
  std::vector<std::string> strings_;
};

/// The value of a sequence or optional at run time (ValueKind other than Tensor): tensors on
/// the host, outside the activation arena, since their number and shapes may change from run to
/// run. An execution plan owns one per such tensor; kernels get a pointer to it as their buffer.
/// An optional tensor holds one item when present; an absent optional holds none.
struct SequenceData {
  std::vector<TensorData> items;
  bool present = true;
  /// The info of this value as \p kind, with its element list (for specialising subgraphs).
  TensorInfo info(ValueKind kind, DataType type) const;
};

/// \returns 64-byte aligned storage of \p bytes bytes (at least one), zero-filled.
std::unique_ptr<uint8_t, void (*)(uint8_t *)> alignedBytes(size_t bytes);

} // namespace popart
