// A Jinja chat template and the variables it is rendered with: the input is the template, a
// NUL byte, and a JSON object of variables (messages, tools, ...). Parsing and rendering end in
// output or an Error, within the render limits, whatever the template does.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "chat/template.h"
#include "core/json.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  // Lambdas cannot capture structured bindings in C++20, so the halves are named plainly.
  const auto parts = fuzz::split_once(fuzz::as_text(data, size), std::string_view("\0", 1));
  const std::string_view source = parts.first;
  const std::string_view variables_text = parts.second;
  nlohmann::ordered_json variables;
  if (parse_json(variables_text, variables) != JsonParse::kOk || !variables.is_object())
    variables = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"add_generation_prompt", true}};
  // Small limits keep each run short; the bounds themselves are what is under test.
  chat::RenderLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = size_t{1} << 20;
  std::optional<chat::ChatTemplate> parsed;
  fuzz::expect_clean([&] { parsed.emplace(std::string(source)); });
  if (parsed) fuzz::expect_clean([&] { (void)parsed->render(variables, limits); });
  return 0;
}
