// A step's forward and sampling (Engine::execute): the grammar masks made beside the forward,
// the draws made where the logits are, and the rows read back to the host for the rest.
#include <algorithm>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_state.h"

namespace deepinfer {

// The forward and sampling of one step (on the runner thread with async scheduling): reads
// the sequences' sampling parameters, histories and matchers, writes only into `work`.
void Engine::execute(StepWork& work) {
  Tensor logits = step_logits(work.batch.logit_rows.size());
  // Rows sampled under their sequence's grammar (verified drafts follow clones of it).
  auto masked_here = [](const Chunk& chunk) {
    return chunk.samples && chunk.drafts.empty() && chunk.sequence->matcher != nullptr;
  };
  if (std::none_of(work.chunks.begin(), work.chunks.end(), masked_here)) {
    forward(work, logits);
  } else {
    // The masks depend only on the tokens so far: they are made on a thread of their own
    // while the forward runs (the GPU's, or the cores the CPU forward leaves idle).
    if (!mask_runner_) mask_runner_ = std::make_unique<StepRunner>(false);
    mask_runner_->start([&work, masked_here] {
      for (Chunk& chunk : work.chunks)
        if (masked_here(chunk)) chunk.mask = chunk.sequence->matcher->allowed();
    });
    try {
      forward(work, logits);
    } catch (...) {
      mask_runner_->wait();  // it reads `work`: not before it is done
      throw;
    }
    mask_runner_->wait();
  }
  sample_step(work, logits);
}

void Engine::forward(StepWork& work, Tensor& logits) {
  if (!mtp_) {
    model_.forward_into(work.batch, cache_, logits);
    return;
  }
  // The MTP module drafts from every position's final-norm output.
  const int final_index = model_.config().num_layers;
  model_.forward_into(work.batch, cache_, logits, [&](int index, const Tensor& hidden) {
    if (index != final_index) return;
    const float* rows = hidden.as<const float>();
    step_hidden_.assign(rows, rows + hidden.numel());
  });
}

// The logits stay in the backend's memory: rows whose sampling needs nothing else (a
// grammar's mask aside, applied there) are drawn there, so a GPU sends back a token, not a
// row of 128 k floats; only the others are copied to the host.
void Engine::sample_step(StepWork& work, Tensor& logits) {
  const auto vocab = static_cast<size_t>(model_.config().vocab_size);
  // Draws see only the ids that can be sampled (the rows keep the model's stride).
  Tensor sampled = Tensor::strided(logits.data, DType::kF32, {logits.dim(0), sampled_vocab_},
                                   {logits.dim(1), 1}, logits.device);
  std::vector<TokenDraw> draws;
  std::vector<RowMask> row_masks;
  std::vector<Chunk*> drawn;
  std::vector<bool> on_backend(work.chunks.size(), false);
  std::vector<std::pair<size_t, size_t>> host_ranges;  // [first row, end row) read on the host
  for (size_t c = 0; c < work.chunks.size(); ++c) {
    Chunk& chunk = work.chunks[c];
    const Sequence& sequence = *chunk.sequence;
    const sampling::SamplingParams& params = sequence.request.sampling;
    size_t end = chunk.first_logit_row + chunk.logit_rows;
    if (chunk.prompt_rows) host_ranges.emplace_back(chunk.first_logit_row, end);
    if (!chunk.samples) continue;
    if (!chunk.drafts.empty()) {
      host_ranges.emplace_back(chunk.first_logit_row, end);
      continue;
    }
    // A masked row's logprobs come from the model's own row: read on the host, as is a row
    // its mask leaves nothing in (the grammar then ends there, see apply_samples).
    const bool masked = !chunk.mask.free();
    if (!sampling::needs_only_logits(params) ||
        (masked && (params.logprobs || !chunk.mask.allows_any(sampled_vocab_)))) {
      if (!chunk.prompt_rows) host_ranges.emplace_back(end - 1, end);
      continue;
    }
    TokenDraw draw = sampling::draw_of(params, sequence.seed, chunk.output_position);
    draw.row = static_cast<int64_t>(end - 1);
    if (masked) row_masks.push_back({draw.row, chunk.mask.bits->data(), chunk.mask.tokens});
    draws.push_back(draw);
    drawn.push_back(&chunk);
    on_backend[c] = true;
  }
  model_.ops().mask_rows(sampled, row_masks);
  std::vector<DrawnToken> tokens(draws.size());
  model_.ops().sample_rows(sampled, draws, tokens.data());
  for (size_t i = 0; i < drawn.size(); ++i) {
    drawn[i]->sample.token = tokens[i].token;
    if (drawn[i]->sequence->request.sampling.logprobs) drawn[i]->sample.logprob = tokens[i].logprob;
  }
  const float* host = host_logits(logits, host_ranges);
  for (size_t c = 0; c < work.chunks.size(); ++c) {
    Chunk& chunk = work.chunks[c];
    const Sequence& sequence = *chunk.sequence;
    const float* rows = host + chunk.first_logit_row * vocab;
    if (!chunk.drafts.empty()) {
      verify_drafts(chunk, rows);
    } else if (chunk.samples && !on_backend[c]) {
      chunk.sample = sample_masked(sequence, chunk.mask, sequence.history,
                                   rows + (chunk.logit_rows - 1) * vocab, chunk.output_position);
    }
    if (!chunk.prompt_rows) continue;
    for (size_t r = 0; r < chunk.logit_rows; ++r) {
      int64_t next = chunk.start + static_cast<int64_t>(r) + 1;
      if (next >= sequence.prompt_size()) break;
      chunk.prompt_scores.push_back(sampling::score_token(
          rows + r * vocab, sampled_vocab_, sequence.request.prompt[static_cast<size_t>(next)],
          sequence.request.sampling.prompt_logprobs));
    }
  }
}

// One buffer for every step's logits (forwards never overlap), in the backend's memory; it
// grows by half again so a growing batch reallocates rarely.
Tensor Engine::step_logits(size_t rows) {
  const int64_t vocab = model_.config().vocab_size;
  size_t floats = std::max<size_t>(rows, 1) * static_cast<size_t>(vocab);
  if (floats > logits_floats_) {
    logits_floats_ = std::max(floats, logits_floats_ + logits_floats_ / 2);
    logits_ = model_.ops().allocate(logits_floats_ * sizeof(float));
    host_logits_.reset();
  }
  return Tensor::contiguous(logits_.get(), DType::kF32, {static_cast<int64_t>(rows), vocab},
                            model_.ops().device());
}

// The logits laid out as on the backend, with the rows of `ranges` (in row order) readable on
// the host: the backend's own memory on the CPU; otherwise page-locked memory that each run
// of adjacent rows is copied into at once.
const float* Engine::host_logits(const Tensor& logits,
                                 const std::vector<std::pair<size_t, size_t>>& ranges) {
  Ops& ops = model_.ops();
  if (ops.device() == Device::kCpu) return logits.as<const float>();
  if (!host_logits_) host_logits_ = ops.allocate_host(logits_floats_ * sizeof(float));
  auto* host = static_cast<float*>(host_logits_.get());
  const size_t row_bytes = static_cast<size_t>(logits.dim(-1)) * sizeof(float);
  for (size_t i = 0; i < ranges.size();) {
    size_t first = ranges[i].first, end = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first <= end; ++i)
      end = std::max(end, ranges[i].second);
    ops.to_host(reinterpret_cast<std::byte*>(host) + first * row_bytes,
                reinterpret_cast<const std::byte*>(logits.data) + first * row_bytes,
                (end - first) * row_bytes);
  }
  return host;
}

sampling::Sample Engine::sample_under(const Sequence& sequence, const structured::Matcher* matcher,
                                      const sampling::TokenHistory& history, const float* logits,
                                      uint64_t position) const {
  return sample_masked(sequence, matcher ? matcher->allowed() : structured::TokenMask{}, history,
                       logits, position);
}

// The token drawn from `logits` (a host row) through `mask` (logprobs still come from the
// unmasked row: the model's own distribution).
sampling::Sample Engine::sample_masked(const Sequence& sequence, const structured::TokenMask& mask,
                                       const sampling::TokenHistory& history, const float* logits,
                                       uint64_t position) const {
  const int32_t vocab = sampled_vocab_;
  const sampling::SamplingParams& params = sequence.request.sampling;
  if (mask.free()) return sampling::sample(logits, vocab, params, history, sequence.seed, position);
  std::vector<float> masked(logits, logits + vocab);
  structured::Matcher::apply(mask, masked.data(), vocab);
  sampling::Sample sample =
      sampling::sample(masked.data(), vocab, params, history, sequence.seed, position);
  if (params.logprobs) {
    sampling::Sample raw = sampling::score_token(logits, vocab, sample.token, params.top_logprobs);
    sample.logprob = raw.logprob;
    sample.top = std::move(raw.top);
  }
  return sample;
}

}  // namespace deepinfer
