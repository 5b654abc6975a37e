#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/layers.h"
#include "model/model.h"

namespace deepinfer {

void ForwardBatch::add_sequence(const std::vector<int32_t>& new_tokens, int64_t cached,
                                const SequenceKv& kv, int block_size, bool all_logits,
                                bool want_logits) {
  auto groups = static_cast<size_t>(kv.num_groups());
  DI_CHECK(groups > 0 && (block_tables.empty() || block_tables.size() == groups),
           "forward batch: sequences must hold blocks in the same cache groups");
  block_tables.resize(groups);
  slot_mapping.resize(groups);
  int32_t first_row = query_start.back();
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    int64_t position = cached + static_cast<int64_t>(i);
    tokens.push_back(new_tokens[i]);
    positions.push_back(static_cast<int32_t>(position));
    for (size_t g = 0; g < groups; ++g)
      slot_mapping[g].push_back(kv.group(static_cast<int>(g)).slot(position, block_size));
    if (want_logits && (all_logits || i + 1 == new_tokens.size()))
      logit_rows.push_back(first_row + static_cast<int32_t>(i));
  }
  query_start.push_back(first_row + static_cast<int32_t>(new_tokens.size()));
  first_positions.push_back(static_cast<int32_t>(kv.replay().start));
  restored_ends.push_back(static_cast<int32_t>(kv.replay().restored_end));
  context_lens.push_back(static_cast<int32_t>(cached + static_cast<int64_t>(new_tokens.size())));
  // Every group's tables are as wide as the widest table; re-pad when this one is wider.
  int width = max_blocks_per_seq;
  for (size_t g = 0; g < groups; ++g)
    width = std::max(width, static_cast<int>(kv.group(static_cast<int>(g)).table().size()));
  for (size_t g = 0; g < groups; ++g) {
    std::vector<int32_t>& tables = block_tables[g];
    if (width != max_blocks_per_seq) {
      std::vector<int32_t> widened(static_cast<size_t>(num_seqs() - 1) * static_cast<size_t>(width),
                                   BlockPool::kNullBlock);
      for (int s = 0; s + 1 < num_seqs(); ++s) {
        std::copy_n(tables.begin() + static_cast<std::ptrdiff_t>(s) * max_blocks_per_seq,
                    max_blocks_per_seq, widened.begin() + static_cast<std::ptrdiff_t>(s) * width);
      }
      tables = std::move(widened);
    }
    const std::vector<int32_t>& table = kv.group(static_cast<int>(g)).table();
    size_t row = tables.size();
    tables.resize(row + static_cast<size_t>(width), BlockPool::kNullBlock);
    std::copy(table.begin(), table.end(), tables.begin() + static_cast<std::ptrdiff_t>(row));
  }
  max_blocks_per_seq = width;
}

void CausalLM::forward(const ForwardBatch& batch, KvCache& cache, float* logits,
                       const HiddenStateSink& hidden_sink) {
  auto rows = static_cast<int64_t>(batch.logit_rows.size());
  int64_t vocab = config().vocab_size;
  if (ops().device() == Device::kCpu) {
    Tensor host = Tensor::contiguous(logits, DType::kF32, {rows, vocab});
    forward_into(batch, cache, host, hidden_sink);
    return;
  }
  BackendTensor device_logits(ops(), {std::max<int64_t>(rows, 1), vocab});
  Tensor view = device_logits.view();
  view.shape[0] = rows;
  forward_into(batch, cache, view, hidden_sink);
  ops().to_host(logits, device_logits.data(), static_cast<size_t>(rows * vocab) * sizeof(float));
}

CausalLM::ReplayBounds CausalLM::replay_bounds() const {
  ReplayBounds bounds;
  for (int window : kv_shape(16).layer_window) {
    bounds.exact += window;
    bounds.window = std::max<int64_t>(bounds.window, window);
    if (window > 0) bounds.least = 1;
  }
  return bounds;
}

namespace {

size_t bytes_of(const std::vector<const Tensor*>& tensors) {
  size_t bytes = 0;
  for (const Tensor* tensor : tensors) {
    bytes += tensor->nbytes();
    if (tensor->block_scales) {
      bytes += sizeof(float) *
               static_cast<size_t>(tensor->block_scales->rows * tensor->block_scales->cols);
    }
  }
  return bytes;
}

}  // namespace

size_t CausalLM::weight_bytes_per_token() const {
  return bytes_of(weights_read_per_token());
}

double CausalLM::weight_bytes_per_step(int batch) const {
  const auto all = static_cast<double>(weight_bytes_per_token());
  const auto routed = static_cast<double>(bytes_of(routed_weights_per_token()));
  const MoeConfig& moe = config().moe;
  if (routed == 0.0 || moe.num_experts <= 0 || moe.experts_per_token <= 0 || batch <= 1) return all;
  const double experts = moe.num_experts, chosen = moe.experts_per_token;
  const double touched = experts * (1.0 - std::pow(1.0 - chosen / experts, batch));
  return all - routed + routed * touched / chosen;
}

AttentionBatch ForwardBatch::attention_view(int group) const {
  AttentionBatch view;
  view.num_seqs = num_seqs();
  view.query_start = query_start.data();
  view.context_lens = context_lens.data();
  view.block_tables = block_tables[static_cast<size_t>(group)].data();
  view.max_blocks_per_seq = max_blocks_per_seq;
  view.slot_mapping = slot_mapping[static_cast<size_t>(group)].data();
  for (int32_t length : context_lens)
    view.max_context_len = std::max<int64_t>(view.max_context_len, length);
  if (replays()) view.first_positions = first_positions.data();
  return view;
}

bool ForwardBatch::replays() const {
  return std::any_of(first_positions.begin(), first_positions.end(),
                     [](int32_t first) { return first > 0; });
}

PackedBatch::PackedBatch(const ForwardBatch& batch) : batch_(batch) {
  tokens_ = append(batch.tokens);
  query_start_ = append(batch.query_start);
  context_lens_ = append(batch.context_lens);
  first_positions_ = append(batch.first_positions);
  for (size_t g = 0; g < batch.block_tables.size(); ++g) {
    block_tables_.push_back(append(batch.block_tables[g]));
    slot_mapping_.push_back(append(batch.slot_mapping[g]));
  }
}

const int32_t* PackedBatch::tokens(const std::byte* base) const {
  return reinterpret_cast<const int32_t*>(base + tokens_);
}

AttentionBatch PackedBatch::attention(const std::byte* base, int group) const {
  AttentionBatch view = batch_.attention_view(group);
  auto g = static_cast<size_t>(group);
  view.query_start = reinterpret_cast<const int32_t*>(base + query_start_);
  view.context_lens = reinterpret_cast<const int32_t*>(base + context_lens_);
  view.block_tables = reinterpret_cast<const int32_t*>(base + block_tables_[g]);
  view.slot_mapping = reinterpret_cast<const int64_t*>(base + slot_mapping_[g]);
  if (view.first_positions)
    view.first_positions = reinterpret_cast<const int32_t*>(base + first_positions_);
  return view;
}

BatchTables::BatchTables(Ops& ops, const ForwardBatch& batch) : batch_(batch) {
  if (ops.device() == Device::kCpu) return;
  packed_.emplace(batch);
  memory_ = ops.allocate_scratch(packed_->bytes().size());
  ops.to_backend(memory_.get(), packed_->bytes().data(), packed_->bytes().size());
}

const int32_t* BatchTables::tokens() const {
  if (!packed_) return batch_.tokens.data();
  return packed_->tokens(static_cast<const std::byte*>(memory_.get()));
}

AttentionBatch BatchTables::attention(int group) const {
  if (!packed_) return batch_.attention_view(group);
  return packed_->attention(static_cast<const std::byte*>(memory_.get()), group);
}

const float* backend_floats(Ops& ops, const std::vector<float>& host, BackendMemory& keep) {
  return static_cast<const float*>(
      backend_copy(ops, host.data(), host.size() * sizeof(float), keep));
}

const int32_t* backend_ints(Ops& ops, const std::vector<int32_t>& host, BackendMemory& keep) {
  return static_cast<const int32_t*>(
      backend_copy(ops, host.data(), host.size() * sizeof(int32_t), keep));
}

void report_hidden(Ops& ops, const HiddenStateSink& sink, int index, const Tensor& hidden) {
  if (!sink) return;
  if (ops.device() == Device::kCpu) {
    sink(index, hidden);
    return;
  }
  DI_CHECK(hidden.is_contiguous(), "hidden states must be contiguous to copy them to the host");
  FloatTensor host({hidden.numel()});
  ops.to_host(host.data(), hidden.data, hidden.nbytes());
  Tensor view = hidden;
  view.data = host.data();
  view.device = Device::kCpu;
  sink(index, view);
}

double CausalLM::flops_per_token(double context) const {
  double weights = 0.0;
  for (const Tensor* tensor : weights_read_per_token()) {
    if (tensor->rank == 2) weights += static_cast<double>(tensor->numel());
  }
  return 2.0 * weights + attention_flops_per_token(context);
}

KvCacheShape CausalLM::mtp_kv_shape(int /*block_size*/) const {
  fail("{} has no multi-token-prediction modules", config().architecture);
}

void CausalLM::mtp_forward(int /*index*/, const ForwardBatch& /*batch*/, const Tensor& /*previous*/,
                           KvCache& /*cache*/, Tensor& /*hidden*/, Tensor& /*logits*/) {
  fail("{} has no multi-token-prediction modules", config().architecture);
}

}  // namespace deepinfer
