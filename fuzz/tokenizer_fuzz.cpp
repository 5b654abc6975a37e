// tokenizer.json, then text to encode with it: the input is the JSON, a NUL byte, and the
// text. Loading refuses anything malformed with an Error; a tokenizer that loads encodes every
// valid UTF-8 text in each trust level and decodes what it produced.
#include <memory>
#include <string>

#include "fuzz/fuzz_support.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  // Lambdas cannot capture structured bindings in C++20, so the halves are named plainly.
  const auto parts = fuzz::split_once(fuzz::as_text(data, size), std::string_view("\0", 1));
  const std::string_view definition = parts.first;
  const std::string_view text = parts.second;
  std::unique_ptr<Tokenizer> tokenizer;
  fuzz::expect_clean([&] { tokenizer = Tokenizer::from_json(std::string(definition), ""); });
  if (!tokenizer) return 0;
  for (EncodeMode mode : {EncodeMode::kSpecials, EncodeMode::kAsText, EncodeMode::kPlain}) {
    fuzz::expect_clean([&] {
      std::vector<int32_t> ids = tokenizer->encode(text, mode, /*add_special_tokens=*/true);
      (void)tokenizer->decode(ids, /*skip_special_tokens=*/mode == EncodeMode::kPlain);
    });
  }
  return 0;
}
