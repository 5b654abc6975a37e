#include "chat/deepseek_encoding.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer::chat {

using Json = nlohmann::ordered_json;
namespace {

const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kSystem = "<｜System｜>";
const std::string kUser = "<｜User｜>";
const std::string kAssistant = "<｜Assistant｜>";
const std::string kThinkOpen = "<think>";
const std::string kThinkClose = "</think>";
const std::string kDsml = "｜DSML｜";

// The prompt as it grows: template text may hold control tokens, client text never does.
class PromptWriter {
 public:
  void control(std::string_view text) { text_ += text; }
  void content(std::string_view text) {
    if (text.empty()) return;
    plain_.emplace_back(text_.size(), text_.size() + text.size());
    text_ += text;
  }
  SegmentedPrompt finish() { return {std::move(text_), std::move(plain_)}; }

 private:
  std::string text_;
  std::vector<std::pair<size_t, size_t>> plain_;
};

// The DSML tag names of each version: V4.1 puts a space after ｜DSML｜ and calls the block
// "calls".
struct DsmlTags {
  std::string mark;   // "｜DSML｜" or "｜DSML｜ "
  std::string block;  // "tool_calls" or "calls"
  explicit DsmlTags(DeepSeekEncoding version)
      : mark(version == DeepSeekEncoding::kV4 ? kDsml : kDsml + " "),
        block(version == DeepSeekEncoding::kV4 ? "tool_calls" : "calls") {}
  std::string open(std::string_view name) const { return fmt::format("<{}{}", mark, name); }
  std::string close(std::string_view name) const { return fmt::format("</{}{}>", mark, name); }
  std::string block_open() const { return open(block) + ">\n"; }
};

// A string member of a message or tool call (empty when absent or null). Requests arrive
// checked, but this encoding is a library function too: any other shape is an Error.
std::string string_member(const Json& object, const char* key) {
  if (!object.is_object())
    fail("DeepSeek encoding: expected an object, not {}", object.type_name());
  auto found = object.find(key);
  if (found == object.end() || found->is_null()) return "";
  if (!found->is_string())
    fail("DeepSeek encoding: '{}' must be a string, not {}", key, found->type_name());
  return found->get<std::string>();
}

std::string text_of(const Json& message) {
  const Json& content = message.contains("content") ? message["content"] : Json(nullptr);
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  fail("message content must be text here");
}

bool thinking_mode(const ChatRequest& request) {
  for (const char* key : {"thinking", "enable_thinking"}) {
    auto found = request.variables.find(key);
    if (found != request.variables.end() && found->is_boolean()) return found->get<bool>();
  }
  auto effort = request.variables.find("reasoning_effort");
  return effort != request.variables.end() && !effort->is_null() && *effort != "none";
}

// The effort line that opens the first turn, with its blank line; empty when none is written.
std::string effort_text(const DeepSeekPromptOptions& options, const ChatRequest& request) {
  auto found = request.variables.find("reasoning_effort");
  Json effort = found == request.variables.end() || found->is_null() ? Json("high") : *found;
  if (options.version == DeepSeekEncoding::kV4) {
    auto sentence = options.v4_effort_sentences.find(effort.is_string() ? effort.get<std::string>()
                                                                        : effort.dump());
    if (sentence == options.v4_effort_sentences.end() || sentence->second.empty()) return "";
    return sentence->second + "\n\n";
  }
  static const std::map<std::string, int> kLevels = {
      {"minimal", 25}, {"low", 50}, {"medium", 63}, {"high", 75}, {"max", 100}};
  int level = 0;
  if (effort.is_number_integer()) {
    level = effort.get<int>();
  } else if (effort.is_string() && kLevels.count(effort.get<std::string>())) {
    level = kLevels.at(effort.get<std::string>());
  }
  if (level < 1 || level > 100) fail("reasoning_effort must be low, medium, high, max or 1 to 100");
  return fmt::format(
      "Reasoning Effort: {} (range 1-100, the higher the value, the more thorough the "
      "reasoning)\n\n",
      level);
}

void write_tools_section(PromptWriter& out, const DsmlTags& tags, const Json& tools) {
  out.control(
      "## Tools\n\nYou can call the tools listed below. To call tools, end your answer "
      "with one block in this form:\n\n");
  out.control(tags.block_open() + tags.open("invoke") + " name=\"TOOL_NAME\">\n" +
              tags.open("parameter") + " name=\"PARAMETER\" string=\"true\">text, written as is" +
              tags.close("parameter") + "\n" + tags.open("parameter") +
              " name=\"PARAMETER\" string=\"false\">a JSON value" + tags.close("parameter") + "\n" +
              tags.close("invoke") + "\n" + tags.close(tags.block) + "\n\n");
  out.control(
      "Several invokes may follow each other in the block. The results come back in "
      "<tool_result> tags in the next user turn.\n\n### Available tools\n");
  for (const Json& tool : tools) {
    const Json& function = tool.contains("function") ? tool["function"] : tool;
    out.control("\n");
    out.content(function.dump());
  }
}

// The leading system messages plus the sections the request asks for, in one system turn.
void write_system_turn(PromptWriter& out, const DeepSeekPromptOptions& options,
                       const ChatRequest& request, const std::string& system_text, bool thinking) {
  const Json& tools = request.tools;
  bool offer_tools =
      tools.is_array() && !tools.empty() && request.tool_choice.mode != ToolChoice::Mode::kNone;
  std::string effort = thinking ? effort_text(options, request) : "";
  bool v41 = options.version == DeepSeekEncoding::kV41;
  if (effort.empty() && system_text.empty() && !offer_tools && !request.json_output) return;
  if (v41) out.control(kSystem);
  out.control(effort);
  out.content(system_text);
  bool separate = !system_text.empty();
  if (offer_tools) {
    if (separate) out.control("\n\n");
    write_tools_section(out, DsmlTags(options.version), tools);
    separate = true;
  }
  if (request.json_output) {
    if (separate) out.control("\n\n");
    out.control("## Response Format\n\nAnswer with one valid JSON object and nothing else.");
  }
}

void write_tool_calls(PromptWriter& out, const DsmlTags& tags, const Json& calls) {
  out.control(tags.block_open());
  for (const Json& call : calls) {
    const Json& function = call.contains("function") ? call["function"] : call;
    if (!function.is_object()) fail("DeepSeek encoding: a tool call must be an object");
    Json arguments = function.value("arguments", Json::object());
    if (arguments.is_string())
      arguments = parse_json_or_discarded<Json>(arguments.get<std::string>());
    if (!arguments.is_object()) fail("tool call arguments must be a JSON object");
    out.control(tags.open("invoke") + " name=\"");
    out.content(string_member(function, "name"));
    out.control("\">\n");
    for (const auto& [name, value] : arguments.items()) {
      out.control(tags.open("parameter") + " name=\"");
      out.content(name);
      out.control(value.is_string() ? "\" string=\"true\">" : "\" string=\"false\">");
      out.content(value.is_string() ? value.get<std::string>() : value.dump());
      out.control(tags.close("parameter") + "\n");
    }
    out.control(tags.close("invoke") + "\n");
  }
  out.control(tags.close(tags.block));
}

void write_assistant_turn(PromptWriter& out, const DsmlTags& tags, const Json& message,
                          bool show_reasoning) {
  out.control(kAssistant);
  std::string reasoning;
  for (const char* key : {"reasoning_content", "reasoning"})
    if (message.contains(key) && message[key].is_string()) reasoning = message[key];
  if (show_reasoning) {
    out.control(kThinkOpen);
    out.content(reasoning);
  }
  out.control(kThinkClose);
  std::string content = text_of(message);
  out.content(content);
  if (message.contains("tool_calls") && message["tool_calls"].is_array() &&
      !message["tool_calls"].empty()) {
    if (!content.empty()) out.control("\n\n");
    write_tool_calls(out, tags, message["tool_calls"]);
  }
  out.control(kEos);
}

// The user and tool messages of one user turn, joined by blank lines; tool results in the
// order of the calls they answer.
void write_user_turn(PromptWriter& out, std::vector<Json> run, const Json& calls) {
  auto call_rank = [&](const Json& message) {
    std::string id = string_member(message, "tool_call_id");
    for (size_t i = 0; calls.is_array() && i < calls.size(); ++i)
      if (string_member(calls[i], "id") == id) return i;
    return calls.is_array() ? calls.size() : size_t{0};
  };
  std::vector<size_t> tool_slots;
  std::vector<Json> results;
  for (size_t i = 0; i < run.size(); ++i) {
    if (string_member(run[i], "role") != "tool") continue;
    tool_slots.push_back(i);
    results.push_back(run[i]);
  }
  std::stable_sort(results.begin(), results.end(),
                   [&](const Json& a, const Json& b) { return call_rank(a) < call_rank(b); });
  for (size_t i = 0; i < tool_slots.size(); ++i) run[tool_slots[i]] = results[i];
  out.control(kUser);
  for (size_t i = 0; i < run.size(); ++i) {
    if (i > 0) out.control("\n\n");
    bool tool = string_member(run[i], "role") == "tool";
    if (tool) out.control("<tool_result>");
    out.content(text_of(run[i]));
    if (tool) out.control("</tool_result>");
  }
}

void write_generation_prompt(PromptWriter& out, const ChatRequest& request, bool thinking) {
  using Mode = ToolChoice::Mode;
  bool force_call =
      request.tool_choice.mode == Mode::kRequired || request.tool_choice.mode == Mode::kNamed;
  out.control(kAssistant);
  // A forced call (written after this by the caller) cannot open inside the reasoning.
  out.control(thinking && !force_call ? kThinkOpen : kThinkClose);
}

}  // namespace

ForcedCallText dsml_forced_call(DeepSeekEncoding version) {
  DsmlTags tags(version);
  return {tags.block_open(), tags.open("invoke") + " name=\"", "\">\n", "", ""};
}

SegmentedPrompt render_deepseek_prompt(const DeepSeekPromptOptions& options,
                                       const ChatRequest& request) {
  const Json& messages = request.messages;
  bool thinking = thinking_mode(request);
  bool v41 = options.version == DeepSeekEncoding::kV41;
  DsmlTags tags(options.version);
  size_t first = 0;
  std::string system_text;
  for (; first < messages.size() && string_member(messages[first], "role") == "system"; ++first)
    system_text += (system_text.empty() ? "" : "\n\n") + text_of(messages[first]);
  size_t last_user = 0;
  for (size_t i = 0; i < messages.size(); ++i)
    if (string_member(messages[i], "role") == "user") last_user = i;
  bool has_tools = request.tools.is_array() && !request.tools.empty();

  PromptWriter out;
  out.control(kBos);
  write_system_turn(out, options, request, system_text, thinking);
  Json last_calls;  // the latest assistant's tool calls, which tool results answer
  std::vector<Json> user_run;
  auto flush_user = [&] {
    if (!user_run.empty()) write_user_turn(out, std::move(user_run), last_calls);
    user_run.clear();
  };
  for (size_t i = first; i < messages.size(); ++i) {
    const Json& message = messages[i];
    std::string role = string_member(message, "role");
    if (role == "user" || role == "tool" || (role == "system" && !v41)) {
      user_run.push_back(message);
      continue;
    }
    flush_user();
    if (role == "system") {
      out.control(kSystem);
      out.content(text_of(message));
    } else if (role == "assistant") {
      bool recent = i > last_user || options.keep_all_reasoning || has_tools;
      write_assistant_turn(out, tags, message, thinking && recent);
      last_calls = message.value("tool_calls", Json(nullptr));
    } else {
      fail("messages.{}: unknown role '{}'", i, role);
    }
  }
  flush_user();
  if (request.add_generation_prompt) write_generation_prompt(out, request, thinking);
  return out.finish();
}

}  // namespace deepinfer::chat
