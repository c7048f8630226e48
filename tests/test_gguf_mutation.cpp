// Robustness of the GGUF reader against corrupt input: valid files are mutated tens of thousands of
// times (every truncation, random bit flips, random byte edits, targeted edits of counts, lengths,
// types, dims and offsets, and combinations) with a fixed seed. Every open() must either succeed —
// and then every tensor byte and metadata value is touched and the layout invariants hold — or throw
// strata::Error naming the file and an offset. Run under ASan+UBSan by scripts/test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "gguf_test_util.h"
#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/model_summary.h"
#include "strata/gguf/writer.h"

using namespace strata;

namespace {

// A file image plus the positions of its numeric fields, so edits can aim at counts, lengths,
// type ids, dims and offsets instead of only random bytes.
struct Field {
  size_t pos;
  int width;  // 4 or 8
};

struct Image {
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<Field> fields;
};

class Crafter {
 public:
  Crafter& u8(uint8_t x) { return put(x, 1, false); }
  Crafter& u16(uint16_t x) { return put(x, 2, false); }
  Crafter& u32(uint32_t x) { return put(x, 4, true); }
  Crafter& u64(uint64_t x) { return put(x, 8, true); }
  Crafter& str(const std::string& s) {
    u64(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  Crafter& header(uint32_t version, uint64_t nt, uint64_t nkv) {
    b_.insert(b_.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(nt).u64(nkv);
  }
  Crafter& tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Crafter& pad(size_t a) {
    while (b_.size() % a != 0) b_.push_back(0);
    return *this;
  }
  // Zero bytes up to absolute position pos (tensor data placement).
  Crafter& fill_to(size_t pos) {
    while (b_.size() < pos) b_.push_back(0);
    return *this;
  }
  Crafter& data(size_t n, std::mt19937& rng) {
    for (size_t i = 0; i < n; ++i) b_.push_back(static_cast<uint8_t>(rng()));
    return *this;
  }
  size_t size() const { return b_.size(); }
  Image image(const std::string& name) const { return Image{name, b_, fields_}; }

 private:
  Crafter& put(uint64_t x, int n, bool record) {
    if (record) fields_.push_back({b_.size(), n});
    for (int i = 0; i < n; ++i) b_.push_back(static_cast<uint8_t>(x >> (8 * i)));
    return *this;
  }
  std::vector<uint8_t> b_;
  std::vector<Field> fields_;
};

// Tensor data: F32 (0), F16 (1), Q4_0 (2), Q8_0 (8), Q4_K (12) sizes from their block geometry.
Image moe_v3(std::mt19937& rng) {
  Crafter c;
  c.header(3, 5, 12);
  c.str("general.architecture").u32(8).str("qwen3moe");
  c.str("qwen3moe.block_count").u32(4).u32(2);
  c.str("qwen3moe.expert_count").u32(4).u32(4);
  c.str("qwen3moe.rope.freq_base").u32(6).u32(0x47c35000);  // 100000.0f
  c.str("qwen3moe.norm_topk").u32(7).u8(1);
  c.str("qwen3moe.big").u32(11).u64(~0ull >> 1);
  c.str("qwen3moe.eps").u32(12).u64(0x3eb0c6f7a0b5ed8dull);  // 1e-6
  c.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(6);
  for (const char* t : {"a", "b", "ab", "<|im_start|>", "", "\xc4\xa0"}) c.str(t);
  c.str("tokenizer.ggml.scores").u32(9).u32(6).u64(3).u32(0).u32(0x3f800000).u32(0xbf800000);
  c.str("t.nested").u32(9).u32(9).u64(2);
  c.u32(2).u64(2).u16(1).u16(2);
  c.u32(9).u64(1).u32(3).u64(1).u16(0xffff);  // an array of arrays of i16 inside
  c.str("t.small").u32(9).u32(1).u64(3).u8(0x80).u8(1).u8(2);
  c.str("tokenizer.ggml.bos_token_id").u32(5).u32(3);
  c.tensor("token_embd.weight", {8, 6}, 0, 0);            // 192 bytes
  c.tensor("blk.0.ffn_gate_exps.weight", {32, 2, 4}, 8, 192);  // 34*8 = 272 -> 480
  c.tensor("blk.0.attn_norm.weight", {8}, 0, 480);         // 32 -> 512
  c.tensor("blk.1.ffn_down_exps.weight", {32, 2, 4}, 2, 512);  // 18*8 = 144 -> 656
  c.tensor("output.weight", {8, 3}, 1, 672);               // 48
  c.pad(32);
  const size_t base = c.size();
  c.data(192, rng).data(272, rng).fill_to(base + 480).data(32, rng).data(144, rng).fill_to(base + 672).data(48, rng);
  return c.image("moe_v3");
}

Image v2_aligned64(std::mt19937& rng) {
  Crafter c;
  c.header(2, 3, 3);
  c.str("general.alignment").u32(4).u32(64);
  c.str("general.architecture").u32(8).str("llama");
  c.str("general.name").u32(8).str("tiny");
  c.tensor("blk.0.ffn_up_exps.weight", {256, 1, 2}, 12, 0);  // q4_k: 144*2 = 288 -> pad 320
  c.tensor("blk.0.attn_q.weight", {4, 4}, 1, 320);           // f16: 32
  c.tensor("norm", {16}, 0, 384);                            // f32: 64
  c.pad(64);
  c.data(288, rng).pad(64).data(32, rng).pad(64).data(64, rng);
  return c.image("v2_aligned64");
}

Image metadata_only(std::mt19937&) {
  Crafter c;
  c.header(3, 0, 4);
  c.str("general.architecture").u32(8).str("x");
  c.str("a.i8").u32(1).u8(0xff);
  c.str("a.deep").u32(9).u32(9).u64(1).u32(9).u64(1).u32(10).u64(2).u64(1).u64(2);
  c.str("a.strs").u32(9).u32(8).u64(2).str("hello").str("");
  return c.image("metadata_only");
}

// A writer-made file: exercised with untargeted mutations only (no field map).
Image writer_made(const std::string& dir) {
  GgufWriter w(32);
  w.set("general.architecture", GgufValue::str("qwen35moe"));
  w.set("qwen35moe.block_count", GgufValue::u32(1));
  w.set("x.f64s", GgufValue::array(GgufType::F64, {GgufValue::f64(1.0), GgufValue::f64(-2.0)}));
  w.set("x.nested", GgufValue::array(GgufType::ARRAY, {GgufValue::string_array({"p", "q"})}));
  w.set("x.i64", GgufValue::i64(-1));
  std::vector<uint8_t> d(34 * 4, 7);
  w.add_tensor("blk.0.ffn_gate_up_exps.weight", GgmlType::Q8_0, {32, 2, 2}, d.data(), d.size());
  w.add_tensor("blk.0.ssm_a", GgmlType::F32, {4}, [](uint8_t* p, size_t n) { std::memset(p, 0x3f, n); });
  const std::string path = dir + "/writer_made.gguf";
  w.write(path);
  Image img{"writer_made", strata_test::read_file(path), {}};
  std::remove(path.c_str());
  return img;
}

uint64_t touch_value(const GgufValue& v) {
  uint64_t h = static_cast<uint64_t>(v.type);
  if (const auto* u = std::get_if<uint64_t>(&v.v)) h += *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) h += static_cast<uint64_t>(*i);
  if (const auto* d = std::get_if<double>(&v.v)) h += static_cast<uint64_t>(*d != 0.0);
  if (const auto* b = std::get_if<bool>(&v.v)) h += *b;
  if (const auto* s = std::get_if<std::string>(&v.v)) {
    for (char ch : *s) h += static_cast<uint8_t>(ch);
  }
  if (const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v.v)) {
    for (const auto& it : (*a)->items) h += touch_value(it);
  }
  return h;
}

struct Stats {
  uint64_t opened = 0, rejected = 0, checksum = 0;
};

class MutationRunner {
 public:
  explicit MutationRunner(std::string path) : path_(std::move(path)) {}

  // Opens one candidate image; fails the test on anything but success or strata::Error.
  void check(const std::vector<uint8_t>& bytes, const std::string& what) {
    strata_test::write_file(path_, bytes);
    try {
      const GgufFile f = GgufFile::open(path_);
      ++stats.opened;
      verify_and_touch(f, what);
    } catch (const Error& e) {
      ++stats.rejected;
      const std::string msg = e.what();
      if (msg.rfind(path_ + ": offset ", 0) != 0 && msg.rfind(path_ + ": ", 0) != 0)
        ADD_FAILURE() << what << ": error does not name the file: " << msg;
      if (msg.rfind(path_ + ": offset ", 0) == 0) ++offset_named_;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": non-strata exception: " << e.what();
    } catch (...) {
      ADD_FAILURE() << what << ": unknown exception";
    }
  }

  Stats stats;
  uint64_t offset_named_ = 0;

 private:
  void verify_and_touch(const GgufFile& f, const std::string& what) {
    // Layout invariants of an accepted file.
    const uint64_t a = f.alignment();
    ASSERT_TRUE(a != 0 && (a & (a - 1)) == 0) << what;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& t : f.tensors()) {
      ASSERT_EQ(t.offset % a, 0u) << what;
      ASSERT_LE(f.data_offset() + t.offset + t.nbytes, f.file_size()) << what;
      ASSERT_EQ(t.nbytes, t.row_nbytes() * static_cast<size_t>(t.n_rows())) << what;
      spans.emplace_back(t.offset, t.offset + t.nbytes);
      uint64_t sum = 0;
      for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      stats.checksum += sum;
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) ASSERT_LE(spans[i - 1].second, spans[i].first) << what;
    for (const auto& [k, v] : f.metadata()) {
      stats.checksum += touch_value(v);
      // Accessors either return or throw strata::Error.
      try { stats.checksum += f.get_u64(k); } catch (const Error&) {}
      try { stats.checksum += static_cast<uint64_t>(f.get_f32(k) != 0); } catch (const Error&) {}
      try { stats.checksum += f.get_string(k).size(); } catch (const Error&) {}
      try { stats.checksum += f.get_string_array(k).size(); } catch (const Error&) {}
      try { stats.checksum += f.get_int_array(k).size(); } catch (const Error&) {}
    }
    try {
      stats.checksum += summarize_bytes(f.tensors()).total_bytes();
    } catch (const Error&) {
    }
  }

  std::string path_;
};

// Values that tend to hit boundaries: zero, tiny, alignment-ish, sign bits, all ones.
uint64_t interesting_value(std::mt19937_64& rng, uint64_t old) {
  static const uint64_t kValues[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 31, 32, 33, 39, 63, 64, 255, 256,
                                     1u << 16, 0x7fffffffu, 0x80000000u, 0xffffffffu, uint64_t{1} << 32,
                                     uint64_t{1} << 62, uint64_t{1} << 63, ~0ull, ~0ull - 31};
  switch (rng() % 4) {
    case 0: return old + 1;
    case 1: return old - 1;
    case 2: return old * 2 + (rng() % 2);
    default: return kValues[rng() % (sizeof kValues / sizeof kValues[0])];
  }
}

void set_field(std::vector<uint8_t>& b, const Field& f, uint64_t v) {
  for (int i = 0; i < f.width; ++i) b[f.pos + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_field(const std::vector<uint8_t>& b, const Field& f) {
  uint64_t v = 0;
  for (int i = 0; i < f.width; ++i) v |= uint64_t{b[f.pos + static_cast<size_t>(i)]} << (8 * i);
  return v;
}

// One random mutation of `b` (untargeted kinds only when the image has no field map).
void mutate_once(std::vector<uint8_t>& b, const Image& img, std::mt19937_64& rng) {
  if (b.empty()) return;
  const int kinds = img.fields.empty() ? 3 : 4;
  switch (rng() % static_cast<uint64_t>(kinds)) {
    case 0: b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
    case 1: b[rng() % b.size()] = static_cast<uint8_t>(rng()); break;
    case 2: b.resize(rng() % b.size()); break;
    default: {
      const Field& f = img.fields[rng() % img.fields.size()];
      if (f.pos + static_cast<size_t>(f.width) <= b.size()) set_field(b, f, interesting_value(rng, get_field(b, f)));
    }
  }
}

}  // namespace

// Scratch directory: tmpfs when there is one, because rewriting a file tens of thousands of times
// on a journalling disk (truncate + write) is 20x slower than the parsing under test.
static std::string scratch_dir() {
  if (::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return testing::TempDir();
}

TEST(GgufMutation, EveryLoadSucceedsOrThrowsStrataError) {
  const std::string dir = scratch_dir();
  MutationRunner run(dir + "/strata_gguf_mutation_" + std::to_string(::getpid()) + ".gguf");
  std::mt19937 data_rng(12345);
  std::vector<Image> images = {moe_v3(data_rng), v2_aligned64(data_rng), metadata_only(data_rng), writer_made(dir)};
  std::mt19937_64 rng(20240601);
  uint64_t cases = 0;

  for (const Image& img : images) {
    // The unmutated image must load: otherwise the mutations below test nothing.
    run.check(img.bytes, img.name + " (unmutated)");
    ASSERT_EQ(run.stats.rejected, 0u) << img.name << " does not load unmutated";
  }
  for (const Image& img : images) {
    const auto& base = img.bytes;
    // 1. Every truncation.
    for (size_t n = 0; n < base.size(); ++n, ++cases)
      run.check(std::vector<uint8_t>(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(n)),
                img.name + " truncated to " + std::to_string(n));
    // 2. Single bit flips at random positions.
    for (int i = 0; i < 2500; ++i, ++cases) {
      auto b = base;
      const size_t pos = rng() % b.size();
      const int bit = static_cast<int>(rng() % 8);
      b[pos] ^= static_cast<uint8_t>(1u << bit);
      run.check(b, img.name + " bit flip at " + std::to_string(pos) + "." + std::to_string(bit));
    }
    // 3. Random byte edits.
    for (int i = 0; i < 1000; ++i, ++cases) {
      auto b = base;
      const size_t pos = rng() % b.size();
      b[pos] = static_cast<uint8_t>(rng());
      run.check(b, img.name + " byte edit at " + std::to_string(pos));
    }
    // 4. Targeted edits of every recorded field (counts, lengths, type ids, dims, offsets).
    for (const Field& f : img.fields) {
      for (int i = 0; i < 12; ++i, ++cases) {
        auto b = base;
        const uint64_t v = interesting_value(rng, get_field(b, f));
        set_field(b, f, v);
        run.check(b, img.name + " field at " + std::to_string(f.pos) + " set to " + std::to_string(v));
      }
    }
    // 5. Several mutations at once.
    for (int i = 0; i < 1500; ++i, ++cases) {
      auto b = base;
      const int n = 2 + static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) mutate_once(b, img, rng);
      run.check(b, img.name + " multi-mutation " + std::to_string(i));
    }
  }
  std::remove((dir + "/strata_gguf_mutation_" + std::to_string(::getpid()) + ".gguf").c_str());

  EXPECT_GE(cases, 20000u);
  // Both outcomes must occur, or the mutations are not reaching the validation paths.
  EXPECT_GT(run.stats.opened, 1000u);
  EXPECT_GT(run.stats.rejected, 10000u);
  EXPECT_EQ(run.offset_named_, run.stats.rejected);
  std::printf("mutation cases: %llu, opened: %llu, rejected: %llu, checksum %llu\n",
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(run.stats.opened),
              static_cast<unsigned long long>(run.stats.rejected), static_cast<unsigned long long>(run.stats.checksum));
}
