// The JSON-Schema-Test-Suite (drafts 2020-12 and 7, with the format assertions of optional/)
// against the schema matcher: for every case whose schema compiles, each test's data written
// as compact JSON is accepted exactly when it is labelled valid. A schema refused with a
// GrammarError counts as unsupported. An invalid instance accepted always fails the test; a
// valid one rejected fails unless not_taken() explains it, and an entry there that explains
// nothing fails too, so the list stays true.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "structured/regex.h"
#include "structured/structured.h"
#include "support/test_support.h"

namespace deepinfer::structured {
namespace {

bool accepts(const Constraint& constraint, const std::string& text) {
  auto matcher = constraint.start();
  for (char c : text)
    if (!matcher->accept(static_cast<uint8_t>(c))) return false;
  return matcher->complete();
}

// Valid data the matcher does not take, by where in either draft ("file#case/test", or a
// whole file or case), with why: one spelling where JSON has several, and format languages
// that are the plain-ASCII subset of their RFCs (whatever the model writes is valid).
const std::vector<std::pair<std::string, std::string>>& not_taken() {
  static const std::vector<std::pair<std::string, std::string>> known = {
      {"const.json#10/", "const 0 is written 0: 0.0 is the same value spelt another way"},
      {"const.json#11/", "const 1 is written 1, not 1.0"},
      {"const.json#12/", "const -2.0 is written -2.0, not -2"},
      {"const.json#13/", "a large const is written as the schema writes it, not with an exponent"},
      {"enum.json#9/", "enum values are written as the schema writes them (0, not 0.0)"},
      {"enum.json#10/", "enum values are written as the schema writes them ([0], not [0.0])"},
      {"enum.json#11/", "enum values are written as the schema writes them (1, not 1.0)"},
      {"enum.json#12/", "enum values are written as the schema writes them ([1], not [1.0])"},
      {"type.json#0/1", "an integer is written without a fraction: 1.0 is spelt 1"},
      {"patternProperties.json#1/", "a key two patterns match is refused (one node per key)"},
      {"vocabulary.json#0/", "a custom metaschema's vocabulary is not read: keywords still assert"},
      {"ref.json#5/", "draft 7 ignores $ref's siblings; they are enforced, as from 2019-09 on"},
      {"optional/format/date-time.json#0/11", "leap seconds only as 23:59:60 with a zero offset"},
      {"optional/format/date-time.json#0/31", "fractions of a second up to nine digits"},
      {"optional/format/time.json#0/", "leap seconds only as 23:59:60 with a zero offset"},
      {"optional/format/hostname.json#1/", "no A-labels (xn--): their punycode is not checked"},
      {"optional/format/email.json#0/", "no quoted local parts or address literals"},
      {"optional/format/ipv6.json#0/", "no IPv4 tail inside an IPv6 address"},
      {"optional/format/idn-email.json", "internationalised forms as their ASCII forms"},
      {"optional/format/idn-hostname.json", "internationalised forms as their ASCII forms"},
      {"optional/format/iri.json", "internationalised forms as their ASCII forms, no IPvFuture"},
      {"optional/format/iri-reference.json", "internationalised forms as their ASCII forms"},
  };
  return known;
}

// The entry of not_taken() that explains a rejection at `where` ("draft/file#case/test").
const std::pair<std::string, std::string>* explained(const std::string& where) {
  const std::string within_draft = where.substr(where.find('/') + 1);
  for (const auto& entry : not_taken())
    if (within_draft.starts_with(entry.first)) return &entry;
  return nullptr;
}

struct Tally {
  int cases = 0, compiled = 0, valid = 0, valid_accepted = 0, invalid = 0, invalid_accepted = 0;
};

void run_file(const std::filesystem::path& file, const std::string& name, Tally& tally,
              std::set<std::string>& rejected_valid) {
  std::ifstream in(file);
  const nlohmann::json cases = nlohmann::json::parse(in);
  const auto table = TokenTable::single_bytes();
  for (size_t c = 0; c < cases.size(); ++c) {
    ++tally.cases;
    std::shared_ptr<const Constraint> constraint;
    try {
      constraint = json_schema_constraint(table, cases[c]["schema"].dump());
    } catch (const GrammarError&) {
      continue;
    }
    ++tally.compiled;
    const nlohmann::json& tests = cases[c]["tests"];
    for (size_t t = 0; t < tests.size(); ++t) {
      const std::string description = tests[t]["description"].get<std::string>();
      // Draft 2020-12 makes format an annotation by default; the engine asserts it (the
      // optional/format files test that).
      if (description.find("only an annotation by default") != std::string::npos) continue;
      const bool valid = tests[t]["valid"].get<bool>();
      const std::string text = tests[t]["data"].dump();
      const bool accepted = accepts(*constraint, text);
      const std::string where = fmt::format("{}#{}/{}", name, c, t);
      (valid ? tally.valid : tally.invalid) += 1;
      (valid ? tally.valid_accepted : tally.invalid_accepted) += accepted ? 1 : 0;
      if (!valid && accepted) ADD_FAILURE() << where << " accepts invalid " << text;
      if (valid && !accepted) rejected_valid.insert(where + " " + text.substr(0, 80));
    }
  }
}

TEST(JsonSchemaTestSuite, LabelsHoldForEveryCompiledCase) {
  const std::filesystem::path root = testing::fixture_path("structured") / "json-schema-test-suite";
  std::set<std::string> rejected_valid;
  for (const char* draft : {"draft2020-12", "draft7"}) {
    Tally tally;
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / draft))
      if (entry.path().extension() == ".json") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    ASSERT_GT(files.size(), 40u) << draft;
    for (const auto& file : files)
      run_file(file, std::filesystem::relative(file, root).generic_string(), tally, rejected_valid);
    std::printf("%s: %d of %d cases compiled; valid accepted %d of %d; invalid accepted %d of %d\n",
                draft, tally.compiled, tally.cases, tally.valid_accepted, tally.valid,
                tally.invalid_accepted, tally.invalid);
    EXPECT_EQ(tally.invalid_accepted, 0) << draft;
  }
  std::set<std::string> used;
  for (const std::string& rejected : rejected_valid) {
    const auto* entry = explained(rejected.substr(0, rejected.find(' ')));
    if (!entry) ADD_FAILURE() << "rejects valid " << rejected;
    if (entry) used.insert(entry->first);
  }
  for (const auto& [where, why] : not_taken())
    if (!used.contains(where)) ADD_FAILURE() << "listed but every test passes: " << where;
}

}  // namespace
}  // namespace deepinfer::structured
