#include "sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/ops.h"

namespace deepinfer::sampling {
namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void validate(const SamplingParams& p, int32_t vocab_size) {
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f)
    fail("temperature must be in [0, 100], got {}", p.temperature);
  if (p.top_k < -1) fail("top_k must be -1, 0 (off) or positive, got {}", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("min_p must be in [0, 1], got {}", p.min_p);
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 10.0f))
    fail("repetition_penalty must be in (0, 10], got {}", p.repetition_penalty);
  if (!(std::fabs(p.presence_penalty) <= 2.0f))
    fail("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  if (!(std::fabs(p.frequency_penalty) <= 2.0f))
    fail("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  for (auto [token, bias] : p.logit_bias) {
    if (token < 0 || token >= vocab_size)
      fail("logit_bias names token {} outside the vocabulary (size {})", token, vocab_size);
    if (!(std::fabs(bias) <= 100.0f))
      fail("logit_bias values must be in [-100, 100], got {}", bias);
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs)
    fail("top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, p.top_logprobs);
  if (p.top_logprobs > 0 && !p.logprobs) fail("top_logprobs needs logprobs to be enabled");
  if (p.n < 1 || p.n > kMaxCompletions) fail("n must be in [1, {}], got {}", kMaxCompletions, p.n);
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > kMaxTopLogprobs)
    fail("prompt_logprobs must be in [0, {}] (or -1: off), got {}", kMaxTopLogprobs,
         p.prompt_logprobs);
}

uint64_t completion_seed(uint64_t seed, int index) {
  return index == 0 ? seed : mix(seed ^ mix(static_cast<uint64_t>(index)));
}

double counter_uniform(uint64_t seed, uint64_t position) {
  uint64_t bits = mix(mix(seed ^ 0x9e3779b97f4a7c15ull) + position * 0xd1b54a32d192ed03ull);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

void TokenHistory::add_prompt(const std::vector<int32_t>& tokens) {
  for (int32_t token : tokens) ++prompt[token];
}

void TokenHistory::add_output(int32_t token) {
  ++output[token];
}

std::vector<float> log_softmax(const float* logits, int32_t vocab_size) {
  float max_logit = *std::max_element(logits, logits + vocab_size);
  double total = 0.0;
  for (int32_t i = 0; i < vocab_size; ++i)
    total += std::exp(static_cast<double>(logits[i] - max_logit));
  auto log_total = static_cast<float>(std::log(total));
  std::vector<float> out(static_cast<size_t>(vocab_size));
  for (int32_t i = 0; i < vocab_size; ++i)
    out[static_cast<size_t>(i)] = logits[i] - max_logit - log_total;
  return out;
}

namespace {

// Penalties and bias, in place on a copy of the logits.
void process(std::vector<float>& logits, const SamplingParams& p, const TokenHistory& history) {
  if (p.repetition_penalty != 1.0f) {
    auto penalise = [&](int32_t token) {
      float& logit = logits[static_cast<size_t>(token)];
      logit = logit > 0 ? logit / p.repetition_penalty : logit * p.repetition_penalty;
    };
    for (const auto& [token, count] : history.prompt) penalise(token);
    for (const auto& [token, count] : history.output) {
      if (!history.prompt.count(token)) penalise(token);
    }
  }
  for (const auto& [token, count] : history.output) {
    logits[static_cast<size_t>(token)] -=
        p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  }
  for (auto [token, bias] : p.logit_bias) logits[static_cast<size_t>(token)] += bias;
}

}  // namespace

TokenDraw draw_of(const SamplingParams& params, uint64_t draw_seed, uint64_t position) {
  TokenDraw draw;
  draw.temperature = params.temperature;
  draw.top_k = params.top_k;
  draw.top_p = params.top_p;
  draw.min_p = params.min_p;
  draw.uniform = params.temperature == 0.0f ? 0.0 : counter_uniform(draw_seed, position);
  draw.with_logprob = params.logprobs;
  return draw;
}

std::vector<float> distribution(const float* logits, int32_t vocab_size,
                                const SamplingParams& params, const TokenHistory& history) {
  thread_local std::vector<float> processed;
  thread_local std::vector<uint64_t> masses;
  processed.assign(logits, logits + vocab_size);
  process(processed, params, history);
  draw_masses(processed.data(), vocab_size, draw_of(params, 0, 0), masses);
  double total = 0.0;
  for (uint64_t mass : masses) total += static_cast<double>(mass);
  std::vector<float> probabilities(masses.size());
  for (size_t i = 0; i < masses.size(); ++i)
    probabilities[i] = static_cast<float>(static_cast<double>(masses[i]) / total);
  return probabilities;
}

uint64_t stream_seed(uint64_t draw_seed, DrawStream stream) {
  return mix(draw_seed ^ mix(0xa0761d6478bd642full * static_cast<uint64_t>(stream)));
}

namespace {

// The token where the running sum of weight(i) over tokens of positive weight, in id order,
// passes uniform * total; `fallback` when nothing weighs anything.
template <typename Weight>
int32_t inverse_draw(size_t count, double uniform, int32_t fallback, Weight weight) {
  double total = 0.0;
  for (size_t i = 0; i < count; ++i) total += weight(i);
  if (!(total > 0.0)) return fallback;
  const double target = uniform * total;
  double running = 0.0;
  int32_t last = fallback;
  for (size_t i = 0; i < count; ++i) {
    const double w = weight(i);
    if (w <= 0.0) continue;
    running += w;
    last = static_cast<int32_t>(i);
    if (running > target) return last;
  }
  return last;
}

}  // namespace

int32_t draw_from(std::span<const float> probabilities, double uniform) {
  return inverse_draw(probabilities.size(), uniform, 0,
                      [&](size_t i) { return static_cast<double>(probabilities[i]); });
}

Verdict verify_draft(std::span<const float> target, std::span<const float> draft, int32_t token,
                     double accept, double resample) {
  DI_CHECK(
      target.size() == draft.size() && token >= 0 && static_cast<size_t>(token) < target.size(),
      "verify_draft: distributions of {} and {} tokens, draft {}", target.size(), draft.size(),
      token);
  const auto p = static_cast<double>(target[static_cast<size_t>(token)]);
  const auto q = static_cast<double>(draft[static_cast<size_t>(token)]);
  if (accept * q < p) return {token, true};
  // Rejected only where the draft over-weighs its token, so the residual has mass (up to
  // rounding: then the target's most likely token stands in).
  const auto best =
      static_cast<int32_t>(std::max_element(target.begin(), target.end()) - target.begin());
  return {inverse_draw(target.size(), resample, best,
                       [&](size_t i) {
                         return std::max(
                             0.0, static_cast<double>(target[i]) - static_cast<double>(draft[i]));
                       }),
          false};
}

bool needs_only_logits(const SamplingParams& params) {
  return params.repetition_penalty == 1.0f && params.presence_penalty == 0.0f &&
         params.frequency_penalty == 0.0f && params.logit_bias.empty() && params.top_logprobs == 0;
}

Sample sample(const float* logits, int32_t vocab_size, const SamplingParams& params,
              const TokenHistory& history, uint64_t draw_seed, uint64_t position) {
  // Reused per thread: a fresh half-megabyte vector per token costs page faults.
  thread_local std::vector<float> processed;
  processed.assign(logits, logits + vocab_size);
  process(processed, params, history);
  Sample result;
  result.token =
      draw_token(processed.data(), vocab_size, draw_of(params, draw_seed, position)).token;
  if (params.logprobs) {
    Sample scored = score_token(logits, vocab_size, result.token, params.top_logprobs);
    result.logprob = scored.logprob;
    result.top = std::move(scored.top);
  }
  return result;
}

// Logprobs describe the model's own distribution (vLLM's default "raw" mode).
Sample score_token(const float* logits, int32_t vocab_size, int32_t token, int top) {
  std::vector<float> raw = log_softmax(logits, vocab_size);
  Sample result;
  result.token = token;
  result.logprob = raw[static_cast<size_t>(token)];
  if (top > 0) {
    std::vector<int32_t> order(static_cast<size_t>(vocab_size));
    std::iota(order.begin(), order.end(), 0);
    auto count = static_cast<size_t>(std::min(top, vocab_size));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count),
                      order.end(), [&](int32_t a, int32_t b) {
                        float la = raw[static_cast<size_t>(a)], lb = raw[static_cast<size_t>(b)];
                        return la > lb || (la == lb && a < b);
                      });
    for (size_t i = 0; i < count; ++i)
      result.top.push_back({order[i], raw[static_cast<size_t>(order[i])]});
  }
  return result;
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& stop : stops_) {
    if (stop.empty()) fail("stop strings must not be empty");
    longest_ = std::max(longest_, stop.size());
  }
}

std::string StopStrings::push(std::string_view text, bool& stopped) {
  stopped = false;
  if (!matched_.empty()) {
    stopped = true;
    return "";
  }
  pending_ += text;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    size_t at = pending_.find(stop);
    if (at != std::string::npos && at < first) {
      first = at;
      matched_ = stop;
    }
  }
  if (first != std::string::npos) {
    stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t length = std::min(stop.size() - 1, pending_.size()); length > hold; --length) {
      if (pending_.compare(pending_.size() - length, length, stop, 0, length) == 0) {
        hold = length;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  std::string out = matched_.empty() ? pending_ : "";
  pending_.clear();
  return out;
}

}  // namespace deepinfer::sampling
