#include "kv/block_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <random>

namespace deepinfer {
namespace {

static_assert(std::endian::native == std::endian::little, "block files are little-endian");

constexpr char kMagic[8] = {'D', 'I', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 2;

// The fixed part of the header, in file order.
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t fingerprint;
  uint64_t key;
  uint64_t salt_hash;
  uint32_t token_count;
  uint32_t retention_seconds;  // how long after its last use it may be deleted (0: never)
  uint64_t payload_bytes;
  uint64_t payload_checksum;
  uint64_t header_checksum;  // of the bytes above and the tokens
};
static_assert(sizeof(Header) == 72, "the header has no padding");
constexpr size_t kChecked = offsetof(Header, header_checksum);

uint64_t header_checksum(const Header& header, std::span<const int32_t> tokens) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &header, kChecked);
  XXH3_64bits_update(state, tokens.data(), tokens.size_bytes());
  uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

// Writes all of `bytes`, retrying short writes and interrupted calls.
bool write_all(int fd, const void* bytes, size_t size) {
  const auto* at = static_cast<const char*>(bytes);
  while (size > 0) {
    ssize_t written = ::write(fd, at, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    at += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

bool fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return false;
  bool synced = ::fsync(fd) == 0;
  ::close(fd);
  return synced;
}

}  // namespace

uint64_t model_fingerprint(std::string_view architecture,
                           const std::vector<TensorDescription>& tensors,
                           const KvCacheShape& shape) {
  // A canonical text, so the fingerprint changes with any field and nothing else.
  std::string text = fmt::format("architecture {}\n", architecture);
  for (const TensorDescription& tensor : tensors)
    text +=
        fmt::format("tensor {} {} {}\n", tensor.name, tensor.dtype, fmt::join(tensor.shape, ","));
  KvGroupLayout groups = shape.groups();
  text += fmt::format("kv layers {} heads {} key {} value {} values_in_keys {} dtype {} block {}\n",
                      shape.num_layers, shape.num_kv_heads, shape.key_dim, shape.value_dim,
                      shape.values_in_keys, static_cast<int>(shape.dtype), shape.block_size);
  text += fmt::format("windows {} groups {} slots {}\n", fmt::join(shape.layer_window, ","),
                      fmt::join(groups.layer_group, ","), fmt::join(groups.layer_slot, ","));
  return XXH3_64bits(text.data(), text.size());
}

std::filesystem::path block_file_path(const std::filesystem::path& dir, uint64_t fingerprint,
                                      BlockHash key) {
  std::string name = fmt::format("{:016x}", key);
  return dir / fmt::format("{:016x}", fingerprint) / name.substr(0, 2) / (name + ".kvb");
}

bool write_block_file(const std::filesystem::path& dir, const BlockFileIdentity& identity,
                      std::span<const int32_t> tokens, std::span<const std::byte> payload,
                      uint32_t retention_seconds) {
  std::filesystem::path final_path = block_file_path(dir, identity.fingerprint, identity.key);
  std::error_code error;
  std::filesystem::create_directories(final_path.parent_path(), error);
  if (error) return false;
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kVersion;
  header.header_bytes = sizeof(Header);
  header.fingerprint = identity.fingerprint;
  header.key = identity.key;
  header.salt_hash = identity.salt_hash;
  header.token_count = static_cast<uint32_t>(tokens.size());
  header.retention_seconds = retention_seconds;
  header.payload_bytes = payload.size();
  header.payload_checksum = XXH3_64bits(payload.data(), payload.size());
  header.header_checksum = header_checksum(header, tokens);
  // A name no other writer (thread, process or host) picks: pid, a random draw and the time.
  static thread_local std::mt19937_64 random(std::random_device{}());
  std::filesystem::path temporary =
      final_path.parent_path() /
      fmt::format(".{}.{}.{:x}.tmp", final_path.filename().string(), ::getpid(), random());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool written = write_all(fd, &header, sizeof(header)) &&
                 write_all(fd, tokens.data(), tokens.size_bytes()) &&
                 write_all(fd, payload.data(), payload.size()) && ::fsync(fd) == 0;
  written = ::close(fd) == 0 && written;
  if (!written || ::rename(temporary.c_str(), final_path.c_str()) != 0) {
    std::filesystem::remove(temporary, error);
    return false;
  }
  fsync_directory(final_path.parent_path());
  return true;
}

const char* block_file_status_name(BlockFileStatus status) {
  switch (status) {
    case BlockFileStatus::kOk:
      return "ok";
    case BlockFileStatus::kMissing:
      return "missing";
    case BlockFileStatus::kTruncated:
      return "truncated";
    case BlockFileStatus::kCorrupt:
      return "corrupt";
    case BlockFileStatus::kForeign:
      return "foreign";
  }
  return "unknown";
}

BlockFileContents parse_block_file(std::span<const std::byte> bytes,
                                   const BlockFileIdentity& identity,
                                   std::span<const int32_t> tokens, size_t payload_bytes) {
  BlockFileContents result;
  Header header{};
  if (bytes.size() < sizeof(Header)) {
    result.status = BlockFileStatus::kTruncated;
    return result;
  }
  std::memcpy(&header, bytes.data(), sizeof(Header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0 || header.version != kVersion ||
      header.header_bytes != sizeof(Header)) {
    result.status = BlockFileStatus::kCorrupt;
    return result;
  }
  // Sizes from the header, checked before anything is read past it.
  const uint64_t token_bytes = uint64_t{header.token_count} * sizeof(int32_t);
  if (header.payload_bytes > bytes.size() || token_bytes > bytes.size() ||
      bytes.size() != sizeof(Header) + token_bytes + header.payload_bytes) {
    result.status = BlockFileStatus::kTruncated;
    return result;
  }
  std::vector<int32_t> stored(header.token_count);
  if (token_bytes > 0) std::memcpy(stored.data(), bytes.data() + sizeof(Header), token_bytes);
  const std::byte* payload = bytes.data() + sizeof(Header) + token_bytes;
  if (header.header_checksum != header_checksum(header, stored) ||
      header.payload_checksum != XXH3_64bits(payload, header.payload_bytes)) {
    result.status = BlockFileStatus::kCorrupt;
    return result;
  }
  if (header.fingerprint != identity.fingerprint || header.key != identity.key ||
      header.salt_hash != identity.salt_hash || header.payload_bytes != payload_bytes ||
      !std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end())) {
    result.status = BlockFileStatus::kForeign;
    return result;
  }
  result.status = BlockFileStatus::kOk;
  result.retention_seconds = header.retention_seconds;
  result.payload.assign(payload, payload + header.payload_bytes);
  return result;
}

BlockFileContents read_block_file(const std::filesystem::path& file,
                                  const BlockFileIdentity& identity,
                                  std::span<const int32_t> tokens, size_t payload_bytes) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return {};
  auto size = static_cast<size_t>(in.tellg());
  // Nothing larger than the expected file is read into memory.
  size_t expected = sizeof(Header) + tokens.size_bytes() + payload_bytes;
  if (size != expected) {
    BlockFileContents result;
    result.status = size < expected ? BlockFileStatus::kTruncated : BlockFileStatus::kCorrupt;
    return result;
  }
  std::vector<std::byte> bytes(size);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size))) {
    BlockFileContents result;
    result.status = BlockFileStatus::kTruncated;
    return result;
  }
  return parse_block_file(bytes, identity, tokens, payload_bytes);
}

}  // namespace deepinfer

namespace deepinfer {

std::optional<uint32_t> block_file_retention(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  Header header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof(header))) return std::nullopt;
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0 || header.version != kVersion ||
      header.header_bytes != sizeof(Header) || header.token_count > (1u << 20))
    return std::nullopt;
  std::vector<int32_t> tokens(header.token_count);
  if (!in.read(reinterpret_cast<char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * sizeof(int32_t))) ||
      header.header_checksum != header_checksum(header, tokens))
    return std::nullopt;
  return header.retention_seconds;
}

}  // namespace deepinfer
