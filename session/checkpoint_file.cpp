#include "session/checkpoint_file.hpp"

#include <popart/error.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

namespace popart::session {

namespace {

/// fsync of \p path opened with \p flags; \p what says what it is in the message.
void syncPath(const std::filesystem::path &path, int flags, const char *what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw error("cannot open ", what, " '", path.string(), "' to sync it: ", std::strerror(errno));
  const int synced = ::fsync(fd);
  const int savedErrno = errno;
  ::close(fd);
  if (synced != 0) throw error("cannot sync ", what, " '", path.string(), "' to disk: ", std::strerror(savedErrno));
}

} // namespace

uint64_t fnv1a64(const void *data, size_t size, uint64_t state) {
  const auto *bytes = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i)
    state = (state ^ bytes[i]) * 1099511628211ull;
  return state;
}

void syncFile(const std::filesystem::path &path) { syncPath(path, O_RDONLY, "file"); }

void syncDirectory(const std::filesystem::path &dir) {
  syncPath(dir.empty() ? std::filesystem::path(".") : dir, O_RDONLY | O_DIRECTORY, "folder");
}

void renameDurably(const std::filesystem::path &from, const std::filesystem::path &to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  if (ec) throw error("cannot rename '", from.string(), "' to '", to.string(), "': ", ec.message());
  syncDirectory(to.parent_path());
}

void writeFileDurably(const std::filesystem::path &path, const std::string &bytes) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw error("cannot write '", tmp.string(), "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw error("writing '", tmp.string(), "' failed (disk full?)");
  }
  syncFile(tmp);
  renameDurably(tmp, path);
}

} // namespace popart::session
