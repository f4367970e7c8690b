// IDX files: a 4-byte magic (0, 0, element type, rank), rank big-endian uint32 dimensions, then
// the elements, big-endian. zlib's gz* functions read gzip and plain files alike.

#include "cli/idx.hpp"

#include <popart/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <limits>
#include <memory>

namespace popart::cli {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

/// Reads exactly \p size bytes or throws naming \p path and \p what; \p what is \p whole bytes long,
/// of which \p before were read already (by earlier calls).
void readExactly(gzFile f, void *data, size_t size, const std::string &path, const std::string &what, size_t before = 0,
                 size_t whole = 0) {
  auto *out = static_cast<uint8_t *>(data);
  size_t done = 0;
  while (done < size) {
    // gzread takes an unsigned count; read in chunks well below its limit.
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
    int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int code = 0;
      const char *msg = gzerror(f, &code);
      throw error("IDX file '", path, "': read error in the ", what, ": ", msg ? msg : "unknown zlib error");
    }
    if (got == 0)
      throw error("IDX file '", path, "' is truncated: the ", what, " needs ", std::max(whole, before + size),
                  " bytes, only ", before + done, " remain");
    done += static_cast<size_t>(got);
  }
}

DataType idxType(uint8_t code, const std::string &path) {
  switch (code) {
  case 0x08: return DataType::UINT8;
  case 0x09: return DataType::INT8;
  case 0x0B: return DataType::INT16;
  case 0x0C: return DataType::INT32;
  case 0x0D: return DataType::FLOAT;
  case 0x0E: return DataType::DOUBLE;
  default:
    throw error("IDX file '", path, "': unknown element type code 0x", std::hex, static_cast<int>(code),
                " (expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E)");
  }
}

} // namespace

IdxArray readIdx(const std::string &path) {
  GzFile f(gzopen(path.c_str(), "rb"));
  if (!f) throw error("IDX file '", path, "' cannot be opened");
  uint8_t magic[4];
  readExactly(f.get(), magic, 4, path, "magic number");
  if (magic[0] != 0 || magic[1] != 0)
    throw error("IDX file '", path, "': bad magic number (first two bytes ", static_cast<int>(magic[0]), ", ",
                static_cast<int>(magic[1]), ", expected 0, 0); not an IDX file");
  DataType type = idxType(magic[2], path);
  int rank = magic[3];
  if (rank == 0) throw error("IDX file '", path, "': bad magic number (rank 0)");
  Shape shape;
  for (int i = 0; i < rank; ++i) {
    uint8_t d[4];
    readExactly(f.get(), d, 4, path, "dimensions");
    uint32_t v = (uint32_t(d[0]) << 24) | (uint32_t(d[1]) << 16) | (uint32_t(d[2]) << 8) | uint32_t(d[3]);
    shape.push_back(static_cast<int64_t>(v));
  }
  IdxArray a{TensorInfo(type, shape), {}};
  int64_t count = 0;
  try {
    count = a.info.elementCount();
  } catch (const error &e) {
    throw error("IDX file '", path, "': ", e.what());
  }
  const auto elementBytes = static_cast<int64_t>(dataTypeSize(type));
  if (count > std::numeric_limits<int64_t>::max() / elementBytes)
    throw error("IDX file '", path, "': ", a.info.toString(), " has more than 2^63 bytes");
  // The buffer grows as the data arrives, doubling from 64 KiB to chunks of 16 MiB, so that a
  // header announcing more than the file holds (gzip hides the real size) is refused as truncated
  // after allocating about what the file has, not what it claims.
  const auto total = static_cast<size_t>(a.info.byteCount());
  constexpr size_t kFirstChunk = size_t{1} << 16, kMaxChunk = size_t{1} << 24;
  while (a.bytes.size() < total) {
    const size_t done = a.bytes.size();
    a.bytes.resize(done + std::min(total - done, std::clamp(done, kFirstChunk, kMaxChunk)));
    readExactly(f.get(), a.bytes.data() + done, a.bytes.size() - done, path, "data of " + a.info.toString(), done,
                total);
  }
  // IDX stores elements big-endian.
  static_assert(std::endian::native == std::endian::little, "IDX reading assumes a little-endian host");
  size_t width = dataTypeSize(type);
  if (width > 1)
    for (size_t i = 0; i < a.bytes.size(); i += width)
      std::reverse(a.bytes.begin() + static_cast<std::ptrdiff_t>(i),
                   a.bytes.begin() + static_cast<std::ptrdiff_t>(i + width));
  uint8_t extra;
  if (gzread(f.get(), &extra, 1) > 0)
    throw error("IDX file '", path, "' has bytes after the ", a.info.toString(), " its header announces");
  return a;
}

std::string findIdxFile(const std::string &dir, const std::string &name) {
  namespace fs = std::filesystem;
  fs::path plain = fs::path(dir) / name;
  if (fs::exists(plain)) return plain.string();
  fs::path gz = fs::path(dir) / (name + ".gz");
  if (fs::exists(gz)) return gz.string();
  throw error("neither '", plain.string(), "' nor '", gz.string(), "' exists");
}

} // namespace popart::cli
