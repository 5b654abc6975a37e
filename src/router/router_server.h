// `deepinfer router`: one address in front of several workers that serve the same model. Every
// API request passes through to the worker with the least estimated time to its first token
// (its queued prompt work plus this prompt's part it is not expected to hold in its prefix
// cache) and its answer comes back as the worker writes it; workers are health-checked, taken
// out of routing when they fail and put back when they answer again.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "router/forward.h"
#include "router/routing.h"
#include "server/http_server.h"

namespace deepinfer::router {

struct RouterOptions {
  server::HttpServerOptions http;
  std::vector<std::string> workers;  // "http://HOST:PORT", each serving prefill and decode
  std::string api_key;               // required of clients when set
  int forward_threads = 64;          // requests passed through at once
  double health_period_seconds = 2.0;
  ForwardTimeouts timeouts;
};

class RouterServer {
 public:
  // Throws Error for a worker URL it cannot read or an address it cannot bind.
  explicit RouterServer(RouterOptions options);
  ~RouterServer();
  uint16_t port() const;
  void run();  // until stop()
  void stop();

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<server::HttpServer> http_;
};

// The prefix keys of a request body: its prompt part (messages, prompt, input, system) in
// blocks of `block_bytes` bytes, each key chaining the ones before, and the prompt's size in
// tokens estimated from its bytes. The router sees no tokenizer, so a prefix's keys stand for
// its text: requests sharing a long prefix share its keys.
struct PromptKeys {
  PrefixKeys keys;
  int64_t estimated_tokens = 0;
};
PromptKeys prompt_keys(const std::string& body, size_t block_bytes);

}  // namespace deepinfer::router
