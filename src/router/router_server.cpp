#include "router/router_server.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "protocol/formatter.h"
#include "protocol/openai.h"

namespace deepinfer::router {
namespace {

using Json = nlohmann::json;
using protocol::ApiError;

// Bytes of prompt text a prefix key covers: about the 16 tokens of a worker's KV block.
constexpr size_t kBlockBytes = 64;
constexpr int64_t kBytesPerToken = 4;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string error_text(const std::string& path, const ApiError& error) {
  return protocol::error_body_for(path)(error).dump();
}

}  // namespace

PromptKeys prompt_keys(const std::string& body, size_t block_bytes) {
  PromptKeys result;
  const Json request = Json::parse(body, nullptr, false);
  if (request.is_discarded() || !request.is_object()) return result;
  std::string text;
  for (const char* field : {"system", "messages", "prompt", "input"})
    if (request.contains(field)) text += request[field].dump();
  result.estimated_tokens = static_cast<int64_t>(text.size()) / kBytesPerToken + 1;
  uint64_t key = 0;
  for (size_t start = 0; start + block_bytes <= text.size(); start += block_bytes) {
    key = XXH3_64bits_withSeed(text.data() + start, block_bytes, key);
    result.keys.push_back(key);
  }
  return result;
}

namespace {

Registry::Options registry_options() {
  Registry::Options options;
  options.block_size = static_cast<int64_t>(kBlockBytes) / kBytesPerToken;
  return options;
}

}  // namespace

struct RouterServer::State {
  explicit State(RouterOptions given)
      : options(std::move(given)),
        registry(registry_options()),
        forwarders(static_cast<size_t>(std::max(1, options.forward_threads))) {
    for (const std::string& url : options.workers) {
      std::optional<WorkerAddress> address = parse_worker_url(url);
      if (!address) fail("router: {} is not a worker URL of the form http://HOST:PORT", url);
      addresses.push_back(*address);
      registry.add(url, Role::kBoth);
    }
    if (addresses.empty()) fail("router: give at least one worker (--worker-urls)");
    in_flight_tokens.assign(addresses.size(), 0);
    per_worker.resize(addresses.size());
  }

  struct WorkerCounters {
    int64_t routed = 0, failed = 0, cached_tokens = 0;
  };

  RouterOptions options;
  std::mutex mutex;  // guards the registry and the counters below
  Registry registry;
  std::vector<WorkerAddress> addresses;
  std::vector<int64_t> in_flight_tokens;
  std::vector<WorkerCounters> per_worker;
  int64_t retried = 0, cut_off = 0, unroutable = 0, unauthorized = 0;
  boost::asio::thread_pool forwarders;
  std::mutex stop_mutex;
  std::condition_variable stop_signal;
  bool stopping = false;

  bool authorized(const server::HttpRequest& request) const {
    if (options.api_key.empty()) return true;
    return request.header("authorization") == "Bearer " + options.api_key ||
           request.header("x-api-key") == options.api_key;
  }

  void handle(server::HttpRequest request, std::shared_ptr<server::ResponseWriter> writer);
  void pass_through(const server::HttpRequest& request, server::ResponseWriter& writer,
                    const std::atomic<bool>& gone);
  std::string metrics();
  void check_health();
  void watch_health();
};

void RouterServer::State::handle(server::HttpRequest request,
                                 std::shared_ptr<server::ResponseWriter> writer) {
  if (request.method == "GET" && request.path == "/health") {
    std::lock_guard lock(mutex);
    const bool any = std::any_of(registry.workers().begin(), registry.workers().end(),
                                 [](const WorkerState& worker) { return worker.healthy; });
    return writer->send(any ? 200 : 503, "application/json",
                        Json{{"status", any ? "ok" : "no healthy worker"}}.dump());
  }
  if (request.method == "GET" && request.path == "/metrics")
    return writer->send(200, "text/plain; version=0.0.4", metrics());
  if (!authorized(request)) {
    std::lock_guard lock(mutex);
    ++unauthorized;
    return writer->send(401, "application/json",
                        error_text(request.path, ApiError(401, "invalid or missing API key", "",
                                                          "authentication_error")));
  }
  auto gone = std::make_shared<std::atomic<bool>>(false);
  writer->on_disconnect([gone] { gone->store(true); });
  boost::asio::post(forwarders, [this, request = std::move(request), writer, gone] {
    pass_through(request, *writer, *gone);
  });
}

// Tries workers in the order the policy ranks them: one that cannot be reached before any
// byte of its answer left is marked down and the next one tried.
void RouterServer::State::pass_through(const server::HttpRequest& request,
                                       server::ResponseWriter& writer,
                                       const std::atomic<bool>& gone) {
  const PromptKeys prompt = prompt_keys(request.body, kBlockBytes);
  for (size_t attempt = 0; attempt < addresses.size(); ++attempt) {
    std::optional<PrefillChoice> choice;
    {
      std::lock_guard lock(mutex);
      choice = registry.route_prefill(prompt.keys, prompt.estimated_tokens);
      if (!choice) break;
      in_flight_tokens[choice->worker] += prompt.estimated_tokens;
      ++per_worker[choice->worker].routed;
      per_worker[choice->worker].cached_tokens += choice->cached_tokens;
    }
    const ForwardResult result =
        forward(addresses[choice->worker], request, writer, gone, options.timeouts);
    std::lock_guard lock(mutex);
    in_flight_tokens[choice->worker] -= prompt.estimated_tokens;
    // Its queued work from now on: the prompts of its requests still in flight.
    WorkerLoad load;
    load.queued_prompt_tokens = in_flight_tokens[choice->worker];
    registry.reported(choice->worker, load);
    if (result.outcome == ForwardResult::Outcome::kAnswered) return;
    ++per_worker[choice->worker].failed;
    registry.checked(choice->worker, false, seconds_now());
    if (result.outcome == ForwardResult::Outcome::kCutOff) {
      ++cut_off;
      const ApiError error(502, "the worker serving this request failed: " + result.error, "",
                           "server_error");
      if (const auto format = protocol::api_format_for(request.path))
        writer.write(protocol::make_formatter(*format, {})->stream_error(error));
      writer.end_stream();
      return;
    }
    ++retried;
  }
  std::lock_guard lock(mutex);
  ++unroutable;
  writer.send(503, "application/json",
              error_text(request.path, ApiError(503, "no worker is available for this request", "",
                                                "server_error")));
}

std::string RouterServer::State::metrics() {
  std::lock_guard lock(mutex);
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  family("deepinfer_router_worker_healthy", "gauge", "1 while the worker is in routing.");
  for (const WorkerState& worker : registry.workers())
    out += fmt::format("deepinfer_router_worker_healthy{{worker=\"{}\"}} {}\n", worker.url,
                       worker.healthy ? 1 : 0);
  family("deepinfer_router_worker_queued_prompt_tokens", "gauge",
         "Estimated prompt tokens of the requests in flight at the worker.");
  for (size_t i = 0; i < addresses.size(); ++i)
    out += fmt::format("deepinfer_router_worker_queued_prompt_tokens{{worker=\"{}\"}} {}\n",
                       registry.workers()[i].url, in_flight_tokens[i]);
  struct PerWorker {
    const char* name;
    int64_t WorkerCounters::*member;
    const char* help;
  };
  const PerWorker counters[] = {
      {"deepinfer_router_requests_routed_total", &WorkerCounters::routed,
       "Requests sent to the worker."},
      {"deepinfer_router_requests_failed_total", &WorkerCounters::failed,
       "Requests the worker failed (unreachable, or its stream cut off)."},
      {"deepinfer_router_expected_cached_tokens_total", &WorkerCounters::cached_tokens,
       "Prompt tokens of the requests sent to the worker that it was expected to hold cached "
       "(estimated from prompt bytes)."}};
  for (const auto& [name, member, help] : counters) {
    family(name, "counter", help);
    for (size_t i = 0; i < addresses.size(); ++i)
      out += fmt::format("{}{{worker=\"{}\"}} {}\n", name, registry.workers()[i].url,
                         per_worker[i].*member);
  }
  struct Total {
    const char* name;
    int64_t value;
    const char* help;
  };
  const Total totals[] = {
      {"deepinfer_router_retries_total", retried,
       "Requests sent to another worker after one could not be reached."},
      {"deepinfer_router_streams_cut_off_total", cut_off,
       "Streams ended with an error event when their worker failed mid-answer."},
      {"deepinfer_router_unroutable_total", unroutable,
       "Requests answered 503: no worker could take them."},
      {"deepinfer_router_unauthorized_total", unauthorized,
       "Requests refused for a missing or wrong API key."}};
  for (const auto& [name, value, help] : totals) {
    family(name, "counter", help);
    out += fmt::format("{} {}\n", name, value);
  }
  return out;
}

// Every worker's /health, healthy ones each period and failed ones when their back-off allows.
void RouterServer::State::check_health() {
  std::vector<size_t> due;
  {
    std::lock_guard lock(mutex);
    due = registry.due_for_retry(seconds_now());
    for (size_t i = 0; i < registry.workers().size(); ++i)
      if (registry.workers()[i].healthy) due.push_back(i);
  }
  for (size_t worker : due) {
    const auto [status, body] = get(addresses[worker], "/health", options.timeouts.connect);
    std::lock_guard lock(mutex);
    registry.checked(worker, status == 200, seconds_now());
  }
}

void RouterServer::State::watch_health() {
  std::unique_lock lock(stop_mutex);
  while (!stopping) {
    lock.unlock();
    check_health();
    lock.lock();
    stop_signal.wait_for(lock, std::chrono::duration<double>(options.health_period_seconds),
                         [&] { return stopping; });
  }
}

RouterServer::RouterServer(RouterOptions options)
    : state_(std::make_shared<State>(std::move(options))) {
  server::HttpServerOptions http = state_->options.http;
  http.error_body = [](int status, const std::string& message, const std::string& path) {
    return error_text(path, ApiError(status, message));
  };
  http_ = std::make_unique<server::HttpServer>(
      http, [state = state_](server::HttpRequest request,
                             std::shared_ptr<server::ResponseWriter> writer) {
        state->handle(std::move(request), std::move(writer));
      });
}

RouterServer::~RouterServer() {
  stop();
  state_->forwarders.join();
}

uint16_t RouterServer::port() const {
  return http_->port();
}

void RouterServer::run() {
  std::thread health([state = state_] { state->watch_health(); });
  http_->run();
  {
    std::lock_guard lock(state_->stop_mutex);
    state_->stopping = true;
  }
  state_->stop_signal.notify_all();
  health.join();
}

void RouterServer::stop() {
  {
    std::lock_guard lock(state_->stop_mutex);
    state_->stopping = true;
  }
  state_->stop_signal.notify_all();
  http_->stop();
}

}  // namespace deepinfer::router
