// Several sequences in one flattened forward: each gets exactly the logits it gets alone.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "model/model.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::as_floats;
using testing::as_ids;
using testing::fixture_model;
using testing::max_abs_difference;

TEST(ForwardBatch, SequencesSharingAForwardMatchTheReference) {
  for (const char* name : {"llama-gqa", "qwen3-hybrid-swa", "mistral-swa"}) {
    auto ops = make_cpu_ops();
    auto model = load_model(fixture_model(name), LoadMode::kMmap, *ops);
    SafetensorsFile reference(fixture_model(name) / "reference.safetensors", LoadMode::kRead);
    std::vector<int32_t> first = as_ids(reference.tensors().at("case0.input_ids"));
    std::vector<int32_t> second = as_ids(reference.tensors().at("case1.input_ids"));
    std::vector<float> first_logits = as_floats(reference.tensors().at("case0.logits"));
    std::vector<float> second_logits = as_floats(reference.tensors().at("case1.logits"));
    int64_t vocab = model->config().vocab_size;
    const int block_size = 4;
    KvCache cache(model->kv_shape(block_size), 64);
    // Interleave the two sequences' block allocations so their tables are not contiguous.
    SequenceKv a, b;
    for (int64_t tokens = block_size; tokens < static_cast<int64_t>(second.size()) + block_size;
         tokens += block_size) {
      if (tokens <= static_cast<int64_t>(first.size()) + block_size - 1)
        a.reserve(cache, std::min<int64_t>(tokens, first.size()));
      b.reserve(cache, std::min<int64_t>(tokens, second.size()));
    }
    // Step 1: both prompts but the last token of each; step 2: one new token per sequence,
    // as a decode step of a continuous batch would be.
    ForwardBatch prefill;
    prefill.add_sequence(std::vector<int32_t>(first.begin(), first.end() - 1), 0, a, block_size,
                         true);
    prefill.add_sequence(std::vector<int32_t>(second.begin(), second.end() - 1), 0, b, block_size,
                         true);
    std::vector<float> logits(prefill.logit_rows.size() * static_cast<size_t>(vocab));
    model->forward(prefill, cache, logits.data());
    size_t first_rows = first.size() - 1;
    EXPECT_LE(max_abs_difference(logits.data(), first_logits.data(), first_rows * vocab), 1e-3f)
        << name;
    EXPECT_LE(max_abs_difference(logits.data() + first_rows * vocab, second_logits.data(),
                                 (second.size() - 1) * vocab),
              1e-3f)
        << name;
    ForwardBatch decode;
    decode.add_sequence({first.back()}, static_cast<int64_t>(first.size()) - 1, a, block_size,
                        false);
    decode.add_sequence({second.back()}, static_cast<int64_t>(second.size()) - 1, b, block_size,
                        false);
    std::vector<float> step(2 * static_cast<size_t>(vocab));
    model->forward(decode, cache, step.data());
    EXPECT_LE(max_abs_difference(step.data(), first_logits.data() + first_rows * vocab, vocab),
              1e-3f)
        << name;
    EXPECT_LE(max_abs_difference(step.data() + vocab,
                                 second_logits.data() + (second.size() - 1) * vocab, vocab),
              1e-3f)
        << name;
  }
}

}  // namespace
}  // namespace deepinfer
