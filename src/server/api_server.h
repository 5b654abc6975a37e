// `deepinfer serve`: the OpenAI-compatible HTTP front of the engine. HTTP threads parse,
// render and tokenize; the engine thread (EngineLoop) sees typed requests only; results come
// back through each request's stream and are detokenized and framed on the HTTP threads.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine_loop.h"
#include "protocol/chat_encoder.h"
#include "protocol/formatter.h"
#include "protocol/openai.h"
#include "protocol/output_constraints.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace boost::asio {
class thread_pool;
}

namespace deepinfer::server {

struct ServeOptions {
  HttpServerOptions http;
  std::string api_key;              // empty: no authentication
  std::string served_model_name;    // the id clients send as "model"
  int64_t max_model_len = 0;        // 0: the model's context length
  int max_pending_requests = 1024;  // more at once get 429
  // Threads that parse, render and tokenize requests, so that no request's size holds up
  // the I/O threads (which accept connections and answer /health and /metrics).
  int request_threads = 2;
  protocol::PromptFormat prompt_format = protocol::PromptFormat::kAuto;
};

class ApiServer {
 public:
  ApiServer(CausalLM& model, const std::string& model_dir, const EngineConfig& engine,
            const ServeOptions& options);
  ~ApiServer();
  uint16_t port() const { return http_->port(); }
  void run() { http_->run(); }
  void stop() { http_->stop(); }

  struct Counters {
    std::atomic<int64_t> in_flight{0};
    std::atomic<int64_t> finished_stop{0}, finished_length{0};
    std::atomic<int64_t> rejected{0};
    std::atomic<int64_t> engine_failures{0};
  };

 private:
  void handle(HttpRequest request, std::shared_ptr<ResponseWriter> writer);
  void answer(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  size_t max_prompt_bytes() const;
  void route(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  void chat_completions(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  void completions(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  void messages(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  void responses(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  void tokenize(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  void detokenize(const HttpRequest& request, const std::shared_ptr<ResponseWriter>& writer);
  std::string metrics_text() const;
  std::string models_json() const;
  bool authorized(const HttpRequest& request) const;

  struct Job;
  std::shared_ptr<Job> new_job(const std::shared_ptr<ResponseWriter>& writer,
                               protocol::ApiFormat api, const protocol::GenerationParams& params);
  void start_chat_job(const std::shared_ptr<Job>& job, chat::ChatRequest chat);
  void start_job(std::shared_ptr<Job> job, GenerationRequest request);
  void drain(const std::shared_ptr<Job>& job);
  bool take_events(Job& job);
  void cut_short_live_jobs();
  protocol::ChoiceOutput choice_of(const Job& job, const GenerationResult& result) const;

  CausalLM& model_;
  ServeOptions options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<protocol::ChatEncoder> chat_encoder_;
  std::unique_ptr<protocol::OutputConstraints> constraints_;
  std::unique_ptr<EngineLoop> engine_;
  std::unique_ptr<boost::asio::thread_pool> request_workers_;
  std::atomic<int64_t> queued_requests_{0};  // waiting for or on a request thread
  std::unique_ptr<HttpServer> http_;
  size_t longest_token_bytes_ = 1;
  int64_t max_model_len_ = 0;
  int32_t vocab_limit_ = 0;  // token ids below this can be sampled, decoded and sent
  Counters counters_;
  std::mutex live_jobs_mutex_;
  std::map<std::string, std::weak_ptr<Job>> live_jobs_;  // started and not yet ended
  std::atomic<bool> shutdown_deadline_passed_{false};
};

}  // namespace deepinfer::server
