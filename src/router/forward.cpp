#include "router/forward.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <limits>
#include <regex>

namespace deepinfer::router {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

// Hop-by-hop and framing headers are the router's own to set on each side.
bool passes_through(const std::string& name) {
  return name != "host" && name != "connection" && name != "content-length" &&
         name != "transfer-encoding" && name != "keep-alive" && name != "upgrade";
}

http::request<http::string_body> outgoing(const WorkerAddress& worker,
                                          const server::HttpRequest& request) {
  http::request<http::string_body> out;
  out.method(http::string_to_verb(request.method));
  out.method_string(request.method);
  out.target(request.path);
  out.version(11);
  for (const auto& [name, value] : request.headers)
    if (passes_through(name)) out.set(name, value);
  out.set(http::field::host, worker.host + ":" + std::to_string(worker.port));
  out.keep_alive(false);
  out.body() = request.body;
  out.prepare_payload();
  return out;
}

struct Connection {
  boost::asio::io_context io;
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;

  beast::error_code connect(const WorkerAddress& worker, std::chrono::milliseconds timeout) {
    beast::error_code error;
    tcp::resolver resolver(io);
    const auto endpoints = resolver.resolve(worker.host, std::to_string(worker.port), error);
    if (error) return error;
    stream.expires_after(timeout);
    stream.connect(endpoints, error);
    return error;
  }
};

// Reads the next piece of the body into `piece`; false at its end or on `error`.
bool read_piece(Connection& connection, http::response_parser<http::buffer_body>& parser,
                std::string& piece, beast::error_code& error) {
  if (parser.is_done()) return false;
  char chunk[16384];
  parser.get().body().data = chunk;
  parser.get().body().size = sizeof(chunk);
  http::read(connection.stream, connection.buffer, parser, error);
  if (error == http::error::need_buffer) error = {};
  if (error) return false;
  piece.assign(chunk, sizeof(chunk) - parser.get().body().size);
  return true;
}

}  // namespace

std::optional<WorkerAddress> parse_worker_url(const std::string& url) {
  static const std::regex pattern(R"(http://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})/?)");
  std::smatch match;
  if (!std::regex_match(url, match, pattern)) return std::nullopt;
  const int port = std::stoi(match[2].str());
  if (port < 1 || port > 65535) return std::nullopt;
  std::string host = match[1].str();
  if (host.front() == '[') host = host.substr(1, host.size() - 2);
  return WorkerAddress{host, static_cast<uint16_t>(port)};
}

ForwardResult forward(const WorkerAddress& worker, const server::HttpRequest& request,
                      server::ResponseWriter& writer, const std::atomic<bool>& client_gone,
                      const ForwardTimeouts& timeouts) {
  Connection connection;
  ForwardResult result;
  beast::error_code error = connection.connect(worker, timeouts.connect);
  auto failed = [&](ForwardResult::Outcome outcome, const std::string& what) {
    result.outcome = outcome;
    result.error = what + ": " + error.message();
    return result;
  };
  if (error) return failed(ForwardResult::Outcome::kUnreachable, "connect");
  connection.stream.expires_after(timeouts.idle);
  http::request<http::string_body> out = outgoing(worker, request);
  http::write(connection.stream, out, error);
  if (error) return failed(ForwardResult::Outcome::kUnreachable, "send");
  http::response_parser<http::buffer_body> parser;
  // No limit, given as the largest one: Boost 1.74 refuses every sized body under boost::none.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read_header(connection.stream, connection.buffer, parser, error);
  if (error) return failed(ForwardResult::Outcome::kUnreachable, "answer");
  result.status = static_cast<int>(parser.get().result_int());
  const std::string content_type(parser.get()[http::field::content_type]);
  std::string piece;
  if (!parser.get().chunked() && content_type.rfind("text/event-stream", 0) != 0) {
    std::string body;
    while (read_piece(connection, parser, piece, error)) body += piece;
    if (error) return failed(ForwardResult::Outcome::kUnreachable, "answer body");
    writer.send(result.status, content_type, std::move(body));
    result.outcome = ForwardResult::Outcome::kAnswered;
    return result;
  }
  // Events pass on whole: a worker that fails mid-event leaves no half event before the
  // error event the caller then sends.
  writer.start_stream(result.status, content_type);
  std::string pending;
  while (!client_gone.load() && read_piece(connection, parser, piece, error)) {
    connection.stream.expires_after(timeouts.idle);
    pending += piece;
    const size_t end = pending.rfind("\n\n");
    if (end == std::string::npos) continue;
    writer.write(pending.substr(0, end + 2));
    pending.erase(0, end + 2);
  }
  if (error) return failed(ForwardResult::Outcome::kCutOff, "stream");
  if (!pending.empty()) writer.write(std::move(pending));
  writer.end_stream();
  result.outcome = ForwardResult::Outcome::kAnswered;
  return result;
}

std::pair<int, std::string> get(const WorkerAddress& worker, const std::string& path,
                                std::chrono::milliseconds timeout) {
  Connection connection;
  if (connection.connect(worker, timeout)) return {0, ""};
  connection.stream.expires_after(timeout);
  server::HttpRequest request;
  request.method = "GET";
  request.path = path;
  http::request<http::string_body> out = outgoing(worker, request);
  beast::error_code error;
  http::write(connection.stream, out, error);
  http::response<http::string_body> answer;
  if (!error) http::read(connection.stream, connection.buffer, answer, error);
  if (error) return {0, ""};
  return {static_cast<int>(answer.result_int()), std::move(answer.body())};
}

}  // namespace deepinfer::router
