#include "model/model.h"

namespace deepinfer {

void ForwardBatch::add_sequence(const std::vector<int32_t>& new_tokens, int64_t cached,
                                const SequenceBlocks& blocks, int block_size, bool all_logits,
                                bool want_logits) {
  int32_t first_row = query_start.back();
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    int64_t position = cached + static_cast<int64_t>(i);
    tokens.push_back(new_tokens[i]);
    positions.push_back(static_cast<int32_t>(position));
    slot_mapping.push_back(blocks.slot(position, block_size));
    if (want_logits && (all_logits || i + 1 == new_tokens.size()))
      logit_rows.push_back(first_row + static_cast<int32_t>(i));
  }
  query_start.push_back(first_row + static_cast<int32_t>(new_tokens.size()));
  context_lens.push_back(static_cast<int32_t>(cached + static_cast<int64_t>(new_tokens.size())));
  // Re-pad every sequence's row when this one needs a wider table.
  const auto& table = blocks.table();
  int width = std::max(max_blocks_per_seq, static_cast<int>(table.size()));
  if (width != max_blocks_per_seq) {
    std::vector<int32_t> widened(static_cast<size_t>(num_seqs() - 1) * static_cast<size_t>(width),
                                 0);
    for (int s = 0; s + 1 < num_seqs(); ++s) {
      std::copy_n(block_tables.begin() + static_cast<std::ptrdiff_t>(s) * max_blocks_per_seq,
                  max_blocks_per_seq, widened.begin() + static_cast<std::ptrdiff_t>(s) * width);
    }
    block_tables = std::move(widened);
    max_blocks_per_seq = width;
  }
  size_t row = block_tables.size();
  block_tables.resize(row + static_cast<size_t>(width), 0);
  std::copy(table.begin(), table.end(), block_tables.begin() + static_cast<std::ptrdiff_t>(row));
}

size_t CausalLM::weight_bytes_per_token() const {
  size_t bytes = 0;
  for (const Tensor* tensor : weights_read_per_token()) {
    bytes += tensor->nbytes();
    if (tensor->block_scales) {
      bytes += sizeof(float) *
               static_cast<size_t>(tensor->block_scales->rows * tensor->block_scales->cols);
    }
  }
  return bytes;
}

AttentionBatch ForwardBatch::attention_view() const {
  AttentionBatch view;
  view.num_seqs = num_seqs();
  view.query_start = query_start.data();
  view.context_lens = context_lens.data();
  view.block_tables = block_tables.data();
  view.max_blocks_per_seq = max_blocks_per_seq;
  view.slot_mapping = slot_mapping.data();
  return view;
}

double CausalLM::flops_per_token(double context) const {
  double weights = 0.0;
  for (const Tensor* tensor : weights_read_per_token()) {
    if (tensor->rank == 2) weights += static_cast<double>(tensor->numel());
  }
  return 2.0 * weights + attention_flops_per_token(context);
}

}  // namespace deepinfer
