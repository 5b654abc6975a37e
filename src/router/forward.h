// Passing one request through to a worker and its answer back to the client: whole answers
// whole, streams (server-sent events) event by event as the worker writes them. Blocking: run
// it on a thread of its own, never on an I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "server/http_server.h"

namespace deepinfer::router {

struct WorkerAddress {
  std::string host;
  uint16_t port = 0;
};
// "http://HOST:PORT" (a trailing slash allowed); nullopt for anything else.
std::optional<WorkerAddress> parse_worker_url(const std::string& url);

struct ForwardResult {
  enum class Outcome {
    kAnswered,     // the worker's answer reached the client (or the client left)
    kUnreachable,  // nothing reached the client: the request may go to another worker
    kCutOff,       // the worker failed after part of its answer reached the client
  };
  Outcome outcome = Outcome::kUnreachable;
  int status = 0;     // the worker's status, when it answered
  std::string error;  // what failed
};

struct ForwardTimeouts {
  std::chrono::milliseconds connect{2000};
  std::chrono::milliseconds idle{600'000};  // longest wait for the worker's next bytes
};

// Sends `request` to `worker` and its answer to `writer`; `client_gone` (set when the
// client disconnects) ends a stream early.
ForwardResult forward(const WorkerAddress& worker, const server::HttpRequest& request,
                      server::ResponseWriter& writer, const std::atomic<bool>& client_gone,
                      const ForwardTimeouts& timeouts = {});

// A GET of `path` on `worker` within `timeout`: its status and body (status 0: unreachable).
std::pair<int, std::string> get(const WorkerAddress& worker, const std::string& path,
                                std::chrono::milliseconds timeout);

}  // namespace deepinfer::router
