// Grammars as clients send them (structured_outputs.grammar, guided_grammar: GBNF or Lark),
// then output bytes: compiling either succeeds or refuses with GrammarError within the limits
// that bound its time and memory; a compiled grammar's matcher follows the bytes (one token a
// byte) and its mask allows exactly the tokens it would accept.
#include <vector>

#include "fuzz/fuzz_support.h"
#include "structured/structured.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::structured;
  static const auto table = TokenTable::single_bytes();
  const auto parts = deepinfer::fuzz::split_once(deepinfer::fuzz::as_text(data, size), "\n\n\n");
  const std::string_view grammar = parts.first, output = parts.second;
  deepinfer::fuzz::expect_clean([&] {
    auto matcher = grammar_constraint(table, grammar)->start();
    for (char c : output)
      if (!matcher->accept(static_cast<uint8_t>(c))) break;
    std::vector<float> logits(257, 0.0f);
    matcher->mask_logits(logits.data(), 257);
    bool any = false;
    for (int32_t id = 0; id < 257; ++id) {
      auto probe = matcher->clone();
      const bool allowed = logits[static_cast<size_t>(id)] == 0.0f;
      if (probe->accept(id) != allowed) std::abort();
      any = any || allowed;
    }
    // Rules that derive no text are dropped: every prefix can still be finished.
    if (!any) std::abort();
  });
  return 0;
}
