// The prefix cache's lower tiers on the command line: --kv-cache-dir and its capacity,
// retention classes and bounded replay, shared by serve, generate and bench-engine.
#include <cctype>
#include <charconv>
#include <filesystem>
#include <limits>

#include "cli/commands.h"
#include "core/error.h"
#include "kv/block_file.h"
#include "model/safetensors.h"

namespace deepinfer::cli {

uint32_t parse_duration_seconds(std::string_view text, const std::string& flag) {
  uint64_t count = 0;
  const char* end = text.data() + text.size();
  auto [rest, error] = std::from_chars(text.data(), end, count);
  const std::string_view unit(rest, static_cast<size_t>(end - rest));
  uint64_t scale = unit.empty() || unit == "s" ? 1
                   : unit == "m"               ? 60
                   : unit == "h"               ? 3600
                   : unit == "d"               ? 86400
                                               : 0;
  if (error != std::errc() || rest == text.data() || scale == 0)
    fail("{}: '{}' is not a duration (a whole number with s, m, h or d)", flag, text);
  if (count > std::numeric_limits<uint32_t>::max() / scale)
    fail("{}: '{}' is longer than {} days", flag, text,
         std::numeric_limits<uint32_t>::max() / 86400);
  return static_cast<uint32_t>(count * scale);
}

std::map<std::string, uint32_t> parse_retention_classes(const std::string& text) {
  const std::string flag = "--kv-retention-classes";
  std::map<std::string, uint32_t> classes;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string_view entry(text.data() + start, comma - start);
    size_t equals = entry.find('=');
    if (equals == std::string_view::npos || equals == 0)
      fail("{}: '{}' is not NAME=DURATION (for example agent=72h)", flag, entry);
    std::string name(entry.substr(0, equals));
    if (!classes.emplace(name, parse_duration_seconds(entry.substr(equals + 1), flag)).second)
      fail("{}: class '{}' is given twice", flag, name);
    start = comma + 1;
  }
  return classes;
}

int64_t parse_replay_tokens(const std::string& text) {
  if (text == "exact") return EngineConfig::kReplayExact;
  if (text == "default") return EngineConfig::kReplayDefault;
  int64_t tokens = 0;
  auto [rest, error] = std::from_chars(text.data(), text.data() + text.size(), tokens);
  if (error != std::errc() || rest != text.data() + text.size() || tokens < 0)
    fail("--swa-replay-tokens: '{}' is not a token count, exact or default", text);
  return tokens;
}

namespace {

// Help text after `prefix`; a sentence of its own (capitalised) when there is none.
std::string help_text(const std::string& prefix, std::string text) {
  if (prefix.empty())
    text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
  return prefix + text;
}

}  // namespace

std::vector<CLI::Option*> add_kv_tier_options(CLI::App& command, EngineConfig& engine,
                                              const std::string& prefix_text) {
  auto prefix = [&prefix_text](std::string text) {
    return help_text(prefix_text, std::move(text));
  };
  std::vector<CLI::Option*> options;
  options.push_back(command.add_option(
      "--kv-cache-dir", engine.kv_cache_dir,
      prefix("directory for the prefix cache's disk tier: blocks of finished requests are kept "
             "there and prompts find their prefix there after memory; several processes may "
             "share it (empty: no disk tier)")));
  options.push_back(
      command
          .add_option("--kv-disk-bytes", engine.kv_disk_bytes,
                      prefix("bytes this model's blocks may take in --kv-cache-dir; expired "
                             "blocks go first, then the least recently used (0: no bound)"))
          ->capture_default_str());
  options.push_back(
      command
          .add_option("--kv-host-bytes", engine.kv_host_bytes,
                      prefix("bytes of host memory for the prefix cache's tier between a GPU's "
                             "KV pool and the disk: blocks the pool lets go of are copied back "
                             "from there (0: none; the CPU backend's pool is host memory "
                             "already)"))
          ->capture_default_str());
  options.push_back(command.add_option_function<std::string>(
      "--kv-retention-classes",
      [&engine](const std::string& text) {
        engine.kv_retention_classes = parse_retention_classes(text);
      },
      prefix("retention classes of the disk tier as NAME=DURATION,... with s, m, h or d (for "
             "example agent=72h,chat=168h); a request picks one with cache_retention, and its "
             "blocks are deleted that long after their last use (none: kept until space runs "
             "out)")));
  options.push_back(command.add_option(
      "--kv-retention-default", engine.kv_retention_default,
      prefix("the class of requests that name none (one of --kv-retention-classes)")));
  options.push_back(command.add_option_function<std::string>(
      "--swa-replay-tokens",
      [&engine](const std::string& text) { engine.swa_replay_tokens = parse_replay_tokens(text); },
      prefix("models with sliding-window and full-attention layers: a prefix cached without its "
             "windows' KV recomputes its last N tokens through every layer, and the disk tier "
             "stores no window KV. N, exact (every sliding layer's window: the cold prefill's "
             "result), 0 (off: windows are stored) or default (the window + 12 with "
             "--kv-cache-dir or --kv-host-bytes, else off)")));
  return options;
}

void prepare_kv_cache_dir(EngineConfig& engine, const ModelOptions& options,
                          const CausalLM& model) {
  if (engine.kv_cache_dir.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(engine.kv_cache_dir, error);
  if (error || !std::filesystem::is_directory(engine.kv_cache_dir))
    fail("--kv-cache-dir: cannot use {} as a directory ({})", engine.kv_cache_dir,
         error ? error.message() : "not a directory");
  TensorStore store(options.model_dir, LoadMode::kMmap);
  std::vector<TensorDescription> tensors;
  for (const std::string& name : store.names()) {
    const Tensor& tensor = store.get(name);
    tensors.push_back(
        {name, std::string(dtype_name(tensor.dtype)),
         std::vector<int64_t>(tensor.shape.begin(), tensor.shape.begin() + tensor.rank)});
  }
  engine.kv_fingerprint =
      model_fingerprint(model.config().architecture, tensors, model.kv_shape(engine.block_size));
}

}  // namespace deepinfer::cli
