// The HTTP layer alone, with a handler that answers at once: connection lifetimes that do not
// need a model behind them.
#include "server/http_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "server/server_fixture.h"

namespace deepinfer::server {
namespace {

using testing::RawConnection;

// Two pipelined requests and a half-close: the client's end arrived while the first answer was
// being written, and the connection went on to read the second request after closing, opening
// an answer nothing could finish. Found by the HTTP framing fuzzer (a leaked connection);
// here it shows as stop() waiting out its whole drain for that answer.
TEST(HttpServer, AClientThatLeavesMidPipelineLeavesNoAnswerOpen) {
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.io_threads = 1;
  options.drain_seconds = 20;
  HttpServer server(options, [](HttpRequest request, std::shared_ptr<ResponseWriter> writer) {
    writer->send(200, "text/plain", request.path);
  });
  std::thread serving([&] { server.run(); });
  for (int i = 0; i < 20; ++i) {
    RawConnection client(server.port());
    client.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.0\r\n\r\n");
    client.shutdown_send();
    (void)client.read_until_closed(std::chrono::seconds(5));
  }
  auto start = std::chrono::steady_clock::now();
  server.stop();
  serving.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace deepinfer::server
