// JSON Schemas as clients send them (response_format json_schema, guided_json), then output
// bytes: compiling either succeeds or refuses with GrammarError within the limits that bound
// its time and memory; a compiled schema's matcher follows the bytes (one token a byte) and
// its mask allows exactly the tokens it would accept.
#include <vector>

#include "fuzz/fuzz_support.h"
#include "structured/structured.h"

namespace {

std::shared_ptr<const deepinfer::structured::TokenTable> byte_table() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back("<eos>");
  return std::make_shared<deepinfer::structured::TokenTable>(bytes, std::vector<int32_t>{256},
                                                             std::vector<int32_t>{});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::structured;
  static const auto table = byte_table();
  const auto parts = deepinfer::fuzz::split_once(deepinfer::fuzz::as_text(data, size), "\n\n");
  const std::string_view schema = parts.first, output = parts.second;
  deepinfer::fuzz::expect_clean([&] {
    auto matcher = json_schema_constraint(table, schema)->start();
    for (char c : output)
      if (!matcher->accept(static_cast<uint8_t>(c))) break;
    std::vector<float> logits(257, 0.0f);
    matcher->mask_logits(logits.data(), 257);
    for (int32_t id = 0; id < 257; ++id) {
      auto probe = matcher->clone();
      if (probe->accept(id) != (logits[static_cast<size_t>(id)] == 0.0f)) std::abort();
    }
  });
  return 0;
}
