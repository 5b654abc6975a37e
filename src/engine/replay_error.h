// What bounded replay (PrefixReplay) costs in accuracy: a prompt's logits after a restored
// prefix whose last tokens are recomputed, against the cold prefill's. The measurement behind
// `deepinfer bench-replay` and the replay tests.
#pragma once

#include <cstdint>
#include <span>

#include "model/model.h"

namespace deepinfer {

struct ReplayError {
  int64_t replay_start = 0;   // the first position the replay computed
  int64_t restored_end = 0;   // positions before it came from the full-attention layers' cache
  double max_abs_diff = 0.0;  // over every logit of the positions from restored_end on
  bool bitwise_equal = false;
  // Bytes per token a lower tier stores for the prefix with the windows' KV and without.
  double stored_bytes_per_token = 0.0;
  double stored_bytes_per_token_without_windows = 0.0;
};

// Computes `prompt` cold (its first `prefix_tokens` tokens, then the rest with every row's
// logits), copies the full-attention layers' blocks of the prefix into a second cache as a
// lower tier would restore them, and computes the rest again after a replay of
// `replay_tokens` tokens. `prefix_tokens` is rounded down to whole blocks; a model whose
// layers all slide restores nothing and replays from scratch.
ReplayError measure_replay(CausalLM& model, std::span<const int32_t> prompt, int64_t prefix_tokens,
                           int64_t replay_tokens, int block_size = 16);

}  // namespace deepinfer
