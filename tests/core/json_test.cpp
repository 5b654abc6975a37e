#include "core/json.h"

#include <gtest/gtest.h>

#include <string>

namespace deepinfer {
namespace {

std::string nested_arrays(int depth) {
  return std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(BoundedJson, ParsesUpToTheDepthAndRefusesDeeper) {
  nlohmann::json value;
  EXPECT_EQ(parse_json(nested_arrays(kMaxJsonDepth), value), JsonParse::kOk);
  EXPECT_TRUE(value.is_array());
  EXPECT_EQ(parse_json(nested_arrays(kMaxJsonDepth + 1), value), JsonParse::kTooDeep);
  EXPECT_TRUE(value.is_null());
  EXPECT_EQ(parse_json(R"({"a": {"b": [1, {"c": 2}]}})", value, 4), JsonParse::kOk);
  EXPECT_EQ(parse_json(R"({"a": {"b": [1, {"c": 2}]}})", value, 3), JsonParse::kTooDeep);
  EXPECT_EQ(parse_json("{\"a\": ", value), JsonParse::kInvalid);
  EXPECT_TRUE(value.is_null());
}

// Far deeper than any stack could recurse through: refused without a recursive walk.
TEST(BoundedJson, AMillionLevelsAreRefusedNotACrash) {
  nlohmann::ordered_json value;
  EXPECT_EQ(parse_json(nested_arrays(1'000'000), value), JsonParse::kTooDeep);
  std::string objects;
  for (int i = 0; i < 200'000; ++i) objects += "{\"x\":";
  objects += "1";
  objects += std::string(200'000, '}');
  EXPECT_EQ(parse_json(objects, value), JsonParse::kTooDeep);
  EXPECT_TRUE(parse_json_or_discarded<nlohmann::json>(objects).is_discarded());
  EXPECT_TRUE(parse_json_or_discarded<nlohmann::json>("[1, 2").is_discarded());
  EXPECT_EQ(parse_json_or_discarded<nlohmann::json>("[1, 2]").size(), 2u);
}

}  // namespace
}  // namespace deepinfer
