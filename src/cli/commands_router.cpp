// router: one address in front of several `deepinfer serve` workers of the same model.
#include <fmt/format.h>

#include "cli/commands.h"
#include "router/router_server.h"

namespace deepinfer::cli {
namespace {

struct RouterArgs {
  router::RouterOptions router;
  int port = 8000;
};

void run_router(RouterArgs& args) {
  const sigset_t signals = block_stop_signals();
  args.router.http.port = static_cast<uint16_t>(args.port);
  router::RouterServer server(args.router);
  fmt::print(stderr, "deepinfer: routing to {} workers on http://{}:{}\n",
             args.router.workers.size(), args.router.http.host, server.port());
  run_until_signal(
      signals, [&] { server.run(); }, [&] { server.stop(); });
}

}  // namespace

void add_router_command(CLI::App& app) {
  auto args = std::make_shared<RouterArgs>();
  CLI::App* command = app.add_subcommand(
      "router",
      "Serve the same APIs as serve in front of several workers, routing each request to the "
      "one with the least estimated time to its first token (queued prompt work, and the "
      "prompt's part its prefix cache is not expected to hold)");
  auto option = [&](const char* flag, auto& value, const char* help, const char* env) {
    return command->add_option(flag, value, help)->envname(env)->capture_default_str();
  };
  option("--worker-urls", args->router.workers,
         "Workers (deepinfer serve of one model), each as http://HOST:PORT",
         "DEEPINFER_WORKER_URLS")
      ->required()
      ->delimiter(',');
  option("--host", args->router.http.host, "Address to listen on", "DEEPINFER_HOST");
  option("--port", args->port, "Port to listen on (0: any free port)", "DEEPINFER_PORT")
      ->check(CLI::Range(0, 65535));
  option("--api-key", args->router.api_key,
         "Require this key of clients (Authorization: Bearer or x-api-key); it is passed on "
         "to the workers as sent",
         "DEEPINFER_API_KEY");
  option("--forward-threads", args->router.forward_threads,
         "Requests passed through to workers at once (more wait for a thread)",
         "DEEPINFER_FORWARD_THREADS")
      ->check(CLI::Range(1, 4096));
  option("--health-check-interval", args->router.health_period_seconds,
         "Seconds between health checks of each worker (a failed worker is checked again "
         "after a back-off)",
         "DEEPINFER_HEALTH_CHECK_INTERVAL")
      ->check(CLI::Range(0.05, 3600.0));
  command->callback([args] { run_router(*args); });
}

}  // namespace deepinfer::cli
