// Cost of one token mask over a real vocabulary (Qwen3's 151k tokens), per grammar state: the
// mask is applied on the sampling path of every constrained decode step. json_object walks the
// vocabulary every time; a regex's automaton state keeps its mask, so only the first visit of a
// state walks it (RegexFirstVisit) and every later one applies it (RegexMask); a JSON Schema's
// program keeps the masks of the states it has seen too (SchemaMask: first visits;
// SchemaMaskSeen: later ones). A grammar's mask runs its Earley chart over the tokens its
// terminals' cached masks leave open (GrammarMask).
#include <benchmark/benchmark.h>

#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

struct Vocabulary {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const structured::TokenTable> table;
  std::shared_ptr<const structured::Constraint> constraint;
};

const Vocabulary& qwen3() {
  static const Vocabulary vocabulary = [] {
    Vocabulary v;
    v.tokenizer = Tokenizer::load(std::string(DEEPINFER_TOKENIZERS) + "/qwen3");
    std::vector<int32_t> control;
    for (int32_t id = 0; id < v.tokenizer->vocab_size(); ++id)
      if (v.tokenizer->is_special(id)) control.push_back(id);
    v.table = std::make_shared<structured::TokenTable>(
        v.tokenizer->token_bytes(), std::vector<int32_t>{*v.tokenizer->token_to_id("<|im_end|>")},
        control);
    v.constraint = structured::json_object_constraint(v.table);
    return v;
  }();
  return vocabulary;
}

// The mask after `prefix` (fed token by token as the tokenizer splits it).
void BM_JsonMask(benchmark::State& state, const char* prefix) {
  const Vocabulary& v = qwen3();
  auto matcher = v.constraint->start();
  for (int32_t id : v.tokenizer->encode(prefix, EncodeMode::kPlain))
    if (!matcher->accept(id)) state.SkipWithError("prefix is not JSON");
  std::vector<float> logits(static_cast<size_t>(v.tokenizer->vocab_size()));
  for (auto _ : state) {
    matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

BENCHMARK_CAPTURE(BM_JsonMask, start, "")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_JsonMask, key, R"({")")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_JsonMask, in_string_value, R"({"name": "a)")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_JsonMask, after_value, R"({"a": [1, 2)")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

constexpr const char* kDatePattern =
    "(19|20)\\d{2}-(0[1-9]|1[0-2])-\\d{2}T[0-2]\\d:[0-5]\\d( [A-Za-z ]{1,20})?";

// The mask of a state seen before: the cached bits applied to the logits.
void BM_RegexMask(benchmark::State& state, const char* prefix) {
  const Vocabulary& v = qwen3();
  auto matcher = structured::regex_constraint(v.table, kDatePattern)->start();
  for (int32_t id : v.tokenizer->encode(prefix, EncodeMode::kPlain))
    if (!matcher->accept(id)) state.SkipWithError("prefix does not match");
  std::vector<float> logits(static_cast<size_t>(v.tokenizer->vocab_size()));
  matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
  for (auto _ : state) {
    matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

// A copy of the vocabulary's table with nothing kept yet: the table keeps the masks worked out
// from each automaton state for every later constraint that builds the same automaton.
std::shared_ptr<const structured::TokenTable> cold_table(const Vocabulary& v) {
  std::vector<int32_t> control;
  for (int32_t id = 0; id < v.tokenizer->vocab_size(); ++id)
    if (v.tokenizer->is_special(id)) control.push_back(id);
  return std::make_shared<structured::TokenTable>(v.tokenizer->token_bytes(), v.table->end_tokens(),
                                                  control);
}

// A state's first mask: the walk of the sorted vocabulary that the cache then keeps (a fresh
// constraint over a cold table each time, both made outside the timing).
void BM_RegexFirstVisit(benchmark::State& state) {
  const Vocabulary& v = qwen3();
  std::vector<float> logits(static_cast<size_t>(v.tokenizer->vocab_size()));
  for (auto _ : state) {
    state.PauseTiming();
    auto matcher = structured::regex_constraint(cold_table(v), kDatePattern)->start();
    state.ResumeTiming();
    matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

// Parsing the pattern and building its automaton (per request unless cached by the server).
void BM_RegexCompile(benchmark::State& state) {
  const Vocabulary& v = qwen3();
  for (auto _ : state)
    benchmark::DoNotOptimize(structured::regex_constraint(v.table, kDatePattern));
}

// A function's arguments as agents ask for them: strings, an enum, a bounded integer, a
// date, an array of objects.
constexpr const char* kToolSchema = R"({"type": "object", "properties": {
    "location": {"type": "string", "maxLength": 64}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}, "start": {"format": "date"},
    "stops": {"type": "array", "items": {"type": "object", "properties": {
      "name": {"type": "string"}, "hours": {"type": "number", "minimum": 0}},
      "required": ["name"], "additionalProperties": false}}},
    "required": ["location", "days"], "additionalProperties": false})";

// A JSON Schema state's first mask: the walk of the vocabulary from the matcher's state (a
// fresh constraint over a cold table each time, made and fed outside the timing).
void BM_SchemaMask(benchmark::State& state, const char* prefix) {
  const Vocabulary& v = qwen3();
  const std::vector<int32_t> ids = v.tokenizer->encode(prefix, EncodeMode::kPlain);
  std::vector<float> logits(static_cast<size_t>(v.tokenizer->vocab_size()));
  for (auto _ : state) {
    state.PauseTiming();
    auto matcher = structured::json_schema_constraint(cold_table(v), kToolSchema)->start();
    for (int32_t id : ids)
      if (!matcher->accept(id)) state.SkipWithError("prefix does not match");
    state.ResumeTiming();
    matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

// The mask after `prefix` in a state its constraint has seen before (another request, an
// earlier step): the kept bits applied.
void seen_state_mask(benchmark::State& state, const structured::Constraint& constraint,
                     const char* prefix) {
  const Vocabulary& v = qwen3();
  auto matcher = constraint.start();
  for (int32_t id : v.tokenizer->encode(prefix, EncodeMode::kPlain))
    if (!matcher->accept(id)) state.SkipWithError("prefix does not match");
  std::vector<float> logits(static_cast<size_t>(v.tokenizer->vocab_size()));
  matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
  for (auto _ : state) {
    matcher->mask_logits(logits.data(), static_cast<int32_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

void BM_SchemaMaskSeen(benchmark::State& state, const char* prefix) {
  seen_state_mask(state, *structured::json_schema_constraint(qwen3().table, kToolSchema), prefix);
}

void BM_SchemaCompile(benchmark::State& state) {
  const Vocabulary& v = qwen3();
  for (auto _ : state)
    benchmark::DoNotOptimize(structured::json_schema_constraint(v.table, kToolSchema));
}

BENCHMARK_CAPTURE(BM_SchemaMask, start, "")
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMask, key, R"({"loc)")
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMask, in_string, R"({"location": "San Fr)")
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMask, in_number, R"({"location": "Oslo", "days": 1)")
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMask, in_date, R"({"location": "Oslo", "days": 3, "start": "2025-0)")
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMask, nested,
                  R"({"location": "Oslo", "days": 3, "stops": [{"name": "A", "hours": 2}, )")
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMaskSeen, key, R"({"loc)")->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMaskSeen, in_string, R"({"location": "San Fr)")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_SchemaCompile)->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_CAPTURE(BM_RegexMask, start, "")->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_RegexMask, in_text, "2024-05-06T12:30 Lun")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_RegexFirstVisit)->Iterations(20)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RegexCompile)->Unit(benchmark::kMicrosecond)->UseRealTime();

// JSON in GBNF, as llama.cpp's examples write it.
constexpr const char* kJsonGrammar = R"(root ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*)";

// A grammar state's mask, the terminals' masks already cached (their first walk is once per
// terminal state for the vocabulary's lifetime).
void BM_GrammarMask(benchmark::State& state, const char* prefix) {
  seen_state_mask(state, *structured::grammar_constraint(qwen3().table, kJsonGrammar), prefix);
}

void BM_GrammarCompile(benchmark::State& state) {
  const Vocabulary& v = qwen3();
  for (auto _ : state)
    benchmark::DoNotOptimize(structured::grammar_constraint(v.table, kJsonGrammar));
}

BENCHMARK_CAPTURE(BM_GrammarMask, start, "")->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GrammarMask, key, R"({"loc)")->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GrammarMask, in_string, R"({"location": "San Fr)")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_GrammarMask, in_number, R"({"location": "Oslo", "days": 1)")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_GrammarMask, nested,
                  R"({"location": "Oslo", "days": 3, "stops": [{"name": "A", "hours": 2}, )")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_GrammarCompile)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();
