// The bench command's arguments, shared by its CPU and GPU halves.
#pragma once

#include <vector>

#include "cli/commands.h"

namespace deepinfer::cli {

struct BenchArgs {
  ModelOptions model;
  int prompt_tokens = 512;
  int decode_tokens = 32;
  int bandwidth_mib = 2048;
  int decode_prompt_tokens = 128;   // GPU: decode runs after a prompt of this length
  std::vector<int> decode_batches;  // GPU: decode steps of this many sequences, timed alone
  int decode_batch_context = 1500;  // ... each with this many cached tokens
  bool json = false;
};

// bench for a model loaded on a GPU backend.
void run_device_bench(const BenchArgs& args, LoadedModel& loaded, double load_seconds);

}  // namespace deepinfer::cli
