// --kv-cache-dir across processes: one process's prefix blocks serve the next one, and a
// process killed while it writes blocks leaves nothing that is ever served wrong.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/test_support.h"

extern char** environ;

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::run_command;
using testing::TempDir;

const std::string kBinary = DEEPINFER_BINARY;

// Requests of `count` prompts of `length` ids, greedy, `max_tokens` each.
void write_requests(const std::filesystem::path& file, int count, int length, int max_tokens) {
  std::ofstream out(file);
  for (int r = 0; r < count; ++r) {
    nlohmann::json ids = nlohmann::json::array();
    for (int i = 0; i < length; ++i) ids.push_back((i * 29 + r * 71 + 2) % 250);
    out << nlohmann::json{{"id", std::to_string(r)},
                          {"prompt_token_ids", ids},
                          {"max_tokens", max_tokens},
                          {"temperature", 0},
                          {"ignore_eos", true}}
               .dump()
        << "\n";
  }
}

std::map<std::string, nlohmann::json> read_results(const std::filesystem::path& file) {
  std::map<std::string, nlohmann::json> results;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json result = nlohmann::json::parse(line);
    results[result["id"].get<std::string>()] = result;
  }
  return results;
}

std::string generate(const std::filesystem::path& input, const std::filesystem::path& output,
                     const std::string& flags) {
  return fmt::format("{} generate {} --input {} --output {} --block-size 4 {}", kBinary,
                     fixture_model("llama-gqa").string(), input.string(), output.string(), flags);
}

TEST(CliKvCacheDir, TheNextProcessTakesThePrefixFromDisk) {
  TempDir dir;
  write_requests(dir.path() / "in.jsonl", 1, 40, 4);
  std::string flags = "--kv-cache-dir " + (dir.path() / "kv").string();
  for (const char* run : {"first", "second"}) {
    auto status = run_command(generate(dir.path() / "in.jsonl", dir.path() / run, flags));
    ASSERT_EQ(status.status, 0) << status.output;
  }
  nlohmann::json first = read_results(dir.path() / "first").at("0");
  nlohmann::json second = read_results(dir.path() / "second").at("0");
  EXPECT_EQ(first["usage"]["cached_tokens"], 0);
  EXPECT_EQ(second["usage"]["cached_tokens"], 36);
  EXPECT_EQ(second["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
  // An unusable directory is a clear error.
  std::ofstream(dir.path() / "file") << "x";
  auto bad = run_command(generate(dir.path() / "in.jsonl", dir.path() / "out",
                                  "--kv-cache-dir " + (dir.path() / "file").string()));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--kv-cache-dir"), std::string::npos) << bad.output;
}

// Starts `command` (through the shell), kills it with SIGKILL once `ready` holds (or after
// 60 s), and waits for it.
void kill_when(const std::string& command, const std::function<bool()>& ready) {
  pid_t pid = 0;
  std::string script = "exec " + command + " >/dev/null 2>&1";
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!ready() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

int64_t files_under(const std::filesystem::path& dir) {
  std::error_code error;
  int64_t files = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error))
    files += it->is_regular_file(error) ? 1 : 0;
  return files;
}

TEST(CliKvCacheDir, AWriterKilledMidRunLeavesOnlyWholeBlocks) {
  TempDir dir;
  write_requests(dir.path() / "in.jsonl", 64, 60, 24);
  auto cold = run_command(generate(dir.path() / "in.jsonl", dir.path() / "cold", ""));
  ASSERT_EQ(cold.status, 0) << cold.output;
  const std::filesystem::path kv = dir.path() / "kv";
  std::string flags = "--max-running 4 --kv-cache-dir " + kv.string();
  kill_when(generate(dir.path() / "in.jsonl", dir.path() / "killed", flags),
            [&] { return files_under(kv) >= 20; });
  EXPECT_GE(files_under(kv), 1);
  auto restarted = run_command(generate(dir.path() / "in.jsonl", dir.path() / "after", flags));
  ASSERT_EQ(restarted.status, 0) << restarted.output;
  std::map<std::string, nlohmann::json> want = read_results(dir.path() / "cold");
  std::map<std::string, nlohmann::json> got = read_results(dir.path() / "after");
  ASSERT_EQ(got.size(), want.size());
  int64_t cached = 0;
  for (auto& [id, result] : want) {
    EXPECT_EQ(got.at(id)["choices"][0]["token_ids"], result["choices"][0]["token_ids"]) << id;
    cached += got.at(id)["usage"]["cached_tokens"].get<int64_t>();
  }
  EXPECT_GT(cached, 0);  // the killed run's blocks were reused
}

}  // namespace
}  // namespace deepinfer
