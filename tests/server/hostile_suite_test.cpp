// A seeded run of generated hostile requests against a real server (Qwen3's chat template and
// tokenizer over a checkpoint with a padded vocabulary): every route, each field given wrong
// types and out-of-range values, broken messages, broken framing, clients that leave at every
// stage of an answer, and control-token text in every client string, with valid requests
// interleaved from several clients at once. DEEPINFER_HOSTILE_CASES (default 600) and
// DEEPINFER_HOSTILE_SEED choose the run.
//
// What must hold for every case: no 5xx; a client's error is a 4xx with the route's error
// shape (OpenAI's, or Anthropic's on /v1/messages); a valid request gets its whole answer and
// a stream its terminator; control-token text never becomes control tokens; and afterwards no
// request or KV block is left and /health answers.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "server/hostile_cases.h"
#include "server/server_fixture.h"
#include "support/test_support.h"

namespace deepinfer::server {
namespace {

using testing::Case;
using testing::Drop;
using testing::Expect;
using testing::Json;
using testing::RawConnection;
using testing::Reply;

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// The route's error shape: OpenAI's {"error": {message, type, param, code}} or Anthropic's
// {"type": "error", "error": {type, message}}. Empty when the body has it.
std::string error_shape_problem(const std::string& path, int status, const std::string& body) {
  Json parsed = Json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return "the error body is not a JSON object";
  const Json& error = parsed.contains("error") ? parsed["error"] : Json();
  if (!error.is_object() || !error.contains("message") || !error["message"].is_string() ||
      !error.contains("type") || !error["type"].is_string())
    return "the error has no string message and type";
  if (path == "/v1/messages") return parsed.value("type", "") == "error" ? "" : "type is not error";
  if (!error.contains("code") || error["code"] != status) return "code is not the status";
  return "";
}

// A 200's body: the JSON answer, or a stream that reached its terminator.
std::string answer_problem(const Case& c, const std::string& body) {
  if (c.method == "GET") return "";
  if (!c.stream) {
    Json parsed = Json::parse(body, nullptr, false);
    return parsed.is_discarded() ? "the answer is not JSON" : "";
  }
  if (c.path == "/v1/messages")
    return body.find("event: message_stop") != std::string::npos ? "" : "no message_stop";
  if (c.path == "/v1/responses")
    return body.find("\"response.completed\"") != std::string::npos ? "" : "no response.completed";
  bool done = false;
  (void)testing::sse_payloads(body, done);
  return done ? "" : "the stream did not end with [DONE]";
}

std::string status_problem(const Case& c, int status) {
  if (status >= 500) return "a 5xx";
  if (status == 0) return "no answer";
  switch (c.expect) {
    case Expect::kOk:
      return status == 200 ? "" : "a valid request was refused";
    case Expect::kClientError:
      return status >= 400 && status < 500 ? "" : "invalid input was accepted";
    case Expect::kEither:
      return status == 200 || (status >= 400 && status < 500) ? "" : "an unexpected status";
  }
  return "";
}

// One whole exchange over its own connection; the problems found, empty when none.
std::string run_whole(uint16_t port, const Case& c) {
  Reply reply = testing::call(port, c.method, c.path, c.body);
  std::string problem = status_problem(c, reply.status);
  if (problem.empty() && reply.status >= 400)
    problem = error_shape_problem(c.path, reply.status, reply.body);
  if (problem.empty() && reply.status == 200) problem = answer_problem(c, reply.body);
  return problem;
}

// Raw bytes, read until the server closes: a status line, and a shaped body for a 4xx.
std::string run_raw(uint16_t port, const Case& c) {
  RawConnection connection(port);
  connection.send(c.raw);
  if (c.drop == Drop::kAfterSend) {
    connection.close();
    return "";
  }
  std::string answer = connection.read_until_closed(std::chrono::seconds(20));
  if (answer.empty()) return c.expect == Expect::kClientError && !c.may_close ? "no answer" : "";
  if (answer.rfind("HTTP/1.1 ", 0) != 0) return "not an HTTP answer";
  int status = std::atoi(answer.c_str() + 9);
  std::string problem = status_problem(c, status);
  size_t body_at = answer.find("\r\n\r\n");
  if (problem.empty() && status >= 400 && body_at != std::string::npos)
    problem = error_shape_problem(c.path, status, answer.substr(body_at + 4));
  return problem;
}

// A streamed request the client leaves at some stage of its answer.
std::string run_disconnect(uint16_t port, const Case& c) {
  RawConnection connection(port);
  connection.send(testing::raw_post(c.path, c.body));
  if (c.drop == Drop::kAfterHead) (void)connection.read_until("\r\n\r\n", std::chrono::seconds(20));
  if (c.drop == Drop::kAfterFirstEvent)
    (void)connection.read_until("data:", std::chrono::seconds(20));
  connection.close();
  return "";
}

// Control-token text in client strings (contents, names, keys) encodes as text: the prompt
// holds exactly the added-vocabulary tokens the same request without that text holds.
std::string run_injection(uint16_t port, const Case& c) {
  auto special_count = [&](const std::string& body, std::string& problem) {
    Reply reply = testing::call(port, "POST", "/tokenize", body);
    if (reply.status != 200) {
      problem = "tokenize answered " + std::to_string(reply.status) + ": " + reply.body;
      return size_t{0};
    }
    size_t count = 0;
    for (const Json& id : reply.json()["tokens"]) count += id.get<int64_t>() >= c.first_added_id;
    return count;
  };
  std::string problem;
  size_t injected = special_count(c.body, problem);
  size_t plain = special_count(c.plain_body, problem);
  if (problem.empty() && injected != plain)
    problem = "control-token text became " + std::to_string(injected - plain) + " control tokens";
  return problem;
}

std::string run_case(uint16_t port, const Case& c) {
  switch (c.kind) {
    case Case::Kind::kWhole:
      return run_whole(port, c);
    case Case::Kind::kRaw:
      return run_raw(port, c);
    case Case::Kind::kDisconnect:
      return run_disconnect(port, c);
    case Case::Kind::kInjection:
      return run_injection(port, c);
  }
  return "";
}

class HostileSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    folder_ = new deepinfer::testing::TempDir();
    testing::make_qwen3_chat_model(folder_->path());
    ServeOptions options;
    options.http.max_body_bytes = 1 << 20;
    options.max_model_len = 256;
    server_ = new testing::LoopbackServer(folder_->path().string(), options);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete folder_;
  }
  static deepinfer::testing::TempDir* folder_;
  static testing::LoopbackServer* server_;
};
deepinfer::testing::TempDir* HostileSuite::folder_ = nullptr;
testing::LoopbackServer* HostileSuite::server_ = nullptr;

TEST_F(HostileSuite, SeededHostileRequestsFromSeveralClients) {
  const uint64_t seed = env_number("DEEPINFER_HOSTILE_SEED", 20261204);
  const size_t count = env_number("DEEPINFER_HOSTILE_CASES", 600);
  testing::HostileCases generator(seed);
  std::vector<Case> cases;
  for (size_t i = 0; i < count; ++i) cases.push_back(generator.next());

  constexpr int kClients = 4;
  std::atomic<size_t> next{0};
  std::mutex failures_lock;
  std::vector<std::string> failures;
  std::vector<std::thread> clients;
  for (int client = 0; client < kClients; ++client) {
    clients.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < cases.size();) {
        std::string problem = run_case(server_->port(), cases[i]);
        if (problem.empty()) continue;
        std::lock_guard<std::mutex> hold(failures_lock);
        failures.push_back("case " + std::to_string(i) + " (" + cases[i].label + "): " + problem +
                           "\n  " + cases[i].describe());
      }
    });
  }
  for (std::thread& client : clients) client.join();
  for (size_t i = 0; i < failures.size() && i < 40; ++i) ADD_FAILURE() << failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << cases.size() << " cases failed "
                                << "(seed " << seed << ")";
  EXPECT_EQ(testing::call(server_->port(), "GET", "/health").status, 200);
  EXPECT_TRUE(server_->settles()) << "a request or KV block was left behind";
}

}  // namespace
}  // namespace deepinfer::server
