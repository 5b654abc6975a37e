// Batch-invariant mode: a sequence's logits are bitwise the same alone, batched with other
// sequences (prefills and decodes) and with its prompt cut into any chunks.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/ops.h"
#include "model/model.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;

constexpr int kBlockSize = 4;

std::vector<int32_t> prompt_of(int length, int salt, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back((i * 37 + salt * 101 + 5) % vocab);
  return ids;
}

// Every position's logits of `target`, computed `chunk` tokens at a time; when `crowd`, each
// step also carries two other sequences: one prefilling its own prompt and one decoding.
std::vector<float> target_logits(CausalLM& model, const std::vector<int32_t>& target, int chunk,
                                 bool crowd) {
  int32_t vocab = model.config().vocab_size;
  KvCache cache(model.kv_shape(kBlockSize), 128);
  const int block_size = cache.shape().block_size;  // a model may round it up
  std::vector<int32_t> neighbour = prompt_of(41, 2, vocab);
  std::vector<int32_t> decoder = prompt_of(9, 3, vocab);
  SequenceKv target_blocks, neighbour_blocks, decoder_blocks;
  std::vector<float> all;
  int64_t decoder_done = 0;
  for (int64_t start = 0; start < static_cast<int64_t>(target.size()); start += chunk) {
    int64_t count = std::min<int64_t>(chunk, static_cast<int64_t>(target.size()) - start);
    ForwardBatch batch;
    if (crowd) {
      // The decoder runs one token per step (its "prompt" doubles as its outputs).
      decoder_blocks.reserve(cache, decoder_done + 1);
      batch.add_sequence({decoder[static_cast<size_t>(decoder_done % 9)]}, decoder_done,
                         decoder_blocks, block_size, false);
      ++decoder_done;
    }
    target_blocks.reserve(cache, start + count);
    batch.add_sequence(std::vector<int32_t>(target.begin() + start, target.begin() + start + count),
                       start, target_blocks, block_size, true);
    if (crowd) {
      int64_t neighbour_start = start * 2 % 30;
      if (neighbour_start == 0) {
        neighbour_blocks.release_all(cache);
      }
      neighbour_blocks.reserve(cache, neighbour_start + 11);
      batch.add_sequence(std::vector<int32_t>(neighbour.begin() + neighbour_start,
                                              neighbour.begin() + neighbour_start + 11),
                         neighbour_start, neighbour_blocks, block_size, false);
    }
    std::vector<float> logits(batch.logit_rows.size() * static_cast<size_t>(vocab));
    model.forward(batch, cache, logits.data());
    size_t first = crowd ? static_cast<size_t>(vocab) : 0;  // after the decoder's row
    all.insert(all.end(), logits.begin() + static_cast<std::ptrdiff_t>(first),
               logits.begin() + static_cast<std::ptrdiff_t>(first + count * vocab));
  }
  return all;
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, LogitsAreBitwiseTheSameInAnyBatchAndChunking) {
  auto ops = make_cpu_ops(MatmulPrecision::kF32, true);
  auto model = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops);
  std::vector<int32_t> target = prompt_of(29, 1, model->config().vocab_size);
  std::vector<float> alone = target_logits(*model, target, 1 << 20, false);
  for (int chunk : {1, 7, 1 << 20}) {
    for (bool crowd : {false, true}) {
      std::vector<float> got = target_logits(*model, target, chunk, crowd);
      ASSERT_EQ(got.size(), alone.size());
      EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)))
          << "chunk " << chunk << (crowd ? " batched" : " alone");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvariance, ::testing::ValuesIn(testing::kFixtureModels),
                         testing::fixture_test_name);

}  // namespace
}  // namespace deepinfer
