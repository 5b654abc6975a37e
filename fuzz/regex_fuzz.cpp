// Regex patterns as clients send them (structured_outputs.regex, guided_regex): parsing and
// building the automaton either succeed or refuse with GrammarError, within the limits that
// bound their time and memory. Beyond not crashing, a compiled automaton's transitions stay
// inside it, and its start state can still reach a match (dead ends are pruned).
#include "fuzz/fuzz_support.h"
#include "structured/regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::structured;
  deepinfer::fuzz::expect_clean([&] {
    const ByteDfa dfa(RegexTree::parse(deepinfer::fuzz::as_text(data, size)));
    for (int state = 0; state < dfa.size(); ++state) {
      for (int byte = 0; byte < 256; ++byte) {
        const int next = dfa.next(state, static_cast<uint8_t>(byte));
        if (next < 0 || next >= dfa.size()) std::abort();
      }
    }
    if (dfa.final(ByteDfa::kStart) && !dfa.accepting(ByteDfa::kStart)) std::abort();
  });
  return 0;
}
