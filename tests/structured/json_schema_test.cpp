// JSON Schema constraints: texts each keyword allows and forbids, fed byte by byte; the
// keywords refused by name; token masks against feeding every token; and JSONSchemaBench
// schemas with their labelled instances (never an invalid one accepted).
#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "structured/structured.h"
#include "support/test_support.h"

namespace deepinfer::structured {
namespace {

// Token i < 256 writes byte i; a few longer tokens follow; the last one ends the output.
std::shared_ptr<const TokenTable> byte_table() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* text : {"{\"", "\":", "\",\"", "\"}", "true", "null", "12", "ab", "\\n", "-0",
                           "1.5", "\"a\"", "]}", "[{", "2024-", "\xc3\xa9", " \"", "\":\""})
    bytes.emplace_back(text);
  bytes.emplace_back("<eos>");
  const auto end = static_cast<int32_t>(bytes.size()) - 1;
  return std::make_shared<TokenTable>(bytes, std::vector<int32_t>{end}, std::vector<int32_t>{});
}

const std::shared_ptr<const TokenTable>& table() {
  static const auto shared = byte_table();
  return shared;
}

bool accepts(const Constraint& constraint, const std::string& text) {
  auto matcher = constraint.start();
  for (char c : text)
    if (!matcher->accept(static_cast<uint8_t>(c))) return false;
  return matcher->complete();
}

struct Case {
  std::string schema;
  std::vector<std::string> good, bad;
};

void check(const Case& c) {
  SCOPED_TRACE(c.schema);
  auto constraint = json_schema_constraint(table(), c.schema);
  for (const std::string& text : c.good) EXPECT_TRUE(accepts(*constraint, text)) << text;
  for (const std::string& text : c.bad) EXPECT_FALSE(accepts(*constraint, text)) << text;
}

TEST(JsonSchema, ObjectsTakeTheirPropertiesInAnyOrder) {
  check({R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
             "required":["a"],"additionalProperties":false})",
         {R"({"a":1})", R"({"b":"x","a":-2})", R"( { "a" : 3 , "b" : "" })"},
         {"{}", R"({"b":"x"})", R"({"a":1.5})", R"({"a":1,"c":2})", R"({"a":1,"a":2})",
          R"({"a":"1"})",
          R"({"a":1})"
          "x"}});
  // Keys are written one way: an escaped spelling of a declared name is not another key.
  check({R"({"type":"object","properties":{"a":{"type":"integer"}}})",
         {R"({"zz":[1,{"q":null}],"a":0})", "{}", R"({"x\ny":1})", R"({"\u001f":1})"},
         {R"({"a":true})", "[]", R"({"\u0061":"s"})", R"({"a\/b":1})", R"({"\u0041":1})"}});
  check({R"({"type":"object","patternProperties":{"^x-":{"type":"integer"}},
             "additionalProperties":false,"minProperties":1,"maxProperties":2})",
         {R"({"x-a":1})", R"({"x-a":1,"x-b":2})"},
         {"{}", R"({"y":1})", R"({"x-a":"s"})", R"({"x-a":1,"x-b":2,"x-c":3})"}});
  check({R"({"type":"object","properties":{"card":{"type":"string"},"bill":{"type":"string"}},
             "dependentRequired":{"card":["bill"]}})",
         {R"({"bill":"x"})", R"({"card":"1","bill":"x"})", "{}", R"({"bill":"x","card":"1"})"},
         {R"({"card":"1"})", R"({"card":"1","z":2})"}});
  check({R"({"dependencies":{"a":["b","c"]},"additionalProperties":false,
             "properties":{"a":{},"b":{}}})",
         {R"({"b":1})", "{}"},
         {R"({"a":1,"b":2})", R"({"a":1})"}});
  check({R"({"type":"object","required":["k"],"additionalProperties":{"type":"boolean"}})",
         {R"({"k":true,"z":false})"},
         {R"({"z":false})", R"({"k":1})"}});
}

TEST(JsonSchema, StringsKeepLengthsPatternsAndFormats) {
  check({R"({"type":"string","minLength":2,"maxLength":3})",
         {R"("ab")", R"("a\nb")", "\"\xc3\xa9\xc3\xa9\"", R"("\u0041bc")"},
         {R"("a")", R"("abcd")", "\"a\nb\"", R"("\x")"}});
  check({R"({"type":"string","pattern":"^[a-z]+\\d$"})", {R"("abc1")"}, {R"("abc")", R"("1")"}});
  check({R"({"type":"string","pattern":"b\"c"})", {R"("ab\"cd")"}, {R"("abcd")", R"("ab"c")"}});
  check({R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")"}});
  check({R"({"type":"string","format":"date-time"})",
         {R"("2024-02-29T12:30:00Z")", R"("2024-02-29T12:30:00.5+01:00")",
          R"("2016-12-31T23:59:60Z")"},
         {R"("2024-02-29 12:30")", R"("2016-12-31T23:58:60Z")"}});
  check({R"({"format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123")"}});
  check({R"({"format":"ipv4"})", {R"("192.168.0.1")"}, {R"("256.1.1.1")"}});
  check({R"({"format":"ipv6"})", {R"("::1")", R"("fe80::1:2")"}, {R"(":::")"}});
  check({R"({"format":"email"})", {R"("a.b@ex.com")"}, {R"("a@")", R"("ab")"}});
  check({R"({"format":"duration"})",
         {R"("P3DT4H")", R"("P1Y2M3DT4H5M6S")", R"("P2W")"},
         {R"("P")", R"("PT")", R"("PT0.5S")", R"("P1Y2D")", R"("PT1H2S")"}});
  check({R"({"format":"hostname"})",
         {R"("a-b.example")", '"' + std::string(63, 'a') + '"'},
         {R"("xn--abc")", R"("ab--c")", '"' + std::string(64, 'a') + '"', R"("-a")"}});
  check({R"({"format":"uri"})",
         {R"("http://u@host:80/p?q#f")", R"("urn:isbn:1")"},
         {R"("http://host:8a/")", R"("http://[x]/")", R"("/relative")"}});
}

TEST(JsonSchema, NumbersKeepTheirBounds) {
  check({R"({"type":"integer","minimum":-5,"exclusiveMaximum":100,"multipleOf":5})",
         {"-5", "0", "95", "-0"},
         {"-10", "100", "7", "1.0", "105", "1e1"}});
  check({R"({"type":"number","minimum":0.5,"maximum":2.25})",
         {"0.5", "1", "2.25", "2.2", "1.999"},
         {"0.4", "2.26", "3", "-1", "1e0", "0.49"}});
  check({R"({"type":"number","exclusiveMinimum":0})", {"0.001", "7"}, {"0", "-0.5", "1e9"}});
  check({R"({"type":"number"})", {"-0.5e-3", "12", "0"}, {"01", "1.", "-", ".5"}});
}

TEST(JsonSchema, ArraysTuplesAndCounts) {
  check({R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})",
         {"[true]", "[ false , true ]"},
         {"[]", "[true,true,true]", "[1]"}});
  check({R"({"prefixItems":[{"type":"integer"},{"type":"string"}],"items":false})",
         {R"([1,"a"])", "[1]", "[]"},
         {R"([1,"a",2])", R"(["a"])"}});
  check({R"({"items":[{"type":"integer"}],"additionalItems":{"type":"null"}})",
         {"[1,null,null]"},
         {"[1,2]"}});
}

TEST(JsonSchema, EnumsConstsUnionsAndNegation) {
  check({R"({"enum":["red","green",1,null,{"a":[1,2]}]})",
         {R"("red")", "1", "null", R"({"a":[1,2]})"},
         {R"("blue")", "2", R"({"a":[1]})", "12"}});
  check({R"({"const":"x"})", {R"("x")"}, {R"("y")"}});
  check({R"({"anyOf":[{"type":"string","maxLength":2},{"type":"integer"}]})",
         {R"("ab")", "5"},
         {R"("abc")", "true"}});
  check({R"({"oneOf":[
           {"properties":{"k":{"const":"a"},"x":{"type":"integer"}},"required":["k","x"],
            "additionalProperties":false},
           {"properties":{"k":{"const":"b"},"y":{"type":"string"}},"required":["k","y"],
            "additionalProperties":false}]})",
         {R"({"k":"a","x":1})", R"({"y":"s","k":"b"})"},
         {R"({"k":"a","y":"s"})", R"({"k":"c","x":1})"}});
  check({R"({"type":["integer","null"]})", {"3", "null"}, {"1.5", R"("3")"}});
  check({R"({"type":"string","nullable":true})", {"null", R"("a")"}, {"1"}});
  check({R"({"not":{"type":"string"}})", {"1", "[]"}, {R"("a")"}});
  check({R"({"type":"string","not":{"enum":["a/b","x"]}})",
         {R"("ab")", R"("a/bc")", R"("")"},
         {R"("a/b")", R"("a\/b")", R"("\u0061/b")", R"("\u0078")"}});
  check({R"({"type":"integer","not":{"const":0}})", {"1", "-3", "10"}, {"0", "-0"}});
  check({R"({"type":"object","not":{"required":["a","b"]}})",
         {R"({"a":1})", R"({"b":1,"c":2})", "{}"},
         {R"({"a":1,"b":2})", R"({"b":2,"x":0,"a":1})"}});
  check({R"({"oneOf":[{"type":"string"},{"type":"integer"}]})", {R"("a")", "3"}, {"1.5"}});
  check({R"({"oneOf":[{"properties":{"k":{"const":1}},"required":["k"]},
                      {"properties":{"k":{"const":2}},"required":["k"]}]})",
         {R"({"k":1})", R"({"k":2,"z":0})"},
         {R"("s")", "7", R"({"k":3})"}});
  check({R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                      {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
         {R"({"a":1,"b":"x"})"},
         {R"({"a":1})", R"({"a":1,"b":2})"}});
}

TEST(JsonSchema, RefsRecurse) {
  check({R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
             "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},
             "required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
         {R"({"v":1,"next":{"v":2,"next":null}})"},
         {R"({"v":1,"next":{"v":2}})"}});
  check({R"({"definitions":{"leaf":{"type":"string"}},
             "type":"array","items":{"$ref":"#/definitions/leaf"}})",
         {R"(["a","b"])"},
         {"[1]"}});
}

TEST(JsonSchema, RefusesWhatItCannotEnforceByName) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"type":"string","format":"color"})", "format 'color'"},
      {R"({"if":{"type":"string"}})", "'if'"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
      {R"({"$ref":"http://example.com/s.json"})", "not local"},
      {R"({"$ref":"#/$defs/missing"})", "points at nothing"},
      {R"({"type":"number","multipleOf":0.5})", "multipleOf"},
      {R"({"type":"strin"})", "unknown type"},
      {R"x({"type":"string","pattern":"(?=a)"})x", "pattern"},
      {"{not json", "not valid JSON"},
      {R"({"minLength":"two"})", "minLength"},
      {R"({"dependencies":{"a":{"required":["b"]}}})", "with a schema"},
      {std::string(100000, '[') + std::string(100000, ']'), "nested deeper"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "never reaches"},
      {R"({"oneOf":[{"required":["a"]},{"required":["b"]}]})", "oneOf"},
      {R"({"not":{"minLength":2}})", "'not' is supported over"},
      {R"({"type":"number","not":{"enum":[1]}})", "'not' of a number"},
  };
  for (const auto& [schema, named] : refused) {
    try {
      json_schema_constraint(table(), schema);
      ADD_FAILURE() << schema << " was accepted";
    } catch (const GrammarError& error) {
      EXPECT_NE(std::string(error.what()).find(named), std::string::npos)
          << schema << ": " << error.what();
    }
  }
}

// A tool call's schema held only where a trigger token opens it (then_free after each), and
// a forced call's arguments then free text.
TEST(JsonSchema, TriggeredAndThenFreeStretches) {
  const int32_t trigger = 0xFF;  // byte 255 stands for the call tag
  auto call = json_schema_constraint(table(), R"({"type":"object","required":["n"],
      "properties":{"n":{"type":"integer"}},"additionalProperties":false})");
  auto each = after_each(trigger, call)->start();
  auto feed = [](Matcher& matcher, const std::string& text) {
    for (char c : text)
      if (!matcher.accept(static_cast<uint8_t>(c))) return false;
    return true;
  };
  EXPECT_TRUE(feed(*each, R"(free text, "quotes" {)"));
  EXPECT_TRUE(each->complete());
  EXPECT_TRUE(each->accept(trigger));
  EXPECT_FALSE(each->complete());
  auto probe = each->clone();
  EXPECT_FALSE(feed(*probe, R"({"m":1})"));
  EXPECT_TRUE(feed(*each, R"({"n":1})"));
  EXPECT_TRUE(each->complete());
  EXPECT_TRUE(feed(*each, "anything again"));
  EXPECT_TRUE(each->accept(trigger));
  EXPECT_FALSE(feed(*each, "x"));

  auto forced = then_free(call)->start();
  EXPECT_FALSE(forced->complete());
  EXPECT_FALSE(feed(*forced->clone(), "hello"));
  EXPECT_TRUE(feed(*forced, R"({"n":7}}</tool_call>)"));
  EXPECT_TRUE(forced->complete());
}

// A forced call closed by the engine: the arguments, then exactly the closing tokens, then
// an end token alone; without `end`, free output after the closing.
TEST(JsonSchema, ThenClosingWritesTheClosingTokensThenEnds) {
  auto call = json_schema_constraint(table(), R"({"type":"object","required":["n"],
      "properties":{"n":{"type":"integer"}},"additionalProperties":false})");
  const int32_t end = table()->size() - 1;
  const std::vector<int32_t> closing = {'}', '\n', 0xFE};
  auto allowed_ids = [&](const Matcher& matcher) {
    std::vector<float> logits(static_cast<size_t>(table()->size()), 0.0f);
    matcher.mask_logits(logits.data(), table()->size());
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < table()->size(); ++id)
      if (std::isfinite(logits[static_cast<size_t>(id)])) ids.push_back(id);
    return ids;
  };
  auto matcher = then_closing(call, *table(), closing, true)->start();
  for (char c : std::string(R"({"n":42})")) ASSERT_TRUE(matcher->accept(static_cast<uint8_t>(c)));
  for (int32_t id : closing) {
    EXPECT_FALSE(matcher->complete());
    EXPECT_EQ(allowed_ids(*matcher), std::vector<int32_t>{id});
    EXPECT_FALSE(matcher->clone()->accept(end));
    ASSERT_TRUE(matcher->accept(id));
  }
  EXPECT_TRUE(matcher->complete());
  EXPECT_EQ(allowed_ids(*matcher), std::vector<int32_t>{end});
  EXPECT_FALSE(matcher->clone()->accept('x'));
  EXPECT_TRUE(matcher->accept(end));

  auto free_after = then_closing(call, *table(), closing, false)->start();
  for (char c : std::string(R"({"n":1}})"
                            "\n\xFE"
                            "more text"))
    ASSERT_TRUE(free_after->accept(static_cast<uint8_t>(c)));
  EXPECT_TRUE(free_after->complete());
}

// Along a valid text, the mask allows exactly the tokens the matcher accepts.
void expect_masks_along(const std::string& schema, const std::string& text) {
  SCOPED_TRACE(schema);
  auto constraint = json_schema_constraint(table(), schema);
  auto matcher = constraint->start();
  const int32_t vocab = table()->size();
  for (size_t at = 0; at <= text.size(); ++at) {
    std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
    matcher->mask_logits(logits.data(), vocab);
    for (int32_t id = 0; id < vocab; ++id) {
      auto probe = matcher->clone();
      EXPECT_EQ(probe->accept(id), std::isfinite(logits[static_cast<size_t>(id)]))
          << "at " << at << " token " << id << " '" << table()->bytes(id) << "'";
    }
    if (at < text.size()) {
      ASSERT_TRUE(matcher->accept(static_cast<uint8_t>(text[at]))) << at;
    }
  }
  EXPECT_TRUE(matcher->complete());
}

TEST(JsonSchema, MasksAreTheTokensTheMatcherAccepts) {
  expect_masks_along(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":4},"tags":{"type":"array","items":{"enum":["ab","c"]}},
      "n":{"type":"integer","minimum":10,"maximum":120},"when":{"format":"date"}},
      "required":["name","n"],"additionalProperties":false})",
                     R"({"name":"ab\n","tags":["ab","c"],"n":112,"when":"2024-01-05"})");
}

// JSON text is UTF-8: strings and keys take whole, well-formed characters only, however the
// vocabulary's tokens cut them.
TEST(JsonSchema, StringsHoldWellFormedUtf8) {
  check({R"({"type":"object","additionalProperties":{"type":"string","maxLength":2}})",
         {"{\"\xc3\xa9\":\"\xc3\xa9\xe2\x82\xac\"}", "{\"k\":\"\xf0\x9f\x98\x80\"}"},
         {"{\"k\":\"\xa9\"}", "{\"k\":\"\xc3\"}", "{\"k\":\"\xc0\x80\"}",
          "{\"k\":\"\xed\xa0\x80\"}", "{\"k\":\"\xf4\x90\x80\x80\"}", "{\"\xff\":\"a\"}",
          "{\"k\":\"\xc3\xa9\xc3\xa9\xc3\xa9\"}"}});
  expect_masks_along(R"({"type":"object","additionalProperties":{"type":"string"}})",
                     "{\"\xc3\xa9\":\"a\xc3\xa9\xe2\x82\xac\"}");
}

// Masks are kept by a state's key, which leaves out what cannot change what follows (an
// unbounded number's digits, counts past their bounds): every kept mask met again along these
// texts is still exactly the tokens accepted, where a count or a value does matter too.
TEST(JsonSchema, KeptMasksHoldWhereStatesShareAKey) {
  expect_masks_along(R"({"type":"array","items":{"type":"number"}})",
                     "[1111111,22.2222,-3333e33,0.5,1,11,111]");
  expect_masks_along(R"({"type":"array","items":{"type":"integer","maximum":1111},"minItems":2})",
                     "[111,1111,11,1,0,111]");
  expect_masks_along(R"({"type":"array","items":{"type":"integer","multipleOf":3}})",
                     "[333,3333,33,3]");
  expect_masks_along(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
      "items":{"type":"boolean"},"minItems":3,"maxItems":6})",
                     R"(["aaaa",1,true,false,true,true])");
  expect_masks_along(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
      "items":false})",
                     R"(["aaaa",1])");
  expect_masks_along(R"({"type":"string","minLength":3})", R"("aaaaaaaa")");
  expect_masks_along(R"({"type":"string","maxLength":6})", R"("aaaaaa")");
  expect_masks_along(
      R"({"type":"object","minProperties":2,"additionalProperties":{"type":"null"}})",
      R"({"a":null,"b":null,"c":null,"d":null})");
  expect_masks_along(R"({"type":"object","maxProperties":3})", R"({"a":1,"b":1,"c":1})");
  expect_masks_along(R"({"type":"object","properties":{"aa":{"type":"integer"}},
      "required":["aa"],"additionalProperties":false})",
                     R"({"aa":11111})");
}

// A union's state is masked thread by thread (each thread's mask kept for the next state that
// holds it, beside other threads): the masks are still exactly the tokens accepted, with the
// end token only where some thread is complete, and where a thread comes back in an array's
// next item or as the only one left.
TEST(JsonSchema, UnionMasksAreTheirThreadsMasks) {
  const std::string shapes = R"({"anyOf":[
      {"type":"object","properties":{"type":{"enum":["Point"]},
       "name":{"type":"string","pattern":"^[a-z]*$"},
       "at":{"type":"array","items":{"type":"number"}}},"required":["type"]},
      {"type":"object","properties":{"type":{"enum":["Polygon"]},
       "name":{"type":"string","maxLength":3}},"additionalProperties":false},
      {"type":"object","properties":{"type":{"const":"Pole"}},"additionalProperties":true},
      {"type":"string","pattern":"^P"}]})";
  expect_masks_along(shapes, R"({"name":"ab\n","type":"Pole","at":[1.5,-0]})");
  expect_masks_along(shapes, R"({"name":"ab","type":"Point","at":[1.5,-0]})");
  expect_masks_along(shapes, R"({"name":"abc","type":"Polygon"})");
  // Past "abc" the Polygon's name is too long: the other two threads' masks are the ones kept
  // when it was alive.
  expect_masks_along(shapes, R"({"name":"abcdef","type":"Pole"})");
  expect_masks_along(shapes, R"("Point")");
  expect_masks_along(R"({"type":"array","items":)" + shapes + "}",
                     R"([{"name":"ab","type":"Pole"},{"name":"ab","type":"Pole","x":null},)"
                     R"({"name":"ab","type":"Point"},"Pa\n"])");
  expect_masks_along(R"({"anyOf":[{"type":"integer"},{"type":"number","maximum":2},
      {"type":"array","items":{"anyOf":[{"type":"integer"},{"type":"string"}]}}]})",
                     R"([12,"a",1,"12",-0])");
  expect_masks_along(R"({"anyOf":[{"type":"integer"},{"type":"number","maximum":2}]})", "12");
}

// JSONSchemaBench (tests/fixtures/structured): every schema compiles or is refused with a
// GrammarError; no instance labelled invalid is accepted (compact JSON, byte by byte), and
// valid instances are accepted unless they use what the matcher writes one way only (an
// exponent in a bounded number, a number where an enum lists its other spelling, ...).
TEST(JsonSchema, JsonSchemaBenchInstancesKeepTheirLabels) {
  struct Counts {
    int schemas = 0, compiled = 0, valid = 0, valid_accepted = 0, invalid = 0, invalid_accepted = 0;
  };
  Counts all;
  for (const char* subset : {"Github_trivial", "Glaiveai2K", "Synthesized", "Handwritten"}) {
    std::ifstream in(testing::fixture_path("structured") / (std::string(subset) + ".jsonl"));
    ASSERT_TRUE(in) << subset;
    Counts counts;
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json record = nlohmann::json::parse(line);
      ++counts.schemas;
      std::shared_ptr<const Constraint> constraint;
      try {
        constraint = json_schema_constraint(table(), record["schema"].dump());
      } catch (const GrammarError&) {
        continue;
      }
      ++counts.compiled;
      for (const auto& instance : record["instances"]) {
        const bool valid = instance["valid"].get<bool>();
        const bool accepted = accepts(*constraint, instance["data"].dump());
        (valid ? counts.valid : counts.invalid) += 1;
        (valid ? counts.valid_accepted : counts.invalid_accepted) += accepted ? 1 : 0;
        if (!valid && accepted)
          ADD_FAILURE() << subset << " " << record["id"] << " accepts invalid "
                        << instance["data"].dump().substr(0, 300);
      }
    }
    std::printf(
        "%s: %d of %d schemas compiled; valid accepted %d of %d; invalid accepted %d of %d\n",
        subset, counts.compiled, counts.schemas, counts.valid_accepted, counts.valid,
        counts.invalid_accepted, counts.invalid);
    if (std::string_view(subset) == "Github_trivial" || std::string_view(subset) == "Glaiveai2K") {
      all.schemas += counts.schemas;
      all.compiled += counts.compiled;
    }
    all.valid += counts.valid;
    all.valid_accepted += counts.valid_accepted;
  }
  // The real-world subsets (Synthesized and Handwritten probe rare keywords on purpose).
  EXPECT_GT(all.compiled * 10, all.schemas * 9);
  EXPECT_GT(all.valid_accepted * 100, all.valid * 97);
}

}  // namespace
}  // namespace deepinfer::structured
