#include "strata/engine/routing_trace.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "strata/base/error.h"

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'R', 'T', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxString = 4096;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_string(std::string& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

std::string header_bytes(const RoutingTraceHeader& h) {
  h.check();
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kVersion);
  put_u32(out, static_cast<uint32_t>(h.n_layer));
  put_u32(out, static_cast<uint32_t>(h.n_expert));
  put_u32(out, static_cast<uint32_t>(h.k));
  put_u32(out, static_cast<uint32_t>(h.id_bytes()));
  put_string(out, h.fingerprint);
  put_string(out, h.source);
  return out;
}

// Checks one token's picks in one layer: ids in range, none twice. Returns the problem or "".
template <typename Id>
std::string check_token_layer(const Id* ids, int k, int n_expert) {
  for (int j = 0; j < k; ++j) {
    if (static_cast<int>(ids[j]) < 0 || static_cast<int>(ids[j]) >= n_expert)
      return cat("expert id ", static_cast<int>(ids[j]), " outside 0..", n_expert - 1);
    for (int i = 0; i < j; ++i)
      if (ids[i] == ids[j]) return cat("expert ", static_cast<int>(ids[j]), " picked twice by one token in one layer");
  }
  return "";
}

std::string record_bytes(const RoutingTraceHeader& h, uint32_t stream, const int* picks, int n_tokens) {
  if (n_tokens <= 0) fail("routing trace: a record needs at least one token, got ", n_tokens);
  const size_t n = static_cast<size_t>(n_tokens) * static_cast<size_t>(h.n_layer) * static_cast<size_t>(h.k);
  for (size_t at = 0; at < n; at += static_cast<size_t>(h.k)) {
    const std::string problem = check_token_layer(picks + at, h.k, h.n_expert);
    if (!problem.empty()) fail("routing trace: ", problem);
  }
  std::string out;
  out.reserve(8 + n * static_cast<size_t>(h.id_bytes()));
  put_u32(out, stream);
  put_u32(out, static_cast<uint32_t>(n_tokens));
  for (size_t i = 0; i < n; ++i) {
    out.push_back(static_cast<char>(picks[i] & 0xff));
    if (h.id_bytes() == 2) out.push_back(static_cast<char>((picks[i] >> 8) & 0xff));
  }
  return out;
}

// A bounds-checked reader over the file's bytes.
class Cursor {
 public:
  Cursor(const std::string& bytes, const std::string& name) : b_(bytes), name_(name) {}
  size_t at() const { return at_; }
  size_t left() const { return b_.size() - at_; }
  [[noreturn]] void bad(const std::string& problem) const { fail(name_, ": offset ", at_, ": ", problem); }
  uint32_t u32(const char* what) {
    if (left() < 4) bad(cat("truncated: ", what, " needs 4 bytes, ", left(), " left"));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(b_[at_ + i])) << (8 * i);
    at_ += 4;
    return v;
  }
  std::string str(const char* what) {
    const uint32_t n = u32(what);
    if (n > kMaxString) bad(cat("corrupt: ", what, " of ", n, " bytes (at most ", kMaxString, ")"));
    if (left() < n) bad(cat("truncated: ", what, " of ", n, " bytes, ", left(), " left"));
    std::string s = b_.substr(at_, n);
    at_ += n;
    return s;
  }
  const unsigned char* take(size_t n) {
    const auto* p = reinterpret_cast<const unsigned char*>(b_.data()) + at_;
    at_ += n;
    return p;
  }

 private:
  const std::string& b_;
  const std::string& name_;
  size_t at_ = 0;
};

}  // namespace

void RoutingTraceHeader::check() const {
  if (n_layer < 1 || n_expert < 1 || n_expert > 65536 || k < 1 || k > n_expert)
    fail("routing trace: invalid shape ", n_layer, " layers x ", n_expert, " experts top-", k);
  if (fingerprint.size() > kMaxString || source.size() > kMaxString)
    fail("routing trace: fingerprint or source longer than ", kMaxString, " bytes");
}

uint64_t RoutingTrace::n_tokens() const {
  uint64_t n = 0;
  const size_t stride = token_stride();
  for (const auto& s : streams) n += stride ? s.picks.size() / stride : 0;
  return n;
}

RoutingTrace parse_routing_trace(const std::string& bytes, const std::string& name) {
  Cursor c(bytes, name);
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    c.bad("not a strata routing trace (no STRATRT1 magic)");
  c.take(sizeof kMagic);
  const uint32_t version = c.u32("version");
  if (version != kVersion) c.bad(cat("routing trace version ", version, " is not supported (this strata reads ", kVersion, ")"));
  RoutingTrace t;
  RoutingTraceHeader& h = t.header;
  const uint32_t n_layer = c.u32("n_layer"), n_expert = c.u32("n_expert"), k = c.u32("k");
  const uint32_t id_bytes = c.u32("id_bytes");
  if (n_layer < 1 || n_layer > 100000 || n_expert < 1 || n_expert > 65536 || k < 1 || k > n_expert)
    c.bad(cat("corrupt: shape ", n_layer, " layers x ", n_expert, " experts top-", k));
  h.n_layer = static_cast<int>(n_layer), h.n_expert = static_cast<int>(n_expert), h.k = static_cast<int>(k);
  if (id_bytes != static_cast<uint32_t>(h.id_bytes()))
    c.bad(cat("corrupt: ", id_bytes, "-byte expert ids for ", n_expert, " experts (expected ", h.id_bytes(), ")"));
  h.fingerprint = c.str("fingerprint");
  h.source = c.str("source");
  const size_t stride = t.token_stride();
  std::unordered_map<uint32_t, size_t> index_of;  // stream id -> index in t.streams
  while (c.left() > 0) {
    const size_t record_at = c.at();
    const uint32_t stream = c.u32("record stream");
    const uint32_t n = c.u32("record token count");
    if (n == 0) c.bad("corrupt: a record of 0 tokens");
    const uint64_t ids = static_cast<uint64_t>(n) * stride;
    const uint64_t need = ids * id_bytes;
    if (need > c.left())
      c.bad(cat("truncated: the record at offset ", record_at, " holds ", n, " tokens (", need, " bytes), ", c.left(),
                " bytes left"));
    auto [slot, added] = index_of.try_emplace(stream, t.streams.size());
    if (added) t.streams.push_back(RoutingStream{stream, {}});
    RoutingStream* s = &t.streams[slot->second];
    const size_t data_at = c.at();
    const unsigned char* p = c.take(need);
    const size_t first = s->picks.size();
    s->picks.resize(first + ids);
    for (uint64_t i = 0; i < ids; ++i)
      s->picks[first + i] = id_bytes == 1 ? p[i] : static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
    for (uint64_t at = 0; at < ids; at += k) {
      const std::string problem = check_token_layer(s->picks.data() + first + at, h.k, h.n_expert);
      if (!problem.empty()) fail(name, ": offset ", data_at + at * id_bytes, ": corrupt: ", problem);
    }
  }
  return t;
}

RoutingTrace read_routing_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open routing trace");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_routing_trace(ss.str(), path);
}

void check_trace_shape(const RoutingTraceHeader& h, int n_layer, int n_expert, int k, const std::string& what) {
  if (h.n_layer != n_layer || h.n_expert != n_expert || h.k != k)
    fail(what, ": a trace of ", h.n_layer, " layers x ", h.n_expert, " experts top-", h.k, " does not fit the model (",
         n_layer, " layers x ", n_expert, " experts top-", k, ")");
}

void check_trace_fits(const RoutingTraceHeader& h, const ModelConfig& c) {
  // A trace records the routed layers only (dense ones route nothing).
  check_trace_shape(h, static_cast<int>(c.routed_layers().size()), c.n_expert, c.n_expert_used, "--collect-routing");
}

void append_layer_picks(RoutingTraceWriter& trace, uint32_t stream, const ModelConfig& c, const int* picks, int n) {
  if (n <= 0) return;
  const size_t k = static_cast<size_t>(c.n_expert_used);
  const std::vector<int> routed = c.routed_layers();
  const size_t stride = routed.size() * k, layers = static_cast<size_t>(c.n_layer);
  std::vector<int> rows(static_cast<size_t>(n) * stride);
  for (size_t t = 0; t < static_cast<size_t>(n); ++t)
    for (size_t r = 0; r < routed.size(); ++r)
      std::copy_n(picks + (t * layers + static_cast<size_t>(routed[r])) * k, k, rows.data() + t * stride + r * k);
  trace.append(stream, rows.data(), n);
}

std::string serialize_routing_trace(const RoutingTrace& trace) {
  std::string out = header_bytes(trace.header);
  const size_t stride = trace.token_stride();
  std::vector<int> ids;
  for (const auto& s : trace.streams) {
    if (s.picks.empty()) continue;
    if (s.picks.size() % stride != 0) fail("routing trace: stream ", s.id, " holds a partial token");
    ids.assign(s.picks.begin(), s.picks.end());
    out += record_bytes(trace.header, s.id, ids.data(), static_cast<int>(s.picks.size() / stride));
  }
  return out;
}

void write_routing_trace(const std::string& path, const RoutingTrace& trace) {
  const std::string bytes = serialize_routing_trace(trace);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, ": cannot write routing trace");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail(path, ": write failed");
}

RoutingTraceWriter::RoutingTraceWriter(const std::string& path, const RoutingTraceHeader& header)
    : path_(path), header_(header) {
  const std::string head = header_bytes(header_);
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) fail(path, ": cannot create routing trace (--collect-routing)");
  if (std::fwrite(head.data(), 1, head.size(), file_) != head.size() || std::fflush(file_) != 0) {
    std::fclose(file_);
    file_ = nullptr;
    fail(path, ": write failed");
  }
}

RoutingTraceWriter::~RoutingTraceWriter() {
  if (file_) std::fclose(file_);
}

void RoutingTraceWriter::append(uint32_t stream, const int* picks, int n_tokens) {
  const std::string rec = record_bytes(header_, stream, picks, n_tokens);
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0)
    fail(path_, ": write failed (--collect-routing)");
  tokens_ += static_cast<uint64_t>(n_tokens);
}

uint64_t RoutingTraceWriter::tokens_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tokens_;
}

TraceReplay::TraceReplay(RoutingTrace trace, std::string label) : trace_(std::move(trace)), label_(std::move(label)) {
  if (trace_.n_tokens() == 0) fail(label_, ": the routing trace holds no tokens");
}

void TraceReplay::next(int n_tokens, int* picks) {
  const size_t stride = trace_.token_stride();
  for (int t = 0; t < n_tokens; ++t) {
    while (token_ * stride >= trace_.streams[stream_].picks.size()) {
      token_ = 0;
      if (++stream_ == trace_.streams.size()) {
        stream_ = 0;
        wrapped_ = true;
      }
    }
    const uint16_t* src = trace_.streams[stream_].picks.data() + token_ * stride;
    for (size_t i = 0; i < stride; ++i) picks[static_cast<size_t>(t) * stride + i] = src[i];
    ++token_;
  }
}

void check_replay_shape(const RoutingSource& source, int n_routed, int n_expert, int k) {
  if (source.n_layer() != n_routed || source.n_expert() != n_expert || source.k() != k)
    fail("--routing ", source.label(), ": routing of ", source.n_layer(), " layers x ", source.n_expert(),
         " experts top-", source.k(), " does not fit the model (", n_routed, " routed layers x ", n_expert,
         " experts top-", k, ")");
}

}  // namespace strata
