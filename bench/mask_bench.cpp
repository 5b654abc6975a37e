// Token-mask cost along real documents, measured the way MaskBench does: for each schema of
// JSONSchemaBench-style files (one {"id", "schema", "instances": [{"valid", "data"}]} a line), a
// fresh constraint is compiled (timed), then each valid instance (compact JSON) is tokenised
// with a real vocabulary and a mask (the bits of the tokens allowed) is computed before every
// token and before the end token (each timed; applying it to a row of logits on the host,
// which the engine does beside the forward or on the device, is timed on its own). Every
// token of a valid instance must be in its mask: those that are not are counted. With --grammar
// FILE, every schema's instances are walked under that grammar (GBNF or Lark) instead, compiled
// afresh for each schema in the same way. With --slow-ms N, each mask slower than N ms is reported
// with its schema's id and place.
//   mask_bench TOKENIZER_DIR [--grammar FILE] [--slow-ms N] FILE.jsonl...
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using deepinfer::structured::Constraint;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double percentile(std::vector<double>& values, double share) {
  if (values.empty()) return 0.0;
  const auto at = static_cast<size_t>(share * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(at), values.end());
  return values[at];
}

struct Totals {
  int schemas = 0, compiled = 0, instances = 0, walked = 0;
  int64_t outside = 0;  // tokens of valid instances their mask did not allow
  int held = 0;         // instances walked to the end with every token in its mask
  double slow_us = 0;   // 0: report none
  std::string id;       // the schema being walked
  std::vector<double> compile_us, mask_us, apply_us;
  std::vector<std::string> exceptions;  // valid instances not held by their masks, and why
};

// Masks before each of the instance's tokens and before the end; false when a token is
// refused (the instance is then left, its masks so far kept).
bool walk(const Constraint& constraint, const std::vector<int32_t>& tokens, int32_t vocab,
          Totals& totals) {
  auto matcher = constraint.start();
  const int64_t outside_before = totals.outside;
  std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
  for (size_t i = 0; i <= tokens.size(); ++i) {
    const Clock::time_point start = Clock::now();
    const deepinfer::structured::TokenMask mask = matcher->allowed();
    totals.mask_us.push_back(micros_since(start));
    const Clock::time_point apply_start = Clock::now();
    deepinfer::structured::Matcher::apply(mask, logits.data(), vocab);
    totals.apply_us.push_back(micros_since(apply_start));
    if (totals.slow_us > 0 && totals.mask_us.back() > totals.slow_us)
      fmt::print("slow: {:.1f} ms, schema {}, before token {} of {}\n",
                 totals.mask_us.back() / 1000, totals.id, i, tokens.size());
    if (i == tokens.size()) break;
    const auto id = static_cast<size_t>(tokens[i]);
    if (!mask.free() && !((*mask.bits)[id / 64] >> (id % 64) & 1)) ++totals.outside;
    if (!matcher->accept(tokens[i])) return false;
  }
  if (totals.outside == outside_before) {
    ++totals.held;
  } else {
    totals.exceptions.push_back(totals.id + ": a token outside its mask");
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr,
               "usage: mask_bench TOKENIZER_DIR [--grammar FILE] [--slow-ms N] FILE.jsonl...\n");
    return 1;
  }
  const auto tokenizer = deepinfer::Tokenizer::load(argv[1]);
  std::vector<int32_t> control;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id)
    if (tokenizer->is_special(id)) control.push_back(id);
  std::vector<int32_t> ends;
  if (auto end = tokenizer->token_to_id("<|im_end|>")) ends.push_back(*end);
  const auto table =
      std::make_shared<deepinfer::structured::TokenTable>(tokenizer->token_bytes(), ends, control);
  std::string grammar;
  Totals totals;
  int first_file = 2;
  for (; first_file + 1 < argc && std::string(argv[first_file]).starts_with("--");
       first_file += 2) {
    const std::string flag = argv[first_file];
    if (flag == "--grammar") {
      std::stringstream text;
      text << std::ifstream(argv[first_file + 1]).rdbuf();
      grammar = text.str();
    } else if (flag == "--slow-ms") {
      totals.slow_us = 1000.0 * std::stod(argv[first_file + 1]);
    } else {
      fmt::print(stderr, "mask_bench: unknown option {}\n", flag);
      return 1;
    }
  }
  for (int arg = first_file; arg < argc; ++arg) {
    std::ifstream in(argv[arg]);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      ++totals.schemas;
      totals.id = record.value("id", nlohmann::json()).dump();
      std::shared_ptr<const Constraint> constraint;
      const Clock::time_point start = Clock::now();
      try {
        constraint = grammar.empty() ? deepinfer::structured::json_schema_constraint(
                                           table, record["schema"].dump())
                                     : deepinfer::structured::grammar_constraint(table, grammar);
      } catch (const std::exception&) {
        continue;
      }
      totals.compile_us.push_back(micros_since(start));
      ++totals.compiled;
      for (const nlohmann::json& instance : record.value("instances", nlohmann::json::array())) {
        if (!instance["valid"].get<bool>()) continue;
        ++totals.instances;
        const auto tokens =
            tokenizer->encode(instance["data"].dump(), deepinfer::EncodeMode::kPlain);
        if (walk(*constraint, tokens, tokenizer->vocab_size(), totals)) {
          ++totals.walked;
        } else {
          totals.exceptions.push_back(totals.id + ": refused before its end");
        }
      }
    }
    fmt::print(stderr, "{}: {} schemas so far\n", argv[arg], totals.schemas);
  }
  double sum = 0.0;
  for (double us : totals.mask_us) sum += us;
  const double mean =
      totals.mask_us.empty() ? 0.0 : sum / static_cast<double>(totals.mask_us.size());
  fmt::print(
      "{} of {} schemas compiled; {} of {} valid instances walked to the end, {} with every "
      "token in its mask ({} tokens outside: masks cut to single bytes by the work budget)\n",
      totals.compiled, totals.schemas, totals.walked, totals.instances, totals.held,
      totals.outside);
  fmt::print("masks: {}, mean {:.1f} us, p50 {:.1f} us, p99 {:.1f} us, max {:.0f} us\n",
             totals.mask_us.size(), mean, percentile(totals.mask_us, 0.5),
             percentile(totals.mask_us, 0.99), percentile(totals.mask_us, 1.0));
  for (const std::string& exception : totals.exceptions)
    fmt::print("exception: schema {}\n", exception);
  double apply_sum = 0.0;
  for (double us : totals.apply_us) apply_sum += us;
  fmt::print(
      "applied to a host row of logits: mean {:.1f} us, p50 {:.1f} us\n",
      totals.apply_us.empty() ? 0.0 : apply_sum / static_cast<double>(totals.apply_us.size()),
      percentile(totals.apply_us, 0.5));
  fmt::print("compile: p50 {:.0f} us, p99 {:.0f} us\n", percentile(totals.compile_us, 0.5),
             percentile(totals.compile_us, 0.99));
  return 0;
}
