// The host reference of Ops::sample_rows (see draw_token in kernels/ops.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/draw_math.h"
#include "kernels/ops.h"

namespace deepinfer {
namespace {

// One draw's per-token arrays, kept per thread between draws: fresh megabyte-sized vectors
// cost more in page faults than the draw's arithmetic.
struct DrawScratch {
  std::vector<uint32_t> keys;
  std::vector<uint64_t> masses;
  std::vector<uint64_t> order;
  std::vector<uint8_t> kept;
  uint64_t total = 0;
};

DrawScratch& weigh(const float* logits, int64_t vocab, float max_logit, float temperature) {
  thread_local DrawScratch w;
  auto count = static_cast<size_t>(vocab);
  w.keys.resize(count);
  w.masses.resize(count);
  w.total = 0;
  for (size_t i = 0; i < count; ++i) {
    float z = draw::scaled(logits[i], max_logit, temperature);
    w.keys[i] = draw::rank_key(z);
    w.masses[i] = draw::mass(z);
    w.total += w.masses[i];
  }
  return w;
}

// A token's place in the ranking as one integer: its key above, its id inverted below, so
// larger means ranked first (more likely, then lower id) and sorting needs no indirection.
uint64_t rank_of(uint32_t key, size_t id) {
  return (uint64_t{key} << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
size_t id_of(uint64_t rank) {
  return 0xffffffffu - static_cast<uint32_t>(rank);
}

// How many of the ranked tokens (most likely first, ties by lower id) top-k and top-p keep;
// w.order holds them first.
int64_t ranked_prefix(DrawScratch& w, const TokenDraw& draw) {
  auto vocab = static_cast<int64_t>(w.keys.size());
  w.order.resize(w.keys.size());
  for (size_t i = 0; i < w.order.size(); ++i) w.order[i] = rank_of(w.keys[i], i);
  const auto first = std::greater<uint64_t>();
  int64_t keep = draw.top_k > 0 && draw.top_k < vocab ? draw.top_k : vocab;
  if (draw.top_p >= 1.0f) {
    std::nth_element(w.order.begin(), w.order.begin() + keep - 1, w.order.end(), first);
    return keep;
  }
  // Rank only a head of the order, widening it until it holds top_p of the mass: the kept
  // prefix is usually a few hundred tokens of a 128 k vocabulary.
  uint64_t need = draw::top_p_mass(draw.top_p, w.total);
  for (int64_t head = std::min<int64_t>(keep, 1024);; head = std::min<int64_t>(keep, head * 8)) {
    std::nth_element(w.order.begin(), w.order.begin() + head - 1, w.order.end(), first);
    std::sort(w.order.begin(), w.order.begin() + head, first);
    uint64_t running = 0;
    for (int64_t i = 0; i < head; ++i) {
      running += w.masses[id_of(w.order[static_cast<size_t>(i)])];
      if (running >= need) return i + 1;
    }
    if (head == keep) return keep;
  }
}

// Marks the survivors of top-k, top-p and min-p in w.kept.
void mark_survivors(DrawScratch& w, const TokenDraw& draw) {
  auto vocab = static_cast<int64_t>(w.keys.size());
  bool ranked = (draw.top_k > 0 && draw.top_k < vocab) || draw.top_p < 1.0f;
  w.kept.assign(w.keys.size(), ranked ? 0 : 1);
  if (ranked) {
    int64_t keep = ranked_prefix(w, draw);
    for (int64_t i = 0; i < keep; ++i) w.kept[id_of(w.order[static_cast<size_t>(i)])] = 1;
  }
  if (draw.min_p <= 0.0f) return;
  uint64_t floor = draw::min_p_mass(draw.min_p);
  for (size_t i = 0; i < w.kept.size(); ++i) w.kept[i] = w.kept[i] && w.masses[i] >= floor;
}

int32_t draw_sampled(const float* logits, int64_t vocab, float max_logit, const TokenDraw& draw) {
  DrawScratch& w = weigh(logits, vocab, max_logit, draw.temperature);
  mark_survivors(w, draw);
  uint64_t kept_total = 0;
  for (size_t i = 0; i < w.kept.size(); ++i) kept_total += w.kept[i] ? w.masses[i] : 0;
  uint64_t target = draw::draw_target(draw.uniform, kept_total);
  uint64_t running = 0;
  int32_t last = 0;
  for (size_t i = 0; i < w.kept.size(); ++i) {
    if (!w.kept[i]) continue;
    running += w.masses[i];
    last = static_cast<int32_t>(i);
    if (running > target) return last;
  }
  return last;
}

int64_t best_token(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace

DrawnToken draw_token(const float* logits, int64_t vocab, const TokenDraw& draw) {
  const int64_t best = best_token(logits, vocab);
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

void draw_masses(const float* logits, int64_t vocab, const TokenDraw& draw,
                 std::vector<uint64_t>& masses) {
  const int64_t best = best_token(logits, vocab);
  masses.assign(static_cast<size_t>(vocab), 0);
  if (draw.temperature == 0.0f) {
    masses[static_cast<size_t>(best)] = 1;
    return;
  }
  DrawScratch& w = weigh(logits, vocab, logits[best], draw.temperature);
  mark_survivors(w, draw);
  for (size_t i = 0; i < masses.size(); ++i) masses[i] = w.kept[i] ? w.masses[i] : 0;
}

}  // namespace deepinfer
