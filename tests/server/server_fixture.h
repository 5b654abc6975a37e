// What the server suites share: an HTTP client for one request, a raw loopback connection for
// framing the client controls byte by byte, SSE payload parsing, and a server on loopback.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ops.h"
#include "server/api_server.h"

namespace deepinfer::server::testing {

using Json = nlohmann::json;

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names in lower case
  Json json() const { return Json::parse(body); }
};

// One request over its own connection (HTTP/1.1, bearer `key` unless empty).
Reply call(uint16_t port, const std::string& method, const std::string& path,
           const std::string& body = "", const std::string& key = "sk-test");

// The JSON payloads of an SSE body; `done` tells whether it ended with [DONE].
std::vector<Json> sse_payloads(const std::string& body, bool& done);

// A loopback connection that sends exactly the bytes it is given.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port);
  void send(const std::string& bytes);
  // Everything the server sends until it closes the connection or `limit` passes.
  std::string read_until_closed(std::chrono::milliseconds limit = std::chrono::seconds(30));
  // Reads until `text` has arrived (or the limit passes); what arrived so far.
  std::string read_until(const std::string& text,
                         std::chrono::milliseconds limit = std::chrono::seconds(30));
  void close();
  // Ends what this side sends (a half-close); the server can still answer.
  void shutdown_send();

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  std::string received_;
};

// A POST of `body` to `path` as raw HTTP/1.1 bytes (authorized with sk-test).
std::string raw_post(const std::string& path, const std::string& body, bool keep_alive = true);

// Fills `folder` with tiny-qwen3-chat's checkpoint and Qwen3's real tokenizer: the model's
// embedding is padded past the tokenizer (151,936 rows for 151,669 tokens), as Qwen3's own
// checkpoints are, and the chat template is Qwen3's.
void make_qwen3_chat_model(const std::filesystem::path& folder);

// A server over `model_dir` on a free loopback port, with API key sk-test.
class LoopbackServer {
 public:
  LoopbackServer(const std::string& model_dir, ServeOptions options = {});
  ~LoopbackServer();
  uint16_t port() const { return server_->port(); }
  // A /metrics value (-1 when absent).
  double metric(const std::string& name) const;
  // Waits (up to 5 s) until no request is in flight and no KV block is held.
  bool settles() const;

 private:
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<ApiServer> server_;
  std::thread thread_;
};

}  // namespace deepinfer::server::testing
