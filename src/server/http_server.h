// An event-driven HTTP/1.1 server (Boost.Beast over Asio): a few I/O threads serve any number
// of open connections and streams. Handlers run on an I/O thread and must not block: work
// that takes long (generation) answers later through the ResponseWriter, from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>  // Asio 1.74 headers use std::exchange without including it

namespace deepinfer::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ... (HEAD is answered as GET)
  std::string path;                            // target without the query string
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  std::string header(const std::string& name) const;
};

// How a handler answers: one complete response, or a stream of chunks (server-sent events).
// Every method may be called from any thread; calls after the connection closed are ignored.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual void send(int status, const std::string& content_type, std::string body) = 0;
  virtual void start_stream(int status, const std::string& content_type) = 0;
  virtual void write(std::string chunk) = 0;
  virtual void end_stream() = 0;
  // Called once (on an I/O thread) when the client goes away before the answer ended.
  virtual void on_disconnect(std::function<void()> callback) = 0;
};

using Handler = std::function<void(HttpRequest, std::shared_ptr<ResponseWriter>)>;

// The JSON error body for a request the server answers before any handler sees it
// (malformed framing 400, headers too large 431, body too large 413), shaped for the route
// it was sent to.
using ErrorBody =
    std::function<std::string(int status, const std::string& message, const std::string& path)>;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port())
  int io_threads = 2;
  size_t max_body_bytes = size_t{32} << 20;    // larger requests get 413
  size_t max_header_bytes = size_t{64} << 10;  // larger request heads get 431
  double drain_seconds = 60.0;                 // stop() waits this long for answers in progress
  ErrorBody error_body;                        // none: a plain OpenAI-shaped body
  // Called once on an I/O thread when the drain's time is up with answers still open; those
  // answers then get a few more seconds to send what it makes them send (their error and
  // terminator) before the server stops.
  std::function<void()> on_drain_deadline;
};

class HttpServer {
 public:
  // Binds and starts listening; throws Error when the address is unusable.
  HttpServer(const HttpServerOptions& options, Handler handler);
  ~HttpServer();
  uint16_t port() const;
  // Serves until stop() (from any thread, e.g. a signal handler's watcher).
  void run();
  // Stops accepting, lets answers in progress finish (for drain_seconds, then
  // on_drain_deadline ends them), then returns from run().
  void stop();
  // Runs `work` on an I/O thread (handlers' follow-up work, e.g. reading engine results).
  void post(std::function<void()> work);

  struct State;  // defined with the connections that share it

 private:
  std::unique_ptr<State> state_;
};

}  // namespace deepinfer::server
