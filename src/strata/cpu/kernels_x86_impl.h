// SIMD decoders and float dots shared by kernels_avx2.cpp and kernels_avx512.cpp. Each of those
// files includes this after `#pragma GCC target(...)`, with STRATA_X86_512 set to 0 or 1; all of it
// sits in an anonymous namespace, so every file gets its own copy compiled for its instruction set
// (no inline function is shared between files, which could let AVX-512 code leak into the AVX2
// path at link time). Block layouts: strata/quant/blocks.h.
//
// Headers must be included by the .cpp BEFORE its target pragma: <immintrin.h>, <cstring>,
// "strata/cpu/cpu_kernels.h", "strata/quant/blocks.h", "strata/quant/fp16.h",
// "strata/quant/quantize.h". Nothing here may instantiate a template with external linkage (e.g.
// strata::fail): that instance could be compiled for the wider instruction set and then picked by
// the linker for every caller.

namespace strata {
namespace {

using namespace blocks;

#if STRATA_X86_512
using VecF = __m512;
constexpr int kLanes = 16;
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline float vsum(VecF v) { return _mm512_reduce_add_ps(v); }
#else
using VecF = __m256;
constexpr int kLanes = 8;
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline float vsum(VecF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// out[i] = scale * q[i] + bias for 16 signed bytes q.
inline void expand16(__m128i q, float scale, float bias, float* out) {
#if STRATA_X86_512
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  _mm512_storeu_ps(out, _mm512_fmadd_ps(f, _mm512_set1_ps(scale), _mm512_set1_ps(bias)));
#else
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
  const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
  _mm256_storeu_ps(out, _mm256_fmadd_ps(f0, s, b));
  _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(f1, s, b));
#endif
}

// 32 signed bytes: the first 16 with (s0, b0), the last 16 with (s1, b1).
inline void expand32(__m256i q, float s0, float b0, float s1, float b1, float* out) {
  expand16(_mm256_castsi256_si128(q), s0, b0, out);
  expand16(_mm256_extracti128_si256(q, 1), s1, b1, out + 16);
}

inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i low_nibbles(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
inline __m256i high_nibbles(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }

// The 16 quant bytes of a 32-weight block as 32 nibble codes in weight order (0..15 low, then high).
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i b = load128(qs);
  const __m128i m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

// Byte j (0..31) = 0x10 when bit j of qh is set, else 0 (Q5_0/Q5_1 fifth bits).
inline __m256i qh_bits_to_0x10(uint32_t qh) {
  const __m256i v = _mm256_set1_epi32(static_cast<int>(qh));
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline __m128i lookup16(__m128i table, __m128i nib) { return _mm_shuffle_epi8(table, nib); }

void decode_f16(const uint8_t* p, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(load128(p + 2 * i)));
  for (; i < n; ++i) y[i] = fp16_to_fp32(load_u16(p + 2 * i));
}

void decode_bf16(const uint8_t* p, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p + 2 * i)), 16);
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) y[i] = bf16_to_fp32(load_u16(p + 2 * i));
}

void decode_q8_0(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q8_0), y += kQK) {
    const float d = fp16_to_fp32(load_u16(p));
    expand32(load256(p + 2), d, 0.0f, d, 0.0f, y);
  }
}

void decode_q4_0(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q4_0), y += kQK) {
    const float d = fp16_to_fp32(load_u16(p));
    expand32(nibbles32(p + 2), d, -8.0f * d, d, -8.0f * d, y);
  }
}

void decode_q4_1(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q4_1), y += kQK) {
    const float d = fp16_to_fp32(load_u16(p)), m = fp16_to_fp32(load_u16(p + 2));
    expand32(nibbles32(p + 4), d, m, d, m, y);
  }
}

void decode_q5_0(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q5_0), y += kQK) {
    const float d = fp16_to_fp32(load_u16(p));
    const __m256i q = _mm256_or_si256(nibbles32(p + 6), qh_bits_to_0x10(load_u32(p + 2)));
    expand32(q, d, -16.0f * d, d, -16.0f * d, y);
  }
}

void decode_q5_1(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q5_1), y += kQK) {
    const float d = fp16_to_fp32(load_u16(p)), m = fp16_to_fp32(load_u16(p + 2));
    const __m256i q = _mm256_or_si256(nibbles32(p + 8), qh_bits_to_0x10(load_u32(p + 4)));
    expand32(q, d, m, d, m, y);
  }
}

void decode_iq4_nl(const uint8_t* p, float* y, int64_t nb) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
  const __m128i m = _mm_set1_epi8(15);
  for (int64_t b = 0; b < nb; ++b, p += sizeof(IQ4_NL), y += kQK) {
    const float d = fp16_to_fp32(load_u16(p));
    const __m128i bytes = load128(p + 2);
    expand16(lookup16(table, _mm_and_si128(bytes, m)), d, 0.0f, y);
    expand16(lookup16(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), m)), d, 0.0f, y + 16);
  }
}

void decode_mxfp4(const uint8_t* p, float* y, int64_t nb) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1TimesTwo));
  const __m128i m = _mm_set1_epi8(15);
  for (int64_t b = 0; b < nb; ++b, p += sizeof(MXFP4), y += kQK) {
    const float d = e8m0_half(p[0]);
    const __m128i bytes = load128(p + 1);
    expand16(lookup16(table, _mm_and_si128(bytes, m)), d, 0.0f, y);
    expand16(lookup16(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), m)), d, 0.0f, y + 16);
  }
}

// Q4_K and Q5_K: chunk c of 32 code bytes holds sub-block 2c (low nibbles) and 2c+1 (high).
template <bool kFive>
void decode_k4(const uint8_t* p, float* y, int64_t nb) {
  constexpr size_t kBytes = kFive ? sizeof(Q5_K) : sizeof(Q4_K);
  for (int64_t b = 0; b < nb; ++b, p += kBytes, y += kQK_K) {
    const float d = fp16_to_fp32(load_u16(p)), dmin = fp16_to_fp32(load_u16(p + 2));
    const uint8_t* scales = p + 4;
    const uint8_t* qs = p + (kFive ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load256(p + 16);
    const __m256i one = _mm256_set1_epi8(1);
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes = load256(qs + 32 * c);
      __m256i lo = low_nibbles(bytes), hi = high_nibbles(bytes);
      if constexpr (kFive) {
        // Bit sb of qh[l] is bit 4 of weight 32*sb + l.
        const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
      }
      uint8_t sc, m;
      k4_scale_min(scales, 2 * c, sc, m);
      const float dl0 = d * sc, ml0 = -(dmin * m);
      k4_scale_min(scales, 2 * c + 1, sc, m);
      const float dl1 = d * sc, ml1 = -(dmin * m);
      expand32(lo, dl0, ml0, dl0, ml0, y + 64 * c);
      expand32(hi, dl1, ml1, dl1, ml1, y + 64 * c + 32);
    }
  }
}

// Q6_K: half n, quarter k: low nibble of ql[64n + 32(k&1) + l] (high nibble for k >= 2) and bits
// 2k..2k+1 of qh[32n + l], minus 32; sub-block scales 8n + 2k (l < 16) and 8n + 2k + 1.
void decode_q6_k(const uint8_t* p, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q6_K), y += kQK_K) {
    const float d = fp16_to_fp32(load_u16(p + 208));
    const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
    const __m256i three = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
    for (int n = 0; n < 2; ++n) {
      const __m256i ql0 = load256(p + 64 * n), ql1 = load256(p + 64 * n + 32);
      const __m256i qh = load256(p + 128 + 32 * n);
      const __m256i lows[4] = {low_nibbles(ql0), low_nibbles(ql1), high_nibbles(ql0), high_nibbles(ql1)};
      const __m256i highs[4] = {_mm256_and_si256(qh, three), _mm256_and_si256(_mm256_srli_epi16(qh, 2), three),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 4), three),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 6), three)};
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lows[k], _mm256_slli_epi16(highs[k], 4)), bias);
        const float s0 = d * static_cast<float>(sc[8 * n + 2 * k]);
        const float s1 = d * static_cast<float>(sc[8 * n + 2 * k + 1]);
        expand32(q, s0, 0.0f, s1, 0.0f, y + 128 * n + 32 * k);
      }
    }
  }
}

void decode_row_simd(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16: decode_f16(src, dst, n); return;
    case GgmlType::BF16: decode_bf16(src, dst, n); return;
    case GgmlType::Q8_0: decode_q8_0(src, dst, n / kQK); return;
    case GgmlType::Q4_0: decode_q4_0(src, dst, n / kQK); return;
    case GgmlType::Q4_1: decode_q4_1(src, dst, n / kQK); return;
    case GgmlType::Q5_0: decode_q5_0(src, dst, n / kQK); return;
    case GgmlType::Q5_1: decode_q5_1(src, dst, n / kQK); return;
    case GgmlType::IQ4_NL: decode_iq4_nl(src, dst, n / kQK); return;
    case GgmlType::MXFP4: decode_mxfp4(src, dst, n / kQK); return;
    case GgmlType::Q4_K: decode_k4<false>(src, dst, n / kQK_K); return;
    case GgmlType::Q5_K: decode_k4<true>(src, dst, n / kQK_K); return;
    case GgmlType::Q6_K: decode_q6_k(src, dst, n / kQK_K); return;
    default:
      // Q2_K, Q3_K (small "XL" files only) and Q8_K use the scalar decoder; the dot stays SIMD.
      dequantize_row(type, src, dst, n);
      return;
  }
}

// R rows against one x, two vector accumulators per row so FMA latency is hidden.
template <int R>
void dot_rows_t(const float* const* rows, const float* x, int64_t n, float* out) {
  VecF acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = vzero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const VecF x0 = vload(x + i), x1 = vload(x + i + kLanes);
    for (int r = 0; r < R; ++r) {
      acc0[r] = vfma(vload(rows[r] + i), x0, acc0[r]);
      acc1[r] = vfma(vload(rows[r] + i + kLanes), x1, acc1[r]);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    const VecF x0 = vload(x + i);
    for (int r = 0; r < R; ++r) acc0[r] = vfma(vload(rows[r] + i), x0, acc0[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = vsum(vadd(acc0[r], acc1[r]));
    for (int64_t j = i; j < n; ++j) s += rows[r][j] * x[j];
    out[r] = s;
  }
}

void dot_rows_simd(const float* const* rows, int nr, const float* x, int64_t n, float* out) {
  switch (nr) {
    case 4: dot_rows_t<4>(rows, x, n, out); return;
    case 3: dot_rows_t<3>(rows, x, n, out); return;
    case 2: dot_rows_t<2>(rows, x, n, out); return;
    default:
      for (int r = 0; r < nr; ++r) dot_rows_t<1>(rows + r, x, n, out + r);
      return;
  }
}

// Q8_0 on the float path without the decode buffer (dot_rows_direct): the weights are expanded in
// registers exactly as decode_q8_0 expands them (fma(q, d, 0)) and summed in dot_rows_t's order
// (acc0 takes lanes [i, i + kLanes), acc1 the next kLanes, per step of 2 * kLanes), so the results
// are bitwise those of decode_row + dot_rows.
inline VecF q8_lanes_to_float(const uint8_t* q) {
#if STRATA_X86_512
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(q)));
#else
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
#endif
}

// Software prefetch distance for the kernels that stream quantised rows once (decode): the rows of a
// tile and the tiles after it are contiguous in the file, so the bytes this far past the block being
// read come next; asking for them early keeps more of DRAM's latency hidden than the hardware
// prefetchers alone do. Prefetches never fault, so running past the matrix's end is harmless.
constexpr size_t kPrefetchAhead = 2048;

// Prefetches the cache lines of kBytes bytes at p + ahead.
template <size_t kBytes>
inline void prefetch_ahead(const uint8_t* p, size_t ahead = kPrefetchAhead) {
  for (size_t off = 0; off < kBytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + ahead + off), _MM_HINT_T0);
}

template <int R>
void dot_rows_q8_0_t(const uint8_t* const* rows, const float* x, int64_t n, float* out) {
  static_assert(kQK % (2 * kLanes) == 0, "a Q8_0 block must hold whole steps of dot_rows_t");
  VecF acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = vzero();
  // The R rows are read side by side: the same place in the next tile's rows (the rows that follow
  // these in the matrix) is what a stream of tiles reads next.
  const size_t ahead = static_cast<size_t>(R) * static_cast<size_t>(n / kQK) * sizeof(Q8_0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + kQK * b;
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = rows[r] + static_cast<size_t>(b) * sizeof(Q8_0);
      prefetch_ahead<sizeof(Q8_0)>(p, ahead);
#if STRATA_X86_512
      const VecF d = _mm512_set1_ps(_cvtsh_ss(load_u16(p)));
#else
      const VecF d = _mm256_set1_ps(_cvtsh_ss(load_u16(p)));
#endif
      for (int j = 0; j < kQK / kLanes; j += 2) {
        acc0[r] = vfma(vfma(q8_lanes_to_float(p + 2 + kLanes * j), d, vzero()), vload(xb + kLanes * j), acc0[r]);
        acc1[r] = vfma(vfma(q8_lanes_to_float(p + 2 + kLanes * (j + 1)), d, vzero()), vload(xb + kLanes * (j + 1)),
                       acc1[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = vsum(vadd(acc0[r], acc1[r]));
}

bool direct_float(GgmlType type) { return type == GgmlType::Q8_0; }

void dot_rows_direct(GgmlType type, const uint8_t* const* rows, int nr, const float* x, int64_t n, float* out) {
  if (type != GgmlType::Q8_0) fail_kernel_type("float path: no direct kernel", type);
  switch (nr) {
    case 4: dot_rows_q8_0_t<4>(rows, x, n, out); return;
    case 3: dot_rows_q8_0_t<3>(rows, x, n, out); return;
    case 2: dot_rows_q8_0_t<2>(rows, x, n, out); return;
    default:
      for (int r = 0; r < nr; ++r) dot_rows_q8_0_t<1>(rows + r, x, n, out + r);
      return;
  }
}

// ------------------------------------------------------------------------------------------
// int8 path (see cpu_kernels.h): unpacking weights to codes + per-16 scales/biases, integer dots.

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline void store256(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// scales8 for one 32-weight block: s0 for the first 16 weights (4 lanes), s1 for the last 16.
inline void put_scales(float* scales8, float s0, float s1) {
  _mm256_storeu_ps(scales8, _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)));
}

I8Format i8_format(GgmlType type) {
  switch (type) {
    // Q8_0 stays on the float path on purpose: its weights are precise enough that int8
    // activations would dominate its error (the engine checks Q8_0 against the same model
    // dequantised to F32). For 4-6 bit weights the activation rounding is small beside theirs.
    case GgmlType::Q4_0: return {true, true, false, type};
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return {true, true, cpu_fused_path(), type};
    default: return {};
  }
}

template <bool kFive>
void unpack_k4(const uint8_t* p, int64_t nb, uint8_t* codes, float* scales8, float* bias16) {
  constexpr size_t kBytes = kFive ? sizeof(Q5_K) : sizeof(Q4_K);
  for (int64_t b = 0; b < nb; ++b, p += kBytes, codes += kQK_K, scales8 += kQK_K / 4, bias16 += kQK_K / 16) {
    const float d = fp16_to_fp32(load_u16(p)), dmin = fp16_to_fp32(load_u16(p + 2));
    const uint8_t* qs = p + (kFive ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load256(p + 16);
    const __m256i one = _mm256_set1_epi8(1);
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes = load256(qs + 32 * c);
      __m256i lo = low_nibbles(bytes), hi = high_nibbles(bytes);
      if constexpr (kFive) {
        const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
      }
      store256(codes + 64 * c, lo);
      store256(codes + 64 * c + 32, hi);
    }
    // The eight 6-bit scales and mins, four at a time in 32-bit words (same packing as
    // k4_scale_min): bytes 0-3 hold sc0-3 (+ high bits of sc4-7), 4-7 m0-3 (+ high bits of
    // m4-7), 8-11 the low nibbles of sc4-7 and m4-7.
    const uint32_t a = load_u32(p + 4), bw = load_u32(p + 8), cw = load_u32(p + 12);
    const uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = bw & 0x3f3f3f3fu;
    const uint32_t sc_hi = (cw & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((cw >> 4) & 0x0f0f0f0fu) | (((bw >> 6) & 0x03030303u) << 4);
    const __m128i sc8 = _mm_cvtsi64_si128(static_cast<long long>(sc_lo | (static_cast<uint64_t>(sc_hi) << 32)));
    const __m128i m8 = _mm_cvtsi64_si128(static_cast<long long>(m_lo | (static_cast<uint64_t>(m_hi) << 32)));
    const __m256 scales = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc8)), _mm256_set1_ps(d));
    const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m8)), _mm256_set1_ps(-dmin));
    for (int j = 0; j < 8; ++j)
      _mm256_storeu_ps(scales8 + 8 * j, _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(j)));
    _mm256_storeu_ps(bias16, _mm256_permutevar8x32_ps(mins, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
    _mm256_storeu_ps(bias16 + 8, _mm256_permutevar8x32_ps(mins, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
  }
}

void unpack_q6_k(const uint8_t* p, int64_t nb, uint8_t* codes, float* scales8, float* bias16) {
  for (int64_t b = 0; b < nb; ++b, p += sizeof(Q6_K), codes += kQK_K, scales8 += kQK_K / 4, bias16 += kQK_K / 16) {
    const float d = fp16_to_fp32(load_u16(p + 208));
    const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
    const __m256i three = _mm256_set1_epi8(3);
    for (int n = 0; n < 2; ++n) {
      const __m256i ql0 = load256(p + 64 * n), ql1 = load256(p + 64 * n + 32);
      const __m256i qh = load256(p + 128 + 32 * n);
      const __m256i lows[4] = {low_nibbles(ql0), low_nibbles(ql1), high_nibbles(ql0), high_nibbles(ql1)};
      for (int k = 0; k < 4; ++k) {
        const __m256i high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), three);
        store256(codes + 128 * n + 32 * k, _mm256_or_si256(lows[k], _mm256_slli_epi16(high, 4)));
      }
    }
    // Sixteen signed scales of 16 weights; block k of 32 gets lanes [2k x4, 2k+1 x4].
    const __m256 s_lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                          reinterpret_cast<const __m128i*>(sc)))), _mm256_set1_ps(d));
    const __m256 s_hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                          reinterpret_cast<const __m128i*>(sc + 8)))), _mm256_set1_ps(d));
    for (int k = 0; k < 8; ++k) {
      const __m256 src = k < 4 ? s_lo : s_hi;
      const int i = 2 * (k % 4);
      const __m256i idx = _mm256_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1);
      _mm256_storeu_ps(scales8 + 8 * k, _mm256_permutevar8x32_ps(src, idx));
    }
    // Codes are stored 0..63; the decoder subtracts 32.
    _mm256_storeu_ps(bias16, _mm256_mul_ps(s_lo, _mm256_set1_ps(-32.0f)));
    _mm256_storeu_ps(bias16 + 8, _mm256_mul_ps(s_hi, _mm256_set1_ps(-32.0f)));
  }
}

void unpack_i8(GgmlType type, const uint8_t* src, int64_t n, uint8_t* codes, float* scales8, float* bias16) {
  if (i8_format(type).fused) {
    // Fused formats are dotted straight from their blocks: the raw row is the "unpacked" form.
    std::memcpy(codes, src, static_cast<size_t>(n / kQK_K) * (type == GgmlType::Q4_K   ? sizeof(Q4_K)
                                                              : type == GgmlType::Q5_K ? sizeof(Q5_K)
                                                                                       : sizeof(Q6_K)));
    return;
  }
  switch (type) {
    case GgmlType::Q4_0:
      for (int64_t b = 0; b < n / kQK; ++b, src += sizeof(Q4_0)) {
        const float d = fp16_to_fp32(load_u16(src));
        store256(codes + 32 * b, nibbles32(src + 2));
        put_scales(scales8 + 8 * b, d, d);
        bias16[2 * b] = bias16[2 * b + 1] = -8.0f * d;
      }
      return;
    case GgmlType::Q4_K: unpack_k4<false>(src, n / kQK_K, codes, scales8, bias16); return;
    case GgmlType::Q5_K: unpack_k4<true>(src, n / kQK_K, codes, scales8, bias16); return;
    case GgmlType::Q6_K: unpack_q6_k(src, n / kQK_K, codes, scales8, bias16); return;
    default: fail_kernel_type("int8 path: no unpacker", type);
  }
}

// Sum of u[i]*s[i] over each group of 4 bytes, as 8 int32 lanes (lanes 0-3: bytes 0-15).
// u is unsigned (codes 0..63, so maddubs' 16-bit pair sums cannot saturate), s signed.
inline __m256i int_dot32(__m256i u, __m256i s) {
#if STRATA_X86_512
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

template <int R>
void dot_i8_t(const I8Row* rows, const I8Act& x, int64_t n, bool has_bias, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t nb = n / 32;
  int64_t b = 0;
#if STRATA_X86_512
  // Two blocks (64 codes) per step with 512-bit VNNI; the scale vector is 8 lanes of block b's
  // activation scale followed by 8 of block b+1's.
  __m512 acc2[R];
  for (int r = 0; r < R; ++r) acc2[r] = _mm512_setzero_ps();
  const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (; b + 2 <= nb; b += 2) {
    const __m512i xv = _mm512_loadu_si512(x.q + 32 * b);
    const __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.d32 + b)));
    const __m512 dx = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(d2));
    for (int r = 0; r < R; ++r) {
      const __m512i w = _mm512_loadu_si512(rows[r].codes + 32 * b);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
      const __m512 scale = _mm512_mul_ps(_mm512_loadu_ps(rows[r].scales8 + 8 * b), dx);
      acc2[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc2[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    // Fold the 512-bit accumulator into the 256-bit one (lane order does not matter for a sum).
    const __m256 lo = _mm512_castps512_ps256(acc2[r]);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc2[r]), 1));
    acc[r] = _mm256_add_ps(lo, hi);
  }
#endif
  for (; b < nb; ++b) {
    const __m256i xv = load256(reinterpret_cast<const uint8_t*>(x.q) + 32 * b);
    const __m256 dx = _mm256_broadcast_ss(x.d32 + b);
    for (int r = 0; r < R; ++r) {
      const __m256i p = int_dot32(load256(rows[r].codes + 32 * b), xv);
      const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(rows[r].scales8 + 8 * b), dx);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum256(acc[r]);
    if (has_bias) {
      const int64_t nh = n / 16;
      __m256 bacc = _mm256_setzero_ps();
      int64_t h = 0;
      for (; h + 8 <= nh; h += 8)
        bacc = _mm256_fmadd_ps(_mm256_loadu_ps(rows[r].bias16 + h), _mm256_loadu_ps(x.sum16 + h), bacc);
      s += hsum256(bacc);
      for (; h < nh; ++h) s += rows[r].bias16[h] * x.sum16[h];
    }
    out[r] = s;
  }
}

void dot_rows_fused(GgmlType type, const uint8_t* const* rows, int nr, const I8Act& x, int64_t n, float* out);

void dot_rows_i8(const I8Row* rows, int nr, const I8Act& x, int64_t n, I8Format fmt, float* out) {
  if (fmt.fused) {  // codes hold raw rows (unpack_i8)
    const uint8_t* raw[kMaxDotRows];
    for (int r = 0; r < nr; ++r) raw[r] = rows[r].codes;
    dot_rows_fused(fmt.type, raw, nr, x, n, out);
    return;
  }
  switch (nr) {
    case 4: dot_i8_t<4>(rows, x, n, fmt.has_bias, out); return;
    case 3: dot_i8_t<3>(rows, x, n, fmt.has_bias, out); return;
    case 2: dot_i8_t<2>(rows, x, n, fmt.has_bias, out); return;
    default:
      for (int r = 0; r < nr; ++r) dot_i8_t<1>(rows + r, x, n, fmt.has_bias, out + r);
      return;
  }
}

// quantize_activations_i8 with 8-wide floats: the same operations as the scalar code (one float
// division for d and for 1/d, x * inv rounded to nearest even by cvtps, clamp to +-127), so the
// results are bitwise equal (tests/test_matmul.cpp checks).
void quantize_act_simd(const float* x, int64_t n, int8_t* q, float* d32, float* sum16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                             _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 iv = _mm256_set1_ps(inv);
    const auto quant = [&](__m256 v) {
      return _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, iv)), lim), nlim);
    };
    const __m256i q0 = quant(v0), q1 = quant(v1), q2 = quant(v2), q3 = quant(v3);
    // packs work per 128-bit lane: bytes come out as q0[0:4] q1[0:4] q2[0:4] q3[0:4] | q0[4:8] ...
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    store256(reinterpret_cast<uint8_t*>(q) + 32 * b,
             _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s01 = _mm256_add_epi32(q0, q1), s23 = _mm256_add_epi32(q2, q3);
    // hadd twice: lane 0 = sum of s01's lanes 0-3, lane 1 = s23's 0-3; lanes 4, 5 the upper halves.
    const __m256i h = _mm256_hadd_epi32(s01, s23);
    const __m256i hh = _mm256_hadd_epi32(h, h);
    const int sum0 = _mm256_extract_epi32(hh, 0) + _mm256_extract_epi32(hh, 4);
    const int sum1 = _mm256_extract_epi32(hh, 1) + _mm256_extract_epi32(hh, 5);
    d32[b] = d;
    sum16[2 * b] = d * static_cast<float>(sum0);
    sum16[2 * b + 1] = d * static_cast<float>(sum1);
  }
}

// ------------------------------------------------------------------------------------------
// Fused int8 path (dot_rows_fused): integer dots straight on the K-quant blocks.
// Per super-block of 256 weights (8 activation blocks of 32): one int32 vector of eight lanes per
// activation block (int_dot32 of 32 unsigned codes with 32 signed activations: vpdpbusd at the
// AVX-512 level, maddubs + madd at AVX2), a horizontal reduction to one vector whose lane j is
// block j's integer sum (two vectors of per-16 sums for Q6_K's per-16 scales), then one float FMA
// with the per-block scales (weight scale x activation scale d32). The additive terms (Q4_K/Q5_K
// mins, Q6_K's -32) use the activation sums x.sum16. All integer sums are exact.
// Block layouts: strata/quant/blocks.h (facts from the GGUF spec / ggml's block definitions).

// Lane j of the result = sum of the 8 lanes of p[j] (j = 0..7).
inline __m256i reduce8x8(const __m256i* p) {
  const __m256i h0 = _mm256_hadd_epi32(p[0], p[1]), h1 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i h2 = _mm256_hadd_epi32(p[4], p[5]), h3 = _mm256_hadd_epi32(p[6], p[7]);
  // g0 = [p0..p3 lanes 0-3 | p0..p3 lanes 4-7], g1 the same for p4..p7.
  const __m256i g0 = _mm256_hadd_epi32(h0, h1), g1 = _mm256_hadd_epi32(h2, h3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

// Two fp16 values at p (d, then dmin) as floats in lanes 0 and 1 (F16C conversion is exact).
inline __m128 load_2xf16(const uint8_t* p) { return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(p)))); }

// Activation sums of the eight 32-blocks of a super-block (lane j = sum16[2j] + sum16[2j+1]).
inline __m256 act_block_sums(const float* sum16) {
  const __m256 h = _mm256_hadd_ps(_mm256_loadu_ps(sum16), _mm256_loadu_ps(sum16 + 8));
  // h = [j0 j1 j4 j5 | j2 j3 j6 j7]: put the 64-bit pairs back in order.
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0xD8));
}

// The eight 6-bit scales (lanes 0-7 of *sc) and mins of a Q4_K/Q5_K super-block, as int32 lanes
// (same packing as blocks::k4_scale_min, four at a time in 32-bit words).
inline void k4_scales_mins(const uint8_t* s, __m256i* sc, __m256i* mn) {
  const uint32_t a = load_u32(s), bw = load_u32(s + 4), cw = load_u32(s + 8);
  const uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = bw & 0x3f3f3f3fu;
  const uint32_t sc_hi = (cw & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((cw >> 4) & 0x0f0f0f0fu) | (((bw >> 6) & 0x03030303u) << 4);
  *sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(sc_lo | (static_cast<uint64_t>(sc_hi) << 32))));
  *mn = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(m_lo | (static_cast<uint64_t>(m_hi) << 32))));
}

// Super-block b of a Q4_K (kFive = false) or Q5_K row (p points at it) against x, added to acc.
template <bool kFive>
inline void fused_k4_block(const uint8_t* p, const I8Act& x, int64_t b, __m256& acc) {
  const __m256i m4 = _mm256_set1_epi8(15);
  const uint8_t* qs = p + (kFive ? 48 : 16);
  const uint8_t* xq = reinterpret_cast<const uint8_t*>(x.q) + kQK_K * b;
  __m256i qh = _mm256_setzero_si256();
  if constexpr (kFive) qh = load256(p + 16);
  __m256i dots[8];
  for (int c = 0; c < 4; ++c) {
    const __m256i bytes = load256(qs + 32 * c);
    __m256i lo = _mm256_and_si256(bytes, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
    if constexpr (kFive) {
      // Bit j of qh[l] is bit 4 of weight 32j + l; qh is shifted right by two per chunk, so the
      // bits wanted are always bits 0 and 1 of each byte (moved to bit 4 by the 16-bit shifts).
      const __m256i b4 = _mm256_set1_epi8(0x10);
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
      qh = _mm256_srli_epi16(qh, 2);
    }
    dots[2 * c] = int_dot32(lo, load256(xq + 64 * c));
    dots[2 * c + 1] = int_dot32(hi, load256(xq + 64 * c + 32));
  }
  const __m128 dm = load_2xf16(p);
  __m256i sc, mn;
  k4_scales_mins(p + 4, &sc, &mn);
  const __m256 d = _mm256_broadcastss_ps(dm), dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
  const __m256 scale = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sc), d), _mm256_loadu_ps(x.d32 + 8 * b));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8x8(dots)), scale, acc);
  // The mins: - dmin * m_j * (activation sum of block j).
  acc = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(mn), dmin), act_block_sums(x.sum16 + 16 * b), acc);
}

// Two vectors of the 16 per-16 sums of eight int32 vectors p[0..7] whose lanes 0-3 / 4-7 cover the
// first / second 16 values of activation block j: lo = [blocks 0-3 first halves | blocks 0-3 second
// halves], hi the same for blocks 4-7.
inline void reduce8x8_halves(const __m256i* p, __m256i* lo, __m256i* hi) {
  const __m256i h0 = _mm256_hadd_epi32(p[0], p[1]), h1 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i h2 = _mm256_hadd_epi32(p[4], p[5]), h3 = _mm256_hadd_epi32(p[6], p[7]);
  *lo = _mm256_hadd_epi32(h0, h1);
  *hi = _mm256_hadd_epi32(h2, h3);
}

// Super-block b of a Q6_K row (p points at it) against x, added to acc: weight = d * sc16 * (q - 32),
// q = 4 low bits (ql) | 2 high bits (qh) << 4, 0..63 (so maddubs' pair sums stay below 2^15).
// The 16 sub-block sums come out as [sub 0 2 4 6 | 1 3 5 7] and [8 10 12 14 | 9 11 13 15] (see
// reduce8x8_halves), so the scales are shuffled into that order and multiplied in float.
inline void fused_q6k_block(const uint8_t* p, const I8Act& x, int64_t b, __m256& acc) {
  const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const uint8_t* xq = reinterpret_cast<const uint8_t*>(x.q) + kQK_K * b;
  __m256i dots[8];
  for (int n = 0; n < 2; ++n) {
    const __m256i ql0 = load256(p + 64 * n), ql1 = load256(p + 64 * n + 32);
    const __m256i qh = load256(p + 128 + 32 * n);
    const __m256i lows[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
    // Bits 2k..2k+1 of qh moved straight to bits 4..5 (the 16-bit shifts only move other bits
    // across the byte boundary, and the mask drops them).
    const __m256i highs[4] = {_mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                              _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30), _mm256_and_si256(qh, m30),
                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)};
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_or_si256(lows[k], highs[k]);  // 0..63
      dots[4 * n + k] = int_dot32(q, load256(xq + 128 * n + 32 * k));
    }
  }
  __m256i sum_lo, sum_hi;
  reduce8x8_halves(dots, &sum_lo, &sum_hi);
  const __m128i sc8 = load128(p + 192);
  const __m128i sc_eo = _mm_shuffle_epi8(sc8, even_odd);
  const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(p + 208))));
  const __m256 dv = _mm256_set1_ps(d);
  // Activation scales of blocks 0-3 (4-7) in both halves, times d.
  const __m256 dx_lo = _mm256_mul_ps(_mm256_broadcast_ps(reinterpret_cast<const __m128*>(x.d32 + 8 * b)), dv);
  const __m256 dx_hi = _mm256_mul_ps(_mm256_broadcast_ps(reinterpret_cast<const __m128*>(x.d32 + 8 * b + 4)), dv);
  const __m256 sc_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc_eo));
  const __m256 sc_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc_eo, 8)));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lo), _mm256_mul_ps(sc_lo, dx_lo), acc);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_hi), _mm256_mul_ps(sc_hi, dx_hi), acc);
  // The -32 of every code: sum over the 16 sub-blocks of sc * (activation sum) * d * 32.
  const __m256 sf_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8));
  const __m256 sf_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8)));
  const __m256 bsum = _mm256_fmadd_ps(sf_lo, _mm256_loadu_ps(x.sum16 + 16 * b),
                                      _mm256_mul_ps(sf_hi, _mm256_loadu_ps(x.sum16 + 16 * b + 8)));
  acc = _mm256_fnmadd_ps(bsum, _mm256_mul_ps(dv, _mm256_set1_ps(32.0f)), acc);
}

// nr rows of nb super-blocks of kBytes each, one row after the other (interleaving rows super-block
// by super-block measured no faster on Zen and spills registers).
template <size_t kBytes, class Block>
void fused_tile(const uint8_t* const* rows, int nr, const I8Act& x, int64_t nb, Block block, float* out) {
  for (int r = 0; r < nr; ++r) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = rows[r] + static_cast<size_t>(b) * kBytes;
      prefetch_ahead<kBytes>(p);
      block(p, x, b, acc);
    }
    out[r] = hsum256(acc);
  }
}

void dot_rows_fused(GgmlType type, const uint8_t* const* rows, int nr, const I8Act& x, int64_t n, float* out) {
  const int64_t nb = n / kQK_K;
  // Lambdas (not function pointers) so that the block functions are inlined into fused_tile.
  const auto q4k = [](const uint8_t* p, const I8Act& a, int64_t b, __m256& acc) {
    fused_k4_block<false>(p, a, b, acc);
  };
  const auto q5k = [](const uint8_t* p, const I8Act& a, int64_t b, __m256& acc) {
    fused_k4_block<true>(p, a, b, acc);
  };
  const auto q6k = [](const uint8_t* p, const I8Act& a, int64_t b, __m256& acc) { fused_q6k_block(p, a, b, acc); };
  switch (type) {
    case GgmlType::Q4_K: fused_tile<sizeof(Q4_K)>(rows, nr, x, nb, q4k, out); return;
    case GgmlType::Q5_K: fused_tile<sizeof(Q5_K)>(rows, nr, x, nb, q5k, out); return;
    case GgmlType::Q6_K: fused_tile<sizeof(Q6_K)>(rows, nr, x, nb, q6k, out); return;
    default: fail_kernel_type("fused int8 path: no kernel", type);
  }
}

// ------------------------------------------------------------------------------------------
// Batched fused int8 path (dot_tile_fused; see cpu_kernels.h). A panel per row and super-block:
// eight 32-byte code vectors transposed to the activations' interleaved layout (interleave_act_i8),
// then six 8-float vectors of the row's scale terms. One int vector holds kTileG rows' eight
// lanes (two rows in a 512-bit vector, one in a 256-bit one); the tokens' 256-bit activation vectors
// are broadcast to match. Panels of the kTileG rows of a group sit side by side, vector by vector.
// The float steps per row and token are fused_k4_block's / fused_q6k_block's, lane for lane.

#if STRATA_X86_512
constexpr int kTileG = 2;
// Row groups x tokens per register tile: 4 rows x 4 tokens; Q6_K (two integer accumulators per
// row group and token) 4 x 3, which keeps its accumulators in the 32 registers.
constexpr int kTileRG = 2, kTileT = 4, kTileT6 = 3;
using TileI = __m512i;
using TileF = __m512;
inline TileI tile_load_w(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline TileI tile_bcast_x(const int8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline TileI tile_dot(TileI acc, TileI w, TileI x) { return _mm512_dpbusd_epi32(acc, w, x); }
inline TileI tile_izero() { return _mm512_setzero_si512(); }
inline TileF tile_fzero() { return _mm512_setzero_ps(); }
inline TileF tile_load_f(const float* p) { return _mm512_loadu_ps(p); }
inline TileF tile_bcast8(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(reinterpret_cast<const double*>(p))));
}
inline TileF tile_bcast4(const float* p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }
inline TileF tile_cvt(TileI v) { return _mm512_cvtepi32_ps(v); }
inline TileF tile_mul(TileF a, TileF b) { return _mm512_mul_ps(a, b); }
inline TileF tile_fmadd(TileF a, TileF b, TileF c) { return _mm512_fmadd_ps(a, b, c); }
inline TileF tile_fnmadd(TileF a, TileF b, TileF c) { return _mm512_fnmadd_ps(a, b, c); }
// Row g of the vector's eight lanes.
inline __m256 tile_row(TileF v, int g) {
  return g == 0 ? _mm512_castps512_ps256(v) : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
#else
constexpr int kTileG = 1;
constexpr int kTileRG = 2, kTileT = 2, kTileT6 = 2;
using TileI = __m256i;
using TileF = __m256;
inline TileI tile_load_w(const uint8_t* p) { return load256(p); }
inline TileI tile_bcast_x(const int8_t* p) { return load256(reinterpret_cast<const uint8_t*>(p)); }
inline TileI tile_dot(TileI acc, TileI w, TileI x) { return _mm256_add_epi32(acc, int_dot32(w, x)); }
inline TileI tile_izero() { return _mm256_setzero_si256(); }
inline TileF tile_fzero() { return _mm256_setzero_ps(); }
inline TileF tile_load_f(const float* p) { return _mm256_loadu_ps(p); }
inline TileF tile_bcast8(const float* p) { return _mm256_loadu_ps(p); }
inline TileF tile_bcast4(const float* p) { return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p)); }
inline TileF tile_cvt(TileI v) { return _mm256_cvtepi32_ps(v); }
inline TileF tile_mul(TileF a, TileF b) { return _mm256_mul_ps(a, b); }
inline TileF tile_fmadd(TileF a, TileF b, TileF c) { return _mm256_fmadd_ps(a, b, c); }
inline TileF tile_fnmadd(TileF a, TileF b, TileF c) { return _mm256_fnmadd_ps(a, b, c); }
inline __m256 tile_row(TileF v, int) { return v; }
#endif

constexpr int kTileRows = kTileG * kTileRG;  // rows of one register tile
static_assert(kMaxTileRows % kTileRows == 0, "a call's rows must be whole register tiles");
constexpr size_t kPanelCodes = 256;                 // code bytes per row and super-block
constexpr size_t kPanelRow = kPanelCodes + 6 * 32;  // plus six 8-float vectors
constexpr size_t kPanelGroup = kTileG * kPanelRow;
static_assert(kMaxTileRows * kPanelRow == 448 * kMaxTileRows, "fused_tile_scratch_bytes assumes 448 bytes a panel");

// Where row i's code vector v (v < 8) and float vector f (f < 6) go within a super-block's panels.
inline size_t panel_code(int i, int v) { return (i / kTileG) * kPanelGroup + v * kTileG * 32 + (i % kTileG) * 32; }
inline size_t panel_float(int i, int f) {
  return (i / kTileG) * kPanelGroup + kTileG * kPanelCodes + f * kTileG * 32 + (i % kTileG) * 32;
}

inline void store_f256(uint8_t* p, __m256 v) { _mm256_storeu_ps(reinterpret_cast<float*>(p), v); }

// One Q4_K/Q5_K super-block p of row i into the panels at sb: code vector k, lane j = the codes of
// weights 32j + 4k .. + 3 (block j = low nibbles of chunk j/2 for even j, high for odd j); floats 0
// and 1 = d * scale_j and dmin * min_j (fused_k4_block's terms).
template <bool kFive>
inline void panel_k4(const uint8_t* p, int i, uint8_t* sb) {
  const uint8_t* qs = p + (kFive ? 48 : 16);
  const __m256i q0 = load256(qs), q1 = load256(qs + 32), q2 = load256(qs + 64), q3 = load256(qs + 96);
  // 4 x 8 transpose of 32-bit groups: u[m] = [group m of chunks 0-3 | group m + 4 of chunks 0-3].
  const __m256i t0 = _mm256_unpacklo_epi32(q0, q1), t1 = _mm256_unpackhi_epi32(q0, q1);
  const __m256i t2 = _mm256_unpacklo_epi32(q2, q3), t3 = _mm256_unpackhi_epi32(q2, q3);
  const __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                        _mm256_unpackhi_epi64(t1, t3)};
  const __m256i nib_shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  const __m256i bit_shift = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  __m256i qh = _mm256_setzero_si256();
  if constexpr (kFive) qh = load256(p + 16);
  for (int k = 0; k < 8; ++k) {
    const int h = 4 * (k / 4);
    const __m256i pick = _mm256_setr_epi32(h, h, h + 1, h + 1, h + 2, h + 2, h + 3, h + 3);
    __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(u[k % 4], pick), nib_shift), m4);
    if constexpr (kFive) {
      // Bit j of qh[l] is bit 4 of weight 32j + l: group k of qh, shifted by the lane's block.
      const __m256i hb = _mm256_permutevar8x32_epi32(qh, _mm256_set1_epi32(k));
      v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(hb, bit_shift), one), 4));
    }
    store256(sb + panel_code(i, k), v);
  }
  const __m128 dm = load_2xf16(p);
  __m256i sc, mn;
  k4_scales_mins(p + 4, &sc, &mn);
  store_f256(sb + panel_float(i, 0), _mm256_mul_ps(_mm256_cvtepi32_ps(sc), _mm256_broadcastss_ps(dm)));
  store_f256(sb + panel_float(i, 1), _mm256_mul_ps(_mm256_cvtepi32_ps(mn), _mm256_broadcastss_ps(_mm_movehdup_ps(dm))));
}

// One Q6_K super-block p of row i: code vector 4n + u, lane l = the codes of group u + 4 (l / 4) of
// block 4n + l % 4 (block 4n + k: low bits from ql chunk 2n + (k & 1), high nibble for k >= 2; high
// bits from qh chunk n, bits 2k..2k+1); floats: d, the scales in the kernel's lane order (even/odd
// halves), the scales in natural order (the -32 term), d * 32 (fused_q6k_block's terms).
inline void panel_q6k(const uint8_t* p, int i, uint8_t* sb) {
  const __m256i m4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
  const __m256i lo_shift = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
  const __m256i hi_shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  for (int n = 0; n < 2; ++n) {
    const __m256i ql0 = load256(p + 64 * n), ql1 = load256(p + 64 * n + 32), qh = load256(p + 128 + 32 * n);
    for (int u = 0; u < 4; ++u) {
      const __m256i pick = _mm256_setr_epi32(u, u, u, u, u + 4, u + 4, u + 4, u + 4);
      const __m256i lo = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(ql0, pick),
                                            _mm256_permutevar8x32_epi32(ql1, pick), 0xAA);
      const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(qh, pick), hi_shift), three);
      store256(sb + panel_code(i, 4 * n + u),
               _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(lo, lo_shift), m4), _mm256_slli_epi32(hi, 4)));
    }
  }
  const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m128i sc8 = load128(p + 192);
  const __m128i sc_eo = _mm_shuffle_epi8(sc8, even_odd);
  const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(p + 208))));
  const __m256 dv = _mm256_set1_ps(d);
  store_f256(sb + panel_float(i, 0), dv);
  store_f256(sb + panel_float(i, 1), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc_eo)));
  store_f256(sb + panel_float(i, 2), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc_eo, 8))));
  store_f256(sb + panel_float(i, 3), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)));
  store_f256(sb + panel_float(i, 4), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))));
  store_f256(sb + panel_float(i, 5), _mm256_mul_ps(dv, _mm256_set1_ps(32.0f)));
}

// kTileRG row groups (panels at `panels`, super-block stride sb_bytes) x T tokens: each code vector
// loaded once per group and dotted with every token; per super-block the float steps of the
// per-token kernels. out[t][g * kTileG + row] for rows < nr.
template <bool kSix, int T>
void tile_kernel(const uint8_t* panels, size_t sb_bytes, int64_t nb, const I8TileAct* xs, int nr, float* const* out) {
  constexpr int kAcc = kSix ? 2 : 1;
  TileF acc[kTileRG][T];
  for (int g = 0; g < kTileRG; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = tile_fzero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb = panels + static_cast<size_t>(b) * sb_bytes;
    TileI dots[kTileRG][T][kAcc];
    for (int g = 0; g < kTileRG; ++g)
      for (int t = 0; t < T; ++t)
        for (int a = 0; a < kAcc; ++a) dots[g][t][a] = tile_izero();
    for (int v = 0; v < 8; ++v) {
      const int a = kSix ? v / 4 : 0;
      TileI xv[T];
      for (int t = 0; t < T; ++t) xv[t] = tile_bcast_x(xs[t].q + kQK_K * b + 32 * v);
      for (int g = 0; g < kTileRG; ++g) {
        const TileI w = tile_load_w(sb + g * kPanelGroup + v * kTileG * 32);
        for (int t = 0; t < T; ++t) dots[g][t][a] = tile_dot(dots[g][t][a], w, xv[t]);
      }
    }
    for (int g = 0; g < kTileRG; ++g) {
      const auto* f = reinterpret_cast<const float*>(sb + g * kPanelGroup + kTileG * kPanelCodes);
      constexpr int kF = kTileG * 8;  // floats per panel vector
      for (int t = 0; t < T; ++t) {
        const I8TileAct& x = xs[t];
        if constexpr (!kSix) {
          const TileF scale = tile_mul(tile_load_f(f), tile_bcast8(x.d32 + 8 * b));
          acc[g][t] = tile_fmadd(tile_cvt(dots[g][t][0]), scale, acc[g][t]);
          acc[g][t] = tile_fnmadd(tile_load_f(f + kF), tile_bcast8(x.bsum32 + 8 * b), acc[g][t]);
        } else {
          const TileF dv = tile_load_f(f);
          const TileF dx_lo = tile_mul(tile_bcast4(x.d32 + 8 * b), dv);
          const TileF dx_hi = tile_mul(tile_bcast4(x.d32 + 8 * b + 4), dv);
          acc[g][t] = tile_fmadd(tile_cvt(dots[g][t][0]), tile_mul(tile_load_f(f + kF), dx_lo), acc[g][t]);
          acc[g][t] = tile_fmadd(tile_cvt(dots[g][t][1]), tile_mul(tile_load_f(f + 2 * kF), dx_hi), acc[g][t]);
          const TileF bsum = tile_fmadd(tile_load_f(f + 3 * kF), tile_bcast8(x.sum16 + 16 * b),
                                        tile_mul(tile_load_f(f + 4 * kF), tile_bcast8(x.sum16 + 16 * b + 8)));
          acc[g][t] = tile_fnmadd(bsum, tile_load_f(f + 5 * kF), acc[g][t]);
        }
      }
    }
  }
  for (int g = 0; g < kTileRG; ++g)
    for (int r = 0; r < kTileG; ++r) {
      const int i = g * kTileG + r;
      if (i >= nr) continue;
      for (int t = 0; t < T; ++t) out[t][i] = hsum256(tile_row(acc[g][t], r));
    }
}

template <bool kSix, int T>
void tile_rows_of(const uint8_t* panels, size_t tile_bytes, size_t sb_bytes, int64_t nb, const I8TileAct* xs, int nr,
                  float* const* out) {
  for (int r0 = 0; r0 < nr; r0 += kTileRows) {
    float* outs[T];
    for (int t = 0; t < T; ++t) outs[t] = out[t] + r0;
    tile_kernel<kSix, T>(panels + static_cast<size_t>(r0 / kTileRows) * tile_bytes, sb_bytes, nb, xs,
                         nr - r0 < kTileRows ? nr - r0 : kTileRows, outs);
  }
}

// Token blocks outer, register row tiles inner: one block's activations stay in L1 while it meets
// every row of the call.
template <bool kSix>
void tile_tokens(const uint8_t* panels, size_t tile_bytes, size_t sb_bytes, int64_t nb, const I8TileAct* xs, int nt,
                 int nr, float* const* out) {
  constexpr int kT = kSix ? kTileT6 : kTileT;
  int t = 0;
  for (; t + kT <= nt; t += kT) tile_rows_of<kSix, kT>(panels, tile_bytes, sb_bytes, nb, xs + t, nr, out + t);
  // The remaining tokens as one narrower tile (no padding tokens computed).
  switch (nt - t) {
    case 1: tile_rows_of<kSix, 1>(panels, tile_bytes, sb_bytes, nb, xs + t, nr, out + t); return;
#if STRATA_X86_512
    case 2: tile_rows_of<kSix, 2>(panels, tile_bytes, sb_bytes, nb, xs + t, nr, out + t); return;
    case 3: tile_rows_of<kSix, 3>(panels, tile_bytes, sb_bytes, nb, xs + t, nr, out + t); return;
#endif
    default: return;
  }
}

void dot_tile_fused(GgmlType type, const uint8_t* const* rows, int nr, const I8TileAct* xs, int nt, int64_t n,
                    uint8_t* scratch, float* const* out) {
  if (!tile_fused_type(type)) fail_kernel_type("batched int8 path: no kernel", type);
  const int64_t nb = n / kQK_K;
  const size_t row_bytes = type == GgmlType::Q4_K ? sizeof(Q4_K) : type == GgmlType::Q5_K ? sizeof(Q5_K) : sizeof(Q6_K);
  // Panels 64-byte aligned (the scratch size allows for it); register row tile after tile, each
  // super-block after super-block.
  uint8_t* panels = scratch + (64 - reinterpret_cast<uintptr_t>(scratch) % 64) % 64;
  const size_t sb_bytes = kTileRows * kPanelRow, tile_bytes = static_cast<size_t>(nb) * sb_bytes;
  const int padded = (nr + kTileRows - 1) / kTileRows * kTileRows;
  for (int i = 0; i < padded; ++i) {
    // Rows past the last are computed on a copy of the first row and not stored.
    const uint8_t* row = rows[i < nr ? i : 0];
    uint8_t* tile = panels + static_cast<size_t>(i / kTileRows) * tile_bytes;
    const int ti = i % kTileRows;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = row + static_cast<size_t>(b) * row_bytes;
      // The rows are read once here, in file order (as the decode kernels read them).
      for (size_t off = 0; off < row_bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead + off), _MM_HINT_T0);
      uint8_t* sb = tile + static_cast<size_t>(b) * sb_bytes;
      if (type == GgmlType::Q4_K)
        panel_k4<false>(p, ti, sb);
      else if (type == GgmlType::Q5_K)
        panel_k4<true>(p, ti, sb);
      else
        panel_q6k(p, ti, sb);
    }
  }
  if (type == GgmlType::Q6_K)
    tile_tokens<true>(panels, tile_bytes, sb_bytes, nb, xs, nt, nr, out);
  else
    tile_tokens<false>(panels, tile_bytes, sb_bytes, nb, xs, nt, nr, out);
}

}  // namespace
}  // namespace strata
