// The routes beside generation: /tokenize, /detokenize and Prometheus /metrics.
#include <fmt/format.h>

#include "core/json.h"
#include "kv/block_file.h"
#include "protocol/openai.h"
#include "protocol/prompt.h"
#include "server/api_server.h"

namespace deepinfer::server {

using protocol::ApiError;
using protocol::Json;

void ApiServer::tokenize(const HttpRequest& request,
                         const std::shared_ptr<ResponseWriter>& writer) {
  Json body = protocol::parse_json_object(request.body);
  std::vector<int32_t> tokens;
  if (body.contains("messages")) {
    protocol::ChatCompletionRequest chat = protocol::parse_chat_completion(request.body);
    chat.chat.add_generation_prompt = protocol::bool_field(body, "add_generation_prompt", true);
    chat.chat.json_output = chat.params.json_output;
    tokens = chat_encoder_->encode(chat.chat).encoded.ids;
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    bool add_special = protocol::bool_field(body, "add_special_tokens", true);
    tokens =
        tokenizer_->encode(body["prompt"].get<std::string>(), EncodeMode::kSpecials, add_special);
  } else {
    throw ApiError(400, "give 'prompt' (a string) or 'messages'", "prompt");
  }
  Json answer = {{"count", tokens.size()}, {"max_model_len", max_model_len_}, {"tokens", tokens}};
  writer->send(200, "application/json", answer.dump());
}

void ApiServer::detokenize(const HttpRequest& request,
                           const std::shared_ptr<ResponseWriter>& writer) {
  Json body = protocol::parse_json_object(request.body);
  auto tokens = body.find("tokens");
  if (tokens == body.end()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids = protocol::read_token_ids(*tokens, "tokens");
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer_->vocab_size())
      throw ApiError(400, fmt::format("token id {} is outside the vocabulary", id), "tokens");
  }
  writer->send(200, "application/json",
               json_text(Json{{"prompt", tokenizer_->decode(ids, false)}}));
}

namespace {

// Prometheus text exposition; vLLM's metric names where one exists, so dashboards built for
// vLLM work unchanged.
class MetricsText {
 public:
  explicit MetricsText(std::string labels) : labels_(std::move(labels)) {}
  void value(const char* name, const char* type, const char* help, double value,
             const std::string& extra_labels = "") {
    header(name, type, help);
    text_ += fmt::format("{}{{{}{}}} {}\n", name, labels_, extra_labels, value);
  }
  void histogram(const char* name, const char* help, const LatencyHistogram& histogram) {
    header(name, "histogram", help);
    for (size_t i = 0; i < std::size(LatencyHistogram::kBounds); ++i) {
      text_ += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels_,
                           LatencyHistogram::kBounds[i], histogram.cumulative[i]);
    }
    text_ +=
        fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels_, histogram.cumulative.back());
    text_ += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels_, histogram.sum, name,
                         labels_, histogram.count);
  }
  const std::string& text() const { return text_; }

 private:
  void header(const char* name, const char* type, const char* help) {
    if (name == last_) return;
    last_ = name;
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  std::string labels_;
  std::string text_;
  std::string last_;
};

// The prefix cache's disk tier (--kv-cache-dir).
// Hits and lookups per tier: every block below the pool is looked up in host memory first,
// what it lacks on disk.
void lower_tier_metrics(MetricsText& metrics, const PrefixTierStats& tiers) {
  auto count = [&](const char* name, const char* help, double value,
                   const std::string& labels = "") {
    metrics.value(name, "counter", help, value, labels);
  };
  const int64_t disk_queried = tiers.queried_blocks - tiers.host_found_blocks;
  for (bool host : {true, false}) {
    if (!(host ? tiers.has_host : tiers.has_disk)) continue;
    const std::string tier = host ? ",tier=\"host\"" : ",tier=\"disk\"";
    count("deepinfer:prefix_cache_tier_queries_total", "Prompt blocks looked up, by tier.",
          static_cast<double>(host ? tiers.queried_blocks : disk_queried), tier);
    count("deepinfer:prefix_cache_tier_hits_total", "Prompt blocks found and loaded, by tier.",
          static_cast<double>(host ? tiers.host_found_blocks
                                   : tiers.found_blocks - tiers.host_found_blocks),
          tier);
  }
  metrics.histogram("deepinfer:kv_tier_load_seconds",
                    "Time to look up and read a prompt's blocks from the tiers below the pool.",
                    tiers.load_seconds);
  if (tiers.has_host) {
    metrics.value("deepinfer:kv_host_bytes", "gauge", "Block bytes the host-memory tier holds.",
                  static_cast<double>(tiers.host.bytes));
    count("deepinfer:kv_host_evictions_total", "Blocks the host-memory tier let go for space.",
          static_cast<double>(tiers.host.evicted));
  }
  if (!tiers.has_disk) return;
  count("deepinfer:kv_disk_bytes_read_total", "Block bytes read from the disk tier.",
        static_cast<double>(tiers.disk.bytes_read));
  count("deepinfer:kv_disk_bytes_written_total", "Block bytes written to the disk tier.",
        static_cast<double>(tiers.disk.bytes_written));
  count("deepinfer:kv_disk_dropped_writes_total", "Blocks not written: the write queue was full.",
        static_cast<double>(tiers.disk.dropped_writes));
  count("deepinfer:kv_disk_write_failures_total", "Blocks the disk refused (full, unwritable).",
        static_cast<double>(tiers.disk.write_failures));
  for (BlockFileStatus status :
       {BlockFileStatus::kTruncated, BlockFileStatus::kCorrupt, BlockFileStatus::kForeign}) {
    count("deepinfer:kv_disk_rejected_files_total", "Block files found bad and removed, by fault.",
          static_cast<double>(tiers.disk.rejected[static_cast<int>(status)]),
          fmt::format(",reason=\"{}\"", block_file_status_name(status)));
  }
  count("deepinfer:kv_disk_evictions_total", "Block files removed, by cause.",
        static_cast<double>(tiers.disk.evicted), ",cause=\"capacity\"");
  count("deepinfer:kv_disk_evictions_total", "Block files removed, by cause.",
        static_cast<double>(tiers.disk.expired), ",cause=\"expired\"");
}

}  // namespace

std::string ApiServer::metrics_text() const {
  EngineStats stats = engine_->stats();
  MetricsText metrics(fmt::format("model_name=\"{}\"", options_.served_model_name));
  metrics.value("vllm:num_requests_running", "gauge", "Sequences in the running batch.",
                static_cast<double>(stats.running));
  metrics.value("vllm:num_requests_waiting", "gauge", "Sequences waiting to be scheduled.",
                static_cast<double>(stats.waiting));
  double usage = stats.kv_blocks_total > 0 ? static_cast<double>(stats.kv_blocks_used) /
                                                 static_cast<double>(stats.kv_blocks_total)
                                           : 0.0;
  metrics.value("vllm:kv_cache_usage_perc", "gauge", "KV cache usage (1 = full).", usage);
  metrics.value("deepinfer:kv_cache_blocks_used", "gauge", "KV blocks in use.",
                static_cast<double>(stats.kv_blocks_used));
  metrics.value("deepinfer:kv_cache_blocks_total", "gauge", "KV blocks in the pool.",
                static_cast<double>(stats.kv_blocks_total));
  metrics.value("vllm:prefix_cache_queries_total", "counter", "Prompt blocks looked up.",
                static_cast<double>(stats.prefix_lookups));
  metrics.value("vllm:prefix_cache_hits_total", "counter", "Prompt blocks found cached.",
                static_cast<double>(stats.prefix_hits));
  metrics.value("deepinfer:prefix_cache_replays_total", "counter",
                "Prefix hits whose sliding-window layers were rebuilt by a bounded replay.",
                static_cast<double>(stats.replays));
  metrics.value("deepinfer:prefix_cache_replayed_tokens_total", "counter",
                "Cached prompt tokens recomputed by bounded replays.",
                static_cast<double>(stats.replayed_tokens));
  if (stats.has_lower_tiers) lower_tier_metrics(metrics, stats.tiers);
  metrics.value("vllm:num_preemptions_total", "counter", "Preemptions.",
                static_cast<double>(stats.preemptions));
  metrics.value("vllm:prompt_tokens_total", "counter", "Prompt tokens computed.",
                static_cast<double>(stats.prompt_tokens));
  metrics.value("vllm:generation_tokens_total", "counter", "Tokens generated.",
                static_cast<double>(stats.generated_tokens));
  metrics.value("vllm:spec_decode_num_drafts_total", "counter",
                "Speculative verifications (a request's drafts in one step).",
                static_cast<double>(stats.drafts));
  metrics.value("vllm:spec_decode_num_draft_tokens_total", "counter",
                "Speculative draft tokens verified.", static_cast<double>(stats.draft_tokens));
  metrics.value("vllm:spec_decode_num_accepted_tokens_total", "counter",
                "Speculative draft tokens accepted.",
                static_cast<double>(stats.accepted_draft_tokens));
  for (size_t position = 0; position < stats.accepted_per_position.size(); ++position) {
    metrics.value("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                  "Speculative draft tokens accepted, by their place among the drafts.",
                  static_cast<double>(stats.accepted_per_position[position]),
                  fmt::format(",position=\"{}\"", position));
  }
  metrics.value("vllm:request_success_total", "counter", "Finished completions by reason.",
                static_cast<double>(counters_.finished_stop.load()), ",finished_reason=\"stop\"");
  metrics.value("vllm:request_success_total", "counter", "Finished completions by reason.",
                static_cast<double>(counters_.finished_length.load()),
                ",finished_reason=\"length\"");
  metrics.value("deepinfer:requests_in_flight", "gauge", "HTTP generation requests running.",
                static_cast<double>(counters_.in_flight.load()));
  metrics.value("deepinfer:requests_rejected_total", "counter",
                "Requests answered with an error status.",
                static_cast<double>(counters_.rejected.load()));
  metrics.histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                    stats.time_to_first_token);
  metrics.histogram("vllm:inter_token_latency_seconds", "Time between output tokens.",
                    stats.inter_token_latency);
  return metrics.text();
}

}  // namespace deepinfer::server
