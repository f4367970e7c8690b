// Durable files for checkpoints: a checksum, and writes that survive a kill or a power cut at
// any moment (a temporary file, fsync, rename, fsync of the folder).

#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace popart::session {

/// FNV-1a's 64-bit offset basis: the state before any byte.
constexpr uint64_t kFnv1a64Start = 14695981039346656037ull;

/// 64-bit FNV-1a of \p size bytes at \p data, continued from \p state (kFnv1a64Start for a
/// new hash). Every change of a single byte changes the result: each step is a bijection.
uint64_t fnv1a64(const void *data, size_t size, uint64_t state = kFnv1a64Start);

/// Flushes the contents of the file at \p path to the disk (fsync); throws popart::error naming it.
void syncFile(const std::filesystem::path &path);

/// Flushes the folder \p dir's entries (a rename or a new file in it) to the disk.
void syncDirectory(const std::filesystem::path &dir);

/// Renames \p from over \p to (atomic: \p to is the old or the new file, never a mix) and makes the
/// rename durable by syncing the folder; \p from must already be synced.
void renameDurably(const std::filesystem::path &from, const std::filesystem::path &to);

/// Writes \p bytes to \p path atomically and durably: into "<path>.tmp", synced, renamed over it.
void writeFileDurably(const std::filesystem::path &path, const std::string &bytes);

} // namespace popart::session
