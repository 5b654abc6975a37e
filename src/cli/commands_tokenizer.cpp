// tokenize / detokenize: the tokenizer of a model folder (or a folder holding only the
// tokenizer files) from the command line.
#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/model_template.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct TokenizeArgs {
  std::string dir, text, text_file, mode = "specials";
  bool with_bos = false;
  bool json = false;
};

std::string read_text_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) fail("--text-file: cannot open {}", path);
  std::stringstream text;
  text << stream.rdbuf();
  return text.str();
}

void run_tokenize(const TokenizeArgs& args) {
  std::string input = args.text_file.empty() ? args.text : read_text_file(args.text_file);
  auto tokenizer = Tokenizer::load(args.dir);
  EncodeMode mode = args.mode == "plain"     ? EncodeMode::kPlain
                    : args.mode == "as-text" ? EncodeMode::kAsText
                                             : EncodeMode::kSpecials;
  std::vector<int32_t> ids = tokenizer->encode(input, mode, args.with_bos);
  if (args.json) {
    fmt::print("{}\n", nlohmann::json(ids).dump());
    return;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  fmt::print("{}\n", line);
}

struct DetokenizeArgs {
  std::string dir, ids;
  bool skip_special = false;
};

void run_detokenize(const DetokenizeArgs& args) {
  auto tokenizer = Tokenizer::load(args.dir);
  std::vector<int32_t> ids = parse_id_list(args.ids, "--ids");
  fmt::print("{}", tokenizer->decode(ids, args.skip_special));
}

struct RenderChatArgs {
  std::string dir, messages, tools, template_name;
  bool add_generation_prompt = false;
  std::vector<std::string> variables;
};

nlohmann::ordered_json read_json_file(const std::string& path, const char* flag) {
  nlohmann::ordered_json value =
      parse_json_or_discarded<nlohmann::ordered_json>(read_text_file(path));
  if (value.is_discarded()) fail("{}: {} is not valid JSON", flag, path);
  return value;
}

void run_render_chat(const RenderChatArgs& args) {
  chat::ModelChatTemplate chat = chat::ModelChatTemplate::load(args.dir, args.template_name);
  chat::ChatRequest request;
  request.messages = read_json_file(args.messages, "--messages");
  if (!args.tools.empty()) request.tools = read_json_file(args.tools, "--tools");
  request.add_generation_prompt = args.add_generation_prompt;
  for (const std::string& variable : args.variables) {
    size_t equals = variable.find('=');
    if (equals == std::string::npos || equals == 0)
      fail("--var: \"{}\" is not key=JSON_VALUE", variable);
    auto value = parse_json_or_discarded<nlohmann::ordered_json>(variable.substr(equals + 1));
    if (value.is_discarded())
      fail("--var: the value of \"{}\" is not JSON (strings need quotes)",
           variable.substr(0, equals));
    request.variables[variable.substr(0, equals)] = value;
  }
  fmt::print("{}", chat.render(request));
}

}  // namespace

void add_tokenizer_commands(CLI::App& app) {
  auto tokenize = std::make_shared<TokenizeArgs>();
  CLI::App* command = app.add_subcommand("tokenize", "Encode text with a model's tokenizer");
  command->add_option("dir", tokenize->dir, "Model folder or folder with tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  CLI::Option* text = command->add_option("--text", tokenize->text, "Text to encode (UTF-8)");
  CLI::Option* text_file =
      command->add_option("--text-file", tokenize->text_file, "File whose contents to encode")
          ->check(CLI::ExistingFile)
          ->excludes(text);
  command
      ->add_option("--mode", tokenize->mode,
                   "Added vocabulary: specials (all control tokens recognised, for template "
                   "text), as-text (special tokens stay text), plain (none: for client text)")
      ->check(CLI::IsMember({"specials", "as-text", "plain"}))
      ->capture_default_str();
  command->add_flag("--with-bos", tokenize->with_bos,
                    "Apply the tokenizer's post-processor (e.g. a leading BOS)");
  command->add_flag("--json", tokenize->json, "Print the ids as a JSON array");
  command->callback([tokenize, text, text_file] {
    if (!*text && !*text_file) fail("tokenize: give --text or --text-file");
    run_tokenize(*tokenize);
  });

  auto detokenize = std::make_shared<DetokenizeArgs>();
  command = app.add_subcommand("detokenize", "Decode token ids to text");
  command->add_option("dir", detokenize->dir, "Model folder or folder with tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--ids", detokenize->ids, "Comma-separated token ids")->required();
  command->add_flag("--skip-special", detokenize->skip_special, "Leave out special tokens");
  command->callback([detokenize] { run_detokenize(*detokenize); });

  auto render = std::make_shared<RenderChatArgs>();
  command = app.add_subcommand("render-chat", "Render a conversation with a model's chat template");
  command->add_option("dir", render->dir, "Model folder or folder with the tokenizer files")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--messages", render->messages, "JSON file with the list of messages")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--tools", render->tools, "JSON file with the list of tool definitions")
      ->check(CLI::ExistingFile);
  command->add_flag("--add-generation-prompt", render->add_generation_prompt,
                    "End with the prompt that starts the assistant's turn");
  command->add_option("--var", render->variables,
                      "Extra template variable as key=JSON_VALUE (e.g. enable_thinking=false); "
                      "repeatable");
  command->add_option("--template", render->template_name,
                      "Which named template when tokenizer_config.json lists several");
  command->callback([render] { run_render_chat(*render); });
}

}  // namespace deepinfer::cli
