// JSON Schemas as clients send them (response_format json_schema, guided_json), then output
// bytes: compiling either succeeds or refuses with GrammarError within the limits that bound
// its time and memory; a compiled schema's matcher follows the bytes (one token a byte) and
// its mask at each step allows exactly the tokens it would accept.
#include <vector>

#include "fuzz/fuzz_support.h"
#include "structured/structured.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::structured;
  static const auto table = deepinfer::structured::TokenTable::single_bytes();
  const auto parts = deepinfer::fuzz::split_once(deepinfer::fuzz::as_text(data, size), "\n\n");
  const std::string_view schema = parts.first, output = parts.second;
  deepinfer::fuzz::expect_clean([&] {
    auto matcher = json_schema_constraint(table, schema)->start();
    // Masks at every step of the output (the first kChecked ones): a state whose mask was
    // kept under the same key as an earlier one must allow what it accepts, no more, no less.
    constexpr size_t kChecked = 48;
    auto check_mask = [&] {
      std::vector<float> logits(257, 0.0f);
      matcher->mask_logits(logits.data(), 257);
      for (int32_t id = 0; id < 257; ++id) {
        auto probe = matcher->clone();
        if (probe->accept(id) != (logits[static_cast<size_t>(id)] == 0.0f)) std::abort();
      }
    };
    size_t step = 0;
    for (char c : output) {
      if (step++ < kChecked) check_mask();
      if (!matcher->accept(static_cast<uint8_t>(c))) break;
    }
    check_mask();
  });
  return 0;
}
