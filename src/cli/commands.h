// Sub-commands of the deepinfer CLI. Each add_* registers its flags (with --help text) and
// the action to run when it is chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::cli {

void add_logits_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_bench_command(CLI::App& app);

// "1,2,3" -> {1, 2, 3}; throws Error naming the flag and the bad entry.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);

}  // namespace deepinfer::cli
