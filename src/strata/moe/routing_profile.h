// Routing profiles: routing counts saved to a JSON file with the identity of the model they were
// counted on, so placement can start from what the model did before (strata calibrate, --profile).
//
// File format (version 1):
//   { "format": "strata-routing-profile", "version": 1,
//     "model": { "fingerprint": "<16 hex>", "name": "...", "arch": "qwen35moe" },
//     "n_layer": L, "n_expert": E, "n_expert_used": K, "n_tokens": T,
//     "counts": [[c_0_0, ..., c_0_{E-1}], ..., [c_{L-1}_0, ...]] }
// counts[l][e] = times expert e of layer l was chosen over T tokens (so each row sums to at most T*K).
#pragma once

#include <string>

#include "strata/engine/routing_counts.h"
#include "strata/moe/model_fingerprint.h"

namespace strata {

class Model;

struct RoutingProfile {
  ModelIdentity model;  // as recorded in the file (file path: empty)
  RoutingCounts counts;
};

// Reads and validates a profile file without checking which model it belongs to. Fails with
// "<path>: <problem>" on a missing, unreadable, non-JSON, wrong-format, wrong-version or inconsistent
// file (shape, negative or non-integer counts, rows summing to more than n_tokens * n_expert_used).
RoutingProfile read_profile(const std::string& path);

// read_profile, then refuses a profile of another model (different fingerprint or shape), naming both
// fingerprints and both model names.
RoutingProfile load_profile(const std::string& path, const ModelIdentity& model);
RoutingProfile load_profile(const std::string& path, const Model& model);

// Writes the profile atomically: a temporary file next to `path`, fsync, rename over `path`, fsync of
// the directory. A reader sees the old or the new file, never a partial one; on failure the temporary
// file is removed and strata::Error names the path and the system error. Safe to call after every
// request (the serving loop); compute the ModelIdentity once and reuse it.
void save_profile_atomic(const std::string& path, const ModelIdentity& model, const RoutingCounts& counts);
void save_profile_atomic(const std::string& path, const Model& model, const RoutingCounts& counts);

// The JSON text save_profile_atomic writes (for tests and --json output).
std::string profile_to_json(const ModelIdentity& model, const RoutingCounts& counts);

}  // namespace strata
