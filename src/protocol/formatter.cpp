#include "protocol/formatter.h"

#include <map>
#include <set>

#include "protocol/anthropic.h"
#include "protocol/responses.h"

namespace deepinfer::protocol {
namespace {

// The end of an OpenAI stream: a usage chunk when asked for, then [DONE].
std::string openai_stream_end(const ResponseMeta& meta, const char* object, const Usage& usage) {
  std::string out;
  if (meta.include_usage)
    out += sse_event(usage_chunk_json(meta.id, object, meta.created, meta.model, usage));
  return out + "data: [DONE]\n\n";
}

class ChatFormatter final : public ResponseFormatter {
 public:
  explicit ChatFormatter(ResponseMeta meta) : meta_(std::move(meta)) {}
  std::string stream_text(int index, const std::string& piece) override {
    return sse_event(chunk(index, delta(index, piece), ""));
  }
  std::string stream_parsed(int index, const ParsedOutput& parsed) override {
    if (parsed.empty()) return "";
    Json out = delta(index, parsed.content);
    if (!parsed.reasoning.empty()) out["reasoning_content"] = parsed.reasoning;
    // A call's first delta names it; later ones add argument text (a closing piece may add
    // none, and then sends nothing).
    Json calls = Json::array();
    for (const ToolCallPiece& piece : parsed.call_pieces) {
      if (!piece.opens && piece.arguments.empty()) continue;
      Json function = {{"arguments", piece.arguments}};
      Json call = {{"index", piece.index}};
      if (piece.opens) {
        function = {{"name", piece.name}, {"arguments", piece.arguments}};
        call.update({{"id", piece.id}, {"type", "function"}});
      }
      call["function"] = function;
      calls.push_back(std::move(call));
    }
    if (!calls.empty()) out["tool_calls"] = calls;
    if (out.empty()) return "";
    return sse_event(chunk(index, out, ""));
  }
  std::string stream_finish(const ChoiceOutput& choice, const std::string& tail) override {
    return sse_event(chunk(choice.index, delta(choice.index, tail), choice.finish_reason));
  }
  std::string stream_end(const Usage& usage) override {
    return openai_stream_end(meta_, "chat.completion.chunk", usage);
  }
  Json whole(const std::vector<ChoiceOutput>& choices, const Usage& usage) override {
    return chat_completion_json(meta_.id, meta_.created, meta_.model, choices, usage);
  }

 private:
  // The first delta of a completion carries the role.
  Json delta(int index, const std::string& piece) {
    Json out = Json::object();
    if (role_sent_.insert(index).second) out["role"] = "assistant";
    if (!piece.empty()) out["content"] = piece;
    return out;
  }
  Json chunk(int index, const Json& delta, const std::string& finish) {
    return chat_chunk_json(meta_.id, meta_.created, meta_.model, index, delta, finish, nullptr);
  }
  ResponseMeta meta_;
  std::set<int> role_sent_;
};

class CompletionFormatter final : public ResponseFormatter {
 public:
  explicit CompletionFormatter(ResponseMeta meta) : meta_(std::move(meta)) {}
  std::string stream_text(int index, const std::string& piece) override {
    return sse_event(completion_chunk_json(meta_.id, meta_.created, meta_.model, index, piece, ""));
  }
  std::string stream_finish(const ChoiceOutput& choice, const std::string& tail) override {
    return sse_event(completion_chunk_json(meta_.id, meta_.created, meta_.model, choice.index, tail,
                                           choice.finish_reason));
  }
  std::string stream_end(const Usage& usage) override {
    return openai_stream_end(meta_, "text_completion", usage);
  }
  Json whole(const std::vector<ChoiceOutput>& choices, const Usage& usage) override {
    return completion_json(meta_.id, meta_.created, meta_.model, choices, usage);
  }

 private:
  ResponseMeta meta_;
};

}  // namespace

std::unique_ptr<ResponseFormatter> make_formatter(ApiFormat format, ResponseMeta meta) {
  switch (format) {
    case ApiFormat::kChatCompletions:
      return std::make_unique<ChatFormatter>(std::move(meta));
    case ApiFormat::kCompletions:
      return std::make_unique<CompletionFormatter>(std::move(meta));
    case ApiFormat::kAnthropicMessages:
      return make_anthropic_formatter(std::move(meta));
    case ApiFormat::kResponses:
      return make_responses_formatter(std::move(meta));
  }
  return nullptr;
}

std::optional<ApiFormat> api_format_for(const std::string& path) {
  if (path == "/v1/chat/completions") return ApiFormat::kChatCompletions;
  if (path == "/v1/completions") return ApiFormat::kCompletions;
  if (path == "/v1/messages") return ApiFormat::kAnthropicMessages;
  if (path == "/v1/responses") return ApiFormat::kResponses;
  return std::nullopt;
}

ErrorBody error_body_for(const std::string& path) {
  return path == "/v1/messages" ? anthropic_error_body : openai_error_body;
}

}  // namespace deepinfer::protocol
