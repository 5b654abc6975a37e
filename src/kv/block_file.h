// One KV block on disk, for the persistent prefix cache: a self-describing file that is
// written atomically (temporary name, fsync, rename) and never trusted on read until its
// header, its model fingerprint, its key, salt and tokens and its checksums all agree.
//
// Layout (little-endian): magic "DIKVBLK1", u32 format version (2), u32 header bytes, u64 model
// fingerprint, u64 block key, u64 salt hash, u32 token count, u32 retention seconds (how long
// after its last use, the file's modification time, it may be deleted; 0: never), u64 payload
// bytes, u64 xxh3 of the payload, u64 xxh3 of everything before it and of the tokens; then the
// token ids (i32) and the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_cache.h"

namespace deepinfer {

// A tensor as the fingerprint sees it.
struct TensorDescription {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// What a block's bytes mean: the architecture, every tensor's name, shape and dtype, and the
// KV layout (layers, their windows and cache groups, row sizes, dtype, block size). Blocks of
// checkpoints or layouts with different fingerprints never mix.
uint64_t model_fingerprint(std::string_view architecture,
                           const std::vector<TensorDescription>& tensors,
                           const KvCacheShape& shape);

// Where a block lives: dir / <fingerprint> / <first two hex digits of the key> / <key>.kvb.
std::filesystem::path block_file_path(const std::filesystem::path& dir, uint64_t fingerprint,
                                      BlockHash key);

struct BlockFileIdentity {
  uint64_t fingerprint = 0;
  BlockHash key = 0;
  uint64_t salt_hash = 0;
};

// Writes the block to its path: a temporary file in the same folder, fsynced, renamed over
// the final name (a reader sees the old file or the whole new one), the folder fsynced.
// Concurrent writers of the same block are safe (each renames a whole file). Returns false,
// leaving nothing behind, when the disk refuses (full, unwritable).
bool write_block_file(const std::filesystem::path& dir, const BlockFileIdentity& identity,
                      std::span<const int32_t> tokens, std::span<const std::byte> payload,
                      uint32_t retention_seconds = 0);
// The retention a block file's header holds, when its header and tokens pass their checksum.
std::optional<uint32_t> block_file_retention(const std::filesystem::path& file);

enum class BlockFileStatus {
  kOk,
  kMissing,    // no such file
  kTruncated,  // shorter than its header (or the caller) says
  kCorrupt,    // bad magic, version or checksum, or longer than it should be
  kForeign,    // another model, layout, key, salt or token sequence than asked for
};
const char* block_file_status_name(BlockFileStatus status);

struct BlockFileContents {
  BlockFileStatus status = BlockFileStatus::kMissing;
  std::vector<std::byte> payload;  // set when kOk
  uint32_t retention_seconds = 0;
};

// Reads and checks a block file's bytes against what the caller expects: the identity, the
// block's tokens and the payload size. Anything short of kOk must not be served.
BlockFileContents parse_block_file(std::span<const std::byte> bytes,
                                   const BlockFileIdentity& identity,
                                   std::span<const int32_t> tokens, size_t payload_bytes);
BlockFileContents read_block_file(const std::filesystem::path& file,
                                  const BlockFileIdentity& identity,
                                  std::span<const int32_t> tokens, size_t payload_bytes);

}  // namespace deepinfer
