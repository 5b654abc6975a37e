// Offline batches for the generate command.
#pragma once

#include <string>

#include "engine/engine.h"
#include "model/model.h"

namespace deepinfer::cli {

struct BatchOptions {
  std::string input, output;
  EngineConfig engine;
};

// Reads JSONL requests (prompt | messages | prompt_token_ids, plus sampling parameters), runs
// them through one engine and writes one JSON line per request in input order.
void run_offline_batch(CausalLM& model, const std::string& model_dir, const BatchOptions& options);

}  // namespace deepinfer::cli
