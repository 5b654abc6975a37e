#include "server/server_fixture.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "support/test_support.h"

namespace deepinfer::server::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

Reply call(uint16_t port, const std::string& method, const std::string& path,
           const std::string& body, const std::string& key) {
  net::io_context io;
  beast::tcp_stream stream(io);
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> request(http::string_to_verb(method), path, 11);
  request.set(http::field::host, "localhost");
  request.set(http::field::content_type, "application/json");
  if (!key.empty()) request.set(http::field::authorization, "Bearer " + key);
  request.body() = body;
  request.prepare_payload();
  beast::error_code write_error;  // a server that refuses a body early (413) stops reading it
  http::write(stream, request, write_error);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 26);
  if (method == "HEAD") parser.skip(true);
  http::read(stream, buffer, parser);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  Reply reply{static_cast<int>(parser.get().result_int()), parser.get().body(), {}};
  for (const auto& field : parser.get()) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    reply.headers[name] = std::string(field.value());
  }
  return reply;
}

std::vector<Json> sse_payloads(const std::string& body, bool& done) {
  std::vector<Json> payloads;
  done = false;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    size_t end = body.find("\n\n", at);
    std::string data = body.substr(at + 6, end - at - 6);
    if (data == "[DONE]") {
      done = true;
    } else {
      payloads.push_back(Json::parse(data));
    }
    at = end;
  }
  return payloads;
}

RawConnection::RawConnection(uint16_t port) : socket_(io_) {
  socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
}

void RawConnection::send(const std::string& bytes) {
  net::write(socket_, net::buffer(bytes));
}

std::string RawConnection::read_until(const std::string& text, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  socket_.non_blocking(true);
  while (received_.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    char bytes[4096];
    beast::error_code error;
    size_t count = socket_.read_some(net::buffer(bytes), error);
    if (error == net::error::would_block) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (error) break;
    received_.append(bytes, count);
  }
  return received_;
}

std::string RawConnection::read_until_closed(std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  socket_.non_blocking(true);
  while (std::chrono::steady_clock::now() < deadline) {
    char bytes[4096];
    beast::error_code error;
    size_t count = socket_.read_some(net::buffer(bytes), error);
    if (error == net::error::would_block) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (error) break;
    received_.append(bytes, count);
  }
  return received_;
}

void RawConnection::close() {
  beast::error_code ignored;
  socket_.close(ignored);
}

void RawConnection::shutdown_send() {
  beast::error_code ignored;
  socket_.shutdown(boost::asio::ip::tcp::socket::shutdown_send, ignored);
}

std::string raw_post(const std::string& path, const std::string& body, bool keep_alive) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n" +
         (keep_alive ? "" : "Connection: close\r\n") +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

void make_qwen3_chat_model(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  fs::path fixture = deepinfer::testing::fixture_model("tiny-qwen3-chat");
  for (const char* file : {"config.json", "model.safetensors", "tokenizer_config.json"})
    fs::copy_file(fixture / file, folder / file);
  fs::copy_file(fs::path(DEEPINFER_TOKENIZERS) / "qwen3" / "tokenizer.json",
                folder / "tokenizer.json");
}

LoopbackServer::LoopbackServer(const std::string& model_dir, ServeOptions options) {
  ops_ = make_cpu_ops();
  model_ = load_model(model_dir, LoadMode::kMmap, *ops_);
  EngineConfig engine;
  engine.block_size = 16;
  engine.kv_bytes = size_t{256} << 20;
  options.http.host = "127.0.0.1";
  options.http.port = 0;
  if (options.api_key.empty()) options.api_key = "sk-test";
  server_ = std::make_unique<ApiServer>(*model_, model_dir, engine, options);
  thread_ = std::thread([this] { server_->run(); });
}

LoopbackServer::~LoopbackServer() {
  server_->stop();
  thread_.join();
  server_.reset();
}

double LoopbackServer::metric(const std::string& name) const {
  std::string text = call(port(), "GET", "/metrics").body;
  size_t at = text.find("\n" + name + "{");
  if (at == std::string::npos) return -1;
  size_t space = text.find("} ", at);
  return std::stod(text.substr(space + 2, text.find('\n', space) - space - 2));
}

bool LoopbackServer::settles() const {
  for (int i = 0; i < 500; ++i) {
    if (metric("deepinfer:requests_in_flight") == 0 &&
        metric("deepinfer:kv_cache_blocks_used") == 0 && metric("vllm:num_requests_running") == 0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace deepinfer::server::testing
