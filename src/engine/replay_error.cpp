#include "engine/replay_error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace deepinfer {
namespace {

// Feeds positions [begin, end) of `prompt` to `kv`; returns every row's logits when asked.
std::vector<float> feed(CausalLM& model, KvCache& cache, SequenceKv& kv,
                        std::span<const int32_t> prompt, int64_t begin, int64_t end, bool logits) {
  kv.reserve(cache, end);
  ForwardBatch batch;
  std::vector<int32_t> tokens(prompt.begin() + begin, prompt.begin() + end);
  batch.add_sequence(tokens, begin, kv, cache.shape().block_size, logits, logits);
  std::vector<float> out(batch.logit_rows.size() * static_cast<size_t>(model.config().vocab_size));
  model.forward(batch, cache, out.data());
  return out;
}

// Copies the full-attention groups' published blocks of `kv` (the first `blocks` of each)
// from `from` into `to`, published there under the same keys, as a lower tier restores them.
void restore_full_attention_blocks(const KvCache& from, const SequenceKv& kv, KvCache& to,
                                   std::span<const int32_t> prompt, int64_t blocks) {
  const int block_size = from.shape().block_size;
  std::vector<std::byte> bytes(from.shape().bytes_per_block());
  for (int g = 0; g < kv.num_groups(); ++g) {
    if (from.groups().group_window[static_cast<size_t>(g)] > 0) continue;
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t source = kv.group(g).table()[static_cast<size_t>(b)];
      from.read_block(source, bytes);
      int32_t block = to.allocate();
      DI_CHECK(block >= 0, "measure_replay: the restoring cache is full");
      to.write_block(block, bytes);
      to.pool().publish(
          block, from.pool().key_of(source),
          prompt.subspan(static_cast<size_t>(b * block_size), static_cast<size_t>(block_size)),
          from.pool().salt_of(source), g);
      to.release(block);  // idle and cached, as an installed block is
    }
  }
}

}  // namespace

ReplayError measure_replay(CausalLM& model, std::span<const int32_t> prompt, int64_t prefix_tokens,
                           int64_t replay_tokens, int block_size) {
  const KvCacheShape shape = model.kv_shape(block_size);
  block_size = shape.block_size;
  const auto length = static_cast<int64_t>(prompt.size());
  const int64_t blocks = std::min(prefix_tokens, length - 1) / block_size;
  DI_CHECK(blocks > 0, "measure_replay: a prefix of {} tokens holds no whole block of {}",
           prefix_tokens, block_size);
  const int64_t restored_end = blocks * block_size;
  const int64_t cache_blocks = shape.groups().num_groups() * (length / block_size + 2) + 1;
  KvCache cold_cache(shape, cache_blocks, model.ops());
  SequenceKv cold;
  feed(model, cold_cache, cold, prompt, 0, restored_end, false);
  cold.publish_full_blocks(cold_cache, prompt, restored_end, 0);
  std::vector<float> reference = feed(model, cold_cache, cold, prompt, restored_end, length, true);

  KvCache cache(shape, cache_blocks, model.ops());
  restore_full_attention_blocks(cold_cache, cold, cache, prompt, blocks);
  SequenceKv replayed;
  int64_t start = 0;
  if (has_full_attention_group(cache.groups())) {
    start = replayed.take_cached_prefix(cache, prompt.first(static_cast<size_t>(restored_end) + 1),
                                        0, replay_tokens);
  } else {
    start = std::max<int64_t>(0, restored_end - replay_tokens);
    replayed.adopt_replay(cache, {start, restored_end},
                          std::vector<std::vector<int32_t>>(cold.num_groups()),
                          std::vector<std::vector<BlockHash>>(cold.num_groups()));
  }
  std::vector<float> logits = feed(model, cache, replayed, prompt, start, length, true);
  ReplayError error;
  error.replay_start = start;
  error.restored_end = replayed.replay().restored_end;
  // Rows of positions restored_end.. are the last ones of both.
  const size_t compared = reference.size();
  DI_CHECK(logits.size() >= compared, "measure_replay: {} logits for {}", logits.size(), compared);
  const float* tail = logits.data() + (logits.size() - compared);
  error.bitwise_equal = std::memcmp(tail, reference.data(), compared * sizeof(float)) == 0;
  for (size_t i = 0; i < compared; ++i) {
    error.max_abs_diff =
        std::max(error.max_abs_diff, std::abs(static_cast<double>(tail[i]) - reference[i]));
  }
  const KvGroupLayout& layout = cache.groups();
  const double per_group = static_cast<double>(shape.bytes_per_block()) / block_size;
  error.stored_bytes_per_token = per_group * layout.num_groups();
  error.stored_bytes_per_token_without_windows =
      per_group *
      static_cast<double>(std::count(layout.group_window.begin(), layout.group_window.end(), 0));
  return error;
}

}  // namespace deepinfer
