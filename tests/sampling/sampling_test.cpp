// Sampling: the counter-based generator, each logits processor's rule, seeded reproducibility,
// the sampled distribution, logprobs, and stop strings across token boundaries.
#include "sampling/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "kernels/draw_math.h"

namespace deepinfer::sampling {
namespace {

std::string validate_error(const SamplingParams& params) {
  try {
    validate(params, 10);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Sampling, CounterGeneratorDependsOnlyOnSeedAndPosition) {
  EXPECT_EQ(counter_uniform(42, 7), counter_uniform(42, 7));
  EXPECT_NE(counter_uniform(42, 7), counter_uniform(42, 8));
  EXPECT_NE(counter_uniform(42, 7), counter_uniform(43, 7));
  // Roughly uniform: 10 bins over 100k draws within 5% of the expected count.
  std::vector<int> bins(10, 0);
  for (uint64_t i = 0; i < 100000; ++i) {
    double u = counter_uniform(1234, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[static_cast<size_t>(u * 10)];
  }
  for (int count : bins) EXPECT_NEAR(count, 10000, 500);
}

TEST(Sampling, GreedyAndFiltersThatLeaveOneToken) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  TokenHistory history;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(sample(logits.data(), 4, greedy, history, 1, 0).token, 1);
  SamplingParams top_k;
  top_k.top_k = 1;
  SamplingParams top_p;
  top_p.top_p = 0.01f;
  SamplingParams min_p;
  min_p.min_p = 0.99f;
  for (uint64_t position = 0; position < 50; ++position) {
    EXPECT_EQ(sample(logits.data(), 4, top_k, history, 9, position).token, 1);
    EXPECT_EQ(sample(logits.data(), 4, top_p, history, 9, position).token, 1);
    EXPECT_EQ(sample(logits.data(), 4, min_p, history, 9, position).token, 1);
  }
}

// The rules of the reference draw every backend matches (kernels' draw_token).
TEST(Sampling, RankingCutsBreakTiesByLowerIdAndTopPStopsAtItsMass) {
  // Probabilities 1/4, 1/2, 1/4 at temperature 1: token 1 alone holds top_p = 0.45, and with
  // top_p = 0.55 token 0 (the lower id of the tie) joins it, never token 2.
  std::vector<float> logits = {std::log(0.25f), std::log(0.5f), std::log(0.25f)};
  TokenDraw draw;
  draw.temperature = 1.0f;
  draw.top_p = 0.45f;
  for (double u : {0.0, 0.3, 0.6, 0.999}) {
    draw.uniform = u;
    EXPECT_EQ(draw_token(logits.data(), 3, draw).token, 1) << u;
    draw.top_p = 0.55f;
    EXPECT_NE(draw_token(logits.data(), 3, draw).token, 2) << u;
    draw.top_p = 0.45f;
  }
  // top_k = 2 over the tie between tokens 0 and 2 keeps token 0 (the lower id): token 2 never.
  draw.top_p = 1.0f;
  draw.top_k = 2;
  std::map<int32_t, int> counts;
  for (int i = 0; i < 300; ++i) {
    draw.uniform = counter_uniform(3, static_cast<uint64_t>(i));
    ++counts[draw_token(logits.data(), 3, draw).token];
  }
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[0], 100, 30);  // 1/3 of the kept mass
  // Greedy takes the first of equal maxima; the logprob is the raw log-softmax.
  std::vector<float> flat = {1.0f, 3.0f, 3.0f, 2.0f};
  TokenDraw greedy;
  DrawnToken best = draw_token(flat.data(), 4, greedy);
  EXPECT_EQ(best.token, 1);
  EXPECT_NEAR(best.logprob, log_softmax(flat.data(), 4)[1], 1e-6);
}

// A nearly flat distribution whose top-p prefix (~2,500 tokens) is longer than the first
// head the reference ranks (1,024): the cut and the draw still follow the whole ranking.
TEST(Sampling, TopPPrefixLongerThanTheFirstRankedHead) {
  const int64_t vocab = 5000;
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    logits[static_cast<size_t>(i)] = -1e-4f * static_cast<float>(i);
  TokenDraw draw;
  draw.temperature = 1.0f;
  draw.top_p = 0.5f;
  // Ranked order is id order here: the kept prefix and the draw's walk, stated directly.
  std::vector<uint64_t> masses;
  uint64_t total = 0;
  for (float logit : logits)
    total += masses.emplace_back(draw::mass(draw::scaled(logit, 0.0f, 1.0f)));
  uint64_t need = draw::top_p_mass(draw.top_p, total), running = 0;
  size_t prefix = 0;
  while (running < need) running += masses[prefix++];
  ASSERT_GT(prefix, 1024u);
  for (double u : {0.0, 0.25, 0.5, 0.999}) {
    draw.uniform = u;
    uint64_t target = draw::draw_target(u, running), walked = 0;
    int32_t want = 0;
    while ((walked += masses[static_cast<size_t>(want)]) <= target) ++want;
    EXPECT_EQ(draw_token(logits.data(), vocab, draw).token, want) << u;
  }
}

TEST(Sampling, DrawsFollowTheTemperatureScaledDistribution) {
  std::vector<float> logits = {1.0f, 2.0f, 0.0f};
  SamplingParams params;
  params.temperature = 0.7f;
  TokenHistory history;
  std::map<int32_t, int> counts;
  constexpr int kDraws = 60000;
  for (int i = 0; i < kDraws; ++i)
    ++counts[sample(logits.data(), 3, params, history, 5, static_cast<uint64_t>(i)).token];
  double total = 0.0;
  for (float logit : logits) total += std::exp(logit / 0.7);
  for (int32_t token = 0; token < 3; ++token) {
    double expected = std::exp(logits[static_cast<size_t>(token)] / 0.7) / total;
    EXPECT_NEAR(counts[token] / double(kDraws), expected, 0.01) << token;
  }
}

TEST(Sampling, SeededDrawsReproduceWhateverCameBefore) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  SamplingParams params;
  params.top_k = 20;
  params.top_p = 0.9f;
  TokenHistory history;
  std::vector<int32_t> first, second;
  for (uint64_t position = 0; position < 30; ++position)
    first.push_back(sample(logits.data(), 50, params, history, 77, position).token);
  // Other requests' draws in between (another batch composition) change nothing.
  for (uint64_t position = 0; position < 30; ++position) {
    sample(logits.data(), 50, params, history, 12345, position);
    second.push_back(sample(logits.data(), 50, params, history, 77, position).token);
  }
  EXPECT_EQ(first, second);
}

TEST(Sampling, PenaltiesAndBiasFollowTheirRules) {
  std::vector<float> logits = {2.0f, -2.0f, 1.7f, 1.6f};
  TokenHistory history;
  history.add_prompt({0, 1});
  history.add_output(2);
  history.add_output(2);
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_logprobs = 0;
  // repetition 2: token 0 -> 1.0, token 1 -> -4, token 2 -> 0.85; then presence 0.1 +
  // frequency 0.2 x 2 on token 2 -> 0.35. Token 3 (1.6, never seen) now wins; with the
  // repetition penalty alone token 0 (1.0) would still lose to it, and without any, token 0.
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.1f;
  params.frequency_penalty = 0.2f;
  EXPECT_EQ(sample(logits.data(), 4, params, history, 1, 0).token, 3);
  params.logit_bias = {{1, 100.0f}};
  EXPECT_EQ(sample(logits.data(), 4, params, history, 1, 0).token, 1);

  // Presence and frequency alone act on output tokens only: 1.7 - (0.05 + 0.05 x 2) < 1.6.
  std::vector<float> close = {1.0f, 1.0f, 1.7f, 1.6f};
  SamplingParams openai;
  openai.temperature = 0.0f;
  EXPECT_EQ(sample(close.data(), 4, openai, history, 1, 0).token, 2);
  openai.presence_penalty = 0.05f;
  openai.frequency_penalty = 0.05f;
  EXPECT_EQ(sample(close.data(), 4, openai, history, 1, 0).token, 3);
}

TEST(Sampling, LogprobsComeFromTheModelDistribution) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.logprobs = true;
  params.top_logprobs = 2;
  params.logit_bias = {{0, 100.0f}};  // changes the choice, not the reported logprobs
  Sample result = sample(logits.data(), 3, params, TokenHistory{}, 1, 0);
  std::vector<float> expected = log_softmax(logits.data(), 3);
  EXPECT_EQ(result.token, 0);
  EXPECT_FLOAT_EQ(result.logprob, expected[0]);
  ASSERT_EQ(result.top.size(), 2u);
  EXPECT_EQ(result.top[0].token, 1);
  EXPECT_EQ(result.top[1].token, 2);
  EXPECT_FLOAT_EQ(result.top[0].logprob, expected[1]);
}

TEST(Sampling, ValidationNamesTheParameter) {
  SamplingParams params;
  params.top_p = 1.5f;
  EXPECT_EQ(validate_error(params), "top_p must be in (0, 1], got 1.5");
  params = {};
  params.temperature = -1.0f;
  EXPECT_NE(validate_error(params).find("temperature"), std::string::npos);
  params = {};
  params.logit_bias = {{99, 1.0f}};
  EXPECT_NE(validate_error(params).find("outside the vocabulary"), std::string::npos);
  params = {};
  params.logprobs = true;
  params.top_logprobs = 50;
  EXPECT_NE(validate_error(params).find("top_logprobs"), std::string::npos);
  params = {};
  params.top_logprobs = 2;
  EXPECT_EQ(validate_error(params), "top_logprobs needs logprobs to be enabled");
  params = {};
  params.n = 0;
  EXPECT_EQ(validate_error(params), "n must be in [1, 128], got 0");
  params = {};
  params.prompt_logprobs = 21;
  EXPECT_NE(validate_error(params).find("prompt_logprobs"), std::string::npos);
}

TEST(Sampling, CompletionSeedsKeepTheFirstAndSpreadTheRest) {
  EXPECT_EQ(completion_seed(42, 0), 42u);
  EXPECT_NE(completion_seed(42, 1), completion_seed(42, 2));
  EXPECT_NE(completion_seed(42, 1), completion_seed(43, 1));
}

// distribution() is what sample() draws from: the survivors of top-k and top-p, renormalised,
// after penalties; greedy is certain of its token.
TEST(Sampling, DistributionIsWhatTheDrawsFollow) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f};
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 3;
  params.presence_penalty = 0.4f;
  TokenHistory history;
  history.add_output(4);
  const std::vector<float> p = distribution(logits.data(), 5, params, history);
  EXPECT_EQ(p[0], 0.0f);  // outside the top 3 (1, 2, 4)
  EXPECT_EQ(p[3], 0.0f);
  EXPECT_NEAR(p[1] + p[2] + p[4], 1.0, 1e-6);
  EXPECT_NEAR(p[4] / p[2], std::exp((2.1 - 2.0) / 0.7), 1e-4);  // 2.5 - 0.4 against 2.0
  std::vector<int> counts(5, 0);
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i)
    ++counts[static_cast<size_t>(
        sample(logits.data(), 5, params, history, 3, static_cast<uint64_t>(i)).token)];
  for (size_t t = 0; t < 5; ++t) EXPECT_NEAR(counts[t] / double{kDraws}, p[t], 0.015) << t;
  params.temperature = 0.0f;
  const std::vector<float> greedy = distribution(logits.data(), 5, params, history);
  EXPECT_EQ(greedy, (std::vector<float>{0, 1, 0, 0, 0}));
}

// Speculative sampling keeps the target's distribution for any draft distribution: the
// verdict's output, summed over drafts drawn from q and both uniforms on fine grids, is p.
TEST(Sampling, VerifiedDraftsFollowTheTargetWhateverTheDraft) {
  const std::vector<std::pair<std::vector<float>, std::vector<float>>> cases = {
      {{0.1f, 0.6f, 0.3f, 0.0f}, {0.4f, 0.2f, 0.2f, 0.2f}},
      {{0.25f, 0.25f, 0.25f, 0.25f}, {0.0f, 0.0f, 1.0f, 0.0f}},
      {{0.0f, 1.0f, 0.0f, 0.0f}, {0.5f, 0.5f, 0.0f, 0.0f}},
      {{0.3f, 0.3f, 0.2f, 0.2f}, {0.3f, 0.3f, 0.2f, 0.2f}}};
  constexpr int kGrid = 2000;
  for (const auto& [p, q] : cases) {
    std::vector<double> output(p.size(), 0.0);
    double accepted = 0.0;
    for (size_t draft = 0; draft < q.size(); ++draft) {
      if (q[draft] == 0.0f) continue;
      for (int a = 0; a < kGrid; ++a) {
        const double accept = (a + 0.5) / kGrid;
        const Verdict verdict = verify_draft(p, q, static_cast<int32_t>(draft), accept, 0.0);
        if (verdict.accepted) {
          output[draft] += q[draft] / kGrid;
          accepted += q[draft] / kGrid;
          continue;
        }
        for (int r = 0; r < kGrid; ++r) {
          const Verdict resampled =
              verify_draft(p, q, static_cast<int32_t>(draft), accept, (r + 0.5) / kGrid);
          EXPECT_FALSE(resampled.accepted);
          EXPECT_NE(resampled.token, static_cast<int32_t>(draft));
          output[static_cast<size_t>(resampled.token)] += q[draft] / kGrid / kGrid;
        }
      }
    }
    double overlap = 0.0;  // the best any verifier can keep: sum of min(p, q)
    for (size_t t = 0; t < p.size(); ++t) {
      EXPECT_NEAR(output[t], p[t], 2e-3) << t;
      overlap += std::min(p[t], q[t]);
    }
    EXPECT_NEAR(accepted, overlap, 2e-3);
  }
}

TEST(StopStrings, CaughtAcrossTokenBoundariesAndNeverStreamedInPart) {
  StopStrings stops({"o w", "END"});
  bool stopped = false;
  std::string streamed;
  for (const char* piece : {"Hel", "lo", " ", "wo", "rld"}) {
    streamed += stops.push(piece, stopped);
    if (stopped) break;
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(streamed, "Hell");
  EXPECT_EQ(stops.matched(), "o w");

  StopStrings held({"END"});
  EXPECT_EQ(held.push("the E", stopped), "the ");  // "E" might start END
  EXPECT_FALSE(stopped);
  EXPECT_EQ(held.push("ND", stopped), "");
  EXPECT_TRUE(stopped);

  StopStrings none({"END"});
  std::string text = none.push("the EN", stopped);
  text += none.flush();
  EXPECT_EQ(text, "the EN");
}

}  // namespace
}  // namespace deepinfer::sampling
