// Raw bytes from a client, as the HTTP server reads them: request lines, headers,
// Content-Length and chunked bodies, pipelining, half-sent requests. A server on loopback in
// this process answers each input's connection; the input is sent, the client's half is
// closed, and the server must answer and close within a bound. Paths starting /stream get a
// streamed answer, others one whole response.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <thread>

#include "fuzz/fuzz_support.h"
#include "server/http_server.h"

namespace {

using namespace deepinfer::server;

void answer(HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
  if (request.path.rfind("/stream", 0) == 0) {
    writer->start_stream(200, "text/event-stream");
    writer->write("data: " + std::to_string(request.body.size()) + "\n\n");
    writer->end_stream();
    return;
  }
  writer->send(200, "application/json", "{\"bytes\":" + std::to_string(request.body.size()) + "}");
}

uint16_t server_port() {
  static HttpServer* server = [] {
    HttpServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.io_threads = 1;
    options.max_body_bytes = 4096;  // small, so 413 is reachable
    options.max_header_bytes = 8192;
    auto* started = new HttpServer(options, answer);
    std::thread([started] { started->run(); }).detach();
    return started;
  }();
  return server->port();
}

int connect_loopback(uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // A signal or a moment without free local ports is not the server's fault: try again with a
  // fresh socket.
  int fd = -1;
  for (int attempt = 0;; ++attempt) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) std::abort();
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) break;
    int error = errno;
    close(fd);
    if ((error != EINTR && error != EADDRNOTAVAIL && error != EAGAIN) || attempt == 100) {
      std::fprintf(stderr, "cannot connect to the server (errno %d)\n", error);
      std::abort();
    }
    usleep(10000);
  }
  // Closing with a reset leaves no TIME_WAIT behind, so a long run keeps its local ports.
  linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  timeval limit{5, 0};  // the server must have answered and closed by then
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = connect_loopback(server_port());
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;  // libFuzzer's own timers interrupt calls
    if (n <= 0) break;                      // the server may close early (a refused request)
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string reply;
  char buffer[4096];
  while (true) {
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) break;
      std::fprintf(stderr, "the server neither answered nor closed (errno %d)\n", errno);
      std::abort();
    }
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  // Whatever came back is HTTP: a status line first.
  if (!reply.empty() && reply.rfind("HTTP/1.", 0) != 0) {
    std::fprintf(stderr, "not an HTTP answer: %.80s\n", reply.c_str());
    std::abort();
  }
  return 0;
}
