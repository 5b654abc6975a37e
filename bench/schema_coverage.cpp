// JSON Schema coverage over JSONSchemaBench-style files (one {"id", "schema", "instances":
// [{"valid", "data"}]} a line): per file, the schemas compiled, and of their labelled
// instances (compact JSON, fed a byte at a time) the valid ones accepted and the invalid ones
// accepted, which must be none. The refusals are counted by message, most common first.
//   schema_coverage FILE.jsonl...
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "structured/structured.h"

namespace {

using deepinfer::structured::Constraint;

bool accepts(const Constraint& constraint, const std::string& text) {
  auto matcher = constraint.start();
  for (char c : text)
    if (!matcher->accept(static_cast<uint8_t>(c))) return false;
  return matcher->complete();
}

struct Counts {
  int schemas = 0, compiled = 0, valid = 0, valid_accepted = 0, invalid = 0, invalid_accepted = 0;
  void add(const Counts& other) {
    schemas += other.schemas, compiled += other.compiled, valid += other.valid;
    valid_accepted += other.valid_accepted, invalid += other.invalid;
    invalid_accepted += other.invalid_accepted;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const auto table = deepinfer::structured::TokenTable::single_bytes();
  std::map<std::string, int> refusals;
  Counts all;
  for (int arg = 1; arg < argc; ++arg) {
    std::ifstream in(argv[arg]);
    if (!in) {
      fmt::print(stderr, "schema_coverage: cannot read {}\n", argv[arg]);
      return 1;
    }
    Counts counts;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      ++counts.schemas;
      std::shared_ptr<const Constraint> constraint;
      try {
        constraint = deepinfer::structured::json_schema_constraint(table, record["schema"].dump());
      } catch (const std::exception& error) {
        // The message without where it happened, so that refusals of a kind add up.
        ++refusals[std::regex_replace(error.what(), std::regex(R"( \(at .*\)$)"), "")];
        continue;
      }
      ++counts.compiled;
      for (const nlohmann::json& instance : record.value("instances", nlohmann::json::array())) {
        const bool valid = instance["valid"].get<bool>();
        const bool accepted = accepts(*constraint, instance["data"].dump());
        (valid ? counts.valid : counts.invalid) += 1;
        (valid ? counts.valid_accepted : counts.invalid_accepted) += accepted ? 1 : 0;
        if (!valid && accepted)
          fmt::print("{}: invalid instance accepted for {}\n", argv[arg], record["id"].dump());
      }
    }
    fmt::print("{}: {} of {} schemas; valid instances accepted {} of {}, invalid {} of {}\n",
               argv[arg], counts.compiled, counts.schemas, counts.valid_accepted, counts.valid,
               counts.invalid_accepted, counts.invalid);
    all.add(counts);
  }
  fmt::print("all: {} of {} schemas; valid instances accepted {} of {}, invalid {} of {}\n",
             all.compiled, all.schemas, all.valid_accepted, all.valid, all.invalid_accepted,
             all.invalid);
  std::multimap<int, std::string, std::greater<>> ranked;
  for (const auto& [message, count] : refusals) ranked.emplace(count, message);
  for (const auto& [count, message] : ranked) fmt::print("{:6}  {}\n", count, message);
  return all.invalid_accepted == 0 ? 0 : 2;
}
