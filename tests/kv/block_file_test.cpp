// KV block files: written whole or not at all, and never served unless every check agrees.
#include "kv/block_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "core/error.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::TempDir;

struct Block {
  BlockFileIdentity identity{0x1234, 0xabcdef0123456789ull, 77};
  std::vector<int32_t> tokens = {5, 6, 7, 8};
  std::vector<std::byte> payload;
  Block() {
    for (int i = 0; i < 1000; ++i) payload.push_back(static_cast<std::byte>(i * 31));
  }
  BlockFileContents read(const std::filesystem::path& dir) const {
    return read_block_file(block_file_path(dir, identity.fingerprint, identity.key), identity,
                           tokens, payload.size());
  }
};

std::vector<char> file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void overwrite(const std::filesystem::path& file, const std::vector<char>& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<long>(bytes.size()));
}

TEST(BlockFile, RoundTripsUnderItsKey) {
  TempDir dir;
  Block block;
  ASSERT_TRUE(write_block_file(dir.path(), block.identity, block.tokens, block.payload));
  BlockFileContents read = block.read(dir.path());
  ASSERT_EQ(read.status, BlockFileStatus::kOk);
  EXPECT_EQ(read.payload, block.payload);
  // Nothing but the block itself is left in its folder (no temporary files).
  auto folder =
      block_file_path(dir.path(), block.identity.fingerprint, block.identity.key).parent_path();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(folder), {}), 1);
}

TEST(BlockFile, EveryFlippedByteAndEveryTruncationIsCaught) {
  TempDir dir;
  Block block;
  ASSERT_TRUE(write_block_file(dir.path(), block.identity, block.tokens, block.payload));
  auto file = block_file_path(dir.path(), block.identity.fingerprint, block.identity.key);
  const std::vector<char> good = file_bytes(file);
  for (size_t i = 0; i < good.size(); i += 7) {
    std::vector<char> bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    overwrite(file, bad);
    EXPECT_NE(block.read(dir.path()).status, BlockFileStatus::kOk) << "byte " << i;
  }
  for (size_t size : {size_t{0}, size_t{10}, size_t{71}, size_t{72}, good.size() - 1}) {
    overwrite(file, {good.begin(), good.begin() + static_cast<std::ptrdiff_t>(size)});
    EXPECT_EQ(block.read(dir.path()).status, BlockFileStatus::kTruncated) << size << " bytes";
  }
  std::vector<char> longer = good;
  longer.push_back(0);
  overwrite(file, longer);
  EXPECT_EQ(block.read(dir.path()).status, BlockFileStatus::kCorrupt);
  std::filesystem::remove(file);
  EXPECT_EQ(block.read(dir.path()).status, BlockFileStatus::kMissing);
}

TEST(BlockFile, AnotherModelSaltKeyOrTokenSequenceIsForeign) {
  TempDir dir;
  Block block;
  ASSERT_TRUE(write_block_file(dir.path(), block.identity, block.tokens, block.payload));
  auto file = block_file_path(dir.path(), block.identity.fingerprint, block.identity.key);
  std::vector<char> bytes(file_bytes(file));
  auto parse = [&](BlockFileIdentity identity, std::vector<int32_t> tokens) {
    return parse_block_file(std::as_bytes(std::span(bytes)), identity, tokens, block.payload.size())
        .status;
  };
  EXPECT_EQ(parse(block.identity, block.tokens), BlockFileStatus::kOk);
  BlockFileIdentity other = block.identity;
  other.fingerprint ^= 1;
  EXPECT_EQ(parse(other, block.tokens), BlockFileStatus::kForeign);
  other = block.identity;
  other.salt_hash ^= 1;
  EXPECT_EQ(parse(other, block.tokens), BlockFileStatus::kForeign);
  other = block.identity;
  other.key ^= 1;
  EXPECT_EQ(parse(other, block.tokens), BlockFileStatus::kForeign);
  EXPECT_EQ(parse(block.identity, {5, 6, 7, 9}), BlockFileStatus::kForeign);
  EXPECT_EQ(parse_block_file(std::as_bytes(std::span(bytes)), block.identity, block.tokens,
                             block.payload.size() + 4)
                .status,
            BlockFileStatus::kForeign);
}

TEST(BlockFile, FingerprintsFollowTheModelAndTheLayout) {
  KvCacheShape shape = KvCacheShape::heads(2, 1, 8, 16);
  std::vector<TensorDescription> tensors = {{"w", "BF16", {4, 8}}};
  uint64_t base = model_fingerprint("LlamaForCausalLM", tensors, shape);
  EXPECT_EQ(model_fingerprint("LlamaForCausalLM", tensors, shape), base);
  EXPECT_NE(model_fingerprint("Qwen3ForCausalLM", tensors, shape), base);
  EXPECT_NE(model_fingerprint("LlamaForCausalLM", {{"w", "BF16", {8, 4}}}, shape), base);
  EXPECT_NE(model_fingerprint("LlamaForCausalLM", {{"w", "F32", {4, 8}}}, shape), base);
  KvCacheShape other = shape;
  other.block_size = 32;
  EXPECT_NE(model_fingerprint("LlamaForCausalLM", tensors, other), base);
  other = shape;
  other.layer_window = {0, 4};
  EXPECT_NE(model_fingerprint("LlamaForCausalLM", tensors, other), base);
  other = shape;
  other.dtype = DType::kBF16;
  EXPECT_NE(model_fingerprint("LlamaForCausalLM", tensors, other), base);
}

TEST(BlockFile, ConcurrentWritersLeaveOneWholeFile) {
  TempDir dir;
  Block block;
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < 20; ++i)
        EXPECT_TRUE(write_block_file(dir.path(), block.identity, block.tokens, block.payload));
    });
  }
  // Readers meanwhile see a missing or a whole file, never a partial one.
  for (int i = 0; i < 200; ++i) {
    BlockFileStatus status = block.read(dir.path()).status;
    EXPECT_TRUE(status == BlockFileStatus::kOk || status == BlockFileStatus::kMissing)
        << block_file_status_name(status);
  }
  for (std::thread& writer : writers) writer.join();
  EXPECT_EQ(block.read(dir.path()).status, BlockFileStatus::kOk);
}

TEST(BlockFile, AnUnwritableDirectoryIsAFailureNotAnError) {
  Block block;
  EXPECT_FALSE(
      write_block_file("/proc/deepinfer-no-such-dir", block.identity, block.tokens, block.payload));
}

// A block's bytes out of one cache, through a block file, into another block of another
// cache: every layer of the page holds the same keys and values.
TEST(BlockFile, CarriesACacheBlockToAnotherCache) {
  KvCacheShape shape = KvCacheShape::heads(4, 2, 8, 4);
  shape.layer_window = {0, 6, 0, 6};  // two groups of two layers: pages of 2 layers
  KvCache source(shape, 10), target(shape, 10);
  for (int layer = 0; layer < 4; ++layer) {
    PagedKvView view = source.layer(layer);
    for (int64_t i = 0; i < 10 * 4 * view.key_stride(); ++i) {
      view.key_floats()[i] = static_cast<float>(layer * 100000 + i);
      view.value_floats()[i] = -static_cast<float>(layer * 100000 + i);
    }
  }
  std::vector<std::byte> bytes(shape.bytes_per_block());
  source.read_block(3, bytes);
  TempDir dir;
  BlockFileIdentity identity{9, 3, 0};
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  ASSERT_TRUE(write_block_file(dir.path(), identity, tokens, bytes));
  BlockFileContents read =
      read_block_file(block_file_path(dir.path(), 9, 3), identity, tokens, bytes.size());
  ASSERT_EQ(read.status, BlockFileStatus::kOk);
  target.write_block(7, read.payload);
  const int64_t row = 4 * 2 * 8;  // a block's floats in one layer
  for (int layer = 0; layer < 4; ++layer) {
    // Layers sharing a page slot share storage, so every layer of the slot came along.
    PagedKvView from = source.layer(layer), to = target.layer(layer);
    for (int64_t i = 0; i < row; ++i) {
      EXPECT_EQ(to.key_floats()[7 * row + i], from.key_floats()[3 * row + i]) << layer;
      EXPECT_EQ(to.value_floats()[7 * row + i], from.value_floats()[3 * row + i]) << layer;
    }
  }
  std::vector<std::byte> short_buffer(bytes.size() - 1);
  EXPECT_THROW(source.read_block(3, short_buffer), Error);
  EXPECT_THROW(source.read_block(0, bytes), Error);  // the null block holds nothing
}

}  // namespace
}  // namespace deepinfer
