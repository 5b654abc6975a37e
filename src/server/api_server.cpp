#include "server/api_server.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "core/error.h"
#include "core/json.h"
#include "protocol/anthropic.h"
#include "protocol/completion_text.h"
#include "protocol/formatter.h"
#include "protocol/openai.h"
#include "protocol/prompt.h"
#include "protocol/responses.h"

namespace deepinfer::server {

using protocol::ApiError;
using protocol::Json;

namespace {

constexpr const char* kJson = "application/json";

void send_json(const std::shared_ptr<ResponseWriter>& writer, int status, const Json& body) {
  writer->send(status, kJson, json_text(body));
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
  std::unique_ptr<protocol::ResponseFormatter> format;
  protocol::ApiFormat api = protocol::ApiFormat::kChatCompletions;
  std::string id;
  protocol::GenerationParams params;
  int64_t prompt_tokens = 0;
  std::vector<protocol::CompletionText> texts;  // per completion index
  // Each completion's parser starts as a copy of this, when the model tags its output.
  std::optional<protocol::OutputParser> parser;
  std::vector<GenerationResult> results;
  std::string echo_prefix;  // /v1/completions with echo
  // json_object with a reasoning model: the JSON starts after the reasoning.
  std::shared_ptr<const structured::Constraint> constraint;
  bool done = false;
  // The server's shutdown deadline passed before the request ended: it ends with a 503.
  std::atomic<bool> cut_short{false};
};

ApiServer::ApiServer(CausalLM& model, const std::string& model_dir, const EngineConfig& engine,
                     const ServeOptions& options)
    : model_(model), options_(options) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(model_dir) / "tokenizer.json"))
    fail("serve: {} has no tokenizer.json (the server needs the model's tokenizer)", model_dir);
  tokenizer_ = Tokenizer::load(model_dir);
  chat_encoder_ =
      std::make_unique<protocol::ChatEncoder>(model_dir, *tokenizer_, options.prompt_format);
  constraints_ =
      std::make_unique<protocol::OutputConstraints>(*tokenizer_, model.config().eos_token_ids);
  for (const std::string& bytes : tokenizer_->token_bytes())
    longest_token_bytes_ = std::max(longest_token_bytes_, bytes.size());
  int64_t context = model.config().max_position_embeddings;
  max_model_len_ = options.max_model_len > 0 ? std::min(options.max_model_len, context) : context;
  if (options_.served_model_name.empty())
    options_.served_model_name = fs::path(model_dir).filename().string();
  // Ids past the tokenizer's vocabulary (a padded embedding) are never sampled or accepted.
  vocab_limit_ = std::min(model.config().vocab_size, tokenizer_->vocab_size());
  EngineConfig config = engine;
  config.vocab_limit = vocab_limit_;
  engine_ = std::make_unique<EngineLoop>(model, config);
  request_workers_ =
      std::make_unique<boost::asio::thread_pool>(std::max(1, options.request_threads));
  HttpServerOptions http = options.http;
  http.error_body = [](int status, const std::string& message, const std::string& path) {
    return json_text(protocol::error_body_for(path)(ApiError(status, message)));
  };
  http.on_drain_deadline = [this] { cut_short_live_jobs(); };
  http_ = std::make_unique<HttpServer>(
      http, [this](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
        handle(std::move(request), std::move(writer));
      });
}

// run() has returned, so no I/O thread runs handlers. The engine goes first: its thread may
// still call stream listeners, which post to the (now idle) I/O context; then the context
// and whatever it still queues.
ApiServer::~ApiServer() {
  request_workers_->join();  // nothing queued may reach a gone engine
  engine_.reset();
  http_.reset();
}

bool ApiServer::authorized(const HttpRequest& request) const {
  if (options_.api_key.empty()) return true;
  std::string bearer = request.header("authorization");
  if (bearer == "Bearer " + options_.api_key) return true;
  return request.header("x-api-key") == options_.api_key;
}

// GETs (health, metrics, models) are answered here, on the I/O thread; everything else is
// parsed, rendered and tokenized on a request thread. Requests waiting for one count against
// --max-pending-requests like running ones.
void ApiServer::handle(HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
  if (request.method == "GET") return answer(request, writer);
  if (queued_requests_.load() + counters_.in_flight.load() >= options_.max_pending_requests) {
    ++counters_.rejected;
    ApiError busy(429, "the server is at its limit of concurrent requests; retry later");
    return send_json(writer, busy.status(), protocol::error_body_for(request.path)(busy));
  }
  ++queued_requests_;
  boost::asio::post(*request_workers_,
                    [this, request = std::move(request), writer = std::move(writer)] {
                      answer(request, writer);
                      --queued_requests_;
                    });
}

void ApiServer::answer(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer) {
  auto error_body = protocol::error_body_for(request.path);
  try {
    route(request, writer);
  } catch (const ApiError& error) {
    ++counters_.rejected;
    send_json(writer, error.status(), error_body(error));
  } catch (const std::exception& error) {
    // Anything else a request triggers is still the request's problem, never the server's end.
    ++counters_.rejected;
    ApiError failure(400, error.what());
    send_json(writer, failure.status(), error_body(failure));
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
  if (post && path == "/v1/messages") return messages(request, writer);
  if (post && path == "/v1/responses") return responses(request, writer);
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

// Tenants never share cached blocks (nor learn from timing what another one sent): the API
// key, when the server has one, salts every request beside the request's own cache_salt.
uint64_t cache_salt_of(const std::string& api_key, const std::string& cache_salt) {
  if (api_key.empty() && cache_salt.empty()) return 0;
  std::string text = api_key + '\0' + cache_salt;
  return XXH3_64bits(text.data(), text.size()) | 1;
}

GenerationRequest engine_request(const std::string& id, std::vector<int32_t> prompt,
                                 const protocol::GenerationParams& params, int max_tokens,
                                 const std::string& api_key) {
  GenerationRequest request;
  request.id = id;
  request.prompt = std::move(prompt);
  request.sampling = params.sampling;
  request.max_tokens = max_tokens;
  request.min_tokens = params.min_tokens;
  request.ignore_eos = params.ignore_eos;
  request.stop_token_ids = params.stop_token_ids;
  request.priority = params.priority;
  request.cache_salt = cache_salt_of(api_key, params.cache_salt);
  request.cache_retention = params.cache_retention;
  return request;
}

}  // namespace

std::shared_ptr<ApiServer::Job> ApiServer::new_job(const std::shared_ptr<ResponseWriter>& writer,
                                                   protocol::ApiFormat api,
                                                   const protocol::GenerationParams& params) {
  static const std::map<protocol::ApiFormat, const char*> kIdPrefix = {
      {protocol::ApiFormat::kChatCompletions, "chatcmpl-"},
      {protocol::ApiFormat::kCompletions, "cmpl-"},
      {protocol::ApiFormat::kAnthropicMessages, "msg_"},
      {protocol::ApiFormat::kResponses, "resp_"}};
  auto job = std::make_shared<Job>();
  job->writer = writer;
  job->api = api;
  job->id = random_id(kIdPrefix.at(api));
  job->params = params;
  return job;
}

void ApiServer::chat_completions(const HttpRequest& http_request,
                                 const std::shared_ptr<ResponseWriter>& writer) {
  protocol::ChatCompletionRequest parsed = protocol::parse_chat_completion(http_request.body);
  check_model(parsed.model, options_.served_model_name);
  start_chat_job(new_job(writer, protocol::ApiFormat::kChatCompletions, parsed.params),
                 parsed.chat);
}

void ApiServer::messages(const HttpRequest& http_request,
                         const std::shared_ptr<ResponseWriter>& writer) {
  protocol::MessagesRequest parsed = protocol::parse_messages(http_request.body);
  check_model(parsed.model, options_.served_model_name);
  if (parsed.params.sampling.n != 1) throw ApiError(400, "the Messages API has one completion");
  start_chat_job(new_job(writer, protocol::ApiFormat::kAnthropicMessages, parsed.params),
                 parsed.chat);
}

void ApiServer::responses(const HttpRequest& http_request,
                          const std::shared_ptr<ResponseWriter>& writer) {
  protocol::ResponsesRequest parsed = protocol::parse_responses(http_request.body);
  check_model(parsed.model, options_.served_model_name);
  start_chat_job(new_job(writer, protocol::ApiFormat::kResponses, parsed.params), parsed.chat);
}

// Text longer than this cannot fit max_model_len tokens, so it is refused before tokenizing
// (which takes seconds for tens of MB): no token is longer than the vocabulary's longest,
// and 4x leaves room for normalizers that shorten text (NFC composition, case folding).
size_t ApiServer::max_prompt_bytes() const {
  return static_cast<size_t>(max_model_len_) * longest_token_bytes_ * 4;
}

// Renders the conversation (template or DeepSeek encoding), tokenizes, checks lengths, starts.
void ApiServer::start_chat_job(const std::shared_ptr<Job>& job, chat::ChatRequest chat) {
  chat.json_output = job->params.json_output;
  protocol::ChatPrompt prompt = chat_encoder_->encode(chat, max_prompt_bytes());
  std::vector<int32_t> ids = std::move(prompt.encoded.ids);
  int max_tokens =
      check_lengths(static_cast<int64_t>(ids.size()), job->params.max_tokens, max_model_len_);
  job->constraint = constraints_->after_reasoning(constraints_->of(job->params), prompt.syntax);
  if (!job->constraint) {
    job->constraint = constraints_->tool_call(chat, prompt.syntax, prompt.forced_closing);
    // Calls the model opens itself come after its reasoning; forced ones open the output.
    if (chat.tool_choice.mode == chat::ToolChoice::Mode::kAuto)
      job->constraint = constraints_->after_reasoning(job->constraint, prompt.syntax);
  }
  if (prompt.syntax.any()) {
    job->parser.emplace(prompt.syntax, "");
    job->parser->push(prompt.forced_output, 0);  // the call the prompt opened (as tokens)
  }
  start_job(job,
            engine_request(job->id, std::move(ids), job->params, max_tokens, options_.api_key));
}

void ApiServer::completions(const HttpRequest& http_request,
                            const std::shared_ptr<ResponseWriter>& writer) {
  protocol::CompletionRequest parsed = protocol::parse_completion(http_request.body);
  check_model(parsed.model, options_.served_model_name);
  std::vector<int32_t> prompt = parsed.prompt_ids;
  if (parsed.prompt_text) {
    if (parsed.prompt_text->size() > max_prompt_bytes()) {
      throw ApiError(400,
                     fmt::format("the prompt is {} bytes, more than the model's context can hold "
                                 "(at most {} bytes)",
                                 parsed.prompt_text->size(), max_prompt_bytes()),
                     "prompt");
    }
    prompt = tokenizer_->encode(*parsed.prompt_text, EncodeMode::kSpecials, true);
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab_limit_)
      throw ApiError(
          400, fmt::format("token id {} is outside the vocabulary (size {})", id, vocab_limit_),
          "prompt");
  }
  int max_tokens = check_lengths(static_cast<int64_t>(prompt.size()),
                                 parsed.params.max_tokens.value_or(16), max_model_len_);
  auto job = new_job(writer, protocol::ApiFormat::kCompletions, parsed.params);
  if (parsed.echo)
    job->echo_prefix = parsed.prompt_text.value_or(tokenizer_->decode(prompt, false));
  start_job(
      job, engine_request(job->id, std::move(prompt), parsed.params, max_tokens, options_.api_key));
}

void ApiServer::start_job(std::shared_ptr<Job> job, GenerationRequest request) {
  if (counters_.in_flight.load() >= options_.max_pending_requests)
    throw ApiError(429, "the server is at its limit of concurrent requests; retry later");
  if (shutdown_deadline_passed_) throw ApiError(503, "the server is shutting down");
  if (!job->constraint) job->constraint = constraints_->of(job->params);
  request.constraint = job->constraint;
  job->prompt_tokens = static_cast<int64_t>(request.prompt.size());
  protocol::ResponseMeta meta{job->id, options_.served_model_name, unix_seconds(),
                              job->prompt_tokens, job->params.include_usage};
  job->format = protocol::make_formatter(job->api, meta);
  for (int i = 0; i < request.sampling.n; ++i) {
    std::optional<protocol::OutputParser> parser = job->parser;
    if (parser)
      parser->set_id_prefix(fmt::format("call_{}_{}_", job->id.substr(job->id.size() - 8), i));
    job->texts.emplace_back(tokenizer_.get(), job->params.stop, std::move(parser));
  }
  try {
    job->stream = engine_->submit(request);
  } catch (const Error& error) {
    throw ApiError(400, error.what());
  }
  ++counters_.in_flight;
  if (job->params.stream) {
    job->writer->start_stream(200, "text/event-stream");
    job->writer->write(job->format->stream_start());
  }
  // A client that goes away ends its request, which gives its KV blocks back.
  job->writer->on_disconnect([this, weak = std::weak_ptr<Job>(job)] {
    if (auto gone = weak.lock()) engine_->stop(gone->id);
  });
  {
    std::lock_guard hold(live_jobs_mutex_);
    live_jobs_[job->id] = job;
  }
  if (shutdown_deadline_passed_) {  // the deadline came while this one was being submitted
    job->cut_short = true;
    engine_->stop(job->id);
  }
  // The listener keeps the job alive until drain() sees the end and clears it.
  job->stream->set_listener([this, job] { http_->post([this, job] { drain(job); }); });
  http_->post([this, job] { drain(job); });  // anything that arrived before the listener
}

namespace {

std::string finish_reason(const GenerationResult& result, const protocol::CompletionText& text,
                          bool called_tools) {
  if (text.stopped() || result.finish_reason == FinishReason::kStop)
    return called_tools ? "tool_calls" : "stop";
  return "length";
}

}  // namespace

protocol::ChoiceOutput ApiServer::choice_of(const Job& job, const GenerationResult& result) const {
  const protocol::CompletionText& text = job.texts[static_cast<size_t>(result.index)];
  const protocol::ParsedOutput& parsed = text.total();
  protocol::ChoiceOutput choice;
  choice.index = result.index;
  choice.text = job.echo_prefix + parsed.content;
  choice.reasoning = parsed.reasoning;
  choice.tool_calls = parsed.tool_calls;
  choice.finish_reason = finish_reason(result, text, !choice.tool_calls.empty());
  choice.stop_reason = text.matched_stop();
  if (job.api == protocol::ApiFormat::kChatCompletions && job.params.sampling.logprobs) {
    choice.logprobs = protocol::chat_logprobs_json(
        result.logprobs, [&](int32_t id) { return tokenizer_->decode({id}, false); });
  }
  return choice;
}

// Takes what the engine delivered: detokenizes, parses, watches stop strings, and streams
// pieces. Returns whether the request has ended.
bool ApiServer::take_events(Job& job) {
  RequestStream::Event event;
  bool ended = false;
  auto stream_piece = [&](int index, const protocol::ParsedOutput& piece) {
    if (!job.params.stream || piece.empty()) return;
    job.writer->write(job.parser ? job.format->stream_parsed(index, piece)
                                 : job.format->stream_text(index, piece.content));
  };
  while (job.stream->poll(event, ended)) {
    for (const TokenEvent& token : event.tokens) {
      protocol::CompletionText& text = job.texts[static_cast<size_t>(token.index)];
      if (text.stopped()) continue;
      protocol::ParsedOutput piece = text.push(token.token);
      if (text.stopped()) engine_->stop(job.id, token.index);
      stream_piece(token.index, piece);
    }
    for (GenerationResult& result : event.finished) {
      protocol::ParsedOutput tail = job.texts[static_cast<size_t>(result.index)].finish();
      std::string tail_text;
      if (job.parser) {
        stream_piece(result.index, tail);
      } else {
        tail_text = std::move(tail.content);
      }
      protocol::ChoiceOutput choice = choice_of(job, result);
      if (job.params.stream) job.writer->write(job.format->stream_finish(choice, tail_text));
      (choice.finish_reason == "stop" ? counters_.finished_stop : counters_.finished_length)++;
      job.results.push_back(std::move(result));
    }
    if (ended) break;
  }
  return ended;
}

// The shutdown's drain time is up: every request still running stops and ends with a 503 (an
// error event and the terminator for a stream), and no new one starts.
void ApiServer::cut_short_live_jobs() {
  shutdown_deadline_passed_ = true;
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard hold(live_jobs_mutex_);
    for (const auto& [id, weak] : live_jobs_)
      if (auto job = weak.lock()) jobs.push_back(job);
  }
  for (const std::shared_ptr<Job>& job : jobs) {
    job->cut_short = true;
    engine_->stop(job->id);
    http_->post([this, job] { drain(job); });
  }
}

// Runs on an I/O thread whenever the engine delivered something; at the end, the whole
// answer or the stream's closing events.
void ApiServer::drain(const std::shared_ptr<Job>& job) {
  std::lock_guard lock(job->mutex);
  if (job->done) return;
  bool ended = false;
  std::optional<ApiError> failure;
  try {
    if (job->cut_short)
      failure.emplace(503, "the server shut down before this request finished");
    else
      ended = take_events(*job);
  } catch (const Error& error) {
    failure.emplace(503, fmt::format("the engine failed: {}", error.what()));
  }
  if (!ended && !failure) return;
  job->done = true;
  --counters_.in_flight;
  {
    std::lock_guard hold(live_jobs_mutex_);
    live_jobs_.erase(job->id);
  }
  job->stream->set_listener(nullptr);  // breaks the job <-> listener cycle
  if (failure) {
    engine_->stop(job->id);  // its KV blocks go back now, not at max_tokens
    if (!job->params.stream) return send_json(job->writer, 503, job->format->error_body(*failure));
    job->writer->write(job->format->stream_error(*failure));
    return job->writer->end_stream();
  }
  protocol::Usage usage;
  usage.prompt_tokens = job->prompt_tokens;
  std::sort(job->results.begin(), job->results.end(),
            [](const auto& a, const auto& b) { return a.index < b.index; });
  std::vector<protocol::ChoiceOutput> choices;
  for (const GenerationResult& result : job->results) {
    usage.completion_tokens += static_cast<int64_t>(result.tokens.size());
    usage.cached_tokens = result.cached_prompt_tokens;
    choices.push_back(choice_of(*job, result));
  }
  if (job->params.stream) {
    job->writer->write(job->format->stream_end(usage));
    return job->writer->end_stream();
  }
  send_json(job->writer, 200, job->format->whole(choices, usage));
}

}  // namespace deepinfer::server
