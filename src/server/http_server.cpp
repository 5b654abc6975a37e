#include "server/http_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string HttpRequest::header(const std::string& name) const {
  auto found = headers.find(name);
  return found == headers.end() ? std::string() : found->second;
}

struct HttpServer::State {
  HttpServerOptions options;
  Handler handler;
  net::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
  std::atomic<int64_t> open_answers{0};
  std::atomic<bool> stopping{false};
  std::shared_ptr<std::function<void()>> drain_poll;
};

namespace {

// Bytes a client may send after a request while its answer is pending: pipelined requests
// are kept for their turn up to this; past it they are read and dropped (so a client that goes
// away is still noticed) and the connection closes after the answer.
constexpr size_t kMaxPipelinedBytes = size_t{1} << 20;

// After the drain's deadline, how long answers being cut short have to send their end.
constexpr std::chrono::seconds kDrainGrace{5};

bool is_http_error(const beast::error_code& error) {
  return &error.category() == &http::make_error_code(http::error::end_of_stream).category();
}

// Raw HTTP/1.1 framing for what we send: a status line and headers, then either a sized body
// or chunks. Beast parses what clients send; our side needs no more than this.
std::string status_head(int status, const std::string& content_type, bool keep_alive) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nConnection: {}\r\n", status,
                     std::string(http::obsolete_reason(static_cast<http::status>(status))),
                     content_type, keep_alive ? "keep-alive" : "close");
}

std::string chunk(const std::string& data) {
  return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpServer::State& state)
      : stream_(std::move(socket)), strand_(stream_.get_executor()), state_(state) {}

  void start() { read_request(); }

  // ResponseWriter calls land here, always on the strand.
  void send(int status, const std::string& content_type, std::string body) {
    if (answered_ || closed_) return;
    answered_ = true;
    std::string message = status_head(status, content_type, keep_alive_) +
                          fmt::format("Content-Length: {}\r\n\r\n", body.size());
    if (!head_only_) message += body;  // HEAD: the headers GET would send, no body
    finish_answer_after(std::move(message));
  }
  void start_stream(int status, const std::string& content_type) {
    if (answered_ || closed_) return;
    answered_ = true;
    streaming_ = true;
    // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
    if (!http11_) keep_alive_ = false;
    enqueue(status_head(status, content_type, keep_alive_) + "Cache-Control: no-cache\r\n" +
            (http11_ ? "Transfer-Encoding: chunked\r\n\r\n" : "\r\n"));
  }
  void write(std::string data) {
    if (!streaming_ || closed_ || data.empty()) return;
    enqueue(http11_ ? chunk(data) : std::move(data));
  }
  void end_stream() {
    if (!streaming_ || closed_) return;
    streaming_ = false;
    finish_answer_after(http11_ ? "0\r\n\r\n" : "");
  }
  void on_disconnect(std::function<void()> callback) {
    if (closed_) {
      if (callback) callback();
      return;
    }
    disconnect_ = std::move(callback);
  }
  net::strand<net::any_io_executor>& strand() { return strand_; }

 private:
  void read_request() {
    parser_.emplace();
    parser_->body_limit(state_.options.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(state_.options.max_header_bytes));
    stream_.expires_after(std::chrono::seconds(300));  // idle keep-alive connections close
    http::async_read(
        stream_, buffer_, *parser_,
        net::bind_executor(strand_, [self = shared_from_this()](beast::error_code error, size_t) {
          self->on_request(error);
        }));
  }

  void on_request(beast::error_code error) {
    stream_.expires_never();
    if (closed_) return;
    if (error) return refuse_request(error);
    http::request<http::string_body> message = parser_->release();
    HttpRequest request;
    head_only_ = message.method() == http::verb::head;
    http11_ = message.version() >= 11;
    request.method = head_only_ ? "GET" : std::string(message.method_string());
    std::string target(message.target());
    request.path = target.substr(0, target.find('?'));
    for (const auto& field : message) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      request.headers[name] = std::string(field.value());
    }
    request.body = std::move(message.body());
    keep_alive_ = message.keep_alive() && !state_.stopping;
    answered_ = false;
    open_answer();
    watch_for_disconnect();
    state_.handler(std::move(request), make_writer());
  }

  std::shared_ptr<ResponseWriter> make_writer();

  // A request that could not be read. Framing the client broke gets its status (too large a
  // body 413, too large a head 431, anything else malformed 400) and the connection closes
  // after it; a client that went away mid-request just loses the connection.
  void refuse_request(const beast::error_code& error) {
    int status = 400;
    std::string message = fmt::format("malformed HTTP request: {}", error.message());
    if (error == http::error::body_limit) {
      status = 413;
      message =
          fmt::format("the request body is larger than {} bytes", state_.options.max_body_bytes);
    } else if (error == http::error::header_limit) {
      status = 431;
      message = fmt::format("the request's headers are larger than {} bytes",
                            state_.options.max_header_bytes);
    } else if (!is_http_error(error) || error == http::error::end_of_stream ||
               error == http::error::partial_message) {
      return close();
    }
    // The target is known once the request line was read (a body limit fails on its
    // Content-Length, before the head counts as done).
    std::string target(parser_->get().target());
    std::string path = target.substr(0, target.find('?'));
    keep_alive_ = false;
    answered_ = false;
    head_only_ = false;
    http11_ = true;
    open_answer();
    send(status, "application/json", error_body(status, message, path));
  }

  std::string error_body(int status, const std::string& message, const std::string& path) const {
    if (state_.options.error_body) return state_.options.error_body(status, message, path);
    nlohmann::json body = {{"error",
                            {{"message", message},
                             {"type", "invalid_request_error"},
                             {"param", nullptr},
                             {"code", status}}}};
    return json_text(body);
  }

  // While an answer is pending, a readable socket is the client closing it or sending more.
  // The read never blocks: readiness can be stale by the time it runs.
  void watch_for_disconnect() {
    uint64_t answer = answers_;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        net::bind_executor(strand_, [self = shared_from_this(), answer](beast::error_code error) {
          if (self->closed_ || !self->answer_open_ || self->answers_ != answer) return;
          if (error) return self->close();
          self->take_pending_bytes();
        }));
  }

  // What the client sent while its answer is pending: nothing yet (watch again), the end of
  // its stream (it went away), or more requests, kept for their turn (beast's next read parses
  // the buffer first) up to kMaxPipelinedBytes and dropped past it.
  void take_pending_bytes() {
    beast::error_code error;
    stream_.socket().non_blocking(true, error);
    auto space = buffer_.prepare(16 << 10);
    size_t bytes = stream_.socket().receive(space, 0, error);
    if (error == net::error::would_block) return watch_for_disconnect();
    if (error || bytes == 0) return close();
    if (!dropping_) buffer_.commit(bytes);
    if (buffer_.size() > kMaxPipelinedBytes) {
      dropping_ = true;
      keep_alive_ = false;
    }
    watch_for_disconnect();
  }

  void enqueue(std::string data) {
    outbox_.push_back(std::move(data));
    if (outbox_.size() == 1) write_next();
  }

  void write_next() {
    net::async_write(
        stream_, net::buffer(outbox_.front()),
        net::bind_executor(strand_, [self = shared_from_this()](beast::error_code error, size_t) {
          // A connection closed while this write was in flight (the client went away) ends
          // here: reading its next request would open an answer nothing can finish.
          if (error || self->closed_) return self->close();
          self->outbox_.pop_front();
          if (!self->outbox_.empty()) return self->write_next();
          if (self->answer_done_) self->after_answer();
        }));
  }

  void finish_answer_after(std::string data) {
    answer_done_ = true;
    enqueue(std::move(data));
  }

  // The server drains by waiting for open answers to reach zero. While an answer is open the
  // connection keeps itself alive: the writer handed to the handler holds it weakly, and no
  // socket operation may be pending (a client that sent nothing more).
  void open_answer() {
    answer_open_ = true;
    ++answers_;
    ++state_.open_answers;
    self_ = shared_from_this();
  }
  void close_answer() {
    if (std::exchange(answer_open_, false)) --state_.open_answers;
  }

  // Called from a handler that holds a reference, so dropping self_ never destroys `this`
  // under its own feet.
  void after_answer() {
    answer_done_ = false;
    disconnect_ = nullptr;
    close_answer();
    if (!keep_alive_ || state_.stopping) {  // a draining server takes no next request
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      closed_ = true;
    } else {
      read_request();
    }
    self_.reset();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    close_answer();
    beast::error_code ignored;
    stream_.socket().close(ignored);
    if (auto callback = std::exchange(disconnect_, nullptr)) callback();
    self_.reset();
  }

  beast::tcp_stream stream_;
  net::strand<net::any_io_executor> strand_;
  HttpServer::State& state_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> outbox_;
  std::function<void()> disconnect_;
  std::shared_ptr<Connection> self_;  // set while an answer is open
  bool keep_alive_ = true;
  bool head_only_ = false;    // a HEAD request: no body in the answer
  bool http11_ = true;        // HTTP/1.1 or later: chunked streams, keep-alive
  bool dropping_ = false;     // pipelined bytes past kMaxPipelinedBytes are dropped
  bool answered_ = false;     // the handler has started its answer
  bool streaming_ = false;    // headers of a stream sent, end not yet
  bool answer_done_ = false;  // the answer's last bytes are queued
  bool answer_open_ = false;  // a request was read and its answer has not been fully sent
  uint64_t answers_ = 0;      // requests read on this connection
  bool closed_ = false;
};

// Hands every call to the connection's strand; harmless after the connection is gone.
class StrandWriter final : public ResponseWriter {
 public:
  explicit StrandWriter(const std::shared_ptr<Connection>& connection)
      : connection_(connection), strand_(connection->strand()) {}

  void send(int status, const std::string& content_type, std::string body) override {
    post([=, body = std::move(body)](Connection& c) mutable {
      c.send(status, content_type, std::move(body));
    });
  }
  void start_stream(int status, const std::string& content_type) override {
    post([=](Connection& c) { c.start_stream(status, content_type); });
  }
  void write(std::string data) override {
    post([data = std::move(data)](Connection& c) mutable { c.write(std::move(data)); });
  }
  void end_stream() override {
    post([](Connection& c) { c.end_stream(); });
  }
  void on_disconnect(std::function<void()> callback) override {
    post([callback = std::move(callback)](Connection& c) mutable {
      c.on_disconnect(std::move(callback));
    });
  }

 private:
  template <typename Action>
  void post(Action action) {
    net::post(strand_, [weak = connection_, action = std::move(action)]() mutable {
      if (auto connection = weak.lock()) action(*connection);
    });
  }
  std::weak_ptr<Connection> connection_;
  net::strand<net::any_io_executor> strand_;
};

std::shared_ptr<ResponseWriter> Connection::make_writer() {
  return std::make_shared<StrandWriter>(shared_from_this());
}

void accept_next(HttpServer::State& state) {
  state.acceptor.async_accept(net::make_strand(state.io),
                              [&state](beast::error_code error, tcp::socket socket) {
                                if (error) {
                                  if (error == net::error::operation_aborted) return;
                                } else {
                                  std::make_shared<Connection>(std::move(socket), state)->start();
                                }
                                accept_next(state);
                              });
}

}  // namespace

HttpServer::HttpServer(const HttpServerOptions& options, Handler handler)
    : state_(std::make_unique<State>()) {
  state_->options = options;
  state_->handler = std::move(handler);
  beast::error_code error;
  auto address = net::ip::make_address(options.host, error);
  if (error) fail("--host: \"{}\" is not an IP address", options.host);
  tcp::endpoint endpoint(address, options.port);
  state_->acceptor.open(endpoint.protocol(), error);
  if (!error) state_->acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) state_->acceptor.bind(endpoint, error);
  if (!error) state_->acceptor.listen(net::socket_base::max_listen_connections, error);
  if (error) fail("cannot listen on {}:{}: {}", options.host, options.port, error.message());
  accept_next(*state_);
}

HttpServer::~HttpServer() {
  stop();
  for (std::thread& thread : state_->threads)
    if (thread.joinable()) thread.join();
}

void HttpServer::post(std::function<void()> work) {
  net::post(state_->io, std::move(work));
}

uint16_t HttpServer::port() const {
  return state_->acceptor.local_endpoint().port();
}

void HttpServer::run() {
  for (int i = 1; i < std::max(1, state_->options.io_threads); ++i)
    state_->threads.emplace_back([this] { state_->io.run(); });
  state_->io.run();
  for (std::thread& thread : state_->threads)
    if (thread.joinable()) thread.join();
}

// Stops accepting, lets answers in progress finish (draining) until drain_seconds, has the
// ones still open ended (on_drain_deadline) within a grace, then ends run().
void HttpServer::stop() {
  if (state_->stopping.exchange(true)) return;
  net::post(state_->io, [this] {
    beast::error_code ignored;
    state_->acceptor.close(ignored);
    auto timer = std::make_shared<net::steady_timer>(state_->io);
    auto poll = std::make_shared<std::function<void()>>();
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(state_->options.drain_seconds));
    *poll = [this, timer, deadline, cut_short = false,
             weak = std::weak_ptr<std::function<void()>>(poll)]() mutable {
      auto now = std::chrono::steady_clock::now();
      if (state_->open_answers <= 0) return state_->io.stop();
      if (now > deadline) {
        // Answers still open end with their error (sent by the callback) within a grace.
        if (cut_short || !state_->options.on_drain_deadline) return state_->io.stop();
        cut_short = true;
        deadline = now + kDrainGrace;
        state_->options.on_drain_deadline();
      }
      timer->expires_after(std::chrono::milliseconds(20));
      timer->async_wait([weak](beast::error_code) {
        if (auto next = weak.lock()) (*next)();
      });
    };
    (*poll)();
    state_->drain_poll = poll;
  });
}

}  // namespace deepinfer::server
