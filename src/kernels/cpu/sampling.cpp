// The host reference of Ops::sample_rows (see draw_token in kernels/ops.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/draw_math.h"
#include "kernels/ops.h"

namespace deepinfer {
namespace {

struct Weighed {
  std::vector<uint32_t> keys;
  std::vector<uint64_t> masses;
  uint64_t total = 0;
};

Weighed weigh(const float* logits, int64_t vocab, float max_logit, float temperature) {
  Weighed w;
  w.keys.resize(static_cast<size_t>(vocab));
  w.masses.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    float z = draw::scaled(logits[i], max_logit, temperature);
    w.keys[static_cast<size_t>(i)] = draw::rank_key(z);
    w.masses[static_cast<size_t>(i)] = draw::mass(z);
    w.total += w.masses[static_cast<size_t>(i)];
  }
  return w;
}

// Which tokens survive top-k and top-p: a prefix of the ranking (most likely first, ties by
// lower id). Everything when neither is on.
std::vector<bool> ranked_survivors(const Weighed& w, const TokenDraw& draw) {
  auto vocab = static_cast<int64_t>(w.keys.size());
  bool top_k = draw.top_k > 0 && draw.top_k < vocab;
  bool top_p = draw.top_p < 1.0f;
  if (!top_k && !top_p) return std::vector<bool>(w.keys.size(), true);
  std::vector<int32_t> order(w.keys.size());
  std::iota(order.begin(), order.end(), 0);
  auto ranks_before = [&](int32_t a, int32_t b) {
    uint32_t ka = w.keys[static_cast<size_t>(a)], kb = w.keys[static_cast<size_t>(b)];
    return ka > kb || (ka == kb && a < b);
  };
  int64_t keep = top_k ? draw.top_k : vocab;
  if (!top_p) {
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), ranks_before);
  } else {
    // Rank only a head of the order, widening it until it holds top_p of the mass: the kept
    // prefix is usually a few hundred tokens of a 128 k vocabulary.
    uint64_t need = draw::top_p_mass(draw.top_p, w.total);
    for (int64_t head = std::min<int64_t>(keep, 1024);; head = std::min<int64_t>(keep, head * 8)) {
      std::nth_element(order.begin(), order.begin() + head - 1, order.end(), ranks_before);
      std::sort(order.begin(), order.begin() + head, ranks_before);
      uint64_t running = 0;
      int64_t reached = -1;
      for (int64_t i = 0; i < head && reached < 0; ++i) {
        running += w.masses[static_cast<size_t>(order[static_cast<size_t>(i)])];
        if (running >= need) reached = i + 1;
      }
      if (reached > 0 || head == keep) {
        keep = reached > 0 ? reached : keep;
        break;
      }
    }
  }
  std::vector<bool> kept(w.keys.size(), false);
  for (int64_t i = 0; i < keep; ++i)
    kept[static_cast<size_t>(order[static_cast<size_t>(i)])] = true;
  return kept;
}

int32_t draw_sampled(const float* logits, int64_t vocab, float max_logit, const TokenDraw& draw) {
  Weighed w = weigh(logits, vocab, max_logit, draw.temperature);
  std::vector<bool> kept = ranked_survivors(w, draw);
  uint64_t floor = draw.min_p > 0.0f ? draw::min_p_mass(draw.min_p) : 0;
  uint64_t kept_total = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    kept[i] = kept[i] && w.masses[i] >= floor;
    if (kept[i]) kept_total += w.masses[i];
  }
  uint64_t target = draw::draw_target(draw.uniform, kept_total);
  uint64_t running = 0;
  int32_t last = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (!kept[i]) continue;
    running += w.masses[i];
    last = static_cast<int32_t>(i);
    if (running > target) return last;
  }
  return last;
}

}  // namespace

DrawnToken draw_token(const float* logits, int64_t vocab, const TokenDraw& draw) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  float max_logit = logits[best];
  DrawnToken out;
  out.token = draw.temperature == 0.0f ? static_cast<int32_t>(best)
                                       : draw_sampled(logits, vocab, max_logit, draw);
  if (!draw.with_logprob) return out;
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logits[i] - max_logit));
  out.logprob = logits[out.token] - max_logit - static_cast<float>(std::log(total));
  return out;
}

}  // namespace deepinfer
