#include "strata/moe/routing_profile.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/base/error.h"
#include "strata/engine/model.h"

namespace strata {
namespace {

constexpr const char* kFormat = "strata-routing-profile";
constexpr int kVersion = 1;

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open routing profile: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(path, ": cannot read routing profile");
  return ss.str();
}

const json& field(const std::string& path, const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, ": routing profile has no '", key, "' field");
  return *it;
}

std::string string_field(const std::string& path, const json& obj, const char* key) {
  const json& v = field(path, obj, key);
  if (!v.is_string()) fail(path, ": routing profile field '", key, "' must be a string");
  return v.get<std::string>();
}

uint64_t count_field(const std::string& path, const json& obj, const char* key, uint64_t max) {
  const json& v = field(path, obj, key);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > max)
    fail(path, ": routing profile field '", key, "' must be an integer in 0..", max);
  return v.get<uint64_t>();
}

void write_all(int fd, const std::string& text, const std::string& tmp) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(tmp, ": cannot write routing profile: ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string profile_to_json(const ModelIdentity& model, const RoutingCounts& counts) {
  if (counts.n_layer != model.n_layer || counts.n_expert != model.n_expert)
    fail("routing profile: counts of ", counts.n_layer, " x ", counts.n_expert, " do not fit model '", model.name,
         "' (", model.n_layer, " layers x ", model.n_expert, " experts)");
  // Hand-assembled so each layer's counts stay on one line (nlohmann's pretty printer puts every
  // number on its own line); strings still go through the JSON library for escaping.
  json m = {{"fingerprint", model.fingerprint}, {"name", model.name}, {"arch", model.arch}};
  std::string s = cat("{\n  \"format\": \"", kFormat, "\",\n  \"version\": ", kVersion, ",\n  \"model\": ", m.dump(),
                      ",\n  \"n_layer\": ", counts.n_layer, ",\n  \"n_expert\": ", counts.n_expert,
                      ",\n  \"n_expert_used\": ", model.n_expert_used, ",\n  \"n_tokens\": ", counts.n_tokens,
                      ",\n  \"counts\": [");
  for (int l = 0; l < counts.n_layer; ++l) {
    s += l ? ",\n    [" : "\n    [";
    for (int e = 0; e < counts.n_expert; ++e) s += cat(e ? "," : "", counts.at(l, e));
    s += "]";
  }
  s += "\n  ]\n}\n";
  return s;
}

RoutingProfile read_profile(const std::string& path) {
  const std::string text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(path, ": routing profile is not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail(path, ": routing profile must be a JSON object");
  if (string_field(path, j, "format") != kFormat)
    fail(path, ": not a strata routing profile (format '", string_field(path, j, "format"), "', expected '", kFormat,
         "')");
  const json& ver = field(path, j, "version");
  if (!ver.is_number_integer() || ver.get<int64_t>() != kVersion)
    fail(path, ": routing profile version ", ver.dump(), " is not supported (this strata reads version ", kVersion,
         ")");

  RoutingProfile p;
  const json& m = field(path, j, "model");
  if (!m.is_object()) fail(path, ": routing profile field 'model' must be an object");
  p.model.fingerprint = string_field(path, m, "fingerprint");
  p.model.name = string_field(path, m, "name");
  p.model.arch = string_field(path, m, "arch");
  p.model.n_layer = static_cast<int>(count_field(path, j, "n_layer", 1 << 16));
  p.model.n_expert = static_cast<int>(count_field(path, j, "n_expert", 1 << 16));
  p.model.n_expert_used = static_cast<int>(count_field(path, j, "n_expert_used", 1 << 16));
  const uint64_t n_tokens = count_field(path, j, "n_tokens", uint64_t{1} << 56);

  const json& rows = field(path, j, "counts");
  if (!rows.is_array() || static_cast<int>(rows.size()) != p.model.n_layer)
    fail(path, ": routing profile field 'counts' must be an array of n_layer = ", p.model.n_layer, " rows");
  p.counts.reset(p.model.n_layer, p.model.n_expert);
  p.counts.n_tokens = n_tokens;
  const uint64_t row_max = n_tokens * static_cast<uint64_t>(p.model.n_expert_used);
  for (int l = 0; l < p.model.n_layer; ++l) {
    const json& row = rows[static_cast<size_t>(l)];
    if (!row.is_array() || static_cast<int>(row.size()) != p.model.n_expert)
      fail(path, ": routing profile counts row ", l, " must be an array of n_expert = ", p.model.n_expert, " integers");
    uint64_t sum = 0;
    for (int e = 0; e < p.model.n_expert; ++e) {
      const json& c = row[static_cast<size_t>(e)];
      if (!c.is_number_unsigned() || c.get<uint64_t>() > row_max)
        fail(path, ": routing profile counts[", l, "][", e, "] = ", c.dump(), " is not an integer in 0..", row_max);
      p.counts.add(l, e, c.get<uint64_t>());
      sum += c.get<uint64_t>();
    }
    if (sum > row_max)
      fail(path, ": routing profile layer ", l, " counts ", sum, " picks, more than n_tokens * n_expert_used = ",
           row_max);
  }
  return p;
}

RoutingProfile load_profile(const std::string& path, const ModelIdentity& model) {
  RoutingProfile p = read_profile(path);
  if (p.model.fingerprint != model.fingerprint)
    fail(path, ": routing profile belongs to another model: the profile was made for '", p.model.name,
         "' (fingerprint ", p.model.fingerprint, "), the loaded model is '", model.name, "' (", model.file,
         ", fingerprint ", model.fingerprint, "); run strata calibrate for this model or drop --profile");
  if (p.model.n_layer != model.n_layer || p.model.n_expert != model.n_expert ||
      p.model.n_expert_used != model.n_expert_used)
    fail(path, ": routing profile shape ", p.model.n_layer, " layers x ", p.model.n_expert, " experts (top-",
         p.model.n_expert_used, ") does not match the model's ", model.n_layer, " x ", model.n_expert, " (top-",
         model.n_expert_used, ")");
  return p;
}

RoutingProfile load_profile(const std::string& path, const Model& model) {
  return load_profile(path, model_identity(model));
}

void save_profile_atomic(const std::string& path, const ModelIdentity& model, const RoutingCounts& counts) {
  const std::string text = profile_to_json(model, counts);
  // Unique per process and call, so concurrent writers never share a temporary file.
  static std::atomic<uint64_t> serial{0};
  const std::string tmp = cat(path, ".tmp.", ::getpid(), ".", serial.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, ": cannot create routing profile: ", std::strerror(errno));
  try {
    write_all(fd, text, tmp);
    if (::fsync(fd) != 0) fail(tmp, ": fsync failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(tmp, ": close failed: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, ": cannot replace routing profile: ", std::strerror(err));
  }
  // The rename is durable only once the directory entry is on disk.
  const std::string dir = directory_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail(dir, ": cannot open directory to sync routing profile: ", std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) fail(dir, ": fsync of directory failed: ", std::strerror(err));
}

void save_profile_atomic(const std::string& path, const Model& model, const RoutingCounts& counts) {
  save_profile_atomic(path, model_identity(model), counts);
}

}  // namespace strata
