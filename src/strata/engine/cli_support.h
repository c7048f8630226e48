// Small helpers the engine-driving CLI commands share (strata logits, strata run, later bench/serve).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Parses "1,2,3" (spaces allowed around commas) into token ids; fails naming the bad entry.
std::vector<int32_t> parse_token_list(const std::string& text, const char* option_name);

// Sets the CPU thread count for the engine (OpenMP). n <= 0 keeps the default (one per hardware thread).
void set_cpu_threads(int n);

}  // namespace strata
