// GGUF v3 writer. Layout: header, metadata, tensor infos, padding to the alignment, then each
// tensor's bytes padded to the alignment. The file is written to "<path>.tmp" and renamed into place
// only when complete, so readers never see a half-written file.
#include "strata/gguf/writer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <unordered_set>

#include "strata/base/error.h"

namespace strata {

namespace {

constexpr int kMaxArrayDepth = 8;  // the reader's limit; deeper arrays would not read back

// Buffered output with error checking; every failure names the file.
class Out {
 public:
  explicit Out(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (f_ == nullptr) fail(path, ": cannot create: ", std::strerror(errno));
  }
  ~Out() {
    if (f_ != nullptr) std::fclose(f_);
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;

  void bytes(const void* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) fail(path_, ": write failed: ", std::strerror(errno));
    pos_ += n;
  }
  template <class T>
  void pod(T x) {
    bytes(&x, sizeof x);
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    uint64_t n = (alignment - pos_ % alignment) % alignment;
    while (n > 0) {
      const uint64_t k = n < sizeof zeros ? n : sizeof zeros;
      bytes(zeros, k);
      n -= k;
    }
  }
  void close() {
    FILE* f = f_;
    f_ = nullptr;
    if (std::fflush(f) != 0 || std::fclose(f) != 0) fail(path_, ": write failed: ", std::strerror(errno));
  }
  uint64_t pos() const { return pos_; }

 private:
  std::string path_;
  FILE* f_;
  uint64_t pos_ = 0;
};

// Checks that the variant alternative matches the declared type (values built by hand could mismatch).
void check_value(const std::string& key, const GgufValue& v, int depth) {
  bool ok = false;
  switch (v.type) {
    case GgufType::U8: case GgufType::U16: case GgufType::U32: case GgufType::U64:
      ok = std::holds_alternative<uint64_t>(v.v);
      break;
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64:
      ok = std::holds_alternative<int64_t>(v.v);
      break;
    case GgufType::F32: case GgufType::F64: ok = std::holds_alternative<double>(v.v); break;
    case GgufType::BOOL: ok = std::holds_alternative<bool>(v.v); break;
    case GgufType::STRING: ok = std::holds_alternative<std::string>(v.v); break;
    case GgufType::ARRAY: {
      const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v.v);
      ok = a != nullptr && *a != nullptr;
      if (ok) {
        if (depth + 1 > kMaxArrayDepth) fail("GGUF writer: key '", key, "': arrays nested deeper than ", kMaxArrayDepth);
        for (const auto& item : (*a)->items) {
          if (item.type != (*a)->elem_type) {
            fail("GGUF writer: key '", key, "': array of ", gguf_type_name((*a)->elem_type), " holds an item of type ",
                 gguf_type_name(item.type));
          }
          check_value(key, item, depth + 1);
        }
      }
      break;
    }
    default: fail("GGUF writer: key '", key, "': unknown value type ", static_cast<uint32_t>(v.type));
  }
  if (!ok) fail("GGUF writer: key '", key, "': value does not hold a ", gguf_type_name(v.type));
  if (v.type == GgufType::F32) {
    const double d = std::get<double>(v.v);
    if (std::isfinite(d) && std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max()))
      fail("GGUF writer: key '", key, "': value ", d, " does not fit in f32");
  }
}

void write_value(Out& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::U8: out.pod(static_cast<uint8_t>(std::get<uint64_t>(v.v))); break;
    case GgufType::U16: out.pod(static_cast<uint16_t>(std::get<uint64_t>(v.v))); break;
    case GgufType::U32: out.pod(static_cast<uint32_t>(std::get<uint64_t>(v.v))); break;
    case GgufType::U64: out.pod(std::get<uint64_t>(v.v)); break;
    case GgufType::I8: out.pod(static_cast<int8_t>(std::get<int64_t>(v.v))); break;
    case GgufType::I16: out.pod(static_cast<int16_t>(std::get<int64_t>(v.v))); break;
    case GgufType::I32: out.pod(static_cast<int32_t>(std::get<int64_t>(v.v))); break;
    case GgufType::I64: out.pod(std::get<int64_t>(v.v)); break;
    case GgufType::F32: out.pod(static_cast<float>(std::get<double>(v.v))); break;
    case GgufType::F64: out.pod(std::get<double>(v.v)); break;
    case GgufType::BOOL: out.pod(static_cast<uint8_t>(std::get<bool>(v.v) ? 1 : 0)); break;
    case GgufType::STRING: out.string(std::get<std::string>(v.v)); break;
    case GgufType::ARRAY: {
      const GgufArray& a = *std::get<std::shared_ptr<GgufArray>>(v.v);
      out.pod(static_cast<uint32_t>(a.elem_type));
      out.pod<uint64_t>(a.items.size());
      for (const auto& item : a.items) write_value(out, item);
      break;
    }
  }
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment))
    fail("GGUF writer: alignment ", alignment, " is not a power of two");
}

void GgufWriter::set(const std::string& key, GgufValue value) {
  if (key.empty()) fail("GGUF writer: empty metadata key");
  check_value(key, value, 0);
  if (key == "general.alignment") {
    if (value.type != GgufType::U32 || std::get<uint64_t>(value.v) != alignment_) {
      fail("GGUF writer: general.alignment must be the u32 ", alignment_,
           " given to the writer's constructor");
    }
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

namespace {

size_t checked_nbytes(const std::string& name, GgmlType type, const std::vector<int64_t>& ne) {
  if (name.empty()) fail("GGUF writer: tensor with an empty name");
  if (ne.empty() || ne.size() > 4) fail("GGUF writer: tensor '", name, "': ", ne.size(), " dimensions (1 to 4 allowed)");
  const TypeTraits* traits = find_type(static_cast<uint32_t>(type));
  if (traits == nullptr) fail("GGUF writer: tensor '", name, "': unsupported type id ", static_cast<uint32_t>(type));
  uint64_t rows = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0) fail("GGUF writer: tensor '", name, "': dimension ", d, " is ", ne[d]);
    if (d > 0 && __builtin_mul_overflow(rows, static_cast<uint64_t>(ne[d]), &rows))
      fail("GGUF writer: tensor '", name, "': size overflows");
  }
  if (ne[0] % traits->block_elems != 0) {
    fail("GGUF writer: tensor '", name, "': row length ", ne[0], " is not a multiple of the ", traits->name,
         " block size ", traits->block_elems);
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(row_bytes(type, ne[0]), rows, &nbytes)) fail("GGUF writer: tensor '", name, "': size overflows");
  return static_cast<size_t>(nbytes);
}

}  // namespace

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                            const void* data, size_t nbytes) {
  const size_t expected = checked_nbytes(name, type, ne);
  if (nbytes != expected) {
    fail("GGUF writer: tensor '", name, "': ", nbytes, " bytes given but ", type_traits(type).name, " of shape ",
         ne.size(), "-d needs ", expected);
  }
  if (data == nullptr && nbytes > 0) fail("GGUF writer: tensor '", name, "': null data");
  Fill none;
  add_tensor(name, type, ne, none);
  tensors_.back().bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + nbytes);
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, Fill fill) {
  const size_t nbytes = checked_nbytes(name, type, ne);
  for (const auto& t : tensors_) {
    if (t.name == name) fail("GGUF writer: duplicate tensor name '", name, "'");
  }
  tensors_.push_back(Pending{name, type, ne, nbytes, {}, std::move(fill)});
}

void GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  try {
    Out out(tmp);
    // general.alignment is written only when it differs from the default the reader assumes.
    bool have_alignment_key = false;
    for (const auto& kv : metadata_) have_alignment_key |= kv.first == "general.alignment";
    const bool add_alignment_key = !have_alignment_key && alignment_ != 32;

    out.bytes("GGUF", 4);
    out.pod<uint32_t>(3);
    out.pod<uint64_t>(tensors_.size());
    out.pod<uint64_t>(metadata_.size() + (add_alignment_key ? 1 : 0));
    if (add_alignment_key) {
      out.string("general.alignment");
      out.pod(static_cast<uint32_t>(GgufType::U32));
      out.pod<uint32_t>(alignment_);
    }
    for (const auto& [key, value] : metadata_) {
      out.string(key);
      out.pod(static_cast<uint32_t>(value.type));
      write_value(out, value);
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      out.string(t.name);
      out.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (int64_t d : t.ne) out.pod<uint64_t>(static_cast<uint64_t>(d));
      out.pod(static_cast<uint32_t>(t.type));
      out.pod<uint64_t>(offset);
      offset += (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
    }
    out.pad_to(alignment_);
    // One tensor's bytes at a time: memory use is bounded by the largest tensor, not the file. The
    // fill buffer is allocated once at the largest filled tensor's size and reused (zeroed before
    // each fill): a fresh multi-hundred-MiB allocation per tensor cost a page fault per 4 KiB, a
    // measurable share of `strata synth`'s time.
    size_t fill_capacity = 1;
    for (const auto& t : tensors_) {
      if (t.fill) fill_capacity = std::max(fill_capacity, t.nbytes);
    }
    // Overlapped (set_overlap_fill): each tensor's bytes are written on a helper thread while the
    // next tensor is filled, so a fast fill and the write syscalls run at the same time; two fill
    // buffers alternate and at most one write is in flight.
    std::unique_ptr<uint8_t[]> fill_buf[2];
    int next_buf = 0;
    std::future<void> writing;  // declared after `out` and fill_buf: its destructor waits first
    auto finish_writing = [&writing] {
      if (writing.valid()) writing.get();  // rethrows a write error here
    };
    for (const auto& t : tensors_) {
      const uint8_t* src = t.bytes.data();
      if (t.fill) {
        auto& buf = fill_buf[overlap_fill_ ? next_buf : 0];
        next_buf ^= 1;
        if (!buf) buf.reset(new uint8_t[fill_capacity]);
        std::memset(buf.get(), 0, t.nbytes);
        t.fill(buf.get(), t.nbytes);
        src = buf.get();
      }
      finish_writing();
      if (overlap_fill_) {
        writing = std::async(std::launch::async, [&out, src, n = t.nbytes, a = alignment_] {
          out.bytes(src, n);
          out.pad_to(a);
        });
      } else {
        out.bytes(src, t.nbytes);
        out.pad_to(alignment_);
      }
    }
    finish_writing();
    out.close();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail(path, ": cannot rename ", tmp, " into place: ", std::strerror(err));
  }
}

}  // namespace strata
