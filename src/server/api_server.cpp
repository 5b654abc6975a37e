#include "server/api_server.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <random>

#include "core/error.h"
#include "protocol/completion_text.h"
#include "protocol/openai.h"

namespace deepinfer::server {

using protocol::ApiError;
using protocol::Json;

namespace {

constexpr const char* kJson = "application/json";

void send_json(const std::shared_ptr<ResponseWriter>& writer, int status, const Json& body) {
  writer->send(status, kJson, body.dump(-1, ' ', false, Json::error_handler_t::replace));
}

void send_error(const std::shared_ptr<ResponseWriter>& writer, const ApiError& error) {
  send_json(writer, error.status(), protocol::openai_error_body(error));
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 generator{std::random_device{}()};
  return fmt::format("{}{:016x}", prefix, generator());
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One generation request while it runs: its stream from the engine, and what has been sent.
struct ApiServer::Job {
  std::mutex mutex;
  std::shared_ptr<ResponseWriter> writer;
  std::shared_ptr<RequestStream> stream;
  std::string id, model, object;  // object: "chat.completion" or "text_completion"
  bool chat = true;
  protocol::GenerationParams params;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  std::vector<protocol::CompletionText> texts;  // per completion index
  std::vector<bool> role_sent;
  std::vector<GenerationResult> results;
  std::string echo_prefix;  // /v1/completions with echo
  bool done = false;
};

ApiServer::ApiServer(CausalLM& model, const std::string& model_dir, const EngineConfig& engine,
                     const ServeOptions& options)
    : model_(model), options_(options) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(model_dir) / "tokenizer.json"))
    fail("serve: {} has no tokenizer.json (the server needs the model's tokenizer)", model_dir);
  tokenizer_ = Tokenizer::load(model_dir);
  try {
    template_ = std::make_unique<chat::ModelChatTemplate>(chat::ModelChatTemplate::load(model_dir));
  } catch (const Error&) {
    template_.reset();  // /v1/chat/completions then answers 400 saying so
  }
  int64_t context = model.config().max_position_embeddings;
  max_model_len_ = options.max_model_len > 0 ? std::min(options.max_model_len, context) : context;
  if (options_.served_model_name.empty())
    options_.served_model_name = fs::path(model_dir).filename().string();
  engine_ = std::make_unique<EngineLoop>(model, engine);
  http_ = std::make_unique<HttpServer>(
      options.http, [this](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
        handle(std::move(request), std::move(writer));
      });
}

ApiServer::~ApiServer() {
  http_.reset();  // no handler runs after this
  engine_.reset();
}

bool ApiServer::authorized(const HttpRequest& request) const {
  if (options_.api_key.empty()) return true;
  std::string bearer = request.header("authorization");
  if (bearer == "Bearer " + options_.api_key) return true;
  return request.header("x-api-key") == options_.api_key;
}

void ApiServer::handle(HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
  try {
    route(request, writer);
  } catch (const ApiError& error) {
    ++counters_.rejected;
    send_error(writer, error);
  } catch (const std::exception& error) {
    // Anything else a request triggers is still the request's problem, never the server's end.
    ++counters_.rejected;
    send_error(writer, ApiError(400, error.what()));
  }
}

void ApiServer::route(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer) {
  const std::string& path = request.path;
  bool get = request.method == "GET", post = request.method == "POST";
  if (path.rfind("/v1/", 0) == 0 && !authorized(request))
    throw ApiError(401,
                   "invalid or missing API key (send 'Authorization: Bearer KEY' or "
                   "'x-api-key: KEY')");
  if (get && path == "/health") return writer->send(200, "text/plain", "");
  if (get && path == "/metrics")
    return writer->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text());
  if (get && path == "/v1/models") return writer->send(200, kJson, models_json());
  if (post && path == "/v1/chat/completions") return chat_completions(request, writer);
  if (post && path == "/v1/completions") return completions(request, writer);
  if (post && path == "/tokenize") return tokenize(request, writer);
  if (post && path == "/detokenize") return detokenize(request, writer);
  throw ApiError(404, fmt::format("no route for {} {}", request.method, path));
}

std::string ApiServer::models_json() const {
  Json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", unix_seconds()},
                {"owned_by", "deepinfer"},
                {"max_model_len", max_model_len_}};
  return Json{{"object", "list"}, {"data", Json::array({model})}}.dump();
}

namespace {

void check_model(const std::string& requested, const std::string& served) {
  if (!requested.empty() && requested != served)
    throw ApiError(
        404,
        fmt::format("The model '{}' does not exist (this server serves '{}')", requested, served),
        "model", "not_found_error");
}

// OpenAI's wording for context overflows, with the numbers.
int check_lengths(int64_t prompt, const std::optional<int>& max_tokens, int64_t limit) {
  if (prompt == 0) throw ApiError(400, "the prompt is empty", "prompt");
  int64_t wanted = max_tokens.value_or(0);
  if (prompt + std::max<int64_t>(wanted, 1) > limit) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you "
                               "requested {} tokens ({} in the messages, {} in the completion). "
                               "Please reduce the length of the messages or completion.",
                               limit, prompt + wanted, prompt, wanted),
                   "messages");
  }
  return max_tokens ? *max_tokens : static_cast<int>(limit - prompt);
}

GenerationRequest engine_request(const std::string& id, std::vector<int32_t> prompt,
                                 const protocol::GenerationParams& params, int max_tokens) {
  GenerationRequest request;
  request.id = id;
  request.prompt = std::move(prompt);
  request.sampling = params.sampling;
  request.max_tokens = max_tokens;
  request.min_tokens = params.min_tokens;
  request.ignore_eos = params.ignore_eos;
  request.stop_token_ids = params.stop_token_ids;
  request.priority = params.priority;
  return request;
}

}  // namespace

void ApiServer::chat_completions(const HttpRequest& http_request,
                                 const std::shared_ptr<ResponseWriter>& writer) {
  protocol::ChatCompletionRequest parsed = protocol::parse_chat_completion(http_request.body);
  check_model(parsed.model, options_.served_model_name);
  if (!template_) throw ApiError(400, "this model has no chat template; use /v1/completions");
  std::string rendered;
  try {
    rendered = template_->render(parsed.chat);
  } catch (const Error& error) {
    throw ApiError(400, fmt::format("the chat template rejected the messages: {}", error.what()),
                   "messages");
  }
  std::vector<int32_t> prompt = tokenizer_->encode(rendered, EncodeMode::kSpecials, false);
  int max_tokens =
      check_lengths(static_cast<int64_t>(prompt.size()), parsed.params.max_tokens, max_model_len_);
  auto job = std::make_shared<Job>();
  job->writer = writer;
  job->id = random_id("chatcmpl-");
  job->object = "chat.completion";
  job->chat = true;
  job->params = parsed.params;
  start_job(job, engine_request(job->id, std::move(prompt), parsed.params, max_tokens));
}

void ApiServer::completions(const HttpRequest& http_request,
                            const std::shared_ptr<ResponseWriter>& writer) {
  protocol::CompletionRequest parsed = protocol::parse_completion(http_request.body);
  check_model(parsed.model, options_.served_model_name);
  std::vector<int32_t> prompt = parsed.prompt_ids;
  if (parsed.prompt_text)
    prompt = tokenizer_->encode(*parsed.prompt_text, EncodeMode::kSpecials, true);
  for (int32_t id : prompt) {
    if (id < 0 || id >= model_.config().vocab_size)
      throw ApiError(400, fmt::format("token id {} is outside the vocabulary", id), "prompt");
  }
  int max_tokens = check_lengths(static_cast<int64_t>(prompt.size()),
                                 parsed.params.max_tokens.value_or(16), max_model_len_);
  auto job = std::make_shared<Job>();
  job->writer = writer;
  job->id = random_id("cmpl-");
  job->object = "text_completion";
  job->chat = false;
  job->params = parsed.params;
  if (parsed.echo)
    job->echo_prefix = parsed.prompt_text.value_or(tokenizer_->decode(prompt, false));
  start_job(job, engine_request(job->id, std::move(prompt), parsed.params, max_tokens));
}

void ApiServer::start_job(std::shared_ptr<Job> job, GenerationRequest request) {
  if (counters_.in_flight.load() >= options_.max_pending_requests)
    throw ApiError(429, "the server is at its limit of concurrent requests; retry later");
  job->model = options_.served_model_name;
  job->created = unix_seconds();
  job->prompt_tokens = static_cast<int64_t>(request.prompt.size());
  for (int i = 0; i < request.sampling.n; ++i) {
    job->texts.emplace_back(tokenizer_.get(), job->params.stop);
    job->role_sent.push_back(false);
  }
  try {
    job->stream = engine_->submit(request);
  } catch (const Error& error) {
    throw ApiError(400, error.what());
  }
  ++counters_.in_flight;
  if (job->params.stream) job->writer->start_stream(200, "text/event-stream");
  // A client that goes away ends its request, which gives its KV blocks back.
  job->writer->on_disconnect([this, weak = std::weak_ptr<Job>(job)] {
    if (auto gone = weak.lock()) engine_->stop(gone->id);
  });
  // The listener keeps the job alive until drain() sees the end and clears it.
  job->stream->set_listener([this, job] { http_->post([this, job] { drain(job); }); });
  http_->post([this, job] { drain(job); });  // anything that arrived before the listener
}

namespace {

std::string finish_reason(const GenerationResult& result, const protocol::CompletionText& text) {
  return text.stopped() || result.finish_reason == FinishReason::kStop ? "stop" : "length";
}

}  // namespace

// Runs on an I/O thread whenever the engine delivered something: detokenizes, watches stop
// strings, and writes chunks (streaming) or the whole answer at the end.
void ApiServer::drain(const std::shared_ptr<Job>& job) {
  std::lock_guard lock(job->mutex);
  if (job->done) return;
  RequestStream::Event event;
  bool ended = false;
  try {
    while (job->stream->poll(event, ended)) {
      for (const TokenEvent& token : event.tokens) {
        auto index = static_cast<size_t>(token.index);
        protocol::CompletionText& text = job->texts[index];
        if (text.stopped()) continue;
        std::string piece = text.push(token.token);
        if (text.stopped()) engine_->stop(job->id, token.index);
        if (!job->params.stream || piece.empty()) continue;
        Json chunk;
        if (job->chat) {
          Json delta = {{"content", piece}};
          if (!job->role_sent[index]) delta = {{"role", "assistant"}, {"content", piece}};
          job->role_sent[index] = true;
          chunk = protocol::chat_chunk_json(job->id, job->created, job->model, token.index, delta,
                                            "", nullptr);
        } else {
          chunk = protocol::completion_chunk_json(job->id, job->created, job->model, token.index,
                                                  piece, "");
        }
        job->writer->write(protocol::sse_event(chunk));
      }
      for (GenerationResult& result : event.finished) {
        protocol::CompletionText& text = job->texts[static_cast<size_t>(result.index)];
        std::string tail = text.finish();
        if (job->params.stream) {
          Json delta = tail.empty() ? Json::object() : Json{{"content", tail}};
          if (job->chat && !job->role_sent[static_cast<size_t>(result.index)])
            delta["role"] = "assistant";
          Json chunk =
              job->chat
                  ? protocol::chat_chunk_json(job->id, job->created, job->model, result.index,
                                              delta, finish_reason(result, text), nullptr)
                  : protocol::completion_chunk_json(job->id, job->created, job->model, result.index,
                                                    tail, finish_reason(result, text));
          job->writer->write(protocol::sse_event(chunk));
        }
        (finish_reason(result, text) == "stop" ? counters_.finished_stop
                                               : counters_.finished_length)++;
        job->results.push_back(std::move(result));
      }
      if (ended) break;
    }
  } catch (const Error& error) {
    job->done = true;
    --counters_.in_flight;
    job->stream->set_listener(nullptr);
    ApiError failure(503, fmt::format("the engine failed: {}", error.what()));
    if (job->params.stream) {
      job->writer->write(protocol::sse_event(protocol::openai_error_body(failure)));
      job->writer->end_stream();
    } else {
      send_error(job->writer, failure);
    }
    return;
  }
  if (!ended) return;
  job->done = true;
  --counters_.in_flight;
  job->stream->set_listener(nullptr);  // breaks the job <-> listener cycle
  protocol::Usage usage;
  usage.prompt_tokens = job->prompt_tokens;
  std::vector<protocol::ChoiceOutput> choices;
  std::sort(job->results.begin(), job->results.end(),
            [](const auto& a, const auto& b) { return a.index < b.index; });
  for (const GenerationResult& result : job->results) {
    usage.completion_tokens += static_cast<int64_t>(result.tokens.size());
    usage.cached_tokens = result.cached_prompt_tokens;
    const protocol::CompletionText& text = job->texts[static_cast<size_t>(result.index)];
    protocol::ChoiceOutput choice;
    choice.index = result.index;
    choice.text = job->echo_prefix + text.text();
    choice.finish_reason = finish_reason(result, text);
    choice.stop_reason = text.matched_stop();
    if (job->chat && job->params.sampling.logprobs) {
      choice.logprobs = protocol::chat_logprobs_json(
          result.logprobs, [&](int32_t id) { return tokenizer_->decode({id}, false); });
    }
    choices.push_back(std::move(choice));
  }
  if (job->params.stream) {
    if (job->params.include_usage) {
      std::string object = job->chat ? "chat.completion.chunk" : "text_completion";
      job->writer->write(protocol::sse_event(
          protocol::usage_chunk_json(job->id, object, job->created, job->model, usage)));
    }
    job->writer->write("data: [DONE]\n\n");
    job->writer->end_stream();
    return;
  }
  Json body =
      job->chat ? protocol::chat_completion_json(job->id, job->created, job->model, choices, usage)
                : protocol::completion_json(job->id, job->created, job->model, choices, usage);
  send_json(job->writer, 200, body);
}

}  // namespace deepinfer::server
