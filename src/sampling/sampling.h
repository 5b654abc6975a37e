// Token sampling: logits processors (penalties, bias, temperature, top-k/top-p/min-p), draws
// from a counter-based generator keyed by (seed, output position) so a seeded request gives
// the same tokens in any batch, at any slot, after preemption and across runs; logprobs; and
// stop strings caught across token boundaries.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/ops.h"

namespace deepinfer::sampling {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0 or -1: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // prompt and output tokens (transformers/vLLM rule)
  float presence_penalty = 0.0f;    // output tokens (OpenAI rule)
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  int n = 1;                 // independent completions of one prompt
  bool logprobs = false;     // report each output token's logprob
  int top_logprobs = 0;      // ... and this many most likely alternatives (needs logprobs)
  int prompt_logprobs = -1;  // -1: off; k >= 0: each prompt token's logprob plus k alternatives
};

// Clear errors for out-of-range values ("top_p must be in (0, 1], got 1.5"); vocab_size bounds
// logit_bias ids.
void validate(const SamplingParams& params, int32_t vocab_size);
inline constexpr int kMaxCompletions = 128;  // n
inline constexpr int kMaxTopLogprobs = 20;   // top_logprobs and prompt_logprobs

// A uniform double in [0, 1) that depends only on (seed, position): a counter-based
// generator (no state to carry between steps or copy on preemption).
double counter_uniform(uint64_t seed, uint64_t position);
// The draw seed of completion `index` of a request with n > 1: `seed` itself for index 0 (so
// n = 1 draws the same tokens), an independent mix of both for the others.
uint64_t completion_seed(uint64_t seed, int index);

// Token counts of a request, for the penalties.
struct TokenHistory {
  std::unordered_map<int32_t, int32_t> prompt;
  std::unordered_map<int32_t, int32_t> output;
  void add_prompt(const std::vector<int32_t>& tokens);
  void add_output(int32_t token);
};

struct Logprob {
  int32_t token;
  float logprob;
};

struct Sample {
  int32_t token = 0;
  float logprob = 0.0f;      // of the chosen token, from the model's raw distribution
  std::vector<Logprob> top;  // the top_logprobs most likely tokens, most likely first
};

// The part of `params` that Ops::sample_rows applies, with the draw for output `position`.
TokenDraw draw_of(const SamplingParams& params, uint64_t draw_seed, uint64_t position);
// True when sampling under `params` needs nothing but the logits (no penalties, logit bias or
// top_logprobs), so the backend can sample where the logits are (sample() gives the same
// token and logprob).
bool needs_only_logits(const SamplingParams& params);

// Picks the next token from logits [vocab]. `draw_seed` is the request's seed (the engine
// gives unseeded requests a random one); `position` the output index being sampled.
Sample sample(const float* logits, int32_t vocab_size, const SamplingParams& params,
              const TokenHistory& history, uint64_t draw_seed, uint64_t position);

// The distribution sample() draws from under `params`: every token's probability after the
// penalties, bias, temperature, top-k, top-p and min-p ([vocab], summing to 1; greedy: the
// token it picks is certain).
std::vector<float> distribution(const float* logits, int32_t vocab_size,
                                const SamplingParams& params, const TokenHistory& history);

// Independent streams of draws a completion makes beside plain sampling's (which uses its
// draw seed itself): a draft model's draws and speculative verification's two.
enum class DrawStream : uint64_t { kDraft = 1, kAccept = 2, kResample = 3 };
uint64_t stream_seed(uint64_t draw_seed, DrawStream stream);

// The token where `probabilities`' running sum, in id order, passes uniform * their total
// (the inverse of the distribution function).
int32_t draw_from(std::span<const float> probabilities, double uniform);

// Speculative sampling's verdict on a draft token drawn from `draft`: kept with probability
// min(1, target[token] / draft[token]) (when `accept` falls under that ratio), otherwise
// replaced by a draw with `resample` from max(0, target - draft), renormalised. Either way the
// token follows `target` exactly, whatever `draft` was.
struct Verdict {
  int32_t token = 0;
  bool accepted = false;
};
Verdict verify_draft(std::span<const float> target, std::span<const float> draft, int32_t token,
                     double accept, double resample);

// log_softmax of logits [vocab].
std::vector<float> log_softmax(const float* logits, int32_t vocab_size);

// `token`'s logprob under logits [vocab] and the `top` most likely tokens (prompt logprobs).
Sample score_token(const float* logits, int32_t vocab_size, int32_t token, int top);

// Watches generated text for stop strings. Text that might be the start of a stop string is
// held back until it is known not to be, so streamed output never contains part of a stop
// string; on a match, everything from the stop string on is dropped.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  // Returns the text that is now safe to emit; sets `stopped` once a stop string appeared.
  std::string push(std::string_view text, bool& stopped);
  // At the end of generation: whatever was held back.
  std::string flush();
  // The stop string that matched ("" if none).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::string pending_;
  std::string matched_;
};

}  // namespace deepinfer::sampling
