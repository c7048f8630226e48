// Routing traces: every kept token's expert picks per layer, recorded from a running model
// (--collect-routing) or made by the generator (moe/routing_generator.h), read by routing-stats and
// replayed by bench (--routing).
//
// File format, version 1, little-endian:
//   header:  magic "STRATRT1" (8 bytes), u32 version (1), u32 n_layer (the model's routed layers, in
//            order: a dense feed-forward layer routes nothing and is not recorded; every layer of
//            qwen3moe / qwen35moe), u32 n_expert, u32 k (picks per token and layer), u32 id_bytes (1 when
//            n_expert <= 256, else 2),
//            u32 fingerprint length + bytes (the model's fingerprint, moe/model_fingerprint.h; empty for
//            a generated trace), u32 source length + bytes (what made it: the model's name, or the
//            generator's setting and seed), each string at most 4096 bytes.
//   records, to the end of the file: u32 stream, u32 n_tokens (>= 1), then n_tokens x n_layer x k
//            expert ids of id_bytes each (token-major, then layer, then the k picks in router order).
// A stream is one token sequence in order: run has stream 0; serve gives every request its own stream
// (records of concurrent requests interleave, each request's tokens stay in order); calibrate gives each
// chunk (run from an empty state) its own stream. Only kept tokens are written: pending (speculative)
// tokens appear once kept, in kept order; a prompt prefix a server slot reuses is not run again and so
// not recorded.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "strata/model/config.h"

namespace strata {

struct RoutingTraceHeader {
  int n_layer = 0, n_expert = 0, k = 0;
  std::string fingerprint;  // "" for a generated trace
  std::string source;       // the model's name, or the generator's setting

  int id_bytes() const { return n_expert <= 256 ? 1 : 2; }
  // Fails unless 1 <= k <= n_expert <= 65536, n_layer >= 1 and the strings fit.
  void check() const;
};

// One stream's tokens, picks[(token * n_layer + layer) * k + j].
struct RoutingStream {
  uint32_t id = 0;
  std::vector<uint16_t> picks;
};

// A trace read whole: its header and its streams in order of first appearance.
struct RoutingTrace {
  RoutingTraceHeader header;
  std::vector<RoutingStream> streams;

  uint64_t n_tokens() const;
  size_t token_stride() const { return static_cast<size_t>(header.n_layer) * static_cast<size_t>(header.k); }
};

// Reads and validates a trace: magic, version, shape, string lengths, record sizes against the file,
// every id < n_expert and no expert twice in one token's layer. Fails naming the file, the offset and
// the problem (truncated, corrupt, unknown version).
RoutingTrace read_routing_trace(const std::string& path);
// The same from bytes in memory (`name` for messages).
RoutingTrace parse_routing_trace(const std::string& bytes, const std::string& name);

// Fails unless the trace's shape is the model's ("<what>: a trace of 48 layers x 128 experts top-8
// does not fit ...").
void check_trace_shape(const RoutingTraceHeader& h, int n_layer, int n_expert, int k, const std::string& what);
// --collect-routing's check of a trace against the model that records into it (its routed layers).
void check_trace_fits(const RoutingTraceHeader& h, const ModelConfig& c);

// Appends records to a new file (created or truncated on open). Thread-safe: serve's slots append
// from their worker threads. Each append is one record, written through to the file, so a killed
// process leaves every complete record readable.
class RoutingTraceWriter {
 public:
  RoutingTraceWriter(const std::string& path, const RoutingTraceHeader& header);
  ~RoutingTraceWriter();
  RoutingTraceWriter(const RoutingTraceWriter&) = delete;
  RoutingTraceWriter& operator=(const RoutingTraceWriter&) = delete;
  // picks: [n_tokens x n_layer x k], checked like the reader checks them.
  void append(uint32_t stream, const int* picks, int n_tokens);
  const RoutingTraceHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t tokens_written() const;

 private:
  std::string path_;
  RoutingTraceHeader header_;
  std::FILE* file_ = nullptr;
  mutable std::mutex mutex_;
  uint64_t tokens_ = 0;
};

// Appends n tokens' picks laid out by model layer ([n x n_layer x k], token-major; the rows of layers
// that route nothing are not read) as one record of `stream`: each token's routed layers, in order.
void append_layer_picks(RoutingTraceWriter& trace, uint32_t stream, const ModelConfig& c, const int* picks, int n);

// The serialised form of a whole trace (header and one record per stream), for the generator and tests.
std::string serialize_routing_trace(const RoutingTrace& trace);
void write_routing_trace(const std::string& path, const RoutingTrace& trace);

// Where replayed picks come from (bench --routing): next() fills n tokens' picks [n x n_layer x k] in
// the order the tokens run. The CPU engine asks once per forward, before its layers run.
class RoutingSource {
 public:
  virtual ~RoutingSource() = default;
  virtual void next(int n_tokens, int* picks) = 0;
  virtual int n_layer() const = 0;
  virtual int n_expert() const = 0;
  virtual int k() const = 0;
  // What the picks are, for every line that reports a speed: "replayed FILE" / "generated NAME".
  virtual std::string label() const = 0;
};

// Fails unless the source's shape is the model's routed layers x n_expert experts top-k (every backend's
// set_routing_replay checks it here).
void check_replay_shape(const RoutingSource& source, int n_routed, int n_expert, int k);

// Replays a trace's tokens: its streams one after another in file order, from the start again after
// the last token (so any number of tokens can be driven; wrapped() says whether it happened).
class TraceReplay : public RoutingSource {
 public:
  TraceReplay(RoutingTrace trace, std::string label);
  void next(int n_tokens, int* picks) override;
  int n_layer() const override { return trace_.header.n_layer; }
  int n_expert() const override { return trace_.header.n_expert; }
  int k() const override { return trace_.header.k; }
  std::string label() const override { return label_; }
  bool wrapped() const { return wrapped_; }

 private:
  RoutingTrace trace_;
  std::string label_;
  size_t stream_ = 0, token_ = 0;
  bool wrapped_ = false;
};

}  // namespace strata
