#include "strata/moe/profile_store.h"

#include <sys/stat.h>

#include <utility>

#include "strata/moe/routing_profile.h"

namespace strata {

ProfileStore::ProfileStore(std::string path, const Model& model)
    : path_(std::move(path)), model_(model_identity(model)) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    counts_ = load_profile(path_, model_).counts;
    loaded_existing_ = true;
  } else {
    counts_.reset(model_.n_layer, model_.n_expert);
  }
}

void ProfileStore::add(const RoutingCounts& counts) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_.merge(counts);
}

void ProfileStore::save() {
  std::lock_guard<std::mutex> lock(mu_);
  save_profile_atomic(path_, model_, counts_);
}

void ProfileStore::add_and_save(const RoutingCounts& counts) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_.merge(counts);
  save_profile_atomic(path_, model_, counts_);
}

RoutingCounts ProfileStore::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace strata
