// --profile FILE while running or serving: starts from the file's counts (or from nothing when the file
// does not exist yet), adds what each request counted, and rewrites the file atomically when asked
// (after each request). Thread-safe: serving slots add and save concurrently.
#pragma once

#include <mutex>
#include <string>

#include "strata/engine/routing_counts.h"
#include "strata/moe/model_fingerprint.h"

namespace strata {

class Model;

class ProfileStore {
 public:
  // Loads `path` when it exists (refusing another model's profile or a corrupt file, as load_profile
  // does); otherwise starts with empty counts of the model's shape. Nothing is written until save().
  ProfileStore(std::string path, const Model& model);

  // Adds a request's counts (same shape as the model) to the accumulated ones.
  void add(const RoutingCounts& counts);
  // Writes the accumulated counts to the file (save_profile_atomic).
  void save();
  // add() then save(), under one lock.
  void add_and_save(const RoutingCounts& counts);

  RoutingCounts snapshot() const;  // a copy of the accumulated counts
  bool loaded_existing() const { return loaded_existing_; }
  const std::string& path() const { return path_; }
  const ModelIdentity& model() const { return model_; }

 private:
  std::string path_;
  ModelIdentity model_;
  bool loaded_existing_ = false;
  mutable std::mutex mu_;
  RoutingCounts counts_;
};

}  // namespace strata
