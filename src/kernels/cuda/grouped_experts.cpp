#include "kernels/cuda/grouped_experts.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/expert_tables.h"

namespace deepinfer::cuda {
namespace {

// Where each expert's rows sit in the quantised copies: one segment per chosen expert, its
// pairs padded to kFp8RowMultiple rows (the padding quantises to zeros). x_source names each
// copy row's row of x, act_source its pair (the activations are stored by pair).
struct SegmentLayout {
  std::vector<int32_t> x_source, act_source, segment_of_row, segment_first;
  int64_t rows = 0;

  explicit SegmentLayout(const ExpertGroups& groups) {
    for (size_t a = 0; a + 1 < groups.first.size(); ++a) {
      const int64_t first = groups.first[a], count = groups.first[a + 1] - first;
      const int64_t padded = (count + kFp8RowMultiple - 1) / kFp8RowMultiple * kFp8RowMultiple;
      segment_first.push_back(static_cast<int32_t>(rows));
      for (int64_t r = 0; r < padded; ++r) {
        const bool real = r < count;
        x_source.push_back(real ? groups.rows[static_cast<size_t>(first + r)] : -1);
        act_source.push_back(real ? static_cast<int32_t>(first + r) : -1);
        segment_of_row.push_back(static_cast<int32_t>(a));
      }
      rows += padded;
    }
    segment_first.push_back(static_cast<int32_t>(rows));
  }
  int64_t segment_rows(size_t a) const { return segment_first[a + 1] - segment_first[a]; }
};

// One scratch allocation split into 256-byte aligned pieces.
class ScratchPieces {
 public:
  size_t add(size_t bytes) {
    const size_t at = total_;
    total_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

}  // namespace

bool fp8_grouped_experts_fit(const RoutedExperts& experts, int64_t hidden) {
  if (!uniform_experts(experts) || experts.gate[0]->dtype != DType::kF8E4M3) return false;
  const int64_t inter = experts.gate[0]->dim(0);
  return experts.gate[0]->dim(1) == hidden && LtMatmul::fp8_fits(inter, hidden) &&
         LtMatmul::fp8_fits(hidden, inter);
}

bool fp8_grouped_experts(Ops& ops, LtMatmul& lt, const Tensor& x, const RoutedExperts& experts,
                         const ExpertGroups& groups, Tensor& out, cudaStream_t stream) {
  const int64_t hidden = x.dim(1), inter = experts.gate[0]->dim(0);
  const auto pairs = static_cast<int64_t>(groups.rows.size());
  const SegmentLayout layout(groups);
  const int64_t rows = layout.rows, spare = kFp8RowMultiple;
  auto floats = [](int64_t count) { return static_cast<size_t>(count) * sizeof(float); };
  ScratchPieces pieces;
  const size_t tables =
      pieces.add(static_cast<size_t>(3 * rows) * 4 + layout.segment_first.size() * 4);
  const size_t x_fp8 = pieces.add(static_cast<size_t>(rows * hidden));
  const size_t x_scales = pieces.add(floats(rows * hidden / kFp8Group));
  const size_t act_fp8 = pieces.add(static_cast<size_t>(rows * inter));
  const size_t act_scales = pieces.add(floats(rows * inter / kFp8Group));
  // A segment's product writes all its padded rows: the next segment's product overwrites the
  // overhang later on the same stream, and `spare` rows take the last one's.
  const size_t gates = pieces.add(floats((pairs + spare) * inter));
  const size_t ups = pieces.add(floats((pairs + spare) * inter));
  const size_t outputs = pieces.add(floats((pairs + spare) * hidden));
  const size_t weight_scales =
      pieces.add(std::max(LtMatmul::fp8_weight_scale_bytes(inter, hidden),
                          LtMatmul::fp8_weight_scale_bytes(hidden, inter)));
  BackendMemory scratch = ops.allocate_scratch(pieces.total());
  auto* base = static_cast<char*>(scratch.get());
  auto at = [&](size_t offset) { return base + offset; };
  auto scale_at = [&](size_t offset) { return reinterpret_cast<float*>(base + offset); };

  // Every shape must have an algorithm before anything runs, so a refusal leaves no work half
  // done and the caller's general path takes the layer.
  for (size_t a = 0; a < groups.experts.size(); ++a) {
    const size_t e = groups.experts[a];
    const int64_t segment = layout.segment_rows(a);
    if (!lt.fp8_ready(segment, inter, hidden, experts.gate[e]->block_scales->data,
                      scale_at(x_scales), at(weight_scales)) ||
        !lt.fp8_ready(segment, hidden, inter, experts.down[e]->block_scales->data,
                      scale_at(act_scales), at(weight_scales)))
      return false;
  }

  std::vector<int32_t> host_tables;
  for (const auto* part :
       {&layout.x_source, &layout.act_source, &layout.segment_of_row, &layout.segment_first})
    host_tables.insert(host_tables.end(), part->begin(), part->end());
  ops.to_backend(at(tables), host_tables.data(), host_tables.size() * sizeof(int32_t));
  const auto* table = reinterpret_cast<const int32_t*>(at(tables));
  const int32_t *segment_of_row = table + 2 * rows, *segment_first = table + 3 * rows;

  auto products = [&](const std::vector<const Tensor*>& weights, size_t activations, size_t scales,
                      int64_t n, int64_t k, size_t results) {
    for (size_t a = 0; a < groups.experts.size(); ++a) {
      const Tensor& weight = *weights[groups.experts[a]];
      const int64_t first_row = layout.segment_first[a];
      const bool done = lt.multiply_fp8(
          at(activations) + first_row * k, scale_at(scales) + first_row * (k / kFp8Group),
          layout.segment_rows(a), weight.as<const uint8_t>(), weight.block_scales->data, n, k,
          scale_at(results) + groups.first[a] * n, at(weight_scales), stream);
      if (!done) fail("cuBLASLt refused an FP8 expert product it planned");
    }
  };
  lt.quantise_fp8(x.as<const float>(), {table, segment_of_row, segment_first, rows, 0}, hidden,
                  at(x_fp8), scale_at(x_scales), stream);
  products(experts.gate, x_fp8, x_scales, inter, hidden, gates);
  products(experts.up, x_fp8, x_scales, inter, hidden, ups);

  Tensor gate = Tensor::contiguous(scale_at(gates), DType::kF32, {pairs, inter}, Device::kCuda);
  const Tensor up = Tensor::contiguous(scale_at(ups), DType::kF32, {pairs, inter}, Device::kCuda);
  if (experts.routing.swiglu_limit > 0) {
    ops.clamped_silu_mul(gate, up, experts.routing.swiglu_limit, gate);
  } else {
    ops.silu_mul(gate, up, gate);
  }
  lt.quantise_fp8(scale_at(gates), {table + rows, segment_of_row, segment_first, rows, 0}, inter,
                  at(act_fp8), scale_at(act_scales), stream);
  products(experts.down, act_fp8, act_scales, hidden, inter, outputs);
  const Tensor results =
      Tensor::contiguous(scale_at(outputs), DType::kF32, {pairs, hidden}, Device::kCuda);
  ops.add_scaled_rows(out, groups.rows, groups.scales, results);
  return true;
}

}  // namespace deepinfer::cuda
