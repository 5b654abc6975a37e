#include "model/layers.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

const Tensor* layer_weight(const TensorStore& store, const std::string& name,
                           std::initializer_list<int64_t> shape) {
  const Tensor& tensor = store.get(name, shape);
  bool block_fp8 = tensor.dtype == DType::kF8E4M3 && tensor.block_scales;
  if (tensor.dtype != DType::kF32 && tensor.dtype != DType::kBF16 && tensor.dtype != DType::kF16 &&
      !block_fp8) {
    fail("tensor \"{}\" has dtype {}; layers need F32, BF16, F16 or block-scaled F8_E4M3", name,
         dtype_name(tensor.dtype));
  }
  return &tensor;
}

std::vector<float> host_floats(Ops& ops, const TensorStore& store, const std::string& name,
                               std::initializer_list<int64_t> shape) {
  const Tensor& tensor = store.get(name, shape);
  if (tensor.dtype != DType::kF32 && tensor.dtype != DType::kBF16 && tensor.dtype != DType::kF16)
    fail("tensor \"{}\" has dtype {}; expected F32, BF16 or F16", name, dtype_name(tensor.dtype));
  std::vector<std::byte> raw(tensor.nbytes());
  ops.to_host(raw.data(), tensor.data, raw.size());
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (tensor.dtype == DType::kF32) {
      std::memcpy(&values[i], raw.data() + i * 4, 4);
      continue;
    }
    uint16_t bits = 0;
    std::memcpy(&bits, raw.data() + i * 2, 2);
    values[i] = tensor.dtype == DType::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
  }
  return values;
}

GatedMlp bind_gated_mlp(const TensorStore& store, const std::string& prefix, int64_t hidden,
                        int64_t intermediate) {
  GatedMlp mlp;
  mlp.gate = layer_weight(store, prefix + "gate_proj.weight", {intermediate, hidden});
  mlp.up = layer_weight(store, prefix + "up_proj.weight", {intermediate, hidden});
  mlp.down = layer_weight(store, prefix + "down_proj.weight", {hidden, intermediate});
  return mlp;
}

void run_gated_mlp(Ops& ops, const GatedMlp& mlp, const Tensor& x, Tensor& out,
                   float swiglu_limit) {
  int64_t tokens = x.dim(0);
  BackendTensor gate(ops, {tokens, mlp.gate->dim(0)});
  BackendTensor up(ops, {tokens, mlp.up->dim(0)});
  Tensor gate_view = gate.view();
  Tensor up_view = up.view();
  ops.matmuls(x, {{mlp.gate, nullptr, &gate_view}, {mlp.up, nullptr, &up_view}});
  if (swiglu_limit > 0) {
    ops.clamped_silu_mul(gate_view, up_view, swiglu_limit, gate_view);
  } else {
    ops.silu_mul(gate_view, up_view, gate_view);
  }
  ops.matmul(gate_view, *mlp.down, nullptr, out);
}

namespace {

bool logit_rows_are_all_rows(const ForwardBatch& batch) {
  for (size_t i = 0; i < batch.logit_rows.size(); ++i) {
    if (batch.logit_rows[i] != static_cast<int32_t>(i)) return false;
  }
  return true;
}

}  // namespace

void decode_logits(Ops& ops, const Tensor& hidden, const Tensor& final_norm, const Tensor& lm_head,
                   float eps, Tensor& logits) {
  BackendTensor normed(ops, {hidden.dim(0), hidden.dim(-1)});
  Tensor normed_view = normed.view();
  ops.norm_matmuls(hidden, final_norm, eps, normed_view, {{&lm_head, nullptr, &logits}});
}

void final_logits(Ops& ops, const ForwardBatch& batch, Tensor hidden, const Tensor& final_norm,
                  const Tensor& lm_head, float eps, int num_layers, Tensor& logits,
                  const HiddenStateSink& hidden_sink) {
  int64_t width = hidden.dim(-1);
  auto rows = static_cast<int64_t>(batch.logit_rows.size());
  BackendTensor selected(ops, {std::max<int64_t>(rows, 1), width});
  Tensor selected_view = selected.view();
  selected_view.shape[0] = rows;
  if (hidden_sink) {
    // Every row's final-norm output is wanted, not only the rows that produce logits.
    ops.rmsnorm(hidden, final_norm, eps, hidden);
    report_hidden(ops, hidden_sink, num_layers, hidden);
    if (rows > 0) ops.gather_rows(hidden, batch.logit_rows, selected_view);
  } else if (rows == hidden.dim(0) && logit_rows_are_all_rows(batch)) {
    ops.rmsnorm(hidden, final_norm, eps, selected_view);  // decode: every row, in order
  } else if (rows > 0) {
    ops.gather_rows(hidden, batch.logit_rows, selected_view);
    ops.rmsnorm(selected_view, final_norm, eps, selected_view);
  }
  if (rows > 0) ops.matmul(selected_view, lm_head, nullptr, logits);
}

}  // namespace deepinfer
