// GGUF reader and writer: round trips of every value and tensor type, hand-built v2/v3 files, every
// validation error (message names path, offset and problem), typed accessors, tensor classification.
#include <gtest/gtest.h>

#include <cmath>
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
using strata_test::Bytes;

namespace {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/strata_test_gguf_" + std::to_string(::getpid()) + "_" + name;
}

// Structural equality of two values, including the exact GGUF type at every level.
bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  if (a.type == GgufType::ARRAY) {
    const auto& x = *std::get<std::shared_ptr<GgufArray>>(a.v);
    const auto& y = *std::get<std::shared_ptr<GgufArray>>(b.v);
    if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i) {
      if (!same_value(x.items[i], y.items[i])) return false;
    }
    return true;
  }
  if (const auto* d = std::get_if<double>(&a.v)) {
    const double e = std::get<double>(b.v);
    return std::memcmp(d, &e, sizeof e) == 0;  // bit-exact, so NaNs compare too
  }
  return a.v == b.v;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& x : out) x = static_cast<uint8_t>(rng());
  return out;
}

// Every metadata type, including nested arrays and arrays of strings.
std::vector<std::pair<std::string, GgufValue>> all_value_types() {
  std::vector<std::pair<std::string, GgufValue>> kv;
  kv.emplace_back("general.architecture", GgufValue::str("qwen3moe"));
  kv.emplace_back("t.u8", GgufValue::u8(250));
  kv.emplace_back("t.i8", GgufValue::i8(-120));
  kv.emplace_back("t.u16", GgufValue::u16(65000));
  kv.emplace_back("t.i16", GgufValue::i16(-32000));
  kv.emplace_back("t.u32", GgufValue::u32(4000000000u));
  kv.emplace_back("t.i32", GgufValue::i32(-2000000000));
  kv.emplace_back("t.u64", GgufValue::u64(18000000000000000000ull));
  kv.emplace_back("t.i64", GgufValue::i64(-9000000000000000000ll));
  kv.emplace_back("t.f32", GgufValue::f32(1.5e-6f));
  kv.emplace_back("t.f64", GgufValue::f64(-2.718281828459045));
  kv.emplace_back("t.bool_true", GgufValue::boolean(true));
  kv.emplace_back("t.bool_false", GgufValue::boolean(false));
  kv.emplace_back("t.string", GgufValue::str("h\xc3\xa9llo\nworld"));
  kv.emplace_back("t.empty_string", GgufValue::str(""));
  kv.emplace_back("t.strings", GgufValue::string_array({"a", "", "b c", "\xe2\x80\x9c"}));
  kv.emplace_back("t.f32s", GgufValue::f32_array({1.0f, -0.5f, 3.25f}));
  kv.emplace_back("t.i32s", GgufValue::i32_array({-1, 0, 7}));
  kv.emplace_back("t.empty_array", GgufValue::array(GgufType::U16, {}));
  kv.emplace_back("t.u8s", GgufValue::array(GgufType::U8, {GgufValue::u8(1), GgufValue::u8(255)}));
  kv.emplace_back("t.bools", GgufValue::array(GgufType::BOOL, {GgufValue::boolean(true), GgufValue::boolean(false)}));
  kv.emplace_back("t.f64s", GgufValue::array(GgufType::F64, {GgufValue::f64(1e300)}));
  kv.emplace_back("t.u64s", GgufValue::array(GgufType::U64, {GgufValue::u64(~0ull)}));
  kv.emplace_back("t.i64s", GgufValue::array(GgufType::I64, {GgufValue::i64(-5)}));
  kv.emplace_back("t.i8s", GgufValue::array(GgufType::I8, {GgufValue::i8(-1)}));
  kv.emplace_back("t.i16s", GgufValue::array(GgufType::I16, {GgufValue::i16(-2)}));
  kv.emplace_back("t.u16s", GgufValue::array(GgufType::U16, {GgufValue::u16(2)}));
  kv.emplace_back("t.u32s", GgufValue::array(GgufType::U32, {GgufValue::u32(3)}));
  // Arrays of arrays (of strings, and three levels deep).
  GgufValue inner1 = GgufValue::string_array({"x", "yz"});
  GgufValue inner2 = GgufValue::string_array({});
  kv.emplace_back("t.nested", GgufValue::array(GgufType::ARRAY, {inner1, inner2}));
  GgufValue deep = GgufValue::i32_array({42});
  for (int i = 0; i < 6; ++i) deep = GgufValue::array(GgufType::ARRAY, {deep});
  kv.emplace_back("t.deep", deep);
  return kv;
}

// Expects open(path) to fail with "<path>: offset <offset>: ...<problem>...".
void expect_error(const Bytes& bytes, uint64_t offset, const std::string& problem, const char* name) {
  const std::string path = temp_path(name);
  strata_test::write_file(path, bytes.b);
  try {
    GgufFile::open(path);
    ADD_FAILURE() << name << ": expected an error containing '" << problem << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string prefix = path + ": offset " + std::to_string(offset) + ": ";
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << name << ": message '" << msg << "' should start with '" << prefix << "'";
    EXPECT_NE(msg.find(problem), std::string::npos) << name << ": message '" << msg << "' should mention '" << problem << "'";
  }
  std::remove(path.c_str());
}

// A minimal valid v3 file: one key, one f32 [4] tensor. Returned so cases can extend it.
Bytes minimal_file(uint32_t version = 3) {
  Bytes b;
  b.header(version, 1, 1).kv_str("general.architecture", "test").tensor("w", {4}, 0, 0).pad(32);
  for (int i = 0; i < 4; ++i) b.u32(0x3f800000);  // 1.0f
  return b;
}

}  // namespace

// --- round trips ------------------------------------------------------------------------------------

TEST(GgufRoundTrip, EveryValueTypeAndEveryTensorType) {
  GgufWriter w;
  const auto kv = all_value_types();
  for (const auto& [k, v] : kv) w.set(k, v);

  struct Expected {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  std::vector<Expected> expected;
  uint32_t seed = 1;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* t = find_type(id);
    if (t == nullptr) continue;
    // Two rows of two blocks, in a 3-d shape; bytes computed here from the block geometry.
    std::vector<int64_t> ne = {2 * t->block_elems, 2, 1};
    const size_t nbytes = 2 * t->block_bytes * 2;
    Expected e{std::string("tensor.") + t->name, t->type, ne, random_bytes(nbytes, seed++)};
    if (id % 2 == 0) {
      w.add_tensor(e.name, e.type, e.ne, e.bytes.data(), e.bytes.size());
    } else {
      const std::vector<uint8_t> copy = e.bytes;
      w.add_tensor(e.name, e.type, e.ne, [copy](uint8_t* dst, size_t n) {
        ASSERT_EQ(n, copy.size());
        std::memcpy(dst, copy.data(), n);
      });
    }
    expected.push_back(std::move(e));
  }
  ASSERT_GE(expected.size(), 16u);
  const std::string path = temp_path("roundtrip.gguf");
  w.write(path);

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  ASSERT_EQ(f.metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, kv[i].first);
    EXPECT_TRUE(same_value(f.metadata()[i].second, kv[i].second)) << kv[i].first;
  }
  ASSERT_EQ(f.tensors().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, expected[i].name);
    EXPECT_EQ(t.type, expected[i].type);
    EXPECT_EQ(t.n_dims, 3u);
    EXPECT_EQ(t.ne[0], expected[i].ne[0]);
    EXPECT_EQ(t.ne[1], 2);
    EXPECT_EQ(t.ne[2], 1);
    EXPECT_EQ(t.ne[3], 1);
    EXPECT_EQ(t.offset % 32, 0u);
    ASSERT_EQ(t.nbytes, expected[i].bytes.size());
    EXPECT_EQ(std::memcmp(t.data, expected[i].bytes.data(), t.nbytes), 0) << t.name;
    EXPECT_EQ(&f.tensor(t.name), &t);
  }
  // The data pointer is mapping + data_offset + offset: check against the file bytes read independently.
  const auto raw = strata_test::read_file(path);
  const GgufTensorInfo& last = f.tensors().back();
  ASSERT_LE(f.data_offset() + last.offset + last.nbytes, raw.size());
  EXPECT_EQ(std::memcmp(raw.data() + f.data_offset() + last.offset, last.data, last.nbytes), 0);
  std::remove(path.c_str());
}

TEST(GgufRoundTrip, AlignmentIsHonoured) {
  for (uint32_t alignment : {32u, 64u, 256u}) {
    GgufWriter w(alignment);
    w.set("general.architecture", GgufValue::str("x"));
    const auto a = random_bytes(3 * 4, 7);    // f32 [3]: 12 bytes, so the next tensor needs padding
    const auto b = random_bytes(5 * 2, 8);    // f16 [5]
    w.add_tensor("a", GgmlType::F32, {3}, a.data(), a.size());
    w.add_tensor("b", GgmlType::F16, {5}, b.data(), b.size());
    const std::string path = temp_path("align" + std::to_string(alignment) + ".gguf");
    w.write(path);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    EXPECT_EQ(f.tensors()[1].offset, alignment);  // the first tensor fits in one aligned slot
    EXPECT_EQ(std::memcmp(f.tensors()[1].data, b.data(), b.size()), 0);
    // The default alignment is implied; others are recorded as a u32 key.
    if (alignment == 32) {
      EXPECT_FALSE(f.has("general.alignment"));
    } else {
      EXPECT_EQ(f.find("general.alignment")->type, GgufType::U32);
      EXPECT_EQ(f.get_u32("general.alignment"), alignment);
    }
    // The file ends padded to the alignment.
    EXPECT_EQ(f.file_size() % alignment, 0u);
    std::remove(path.c_str());
  }
}

TEST(GgufRoundTrip, HandBuiltV2AndV3FilesRead) {
  for (uint32_t version : {2u, 3u}) {
    Bytes b;
    b.header(version, 2, 3)
        .kv_str("general.architecture", "llama")
        .kv_u32("general.alignment", 64)
        .str("nested").u32(9).u32(9).u64(2)   // array of 2 arrays
        .u32(4).u64(1).u32(7)                 //   [u32 7]
        .u32(8).u64(1).str("s")               //   ["s"]
        .tensor("x", {32, 2}, 8, 0)           // q8_0, 2 rows of one block: 68 bytes
        .tensor("y", {2}, 0, 128)
        .pad(64);
    const size_t data_at = b.size();
    const auto qbytes = random_bytes(68, 3);
    b.b.insert(b.b.end(), qbytes.begin(), qbytes.end());
    b.pad(64).u32(0x40000000).u32(0xbf800000);  // 2.0f, -1.0f
    const std::string path = temp_path("v" + std::to_string(version) + ".gguf");
    strata_test::write_file(path, b.b);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.data_offset(), data_at);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    const auto& nested = *std::get<std::shared_ptr<GgufArray>>(f.find("nested")->v);
    ASSERT_EQ(nested.elem_type, GgufType::ARRAY);
    ASSERT_EQ(nested.items.size(), 2u);
    const auto& first = *std::get<std::shared_ptr<GgufArray>>(nested.items[0].v);
    EXPECT_EQ(first.elem_type, GgufType::U32);
    EXPECT_EQ(std::get<uint64_t>(first.items.at(0).v), 7u);
    const auto& second = *std::get<std::shared_ptr<GgufArray>>(nested.items[1].v);
    EXPECT_EQ(std::get<std::string>(second.items.at(0).v), "s");
    const GgufTensorInfo& x = f.tensor("x");
    EXPECT_EQ(x.type, GgmlType::Q8_0);
    EXPECT_EQ(x.nbytes, 68u);
    EXPECT_EQ(x.shape_string(), "[32, 2]");
    EXPECT_EQ(std::memcmp(x.data, qbytes.data(), 68), 0);
    const GgufTensorInfo& y = f.tensor("y");
    float vals[2];
    std::memcpy(vals, y.data, 8);
    EXPECT_EQ(vals[0], 2.0f);
    EXPECT_EQ(vals[1], -1.0f);
    std::remove(path.c_str());
  }
}

// --- validation --------------------------------------------------------------------------------------

TEST(GgufValidation, HeaderProblems) {
  expect_error(Bytes{}, 0, "truncated", "empty");
  expect_error(Bytes{}.raw("GGU"), 0, "truncated", "short_magic");
  expect_error(Bytes{}.raw("GGML").u32(3).u64(0).u64(0), 0, "bad magic", "magic");
  expect_error(Bytes{}.raw("GGUF").u32(3).u64(0), 16, "truncated", "short_header");
  expect_error(Bytes{}.header(1, 0, 0), 4, "version 1 is not supported", "v1");
  expect_error(Bytes{}.header(4, 0, 0), 4, "unsupported GGUF version 4", "v4");
  expect_error(Bytes{}.header(0x03000000, 0, 0), 4, "big-endian", "bigendian");
  // 24-byte header + 100 bytes: cannot hold a million tensor infos or keys.
  expect_error(Bytes{}.header(3, 1000000, 0).zeros(100), 8, "tensor count 1000000 is absurd", "ntensors");
  expect_error(Bytes{}.header(3, 0, 1000000).zeros(100), 16, "metadata count 1000000 is absurd", "nkv");
  expect_error(Bytes{}.header(3, ~0ull, 0).zeros(100), 8, "tensor count", "ntensors_max");
  expect_error(Bytes{}.header(3, 1, 2).zeros(40), 8, "need more bytes", "counts_combined");
}

TEST(GgufValidation, MetadataProblems) {
  // Key string length past the end.
  expect_error(Bytes{}.header(3, 0, 1).u64(1000).raw("abc").zeros(10), 24, "string length 1000 runs past the end",
               "key_len");
  // Value string length past the end: the value starts after key (8+1) and type (4).
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(8).u64(500).raw("xyz"), 24 + 9 + 4, "string length 500", "str_len");
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(13).u32(0), 24 + 9, "unknown value type 13", "value_type");
  // Array: element type at 37, count at 41.
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(9).u32(4).u64(uint64_t{1} << 62).zeros(8), 24 + 9 + 4 + 4,
               "runs past the end", "array_overflow");
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(9).u32(4).u64(100).zeros(16), 24 + 9 + 4 + 4, "runs past the end",
               "array_past_end");
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(9).u32(99).u64(0), 24 + 9 + 4, "unknown array element type 99",
               "array_elem_type");
  // Arrays of strings whose count cannot fit.
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(9).u32(8).u64(10).str("a"), 24 + 9 + 4 + 4, "runs past the end",
               "string_array");
  // Nine nested arrays: the ninth array header sits at 24 + 9 + 4 + 8 * 12.
  {
    Bytes b;
    b.header(3, 0, 1).str("k").u32(9);
    for (int i = 0; i < 9; ++i) b.u32(9).u64(1);
    b.u32(4).u64(0);
    expect_error(b, 24 + 9 + 4 + 8 * 12, "nested deeper than 8", "depth");
  }
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(7).u8(2), 24 + 9 + 4, "bool value 2", "bool");
  expect_error(Bytes{}.header(3, 0, 2).kv_u32("a", 1).kv_u32("a", 2), 24 + 17, "duplicate metadata key 'a'", "dup_key");
  expect_error(Bytes{}.header(3, 0, 1).str("").u32(4).u32(0), 24, "empty", "empty_key");
  expect_error(Bytes{}.header(3, 0, 1).str("k").u32(4).raw("xy"), 24 + 9 + 4, "truncated", "short_value");
}

TEST(GgufValidation, AlignmentKeyProblems) {
  const std::string key = "general.alignment";
  const uint64_t value_at = 24 + 8 + key.size() + 4;
  expect_error(Bytes{}.header(3, 0, 1).str(key).u32(10).u64(32), value_at - 4, "must be a u32", "align_type");
  expect_error(Bytes{}.header(3, 0, 1).kv_u32(key, 0), value_at, "not a power of two", "align_zero");
  expect_error(Bytes{}.header(3, 0, 1).kv_u32(key, 48), value_at, "general.alignment 48 is not a power of two",
               "align_48");
}

TEST(GgufValidation, TensorInfoProblems) {
  // After a 24-byte header and no metadata, the first tensor info starts at 24: name (8+1),
  // n_dims at 33, dims from 37, then type and offset.
  auto one = [](const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    Bytes b;
    b.header(3, 1, 0).tensor("t", dims, type, offset).pad(32).zeros(4096);
    return b;
  };
  expect_error(one({}, 0, 0), 33, "n_dims 0", "ndims0");
  expect_error(one({1, 1, 1, 1, 1}, 0, 0), 33, "n_dims 5", "ndims5");
  expect_error(one({4, 0}, 0, 0), 37 + 8, "dimension 1 is 0", "dim0");
  expect_error(one({~0ull}, 0, 0), 37, "does not fit in int64", "dim_huge");
  expect_error(one({uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0), 37 + 8, "overflows int64", "dim_product");
  // Elements fit in int64 (2^62) but f32 bytes (2^64) do not fit in 64 bits.
  expect_error(one({uint64_t{1} << 31, uint64_t{1} << 31}, 0, 0), 37 + 16, "overflows 64 bits", "byte_overflow");
  expect_error(one({33}, 2, 0), 37 + 8, "row length 33 is not a multiple of the q4_0 block size 32", "block");
  expect_error(one({32}, 9, 0), 37 + 8, "unsupported tensor type id 9 (q8_1)", "type_q8_1");
  expect_error(one({32}, 1000, 0), 37 + 8, "unsupported tensor type id 1000 (unknown)", "type_unknown");
  expect_error(one({4}, 0, 16), 37 + 8 + 4, "data offset 16 is not a multiple of the alignment 32", "unaligned");
  expect_error(one({4}, 0, 1 << 20), 37 + 8 + 4, "extends past the end of the file", "past_end");
  expect_error(one({4}, 0, ~0ull - 31), 37 + 8 + 4, "extends past the end of the file", "offset_overflow");
  expect_error(one({1 << 20}, 0, 0), 37 + 8 + 4, "extends past the end of the file", "too_big");
  {
    Bytes e;
    e.header(3, 1, 0).tensor("", {4}, 0, 0).pad(32).zeros(16);
    expect_error(e, 24, "empty name", "empty_name");
  }
  {
    Bytes b;
    b.header(3, 2, 0).tensor("t", {4}, 0, 0);
    const size_t second = b.size();
    b.tensor("t", {4}, 0, 32).pad(32).zeros(64);
    expect_error(b, second, "duplicate tensor name 't'", "dup_tensor");
  }
  {
    // b starts inside a (a: f32 [16] = 64 bytes at 0; b at 32).
    Bytes b;
    b.header(3, 2, 0).tensor("a", {16}, 0, 0);
    const size_t b_offset_field = b.size() + 8 + 1 + 4 + 8 + 4;
    b.tensor("b", {4}, 0, 32).pad(32).zeros(128);
    expect_error(b, b_offset_field, "tensor 'b' data", "overlap");
  }
  {
    // The data section would start past the end: infos end unaligned and the file stops there.
    Bytes b;
    b.header(3, 1, 0).tensor("t", {4}, 0, 0);
    const size_t end = b.size();
    ASSERT_NE(end % 32, 0u);
    expect_error(b, end, "past the end of the file", "data_section");
  }
}

TEST(GgufValidation, EveryTruncationOfAValidFileFailsCleanly) {
  const Bytes full = minimal_file();
  const std::string path = temp_path("trunc.gguf");
  strata_test::write_file(path, full.b);
  EXPECT_NO_THROW(GgufFile::open(path));
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes cut;
    cut.b.assign(full.b.begin(), full.b.begin() + static_cast<std::ptrdiff_t>(n));
    strata_test::write_file(path, cut.b);
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "truncation to " << n << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": offset ", 0), 0u) << e.what();
    }
  }
  std::remove(path.c_str());
}

// --- typed accessors ---------------------------------------------------------------------------------

class GgufAccessors : public testing::Test {
 protected:
  void SetUp() override {
    path_ = temp_path("accessors.gguf");
    GgufWriter w;
    for (const auto& [k, v] : all_value_types()) w.set(k, v);
    w.set("t.small_u64", GgufValue::u64(12345));
    w.set("t.neg", GgufValue::i32(-3));
    w.add_tensor("w", GgmlType::F32, {4}, std::vector<float>(4, 1.0f).data(), 16);
    w.write(path_);
    f_ = std::make_unique<GgufFile>(GgufFile::open(path_));
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // Runs fn, expecting a strata::Error that mentions the path and every given fragment.
  template <class Fn>
  void expect_throw(Fn fn, std::vector<std::string> fragments) {
    try {
      fn();
      ADD_FAILURE() << "expected an error mentioning " << fragments.at(0);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path_ + ": ", 0), 0u) << msg;
      for (const auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << msg << " / " << frag;
    }
  }

  std::string path_;
  std::unique_ptr<GgufFile> f_;
};

TEST_F(GgufAccessors, ValuesOfMatchingTypes) {
  const GgufFile& f = *f_;
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_u32("t.u8"), 250u);          // any integer type whose value fits
  EXPECT_EQ(f.get_u64("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get_i64("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_i64("t.u32"), 4000000000ll);
  EXPECT_EQ(f.get_u32("t.small_u64"), 12345u);
  EXPECT_EQ(f.get_f32("t.f32"), 1.5e-6f);
  EXPECT_EQ(f.get_f32("t.f64"), static_cast<float>(-2.718281828459045));
  EXPECT_TRUE(f.get_bool("t.bool_true"));
  EXPECT_FALSE(f.get_bool("t.bool_false"));
  EXPECT_EQ(f.get_string_array("t.strings"), (std::vector<std::string>{"a", "", "b c", "\xe2\x80\x9c"}));
  EXPECT_EQ(f.get_int_array("t.i32s"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(f.get_int_array("t.u8s"), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(f.get_f32_array("t.f32s"), (std::vector<float>{1.0f, -0.5f, 3.25f}));
  EXPECT_EQ(f.get_u32_or("missing", 9), 9u);
  EXPECT_EQ(f.get_u32_or("t.u16", 9), 65000u);
  EXPECT_EQ(f.get_f32_or("missing", 0.25f), 0.25f);
  EXPECT_TRUE(f.get_bool_or("missing", true));
  EXPECT_EQ(f.get_string_or("missing", "d"), "d");
  EXPECT_EQ(f.get_string_or("t.string", "d"), "h\xc3\xa9llo\nworld");
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_NE(f.find_tensor("w"), nullptr);
}

TEST_F(GgufAccessors, ErrorsNameKeyAndTypes) {
  const GgufFile& f = *f_;
  expect_throw([&] { f.get_u32("no.such.key"); }, {"missing metadata key 'no.such.key'"});
  expect_throw([&] { f.get_u32("t.string"); }, {"'t.string'", "expected u32", "found string"});
  expect_throw([&] { f.get_u32("t.u64"); }, {"'t.u64'", "18000000000000000000", "does not fit in u32"});
  expect_throw([&] { f.get_u32("t.neg"); }, {"'t.neg'", "-3", "does not fit in u32"});
  expect_throw([&] { f.get_u64("t.i8"); }, {"'t.i8'", "-120", "does not fit in u64"});
  expect_throw([&] { f.get_i64("t.u64"); }, {"does not fit in i64"});
  expect_throw([&] { f.get_u64("t.f32"); }, {"expected u64", "found f32"});
  expect_throw([&] { f.get_f32("t.u32"); }, {"expected f32 or f64", "found u32"});
  expect_throw([&] { f.get_bool("t.u8"); }, {"expected bool", "found u8"});
  expect_throw([&] { f.get_string("t.strings"); }, {"expected string", "found array of string"});
  expect_throw([&] { f.get_string_array("t.i32s"); }, {"expected array of string", "found array of i32"});
  expect_throw([&] { f.get_int_array("t.f32s"); }, {"expected array of integers", "found array of f32"});
  expect_throw([&] { f.get_f32_array("t.strings"); }, {"expected array of f32"});
  expect_throw([&] { f.get_int_array("t.u64s"); }, {"does not fit in i64"});
  expect_throw([&] { f.get_f32_array("t.f64s"); }, {"'t.f64s'", "does not fit in f32"});  // 1e300
  expect_throw([&] { f.get_u32_or("t.string", 1); }, {"expected u32"});  // present but wrong type
  expect_throw([&] { f.get_bool_or("t.u8", true); }, {"expected bool"});
  expect_throw([&] { f.tensor("missing.weight"); }, {"no tensor named 'missing.weight'"});
}

// --- writer input validation -------------------------------------------------------------------------

TEST(GgufWriterValidation, RejectsBadInputs) {
  auto expect_fail = [](auto fn, const std::string& fragment) {
    try {
      fn();
      ADD_FAILURE() << "expected an error mentioning " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_fail([] { GgufWriter w(48); }, "not a power of two");
  expect_fail([] { GgufWriter w(0); }, "not a power of two");
  GgufWriter w;
  std::vector<uint8_t> buf(1024);
  expect_fail([&] { w.add_tensor("a", GgmlType::F32, {4}, buf.data(), 15); }, "15 bytes given");
  expect_fail([&] { w.add_tensor("a", GgmlType::Q4_0, {33}, buf.data(), 18); }, "not a multiple");
  expect_fail([&] { w.add_tensor("a", GgmlType::F32, {4, 0}, buf.data(), 0); }, "dimension 1 is 0");
  expect_fail([&] { w.add_tensor("a", GgmlType::F32, {1, 1, 1, 1, 1}, buf.data(), 4); }, "5 dimensions");
  expect_fail([&] { w.add_tensor("", GgmlType::F32, {1}, buf.data(), 4); }, "empty name");
  w.add_tensor("a", GgmlType::F32, {4}, buf.data(), 16);
  expect_fail([&] { w.add_tensor("a", GgmlType::F32, {4}, buf.data(), 16); }, "duplicate tensor name 'a'");
  expect_fail([&] { w.set("general.alignment", GgufValue::u32(64)); }, "general.alignment");
  expect_fail([&] { w.set("", GgufValue::u32(1)); }, "empty metadata key");
  expect_fail([] { GgufValue::array(GgufType::U32, {GgufValue::i32(1)}); }, "item 0 has type i32");
  GgufValue bad = GgufValue::u32(1);
  bad.v = std::string("not a number");
  expect_fail([&] { w.set("k", bad); }, "does not hold a u32");
  GgufValue huge = GgufValue::f32(1.0f);
  huge.v = 1e300;
  expect_fail([&] { w.set("k", huge); }, "does not fit in f32");
}

TEST(GgufWriterValidation, FailedFillLeavesNoFile) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::F32, {4}, [](uint8_t*, size_t) { throw Error("fill failed"); });
  const std::string path = temp_path("failed.gguf");
  EXPECT_THROW(w.write(path), Error);
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);
}

// --- tensor classification ---------------------------------------------------------------------------

TEST(ModelSummary, ClassifiesRoutedExperts) {
  struct Case {
    const char* name;
    int layer;
    bool expert;
  };
  for (const Case& c : std::vector<Case>{
           {"blk.0.ffn_gate_exps.weight", 0, true},
           {"blk.12.ffn_up_exps.weight", 12, true},
           {"blk.3.ffn_down_exps.weight", 3, true},
           {"blk.47.ffn_gate_up_exps.weight", 47, true},
           {"blk.5.ffn_down_exps.bias", 5, true},
           {"blk.5.ffn_gate_inp.weight", 5, false},
           {"blk.5.ffn_gate_shexp.weight", 5, false},
           {"blk.5.ffn_up_shexp.weight", 5, false},
           {"blk.5.attn_q.weight", 5, false},
           {"token_embd.weight", -1, false},
           {"output.weight", -1, false},
           {"blk.x.ffn_gate_exps.weight", -1, false},
           {"blk.7", -1, false},
           {"blkk.1.ffn_up_exps.weight", -1, false},
       }) {
    const TensorClass t = classify_tensor(c.name);
    EXPECT_EQ(t.layer, c.layer) << c.name;
    EXPECT_EQ(t.routed_expert, c.expert) << c.name;
  }
}

TEST(ModelSummary, SumsBytesPerLayer) {
  auto info = [](const std::string& name, GgmlType type, std::vector<int64_t> ne) {
    GgufTensorInfo t;
    t.name = name;
    t.type = type;
    t.n_dims = static_cast<uint32_t>(ne.size());
    for (size_t i = 0; i < ne.size(); ++i) t.ne[i] = ne[i];
    t.nbytes = t.row_nbytes() * static_cast<size_t>(t.n_rows());
    return t;
  };
  std::vector<GgufTensorInfo> ts = {
      info("token_embd.weight", GgmlType::F16, {64, 100}),          // 12800
      info("blk.0.attn_q.weight", GgmlType::F32, {64, 64}),         // 16384
      info("blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, {64, 32, 8}),  // 2*34*32*8 = 17408
      info("blk.0.ffn_up_exps.weight", GgmlType::Q8_0, {64, 32, 8}),    // 17408
      info("blk.0.ffn_down_exps.weight", GgmlType::Q4_0, {32, 64, 8}),  // 18*64*8 = 9216
      info("blk.1.ffn_norm.weight", GgmlType::F32, {64}),           // 256
  };
  const ModelBytes mb = summarize_bytes(ts);
  ASSERT_EQ(mb.layers.size(), 2u);
  EXPECT_EQ(mb.layers[0].layer, 0);
  EXPECT_EQ(mb.layers[0].expert_bytes, 17408u * 2 + 9216u);
  EXPECT_EQ(mb.layers[0].other_bytes, 16384u);
  EXPECT_EQ(mb.layers[0].n_expert, 8);
  EXPECT_EQ(mb.layers[0].bytes_per_expert, (17408u * 2 + 9216u) / 8);
  EXPECT_EQ(mb.layers[1].layer, 1);
  EXPECT_EQ(mb.layers[1].expert_bytes, 0u);
  EXPECT_EQ(mb.layers[1].other_bytes, 256u);
  EXPECT_EQ(mb.layers[1].n_expert, 0);
  EXPECT_EQ(mb.non_layer_bytes, 12800u);
  EXPECT_EQ(mb.expert_bytes, 17408u * 2 + 9216u);
  EXPECT_EQ(mb.other_bytes, 12800u + 16384u + 256u);
  EXPECT_EQ(mb.total_bytes(), 12800u + 16384u + 256u + 17408u * 2 + 9216u);

  ts.push_back(info("blk.0.ffn_gate_up_exps.weight", GgmlType::F32, {64, 64, 4}));
  EXPECT_THROW(summarize_bytes(ts), Error);
}
