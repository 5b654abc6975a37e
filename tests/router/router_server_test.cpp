// The router in front of two worker processes on loopback: answers and streams pass through
// unchanged, requests sharing a prefix go to the worker that holds it, a worker that goes away
// costs no request, and what clients get wrong is answered by the router in the API's shape.
#include "router/router_server.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "server/server_fixture.h"
#include "support/test_support.h"

extern char** environ;

namespace deepinfer::router {
namespace {

using server::testing::call;
using server::testing::Json;

// `deepinfer serve` of demo-code-target on a free loopback port, in a process of its own (as
// workers are deployed); killed when it goes.
class Worker {
 public:
  Worker() {
    const std::string script =
        "exec " + std::string(DEEPINFER_BINARY) + " serve " +
        deepinfer::testing::fixture_model("demo-code-target").string() +
        " --host 127.0.0.1 --port 0 --api-key sk-test --kv-cache-bytes 268435456 2>" +
        (dir_.path() / "log").string();
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ),
              0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const std::regex serving(R"(on http://127\.0\.0\.1:(\d+))");
    while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
      std::stringstream log;
      log << std::ifstream(dir_.path() / "log").rdbuf();
      const std::string text = log.str();
      std::smatch match;
      if (std::regex_search(text, match, serving)) {
        port_ = static_cast<uint16_t>(std::stoi(match[1].str()));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    EXPECT_NE(port_, 0) << "the worker did not start";
  }
  ~Worker() {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // A /metrics value, whatever its labels (-1 when absent).
  double metric(const std::string& name) const {
    std::istringstream text(call(port_, "GET", "/metrics").body);
    for (std::string line; std::getline(text, line);)
      if (line.starts_with(name + " ") || line.starts_with(name + "{"))
        return std::stod(line.substr(line.rfind(' ') + 1));
    return -1.0;
  }

 private:
  deepinfer::testing::TempDir dir_;
  pid_t pid_ = 0;
  uint16_t port_ = 0;
};

std::string worker_url(const Worker& worker) {
  return worker.url();
}

class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& worker : workers_) worker = std::make_unique<Worker>();
    start_router({worker_url(*workers_[0]), worker_url(*workers_[1])});
  }
  void TearDown() override {
    if (router_) router_->stop();
    if (thread_.joinable()) thread_.join();
  }
  void start_router(std::vector<std::string> urls) {
    RouterOptions options;
    options.http.host = "127.0.0.1";
    options.http.port = 0;
    options.workers = std::move(urls);
    options.api_key = "sk-test";
    options.health_period_seconds = 0.1;
    router_ = std::make_unique<RouterServer>(options);
    thread_ = std::thread([this] { router_->run(); });
  }
  uint16_t port() const { return router_->port(); }
  // A router metric's value for `worker` (-1 when absent).
  double metric(const std::string& name, const std::string& worker) const {
    const std::string text = call(port(), "GET", "/metrics").body;
    const std::string prefix = name + "{worker=\"" + worker + "\"} ";
    const size_t at = text.find(prefix);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + prefix.size()));
  }

  // A router metric without labels (-1 when absent).
  double router_metric(const std::string& name) const {
    const std::string text = call(port(), "GET", "/metrics").body;
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + name.size() + 2));
  }

  std::unique_ptr<Worker> workers_[2];
  std::unique_ptr<RouterServer> router_;
  std::thread thread_;
};

const std::string kChat = R"({"model":"demo-code-target","max_tokens":8,"temperature":0,)"
                          R"("messages":[{"role":"user","content":"def add(a, b):"}]})";

TEST_F(RouterTest, AnswersAndStreamsAreTheWorkersOwn) {
  const auto direct = call(workers_[0]->port(), "POST", "/v1/chat/completions", kChat);
  const auto routed = call(port(), "POST", "/v1/chat/completions", kChat);
  ASSERT_EQ(routed.status, 200) << routed.body;
  EXPECT_EQ(routed.json()["choices"][0]["message"], direct.json()["choices"][0]["message"]);

  Json streamed = Json::parse(kChat);
  streamed["stream"] = true;
  const auto direct_stream =
      call(workers_[1]->port(), "POST", "/v1/chat/completions", streamed.dump());
  const auto routed_stream = call(port(), "POST", "/v1/chat/completions", streamed.dump());
  ASSERT_EQ(routed_stream.status, 200);
  EXPECT_EQ(routed_stream.headers.at("content-type"), "text/event-stream");
  bool done = false, direct_done = false;
  auto text_of = [](const std::vector<Json>& events) {
    std::string text;
    for (const Json& event : events)
      if (!event["choices"].empty() && event["choices"][0]["delta"].contains("content"))
        text += event["choices"][0]["delta"]["content"].get<std::string>();
    return text;
  };
  EXPECT_EQ(text_of(server::testing::sse_payloads(routed_stream.body, done)),
            text_of(server::testing::sse_payloads(direct_stream.body, direct_done)));
  EXPECT_TRUE(done);

  const std::string message =
      R"({"model":"demo-code-target","max_tokens":4,"messages":[{"role":"user","content":"x = "}]})";
  const auto anthropic = call(port(), "POST", "/v1/messages", message);
  ASSERT_EQ(anthropic.status, 200) << anthropic.body;
  EXPECT_EQ(anthropic.json()["type"], "message");
  EXPECT_EQ(call(port(), "GET", "/v1/models").json()["data"][0]["id"], "demo-code-target");
}

// Two long system prompts: the first request of each lands on its own worker (the second
// while the first is still running, so the busy worker is passed over); after that each prompt
// follows its cached prefix, where an idle tie would send both to the first worker.
TEST_F(RouterTest, RequestsSharingAPrefixGoWhereItIsCached) {
  auto request = [](char system, int question, int max_tokens) {
    Json body = Json::parse(kChat);
    body["max_tokens"] = max_tokens;
    body["messages"] = {{{"role", "system"}, {"content", std::string(600, system)}},
                        {{"role", "user"}, {"content", "question " + std::to_string(question)}}};
    return body.dump();
  };
  std::thread long_running([&] {
    EXPECT_EQ(call(port(), "POST", "/v1/chat/completions", request('a', 0, 200)).status, 200);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(call(port(), "POST", "/v1/chat/completions", request('b', 0, 8)).status, 200);
  long_running.join();
  for (int r = 1; r <= 3; ++r) {
    for (char system : {'a', 'b'})
      ASSERT_EQ(call(port(), "POST", "/v1/chat/completions", request(system, r, 8)).status, 200);
  }
  for (const auto& worker : workers_) {
    EXPECT_EQ(metric("deepinfer_router_requests_routed_total", worker_url(*worker)), 4);
    EXPECT_GT(metric("deepinfer_router_expected_cached_tokens_total", worker_url(*worker)), 0);
    EXPECT_GT(worker->metric("vllm:prefix_cache_hits_total"), 0);
  }
}

TEST_F(RouterTest, AWorkerThatGoesAwayCostsNoRequest) {
  const std::string gone = worker_url(*workers_[0]);
  workers_[0].reset();
  for (int r = 0; r < 4; ++r) {
    const auto reply = call(port(), "POST", "/v1/chat/completions", kChat);
    EXPECT_EQ(reply.status, 200) << reply.body;
  }
  EXPECT_EQ(metric("deepinfer_router_worker_healthy", gone), 0);
  EXPECT_EQ(call(port(), "GET", "/health").status, 200);
  workers_[1].reset();
  const auto none = call(port(), "POST", "/v1/messages", kChat);
  EXPECT_EQ(none.status, 503);
  EXPECT_EQ(none.json()["type"], "error");
  EXPECT_EQ(none.json()["error"]["type"], "api_error");
}

// Two long streams, one on each worker; one worker is killed while they run: its stream ends
// with an error event and [DONE], the other runs to its end, and the next request is answered.
TEST_F(RouterTest, AWorkerKilledMidStreamEndsOnlyItsOwnStream) {
  Json request = Json::parse(kChat);
  request["stream"] = true;
  request["max_tokens"] = 400;
  request["ignore_eos"] = true;
  server::testing::Reply replies[2];
  std::thread streams[2];
  for (int s = 0; s < 2; ++s) {
    streams[s] = std::thread(
        [&, s] { replies[s] = call(port(), "POST", "/v1/chat/completions", request.dump()); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  workers_[0].reset();
  for (auto& stream : streams) stream.join();
  int cut = 0, whole = 0;
  for (const auto& reply : replies) {
    ASSERT_EQ(reply.status, 200);
    bool done = false;
    const std::vector<Json> events = server::testing::sse_payloads(reply.body, done);
    EXPECT_TRUE(done);
    ASSERT_FALSE(events.empty());
    if (events.back().contains("error")) {
      ++cut;
      EXPECT_EQ(events.back()["error"]["code"], 502);
    } else if (events.back()["choices"][0]["finish_reason"] == "length") {
      ++whole;
    }
  }
  EXPECT_EQ(cut, 1);
  EXPECT_EQ(whole, 1);
  EXPECT_EQ(call(port(), "POST", "/v1/chat/completions", kChat).status, 200);
  EXPECT_EQ(router_metric("deepinfer_router_streams_cut_off_total"), 1);
}

TEST_F(RouterTest, BadInputIsAnsweredInTheApisShape) {
  const auto unauthorized = call(port(), "POST", "/v1/chat/completions", kChat, "sk-wrong");
  EXPECT_EQ(unauthorized.status, 401);
  EXPECT_TRUE(unauthorized.json()["error"].contains("message"));
  const auto malformed = call(port(), "POST", "/v1/chat/completions", "{not json");
  EXPECT_EQ(malformed.status, 400);  // the worker's answer, passed through
  EXPECT_TRUE(malformed.json()["error"].contains("message"));
  RouterOptions bad_url;
  bad_url.workers = {"localhost:80"};
  EXPECT_THROW(RouterServer{bad_url}, Error);
  EXPECT_THROW(RouterServer{RouterOptions{}}, Error);
}

}  // namespace
}  // namespace deepinfer::router
