// GGUF reader: maps the file and validates every field before anything uses it.
//
// The file is untrusted input. Every read goes through `need()`, which checks the remaining bytes
// before touching memory; every size computation uses overflow-checked arithmetic; counts are
// bounded by what the remaining bytes could possibly hold, so a corrupt count fails at once instead
// of allocating. Every error reads "<path>: offset <n>: <problem>" where n is where the bad field
// starts. Format facts: the public GGUF specification.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"

namespace strata {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;             // arrays of arrays nest at most this deep
constexpr uint64_t kMaxArrayItems = uint64_t{1} << 24;   // 16M; real vocabularies are ~250k
constexpr uint64_t kMaxValueString = uint64_t{1} << 26;  // 64 MiB; chat templates are ~10 KiB
constexpr uint64_t kMaxNameString = uint64_t{1} << 16;   // keys and tensor names
constexpr uint64_t kMaxCount = uint64_t{1} << 20;        // tensors or keys; real files have < 10k
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, one dim, type, offset

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

// Fewest bytes one value of type t can occupy (strings and arrays: their length/count headers).
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 4 + 8;
  }
  return 1;
}

}  // namespace

class GgufParser {
 public:
  explicit GgufParser(GgufFile& f) : f_(f), base_(f.file_.data()), size_(f.file_.size()) {}

  void parse() {
    parse_header();
    parse_metadata();
    parse_alignment();
    parse_tensor_infos();
    place_tensor_data();
  }

 private:
  template <class... Args>
  [[noreturn]] void error(uint64_t offset, const Args&... args) {
    fail(f_.path(), ": offset ", offset, ": ", args...);
  }

  uint64_t remaining() const { return size_ - pos_; }

  // Ensures n bytes can be read at pos_; names what was being read otherwise.
  template <class... What>
  void need(uint64_t n, const What&... what) {
    if (n > remaining())
      error(pos_, "file truncated: ", what..., " needs ", n, " bytes but only ", remaining(), " remain");
  }

  template <class T, class... What>
  T read(const What&... what) {
    need(sizeof(T), what...);
    T x;
    std::memcpy(&x, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return x;
  }

  template <class... What>
  std::string read_string(uint64_t max_len, const What&... what) {
    const uint64_t start = pos_;
    const uint64_t len = read<uint64_t>(what..., " (string length)");
    if (len > remaining()) {
      error(start, what..., ": string length ", len, " runs past the end of the file (", remaining(),
            " bytes remain)");
    }
    if (len > max_len) error(start, what..., ": string length ", len, " exceeds the limit of ", max_len);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  void parse_header() {
    need(4, "magic");
    uint32_t magic = read<uint32_t>("magic");
    if (magic != kGgufMagic) {
      char shown[5] = {};
      std::memcpy(shown, &magic, 4);
      for (char& c : shown) {
        if (c != 0 && (c < 32 || c > 126)) c = '?';
      }
      error(0, "bad magic '", std::string(shown, 4).c_str(), "' (expected 'GGUF'): not a GGUF file");
    }
    const uint64_t version_at = pos_;
    const uint32_t version = read<uint32_t>("version");
    if (version == 1) error(version_at, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped >= 1 && swapped <= 3)
        error(version_at, "GGUF version field reads ", version, ": a big-endian file, which is not supported");
      error(version_at, "unsupported GGUF version ", version, " (only versions 2 and 3)");
    }
    f_.version_ = version;
    const uint64_t counts_at = pos_;
    n_tensors_ = read<uint64_t>("tensor count");
    n_kv_ = read<uint64_t>("metadata count");
    // Every entry needs a minimum number of bytes, so counts the rest of the file could never hold
    // are rejected before anything is allocated.
    const uint64_t rest = remaining();
    if (n_tensors_ > kMaxCount || n_tensors_ > rest / kMinTensorInfoBytes)
      error(counts_at, "tensor count ", n_tensors_, " is absurd for a file of ", size_, " bytes");
    if (n_kv_ > kMaxCount || n_kv_ > rest / kMinKvBytes)
      error(counts_at + 8, "metadata count ", n_kv_, " is absurd for a file of ", size_, " bytes");
    if (n_tensors_ * kMinTensorInfoBytes + n_kv_ * kMinKvBytes > rest) {
      error(counts_at, "tensor count ", n_tensors_, " and metadata count ", n_kv_,
            " need more bytes than the file's ", size_);
    }
  }

  GgufType read_value_type(const std::string& key, const char* what) {
    const uint64_t at = pos_;
    const uint32_t t = read<uint32_t>("key '", key, "' ", what);
    if (!valid_value_type(t)) error(at, "key '", key, "': unknown ", what, " ", t);
    return static_cast<GgufType>(t);
  }

  GgufValue read_value(GgufType t, const std::string& key, int depth) {
    GgufValue v;
    v.type = t;
    const uint64_t at = pos_;
    switch (t) {
      case GgufType::U8: v.v = uint64_t{read<uint8_t>("key '", key, "' value")}; break;
      case GgufType::I8: v.v = int64_t{read<int8_t>("key '", key, "' value")}; break;
      case GgufType::U16: v.v = uint64_t{read<uint16_t>("key '", key, "' value")}; break;
      case GgufType::I16: v.v = int64_t{read<int16_t>("key '", key, "' value")}; break;
      case GgufType::U32: v.v = uint64_t{read<uint32_t>("key '", key, "' value")}; break;
      case GgufType::I32: v.v = int64_t{read<int32_t>("key '", key, "' value")}; break;
      case GgufType::U64: v.v = read<uint64_t>("key '", key, "' value"); break;
      case GgufType::I64: v.v = read<int64_t>("key '", key, "' value"); break;
      case GgufType::F32: v.v = static_cast<double>(read<float>("key '", key, "' value")); break;
      case GgufType::F64: v.v = read<double>("key '", key, "' value"); break;
      case GgufType::BOOL: {
        const uint8_t b = read<uint8_t>("key '", key, "' value");
        if (b > 1) error(at, "key '", key, "': bool value ", int{b}, " is neither 0 nor 1");
        v.v = b == 1;
        break;
      }
      case GgufType::STRING: v.v = read_string(kMaxValueString, "key '", key, "' value"); break;
      case GgufType::ARRAY: v.v = read_array(key, depth + 1); break;
    }
    return v;
  }

  std::shared_ptr<GgufArray> read_array(const std::string& key, int depth) {
    const uint64_t at = pos_;
    if (depth > kMaxArrayDepth)
      error(at, "key '", key, "': arrays nested deeper than ", kMaxArrayDepth, " levels");
    auto arr = std::make_shared<GgufArray>();
    arr->elem_type = read_value_type(key, "array element type");
    const uint64_t count_at = pos_;
    const uint64_t count = read<uint64_t>("key '", key, "' array count");
    uint64_t min_bytes = 0;
    if (__builtin_mul_overflow(count, min_value_bytes(arr->elem_type), &min_bytes) || min_bytes > remaining()) {
      error(count_at, "key '", key, "': array of ", count, " ", gguf_type_name(arr->elem_type),
            " runs past the end of the file (", remaining(), " bytes remain)");
    }
    if (count > kMaxArrayItems)
      error(count_at, "key '", key, "': array of ", count, " items exceeds the limit of ", kMaxArrayItems);
    arr->items.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) arr->items.push_back(read_value(arr->elem_type, key, depth));
    return arr;
  }

  void parse_metadata() {
    std::unordered_set<std::string> seen;
    for (uint64_t i = 0; i < n_kv_; ++i) {
      const uint64_t key_at = pos_;
      std::string key = read_string(kMaxNameString, "metadata key ", i);
      if (key.empty()) error(key_at, "metadata key ", i, " is empty");
      if (!seen.insert(key).second) error(key_at, "duplicate metadata key '", key, "'");
      const GgufType t = read_value_type(key, "value type");
      value_offsets_.push_back(pos_);
      GgufValue v = read_value(t, key, 0);
      f_.metadata_.emplace_back(std::move(key), std::move(v));
    }
  }

  void parse_alignment() {
    for (size_t i = 0; i < f_.metadata_.size(); ++i) {
      const auto& [key, v] = f_.metadata_[i];
      if (key != "general.alignment") continue;
      // The value sits after its 4-byte type field; point at the type for a type error.
      if (v.type != GgufType::U32)
        error(value_offsets_[i] - 4, "general.alignment must be a u32, found ", gguf_type_name(v.type));
      const uint64_t a = std::get<uint64_t>(v.v);
      if (a == 0 || !std::has_single_bit(a))
        error(value_offsets_[i], "general.alignment ", a, " is not a power of two");
      f_.alignment_ = static_cast<size_t>(a);
    }
  }

  void parse_tensor_infos() {
    std::unordered_set<std::string> names;
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      GgufTensorInfo t;
      const uint64_t name_at = pos_;
      t.name = read_string(kMaxNameString, "tensor info ", i, " name");
      if (t.name.empty()) error(name_at, "tensor ", i, " has an empty name");
      if (!names.insert(t.name).second) error(name_at, "duplicate tensor name '", t.name, "'");

      const uint64_t ndims_at = pos_;
      t.n_dims = read<uint32_t>("tensor '", t.name, "' n_dims");
      if (t.n_dims == 0 || t.n_dims > 4)
        error(ndims_at, "tensor '", t.name, "': n_dims ", t.n_dims, " is not between 1 and 4");
      int64_t n_elements = 1;
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        const uint64_t dim_at = pos_;
        const uint64_t x = read<uint64_t>("tensor '", t.name, "' dimension ", d);
        if (x == 0) error(dim_at, "tensor '", t.name, "': dimension ", d, " is 0");
        if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          error(dim_at, "tensor '", t.name, "': dimension ", d, " (", x, ") does not fit in int64");
        t.ne[d] = static_cast<int64_t>(x);
        if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements))
          error(dim_at, "tensor '", t.name, "': element count ", t.shape_string(), " overflows int64");
      }

      const uint64_t type_at = pos_;
      const uint32_t type_id = read<uint32_t>("tensor '", t.name, "' type");
      const TypeTraits* traits = find_type(type_id);
      if (traits == nullptr) {
        error(type_at, "tensor '", t.name, "': unsupported tensor type id ", type_id, " (",
              ggml_type_name(type_id), ")");
      }
      t.type = traits->type;
      if (t.ne[0] % traits->block_elems != 0) {
        error(type_at, "tensor '", t.name, "': row length ", t.ne[0], " is not a multiple of the ", traits->name,
              " block size ", traits->block_elems);
      }
      uint64_t row = 0;
      uint64_t nbytes = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(t.ne[0] / traits->block_elems), traits->block_bytes, &row) ||
          __builtin_mul_overflow(row, static_cast<uint64_t>(t.n_rows()), &nbytes)) {
        error(type_at, "tensor '", t.name, "': byte size of ", t.shape_string(), " ", traits->name,
              " overflows 64 bits");
      }
      t.nbytes = static_cast<size_t>(nbytes);

      const uint64_t offset_at = pos_;
      t.offset = read<uint64_t>("tensor '", t.name, "' data offset");
      if (t.offset % f_.alignment_ != 0) {
        error(offset_at, "tensor '", t.name, "': data offset ", t.offset, " is not a multiple of the alignment ",
              f_.alignment_);
      }
      offset_fields_.push_back(offset_at);
      f_.tensors_.push_back(std::move(t));
    }
  }

  void place_tensor_data() {
    const uint64_t a = f_.alignment_;
    uint64_t data_offset = 0;
    if (__builtin_add_overflow(pos_, a - 1, &data_offset)) error(pos_, "data section offset overflows");
    data_offset -= data_offset % a;
    f_.data_offset_ = data_offset;
    if (f_.tensors_.empty()) return;  // nothing is read from the data section
    if (data_offset > size_)
      error(pos_, "data section starts at ", data_offset, ", past the end of the file (", size_, " bytes)");

    struct Span { uint64_t begin, end; size_t index; };
    std::vector<Span> spans;
    spans.reserve(f_.tensors_.size());
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      GgufTensorInfo& t = f_.tensors_[i];
      uint64_t begin = 0;
      uint64_t end = 0;
      if (__builtin_add_overflow(data_offset, t.offset, &begin) || __builtin_add_overflow(begin, t.nbytes, &end) ||
          end > size_) {
        error(offset_fields_[i], "tensor '", t.name, "': data (offset ", t.offset, ", ", t.nbytes,
              " bytes) extends past the end of the file (", size_, " bytes; data section starts at ",
              data_offset, ")");
      }
      t.data = base_ + begin;
      spans.push_back({begin, end, i});
    }
    std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.begin < y.begin; });
    for (size_t k = 1; k < spans.size(); ++k) {
      const Span& prev = spans[k - 1];
      const Span& cur = spans[k];
      if (cur.begin < prev.end) {
        const GgufTensorInfo& a_t = f_.tensors_[prev.index];
        const GgufTensorInfo& b_t = f_.tensors_[cur.index];
        error(offset_fields_[cur.index], "tensor '", b_t.name, "' data [", cur.begin, ", ", cur.end,
              ") overlaps tensor '", a_t.name, "' data [", prev.begin, ", ", prev.end, ")");
      }
    }
    for (size_t i = 0; i < f_.tensors_.size(); ++i) f_.tensor_index_.emplace(f_.tensors_[i].name, i);
  }

  GgufFile& f_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  std::vector<uint64_t> value_offsets_;  // file offset of each metadata value (after its type)
  std::vector<uint64_t> offset_fields_;  // file offset of each tensor's data-offset field
};

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.file_ = MappedFile::open(path);
  GgufParser(f).parse();
  return f;
}

}  // namespace strata
