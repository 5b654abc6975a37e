// A soak of a running `deepinfer serve` on loopback: many concurrent streaming clients for a
// while, some leaving mid-stream, then the server's resources measured against where they
// started; optionally a SIGTERM under load, with every stream in progress expected to finish.
//
//   soak --port 8000 --pid PID --clients 1000 --seconds 300 --leave-rate 0.2 [--sigterm]
//
// Prints one line per phase and exits non-zero when a client saw an error, when requests or
// KV blocks are still held afterwards, or when descriptors did not come back.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  uint16_t port = 8000;
  int pid = 0;
  int clients = 1000;
  double seconds = 300;
  double leave_rate = 0.2;
  int max_tokens = 64;
  std::string api_key;
  bool sigterm = false;
};

// A blocking loopback connection; -1 when the server refused it.
int connect_to(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  timeval limit{120, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  return fd;
}

bool send_all(int fd, const std::string& data) {
  for (size_t sent = 0; sent < data.size();) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string http_post(const Options& options, const std::string& path, const std::string& body) {
  std::string auth =
      options.api_key.empty() ? "" : fmt::format("Authorization: Bearer {}\r\n", options.api_key);
  return fmt::format(
      "POST {} HTTP/1.1\r\nHost: x\r\n{}Content-Type: application/json\r\nContent-Length: "
      "{}\r\nConnection: close\r\n\r\n{}",
      path, auth, body.size(), body);
}

// One GET's whole answer ("" when the server is gone).
std::string http_get(uint16_t port, const std::string& path) {
  int fd = connect_to(port);
  if (fd < 0) return "";
  std::string answer;
  if (send_all(fd, fmt::format("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path))) {
    char buffer[16384];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;)
      answer.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

double metric(const std::string& metrics, const std::string& name) {
  size_t at = metrics.find("\n" + name + "{");
  if (at == std::string::npos) return -1;
  size_t space = metrics.find("} ", at);
  return std::stod(metrics.substr(space + 2, metrics.find('\n', space) - space - 2));
}

struct Sample {
  double rss_mib = 0;
  int descriptors = 0;
  int threads = 0;
  double running = 0, waiting = 0, in_flight = 0, kv_blocks = 0;
};

Sample sample(const Options& options) {
  Sample s;
  std::ifstream status(fmt::format("/proc/{}/status", options.pid));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mib = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoi(line.substr(8));
  }
  std::error_code error;
  for (auto it =
           std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", options.pid), error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error))
    ++s.descriptors;
  std::string metrics = http_get(options.port, "/metrics");
  s.running = metric(metrics, "vllm:num_requests_running");
  s.waiting = metric(metrics, "vllm:num_requests_waiting");
  s.in_flight = metric(metrics, "deepinfer:requests_in_flight");
  s.kv_blocks = metric(metrics, "deepinfer:kv_cache_blocks_used");
  return s;
}

void print_sample(const char* phase, const Sample& s) {
  fmt::print(
      "{:<9} rss {:7.1f} MiB  fds {:5}  threads {:4}  running {:4}  waiting {:4}  "
      "in_flight {:4}  kv_blocks {:5}\n",
      phase, s.rss_mib, s.descriptors, s.threads, s.running, s.waiting, s.in_flight, s.kv_blocks);
  std::fflush(stdout);
}

struct Tally {
  // ended whole, left by the client on purpose, ended by the server's shutdown with a 503 the
  // client could read, anything else
  std::atomic<int64_t> finished{0}, left{0}, cut_short{0}, errors{0}, bytes{0};
};

// The four APIs: a request's fixed part, its length field, and the text its last event holds.
struct Api {
  const char* path;
  const char* body;
  const char* length_field;
  const char* terminator;
};
constexpr Api kApis[] = {
    {"/v1/chat/completions", R"("messages":[{"role":"user","content":"Write a loop"}])",
     "max_tokens", "data: [DONE]"},
    {"/v1/completions", R"("prompt":"def fib(n):")", "max_tokens", "data: [DONE]"},
    {"/v1/messages", R"("messages":[{"role":"user","content":"Sort a list"}])", "max_tokens",
     "event: message_stop"},
    {"/v1/responses", R"("input":"Parse JSON")", "max_output_tokens", "response.completed"},
};

// A streamed request of one of the four APIs, and the text its last event carries.
std::pair<std::string, std::string> streamed_request(const Options& options, std::mt19937_64& rng,
                                                     bool endless) {
  int max_tokens = 1 + static_cast<int>(rng() % static_cast<uint64_t>(options.max_tokens));
  if (endless) max_tokens = 200;
  const Api& api = kApis[rng() % std::size(kApis)];
  std::string body = fmt::format(R"({{{},"{}":{},"stream":true{}}})", api.body, api.length_field,
                                 max_tokens, endless ? R"(,"ignore_eos":true)" : "");
  return {http_post(options, api.path, body), api.terminator};
}

// One streamed exchange: true when it ended as it should (whole, or left on purpose).
bool stream_once(const Options& options, std::mt19937_64& rng, Tally& tally, bool endless,
                 bool may_leave) {
  auto [request, terminator] = streamed_request(options, rng, endless);
  bool leave = may_leave && std::bernoulli_distribution(options.leave_rate)(rng);
  size_t leave_after = 1 + rng() % 4000;
  int fd = connect_to(options.port);
  if (fd < 0 || !send_all(fd, request)) {
    if (fd >= 0) close(fd);
    ++tally.errors;
    return false;
  }
  std::string answer;
  char buffer[8192];
  bool ok = false;
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) {
    answer.append(buffer, static_cast<size_t>(n));
    if (leave && answer.size() >= leave_after) break;
  }
  close(fd);
  tally.bytes += static_cast<int64_t>(answer.size());
  if (leave && answer.size() >= leave_after) {
    ++tally.left;
    return true;
  }
  bool whole_stream = answer.size() >= 5 && answer.compare(answer.size() - 5, 5, "0\r\n\r\n") == 0;
  bool shutdown = answer.find("shut down before this request finished") != std::string::npos ||
                  answer.find("the server is shutting down") != std::string::npos;
  if (shutdown && (whole_stream || answer.rfind("HTTP/1.1 503", 0) == 0)) {
    ++tally.cut_short;
    return true;
  }
  ok = answer.rfind("HTTP/1.1 200", 0) == 0 && answer.find(terminator) != std::string::npos;
  ++(ok ? tally.finished : tally.errors);
  return ok;
}

// `clients` threads streaming until `deadline`; samples the server every few seconds.
void run_clients(const Options& options, Clock::time_point deadline, Tally& tally, Sample& peak) {
  std::vector<std::thread> threads;
  for (int i = 0; i < options.clients; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(static_cast<uint64_t>(i) * 7919 + 1);
      while (Clock::now() < deadline) stream_once(options, rng, tally, false, true);
    });
  }
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    Sample now = sample(options);
    if (now.rss_mib > peak.rss_mib) peak = now;
    fmt::print("  ... finished {} left {} errors {}  ", tally.finished.load(), tally.left.load(),
               tally.errors.load());
    print_sample("during", now);
  }
  for (std::thread& thread : threads) thread.join();
}

Sample settled(const Options& options) {
  Sample s;
  for (int i = 0; i < 600; ++i) {
    s = sample(options);
    if (s.running == 0 && s.waiting == 0 && s.in_flight == 0 && s.kv_blocks == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // closed sockets reach the server
  return sample(options);
}

// SIGTERM with `clients` long streams in progress: each must end whole, or, when the server's
// --shutdown-timeout passes first, with the 503 error its client can read; and the server must
// exit.
int drain_under_load(const Options& options) {
  Tally tally;
  std::vector<std::thread> threads;
  for (int i = 0; i < options.clients; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(static_cast<uint64_t>(i) + 104729);
      stream_once(options, rng, tally, true, false);
    });
  }
  for (int i = 0; i < 200 && sample(options).running < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  Sample before = sample(options);
  auto start = Clock::now();
  kill(options.pid, SIGTERM);
  for (std::thread& thread : threads) thread.join();
  while (kill(options.pid, 0) == 0 && Clock::now() - start < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  bool exited = kill(options.pid, 0) != 0;
  fmt::print(
      "sigterm   with {} running and {} waiting: {} streams ended whole, {} ended by the "
      "shutdown deadline with a 503, {} errors; the server {} after {:.1f} s\n",
      before.running, before.waiting, tally.finished.load(), tally.cut_short.load(),
      tally.errors.load(), exited ? "exited" : "was still running", seconds);
  return tally.errors == 0 && exited ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app("Soaks a running deepinfer server with concurrent streaming clients");
  app.add_option("--port", options.port, "The server's port on 127.0.0.1");
  app.add_option("--pid", options.pid, "The server's process id (for RSS, descriptors, SIGTERM)")
      ->required();
  app.add_option("--clients", options.clients, "Concurrent streaming clients");
  app.add_option("--seconds", options.seconds, "How long the clients stream");
  app.add_option("--leave-rate", options.leave_rate,
                 "Share of requests whose client leaves mid-stream");
  app.add_option("--max-tokens", options.max_tokens, "Largest max_tokens a request asks for");
  app.add_option("--api-key", options.api_key, "Bearer key, when the server wants one");
  app.add_flag("--sigterm", options.sigterm,
               "Then SIGTERM the server under as many long streams and check they all end whole");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);

  Sample baseline = sample(options);
  print_sample("baseline", baseline);
  Tally tally;
  Sample peak = baseline;
  auto start = Clock::now();
  run_clients(options,
              start + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(options.seconds)),
              tally, peak);
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  print_sample("peak", peak);
  Sample after = settled(options);
  print_sample("after", after);
  fmt::print(
      "streams   {} clients for {:.0f} s: {} ended whole, {} left mid-stream, {} errors, "
      "{:.1f} MiB received\n",
      options.clients, seconds, tally.finished.load(), tally.left.load(), tally.errors.load(),
      static_cast<double>(tally.bytes.load()) / (1 << 20));
  bool back = after.running == 0 && after.waiting == 0 && after.in_flight == 0 &&
              after.kv_blocks == 0 && after.descriptors <= baseline.descriptors + 2;
  fmt::print("resources {} (descriptors {} -> {}, rss {:.1f} -> {:.1f} MiB)\n",
             back ? "back to baseline" : "NOT back to baseline", baseline.descriptors,
             after.descriptors, baseline.rss_mib, after.rss_mib);
  int status = tally.errors == 0 && back ? 0 : 1;
  if (options.sigterm) status |= drain_under_load(options);
  return status;
}
