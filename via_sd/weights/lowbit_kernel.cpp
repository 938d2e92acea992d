// The low-bit matmuls of the CPU verifier and drafter: y = x @ W.T for int4 (GGUF's Q4_K), int6 (Q6_K) and int8 (per
// channel) weights, with the activations quantized to int8 per row and group of 32 (as llama.cpp's Q4 x Q8 dot
// products do), multiplied in integers, then scaled in fp32. int4 and int6 hold the GGUF's values exactly (tiles.py).
//
// One arithmetic, three instruction sets. Every path computes, for each output n and row r, exactly:
//     P_g  = the group's integer dot product sum_j q[n, 32g + j] * a[r, 32g + j]        (exact int32)
//     int4: acc = fma(float(P_g) * sa_g, s[n, g], acc);  acc = fma(m[n, g], b_g, acc)  over g in order; y = acc
//           with s = d * sc and m = dm * mn (fp16 d, dm per 256 inputs, 6-bit sc, mn per 32: exact in fp32)
//     int6: D_g = sc[n, 2g] P_g,0 + sc[n, 2g + 1] P_g,1 (exact int32; P_g,h over 16 inputs, codes q - 32, int8 sc)
//           acc = fma(float(D_g) * sa_g, d[n, g / 8], acc) over g in order; y = acc
//     int8: acc = fma(float(P_g), sa_g, acc) over g in order;  y = scale[n] * acc
// with sa_g the activations' scale and b_g = sa_g * float(sum of the group's activation codes). So AVX-512 VNNI,
// AVX2 and the generic loop give the same bits, and a row's result never depends on the other rows of the call,
// the thread count or the machine. Built with -ffp-contract=off: nothing is fused unless written as fma.
//
// One call runs any group of such weights over one input (a layer's q, k and v: Q4_K and Q6_K side by side; its gate
// and up), one quantization for them all, each part's bias and a residual added at the end (Linears, tiles_mm);
// attention_sublayer and mlp_sublayer run a decoder layer's two halves each in one call (lean_forward.py).
//
// The weights of 16 outputs sit side by side, four inputs at a time (the layout VNNI's dot product of four bytes
// wants), so one register multiplies 16 outputs by one broadcast quad of activations and a group's sums come out
// whole: the weights are read once per call whatever the rows, and each row costs a few instructions per 512 MACs.
//   int4 codes   uint8 [N/16, G, 256]: byte (64 jp + 4 o + i): low nibble q[16t + o, 32g + 8jp + i],
//                                      high nibble q[16t + o, 32g + 8jp + 4 + i]
//   int4 scales  uint8 [N/16, ceil(G/8), 256]: per super-block of 8 groups (the last may hold fewer), the tile's
//                16 outputs o side by side: bytes 0..31 d, 32..63 dm (fp16); group j's sc: low 4 bits in byte
//                64 + 16 (j / 2) + o (nibble j % 2), high 2 bits at bit 2 (j % 4) of byte 192 + 16 (j / 4) + o;
//                mn the same at 128 and 224
//   int6 codes   uint8 [N/16, G, 384]: bytes 0..255 the low 4 bits as int4's; byte 256 + 64 h + 4 o + i, bits
//                2k: the high 2 bits of q[16t + o, 32g + 16h + 4k + i]
//   int6 scales  uint8 [N/16, G/8, 288]: d (fp16 [16]), then int8 sc of sub-block u (16 inputs) at 32 + 16 u + o
//   int8 codes   uint8 [N/16, G, 512]:  byte (64 j + 4 o + i) = w[16t + o, 32g + 4j + i] + 128
//   int8 scale   fp32  [N]

#include <torch/csrc/utils/pybind.h>  // pybind11 and its at::Tensor casters
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sum.h>

#include <immintrin.h>
#include <omp.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

float fp16(uint16_t h) {  // exact, as F16C's conversion (and numpy's); head_rows.cpp uses it too
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 31, mantissa = h & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact
    float f = std::ldexp(float(mantissa), -24);
    return sign ? -f : f;
  }
  uint32_t u = sign | (exponent == 31 ? 0x7f800000u | (mantissa << 13) : ((exponent + 112) << 23) | (mantissa << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t SUPER = 8;  // groups of a super-block
constexpr int64_t PREFETCH = 4096;  // bytes of int4 codes fetched ahead (int8: twice); 1-4 KB measured best
constexpr int64_t CHUNK = 128 << 10;  // bytes of codes a chunk of work holds (tiles_mm); measured: BENCHMARKS.md
enum Isa { GENERIC = 0, AVX2 = 1, AVX512_VNNI = 2 };

// sub-block j's 6-bit integer of output o: sc (at = 64, high = 192) or mn (at = 128, high = 224)
inline int six(const uint8_t* sb, int at, int high, int64_t j, int o) {
  return ((sb[at + 16 * (j >> 1) + o] >> (4 * (j & 1))) & 15) | (((sb[high + 16 * (j >> 2) + o] >> (2 * (j & 3))) & 3) << 4);
}


// One call's activations: int8 codes per row and group of 32, the group's scale sa, sum of its codes (and of its
// first 16: int6's sub-blocks), and b.
// Each thread keeps one and reuses its memory from call to call (no allocation per call once it is large enough).
struct Activations {
  int64_t M = 0, K = 0, G = 0;
  std::vector<int8_t> q;
  std::vector<float> sa, b;
  std::vector<int32_t> sum, first;
  const int8_t* row(int64_t r, int64_t g) const { return q.data() + r * K + g * GROUP; }
  int64_t at(int64_t r, int64_t g) const { return r * G + g; }
};

// One group of 32 values -> 32 codes; the definition (every path below gives these bits): amax = max |v|,
// id = 127 / amax, q = nearbyint(v * id) (round half to even) clamped to +-127, sa = amax / 127; a group holding NaN
// or inf gets codes 0 and sa = NaN (the row's outputs are NaN, through sa and b).
inline void quantize_generic(const float* v, int8_t* q, float& sa, int32_t& sum, int32_t& first) {
  float amax = 0.f;
  bool finite = true;
  for (int j = 0; j < GROUP; ++j) amax = std::fmax(amax, std::fabs(v[j])), finite &= std::isfinite(v[j]);
  float id = amax > 0.f ? 127.f / amax : 0.f;
  sa = amax / 127.f;
  if (!finite) id = 0.f, sa = NAN;
  sum = first = 0;
  for (int j = 0; j < GROUP; ++j) {
    float t = finite ? std::nearbyint(v[j] * id) : 0.f;  // casting a NaN to int8 is undefined
    q[j] = int8_t(t > 127.f ? 127.f : (t < -127.f ? -127.f : t));
    sum += q[j];
    if (j == GROUP / 2 - 1) first = sum;
  }
}

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

AVX2_TARGET inline int32_t add8(__m256i s) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
}

AVX2_TARGET inline void quantize_avx2(const float* v, int8_t* q, float& sa, int32_t& sum, int32_t& first) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(FLT_MAX);
  __m256 x[4], m = _mm256_setzero_ps();
  int finite = 0xff;
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    __m256 a = _mm256_and_ps(x[i], magnitude);
    finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ));  // false for NaN and inf
    m = _mm256_max_ps(m, a);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));  // max is exact: the order does not matter
  if (finite != 0xff) {
    std::memset(q, 0, GROUP), sa = NAN, sum = first = 0;
    return;
  }
  const __m256 id = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  __m256i c[4];
  for (int i = 0; i < 4; ++i)
    c[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(
        _mm256_round_ps(_mm256_mul_ps(x[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi));
  first = add8(_mm256_add_epi32(c[0], c[1]));
  sum = first + add8(_mm256_add_epi32(c[2], c[3]));
  __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  sa = amax / 127.f;
}

AVX512_TARGET inline __m512i codes16(__m512 x, __m512 id) {  // nearbyint(x * id) clamped to +-127, as int32
  return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(
      _mm512_roundscale_ps(_mm512_mul_ps(x, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm512_set1_ps(-127.f)),
      _mm512_set1_ps(127.f)));
}

AVX512_TARGET inline void quantize_avx512(const float* v, int8_t* q, float& sa, int32_t& sum, int32_t& first) {
  const __m512 big = _mm512_set1_ps(FLT_MAX);
  __m512 x0 = _mm512_loadu_ps(v), x1 = _mm512_loadu_ps(v + 16);
  __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
  if ((_mm512_cmp_ps_mask(a0, big, _CMP_LE_OQ) & _mm512_cmp_ps_mask(a1, big, _CMP_LE_OQ)) != 0xffff) {
    std::memset(q, 0, GROUP), sa = NAN, sum = first = 0;
    return;
  }
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
  const __m512 id = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m512i c0 = codes16(x0, id), c1 = codes16(x1, id);
  first = _mm512_reduce_add_epi32(c0);
  sum = first + _mm512_reduce_add_epi32(c1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(c0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(c1));
  sa = amax / 127.f;
}

constexpr int64_t KEPT = 1 << 22;  // activations a thread keeps between calls (decoding and verifying); larger are freed

void quantize(const float* x, int64_t M, int64_t K, int isa, Activations& a) {  // a: the caller's, filled by workers
  a.M = M, a.K = K, a.G = K / GROUP;
  if (int64_t(a.q.size()) < M * K) a.q.resize(M * K);
  if (int64_t(a.sa.size()) < M * a.G) a.sa.resize(M * a.G), a.b.resize(M * a.G), a.sum.resize(M * a.G), a.first.resize(M * a.G);
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t g = 0; g < a.G; ++g) {
        const float* v = x + r * K + g * GROUP;
        int8_t* q = a.q.data() + r * K + g * GROUP;
        int64_t rg = a.at(r, g);
        if (isa == AVX512_VNNI) quantize_avx512(v, q, a.sa[rg], a.sum[rg], a.first[rg]);
        else if (isa == AVX2) quantize_avx2(v, q, a.sa[rg], a.sum[rg], a.first[rg]);
        else quantize_generic(v, q, a.sa[rg], a.sum[rg], a.first[rg]);
        a.b[rg] = a.sa[rg] * float(a.sum[rg]);
      }
  };
  if (M * K < (1 << 18)) rows(0, M);  // a parallel region costs more than quantizing a few rows
  else at::parallel_for(0, M, std::max<int64_t>(1, (1 << 18) / K), rows);
}

// The buffer a call quantizes into: the thread's own, reused, up to KEPT values; a long prompt's, freed after it.
Activations& buffer(int64_t values, Activations& once) {
  thread_local Activations kept;
  return values <= KEPT ? kept : once;
}

inline int32_t quad(const int8_t* q, int j) {  // four activation codes as one int32, for a broadcast
  int32_t v;
  std::memcpy(&v, q + 4 * j, 4);
  return v;
}

// ---------------------------------------------------------------- generic (any CPU): the definition, written out
void int4_generic(const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, int64_t r0, int64_t r1,
                  float* y, int64_t N) {
  const int64_t B = (a.G + SUPER - 1) / SUPER;
  for (int64_t r = r0; r < r1; ++r)
    for (int o = 0; o < 16; ++o) {
      float acc = 0.f;
      for (int64_t g = 0; g < a.G; ++g) {
        const uint8_t* c = codes + (t * a.G + g) * 256;
        const int8_t* q = a.row(r, g);
        int32_t P = 0;
        for (int jp = 0; jp < 4; ++jp)
          for (int i = 0; i < 4; ++i) {
            uint8_t byte = c[64 * jp + 4 * o + i];
            P += int32_t(byte & 15) * q[8 * jp + i] + int32_t(byte >> 4) * q[8 * jp + 4 + i];
          }
        const uint8_t* sb = scales + (t * B + g / SUPER) * 256;
        uint16_t d, dm;
        std::memcpy(&d, sb + 2 * o, 2), std::memcpy(&dm, sb + 32 + 2 * o, 2);
        const float s = fp16(d) * float(six(sb, 64, 192, g % SUPER, o)), m = fp16(dm) * float(six(sb, 128, 224, g % SUPER, o));
        acc = std::fma(float(P) * a.sa[a.at(r, g)], s, acc);
        acc = std::fma(m, a.b[a.at(r, g)], acc);
      }
      y[r * N + 16 * t + o] = acc;
    }
}

void int8_generic(const uint8_t* codes, const float* scale, const Activations& a, int64_t t, int64_t r0, int64_t r1,
                  float* y, int64_t N) {
  for (int64_t r = r0; r < r1; ++r)
    for (int o = 0; o < 16; ++o) {
      float acc = 0.f;
      for (int64_t g = 0; g < a.G; ++g) {
        const uint8_t* c = codes + (t * a.G + g) * 512;
        const int8_t* q = a.row(r, g);
        int32_t P = 0;
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 4; ++i) P += (int32_t(c[64 * j + 4 * o + i]) - 128) * q[4 * j + i];
        acc = std::fma(float(P), a.sa[a.at(r, g)], acc);
      }
      y[r * N + 16 * t + o] = scale[16 * t + o] * acc;
    }
}

// int6 (Q6_K): the group's two sub-blocks of 16 in integers, D = sc_0 sum (q - 32) a + sc_1 sum (q - 32) a (exact)
inline int six_code(const uint8_t* c, int j, int o, int i) {  // quad j's input i of output o: 0..63
  int low = (c[64 * (j >> 1) + 4 * o + i] >> (4 * (j & 1))) & 15;
  return low | (((c[256 + 64 * (j >> 2) + 4 * o + i] >> (2 * (j & 3))) & 3) << 4);
}

void int6_generic(const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, int64_t r0, int64_t r1,
                  float* y, int64_t N) {
  const int64_t B = a.G / SUPER;
  for (int64_t r = r0; r < r1; ++r)
    for (int o = 0; o < 16; ++o) {
      float acc = 0.f;
      for (int64_t g = 0; g < a.G; ++g) {
        const uint8_t* c = codes + (t * a.G + g) * 384;
        const int8_t* q = a.row(r, g);
        const int64_t rg = a.at(r, g);
        int32_t P[2] = {-32 * a.first[rg], -32 * (a.sum[rg] - a.first[rg])};
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 4; ++i) P[j >> 2] += six_code(c, j, o, i) * q[4 * j + i];
        const uint8_t* sb = scales + (t * B + g / SUPER) * 288;
        const int u = 2 * int(g % SUPER);
        const int32_t D = int32_t(int8_t(sb[32 + 16 * u + o])) * P[0] + int32_t(int8_t(sb[48 + 16 * u + o])) * P[1];
        uint16_t d;
        std::memcpy(&d, sb + 2 * o, 2);
        acc = std::fma(float(D) * a.sa[rg], fp16(d), acc);
      }
      y[r * N + 16 * t + o] = acc;
    }
}

// ---------------------------------------------------------------- AVX2 + FMA: a tile as two halves of 8 outputs
AVX2_TARGET inline __m128i six_bytes(__m128i low, __m128i high, int64_t j) {  // see six()
  low = _mm_and_si128(_mm_srl_epi16(low, _mm_cvtsi32_si128(int(4 * (j & 1)))), _mm_set1_epi8(15));
  high = _mm_and_si128(_mm_srl_epi16(high, _mm_cvtsi32_si128(int(2 * (j & 3)))), _mm_set1_epi8(3));
  return _mm_or_si128(low, _mm_slli_epi16(high, 4));
}

// d (or dm) times the 6-bit integers of sub-block j, outputs 8h .. 8h + 7 (exact)
AVX2_TARGET inline __m256 scale8(const uint8_t* sb, int half_at, int at, int high, int64_t j, int h) {
  __m128i six = six_bytes(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + at + 16 * (j >> 1) + 8 * h)),
                          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + high + 16 * (j >> 2) + 8 * h)), j);
  return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + half_at + 16 * h))),
                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(six)));
}

AVX2_TARGET inline __m256i dot_u8s8(__m256i w, int32_t q4) {  // w <= 15 or |w| <= 127 with q's sign: no saturation
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_set1_epi32(q4)), _mm256_set1_epi16(1));
}

AVX2_TARGET void int4_avx2(const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, int64_t r0,
                           int64_t r1, float* y, int64_t N) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const int64_t B = (a.G + SUPER - 1) / SUPER;
  for (int64_t r = r0; r < r1; ++r) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < a.G; ++g) {
      const uint8_t* c = codes + (t * a.G + g) * 256;
      const uint8_t* sb = scales + (t * B + g / SUPER) * 256;
      if (r == r0) {
        for (int l = 0; l < 256; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH + l), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(sb + PREFETCH / 8 + 64 * (g % 4)), _MM_HINT_T0);
      }
      const int8_t* q = a.row(r, g);
      const __m256 sa = _mm256_set1_ps(a.sa[a.at(r, g)]), b = _mm256_set1_ps(a.b[a.at(r, g)]);
      for (int h = 0; h < 2; ++h) {  // outputs 8h .. 8h + 7
        __m256i P = _mm256_setzero_si256();
        for (int jp = 0; jp < 4; ++jp) {
          __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * jp + 32 * h));
          P = _mm256_add_epi32(P, dot_u8s8(_mm256_and_si256(x, low), quad(q, 2 * jp)));
          P = _mm256_add_epi32(P, dot_u8s8(_mm256_and_si256(_mm256_srli_epi16(x, 4), low), quad(q, 2 * jp + 1)));
        }
        acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(P), sa), scale8(sb, 0, 64, 192, g % SUPER, h), acc[h]);
        acc[h] = _mm256_fmadd_ps(scale8(sb, 32, 128, 224, g % SUPER, h), b, acc[h]);
      }
    }
    _mm256_storeu_ps(y + r * N + 16 * t, acc[0]);
    _mm256_storeu_ps(y + r * N + 16 * t + 8, acc[1]);
  }
}

AVX2_TARGET void int8_avx2(const uint8_t* codes, const float* scale, const Activations& a, int64_t t, int64_t r0,
                           int64_t r1, float* y, int64_t N) {
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  for (int64_t r = r0; r < r1; ++r) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < a.G; ++g) {
      const uint8_t* c = codes + (t * a.G + g) * 512;
      if (r == r0)
        for (int l = 0; l < 512; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + 2 * PREFETCH + l), _MM_HINT_T0);
      const int8_t* q = a.row(r, g);
      const __m256 sa = _mm256_set1_ps(a.sa[a.at(r, g)]);
      for (int h = 0; h < 2; ++h) {
        __m256i P = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * j + 32 * h)), bias);
          __m256i qs = _mm256_sign_epi8(_mm256_set1_epi32(quad(q, j)), w);
          P = _mm256_add_epi32(P, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), qs), _mm256_set1_epi16(1)));
        }
        acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P), sa, acc[h]);
      }
    }
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(y + r * N + 16 * t + 8 * h, _mm256_mul_ps(_mm256_loadu_ps(scale + 16 * t + 8 * h), acc[h]));
  }
}

AVX2_TARGET void int6_avx2(const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, int64_t r0,
                           int64_t r1, float* y, int64_t N) {
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  const int64_t B = a.G / SUPER;
  for (int64_t r = r0; r < r1; ++r) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < a.G; ++g) {
      const uint8_t* c = codes + (t * a.G + g) * 384;
      const uint8_t* sb = scales + (t * B + g / SUPER) * 288;
      if (r == r0) {
        for (int l = 0; l < 384; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + 3 * PREFETCH / 2 + l), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(sb + PREFETCH / 8 + 64 * (g % 4)), _MM_HINT_T0);
      }
      const int8_t* q = a.row(r, g);
      const int64_t rg = a.at(r, g);
      const int u = 2 * int(g % SUPER);
      const __m256 sa = _mm256_set1_ps(a.sa[rg]);
      for (int h = 0; h < 2; ++h) {  // outputs 8h .. 8h + 7
        __m256i P[2] = {_mm256_set1_epi32(-32 * a.first[rg]), _mm256_set1_epi32(-32 * (a.sum[rg] - a.first[rg]))};
        __m256i top[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 256 + 32 * h)),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 320 + 32 * h))};
        for (int jp = 0; jp < 4; ++jp) {
          __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * jp + 32 * h));
          for (int n = 0; n < 2; ++n) {
            const int j = 2 * jp + n;
            __m256i w = _mm256_and_si256(n ? _mm256_srli_epi16(x, 4) : x, low);
            __m256i hb = _mm256_and_si256(_mm256_srl_epi16(top[j >> 2], _mm_cvtsi32_si128(2 * (j & 3))), two);
            w = _mm256_or_si256(w, _mm256_slli_epi16(hb, 4));
            P[j >> 2] = _mm256_add_epi32(P[j >> 2], dot_u8s8(w, quad(q, j)));
          }
        }
        __m256i sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + 32 + 16 * u + 8 * h)));
        __m256i sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + 48 + 16 * u + 8 * h)));
        __m256i D = _mm256_add_epi32(_mm256_mullo_epi32(sc0, P[0]), _mm256_mullo_epi32(sc1, P[1]));
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 16 * h)));
        acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(D), sa), d, acc[h]);
      }
    }
    _mm256_storeu_ps(y + r * N + 16 * t, acc[0]);
    _mm256_storeu_ps(y + r * N + 16 * t + 8, acc[1]);
  }
}

// ---------------------------------------------------------------- AVX-512 VNNI: a tile in one register, rows in a block
AVX512_TARGET inline __m512 scale16(const uint8_t* sb, int half_at, int at, int high, int64_t j) {  // see scale8
  __m128i six = six_bytes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + at + 16 * (j >> 1))),
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + high + 16 * (j >> 2))), j);
  return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + half_at))),
                       _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(six)));
}

template <int R>
AVX512_TARGET void int4_avx512(const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, int64_t r0,
                               float* y, int64_t N) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t B = (a.G + SUPER - 1) / SUPER;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* c = codes + (t * a.G + g) * 256;
    const uint8_t* sb = scales + (t * B + g / SUPER) * 256;
    for (int l = 0; l < 256; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + PREFETCH + l), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sb + PREFETCH / 8 + 64 * (g % 4)), _MM_HINT_T0);
    __m512i w[8];
    for (int jp = 0; jp < 4; ++jp) {
      __m512i x = _mm512_loadu_si512(c + 64 * jp);
      w[2 * jp] = _mm512_and_si512(x, low);
      w[2 * jp + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
    }
    const __m512 scale = scale16(sb, 0, 64, 192, g % SUPER), m = scale16(sb, 32, 128, 224, g % SUPER);
    __m512i Ps[R];  // every row's sums first, then their floats: 3-6% faster at 8 rows than row by row
    for (int r = 0; r < R; ++r) {
      const int8_t* q = a.row(r0 + r, g);
      __m512i P = _mm512_setzero_si512(), P1 = _mm512_setzero_si512();  // two chains: exact integer sums either way
      for (int j = 0; j < 8; j += 2) {
        P = _mm512_dpbusd_epi32(P, w[j], _mm512_set1_epi32(quad(q, j)));
        P1 = _mm512_dpbusd_epi32(P1, w[j + 1], _mm512_set1_epi32(quad(q, j + 1)));
      }
      Ps[r] = _mm512_add_epi32(P, P1);
    }
    for (int r = 0; r < R; ++r) {
      int64_t rg = a.at(r0 + r, g);
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(Ps[r]), _mm512_set1_ps(a.sa[rg])), scale, acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.b[rg]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * N + 16 * t, acc[r]);
}

template <int R>
AVX512_TARGET void int8_avx512(const uint8_t* codes, const float* scale, const Activations& a, int64_t t, int64_t r0,
                               float* y, int64_t N) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* c = codes + (t * a.G + g) * 512;
    for (int l = 0; l < 512; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + 2 * PREFETCH + l), _MM_HINT_T0);
    __m512i w[8];
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(c + 64 * j);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = a.row(r0 + r, g);
      int64_t rg = a.at(r0 + r, g);
      __m512i P = _mm512_set1_epi32(-128 * a.sum[rg]);  // sum (w + 128) q - 128 sum q = sum w q
      for (int j = 0; j < 8; ++j) P = _mm512_dpbusd_epi32(P, w[j], _mm512_set1_epi32(quad(q, j)));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P), _mm512_set1_ps(a.sa[rg]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(y + (r0 + r) * N + 16 * t, _mm512_mul_ps(_mm512_loadu_ps(scale + 16 * t), acc[r]));
}

template <int R>
AVX512_TARGET void int6_avx512(const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, int64_t r0,
                               float* y, int64_t N) {
  const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
  const int64_t B = a.G / SUPER;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    const uint8_t* c = codes + (t * a.G + g) * 384;
    const uint8_t* sb = scales + (t * B + g / SUPER) * 288;
    for (int l = 0; l < 384; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + 3 * PREFETCH / 2 + l), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sb + PREFETCH / 8 + 64 * (g % 4)), _MM_HINT_T0);
    __m512i w[8];
    for (int jp = 0; jp < 4; ++jp) {
      __m512i x = _mm512_loadu_si512(c + 64 * jp);
      w[2 * jp] = _mm512_and_si512(x, low);
      w[2 * jp + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
    }
    for (int h = 0; h < 2; ++h) {
      __m512i top = _mm512_loadu_si512(c + 256 + 64 * h);
      w[4 * h] = _mm512_or_si512(w[4 * h], _mm512_slli_epi16(_mm512_and_si512(top, two), 4));
      w[4 * h + 1] = _mm512_or_si512(w[4 * h + 1], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(top, 2), two), 4));
      w[4 * h + 2] = _mm512_or_si512(w[4 * h + 2], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(top, 4), two), 4));
      w[4 * h + 3] = _mm512_or_si512(w[4 * h + 3], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(top, 6), two), 4));
    }
    const int u = 2 * int(g % SUPER);
    const __m512i sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 32 + 16 * u)));
    const __m512i sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 48 + 16 * u)));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb)));
    for (int r = 0; r < R; ++r) {
      const int8_t* q = a.row(r0 + r, g);
      const int64_t rg = a.at(r0 + r, g);
      __m512i P0 = _mm512_set1_epi32(-32 * a.first[rg]), P1 = _mm512_set1_epi32(-32 * (a.sum[rg] - a.first[rg]));
      for (int j = 0; j < 4; ++j) P0 = _mm512_dpbusd_epi32(P0, w[j], _mm512_set1_epi32(quad(q, j)));
      for (int j = 4; j < 8; ++j) P1 = _mm512_dpbusd_epi32(P1, w[j], _mm512_set1_epi32(quad(q, j)));
      __m512i D = _mm512_add_epi32(_mm512_mullo_epi32(sc0, P0), _mm512_mullo_epi32(sc1, P1));
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(D), _mm512_set1_ps(a.sa[rg])), d, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * N + 16 * t, acc[r]);
}

// ---------------------------------------------------------------- dispatch: tiles across threads, rows in blocks of 8
#define ROWS_SWITCH(n, CALL) \
  switch (n) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
               case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; default: CALL(8); }

void run_int4(int isa, const uint8_t* codes, const uint8_t* sm, const Activations& a, int64_t t, float* y, int64_t N) {
  if (isa != AVX512_VNNI)
    return isa == AVX2 ? int4_avx2(codes, sm, a, t, 0, a.M, y, N) : int4_generic(codes, sm, a, t, 0, a.M, y, N);
  for (int64_t r0 = 0; r0 < a.M; r0 += 8) {
#define K512(R) int4_avx512<R>(codes, sm, a, t, r0, y, N)
    ROWS_SWITCH(std::min<int64_t>(8, a.M - r0), K512)
#undef K512
  }
}

void run_int8(int isa, const uint8_t* codes, const float* scale, const Activations& a, int64_t t, float* y, int64_t N) {
  if (isa != AVX512_VNNI)
    return isa == AVX2 ? int8_avx2(codes, scale, a, t, 0, a.M, y, N) : int8_generic(codes, scale, a, t, 0, a.M, y, N);
  for (int64_t r0 = 0; r0 < a.M; r0 += 8) {
#define K512(R) int8_avx512<R>(codes, scale, a, t, r0, y, N)
    ROWS_SWITCH(std::min<int64_t>(8, a.M - r0), K512)
#undef K512
  }
}

void run_int6(int isa, const uint8_t* codes, const uint8_t* scales, const Activations& a, int64_t t, float* y, int64_t N) {
  if (isa != AVX512_VNNI)
    return isa == AVX2 ? int6_avx2(codes, scales, a, t, 0, a.M, y, N) : int6_generic(codes, scales, a, t, 0, a.M, y, N);
  for (int64_t r0 = 0; r0 < a.M; r0 += 8) {
#define K512(R) int6_avx512<R>(codes, scales, a, t, r0, y, N)
    ROWS_SWITCH(std::min<int64_t>(8, a.M - r0), K512)
#undef K512
  }
}

int best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
    return AVX512_VNNI;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return AVX2;
  return GENERIC;
}

// One input, any number of weight tensors ("parts", each int4, int6 or int8 in its tiles) side by side in one
// output, one quantization and one parallel region for them all: a layer's q, k and v (Q4_K and Q6_K mixed), its
// gate and up. Each part's columns are then, in order, y + bias (when given) and residual + that (when given):
// the very additions `linear(x) + bias` and `h + linear(x)` make in torch, so the bits are theirs.
constexpr int64_t INT4 = 4, INT6 = 6, INT8 = 8;

struct Part {
  int64_t kind, tiles, G, col, out;  // out = 16 tiles (an int8 layer's padding outputs are sliced off by its caller)
  const uint8_t* codes;
  const void* scales;
  const float* bias;
  int64_t tile_bytes() const { return G * (kind == INT4 ? 256 : kind == INT6 ? 384 : 512); }
};

Part part_of(int64_t kind, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& bias, int64_t K,
             int64_t col) {
  TORCH_CHECK(kind == INT4 || kind == INT6 || kind == INT8, "a part's kind is 4, 6 or 8, not ", kind);
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous(),
              "codes must be a contiguous uint8 [N/16, K/32, bytes]");
  Part p{kind, codes.size(0), codes.size(1), col, 16 * codes.size(0), codes.data_ptr<uint8_t>(), nullptr, nullptr};
  TORCH_CHECK(p.G * GROUP == K && codes.size(2) == p.tile_bytes() / p.G, "codes in the wrong layout for int", kind);
  const int64_t B = kind == INT4 ? (p.G + SUPER - 1) / SUPER : p.G / SUPER;
  if (kind == INT8) {
    TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == p.out,
                "an int8 part's scale must be float32 [16 * tiles]");
    p.scales = scales.data_ptr<float>();
  } else {
    TORCH_CHECK(scales.scalar_type() == at::kByte && scales.is_contiguous() &&
                scales.numel() == p.tiles * B * (kind == INT4 ? 256 : 288) && (kind == INT4 || p.G % SUPER == 0),
                "scales in the wrong layout for int", kind);
    p.scales = scales.data_ptr<uint8_t>();
  }
  if (bias.numel()) {
    TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.numel() == p.out,
                "a bias must be float32 [", p.out, "]");
    p.bias = bias.data_ptr<float>();
  }
  return p;
}

// Tile t of part p for every row, then its epilogue (bias, residual) while the outputs are in cache.
void run_tile(int isa, const Part& p, const Activations& a, int64_t t, float* y, int64_t N, const float* residual) {
  float* at = y + p.col;
  if (p.kind == INT4) run_int4(isa, p.codes, static_cast<const uint8_t*>(p.scales), a, t, at, N);
  else if (p.kind == INT6) run_int6(isa, p.codes, static_cast<const uint8_t*>(p.scales), a, t, at, N);
  else run_int8(isa, p.codes, static_cast<const float*>(p.scales), a, t, at, N);
  if (!p.bias && !residual) return;
  for (int64_t r = 0; r < a.M; ++r)
    for (int64_t o = 0; o < 16; ++o) {
      float& v = at[r * N + 16 * t + o];
      if (p.bias) v = v + p.bias[16 * t + o];
      if (residual) v = residual[r * N + p.col + 16 * t + o] + v;
    }
}

// A group of linears over one input run as one call (see Part): built once per layer from Python, so a call passes
// one handle instead of lists of tensors.
struct Linears {
  std::vector<Part> parts;
  std::vector<at::Tensor> held;  // keeps the tensors the parts point into alive
  std::vector<int64_t> kinds;
  int64_t K = 0, N = 0, nbytes = 0;  // nbytes: what a call reads of the weights (codes, scales, biases)
  Linears(std::vector<int64_t> kinds, std::vector<at::Tensor> codes, std::vector<at::Tensor> scales,
          std::vector<at::Tensor> biases) {
    TORCH_CHECK(!kinds.empty() && codes.size() == kinds.size() && scales.size() == kinds.size() &&
                biases.size() == kinds.size(), "one kind, codes, scales and bias (empty for none) per part");
    K = codes[0].dim() == 3 ? codes[0].size(1) * GROUP : 0;
    for (size_t i = 0; i < kinds.size(); ++i) {
      parts.push_back(part_of(kinds[i], codes[i], scales[i], biases[i], K, N));
      N += parts.back().out;
      held.insert(held.end(), {codes[i], scales[i], biases[i]});
    }
    this->kinds = kinds;
    for (const auto& t : held) nbytes += t.numel() * t.element_size();
  }
};

// Runs work(0 .. n - 1) on `threads` threads. Each owns a contiguous run of the chunks and takes them in order, so
// its reads flow from one chunk into the next as one memory stream (the prefetch ahead runs on into the next); one
// out of work takes the last chunk left in another's run, so on a shared machine nobody waits for the slower core.
template <class Work>
void run_chunks(uint64_t n, int threads, const Work& work) {
  std::vector<std::atomic<uint64_t>> runs(threads);  // each run's [first, end), packed first | end << 32
  for (int i = 0; i < threads; ++i) runs[i] = (n * i / threads) | ((n * (i + 1) / threads) << 32);
  auto take = [&](int owner, bool last) -> int64_t {  // the run's first chunk (or its last), -1 when it is empty
    uint64_t r = runs[owner].load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t first = r & 0xffffffff, end = r >> 32;
      if (first >= end) return -1;
      const uint64_t left = last ? first | ((end - 1) << 32) : (first + 1) | (end << 32);
      if (runs[owner].compare_exchange_weak(r, left, std::memory_order_relaxed)) return int64_t(last ? end - 1 : first);
    }
  };
#pragma omp parallel num_threads(threads)
  {
    const int me = omp_get_thread_num();
    for (int other = 0; other < threads; ++other) {
      const int owner = (me + other) % threads;
      for (int64_t i; (i = take(owner, other > 0)) >= 0;) work(i);
    }
  }
}

// y [M, N] = x @ [W_0; W_1; ...].T (+ biases) (+ residual). The parts' tiles go out in chunks of ~CHUNK bytes of codes
// (run_chunks); below two chunks of work, or inside a parallel region, the caller runs them.
at::Tensor tiles_mm(const at::Tensor& x, const Linears& L, const at::Tensor& residual, int64_t isa) {
  TORCH_CHECK(isa >= GENERIC && isa <= best_isa(), "this CPU cannot run instruction set ", isa);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) == L.K,
              "x must be a contiguous float32 [M, ", L.K, "]");
  const int64_t M = x.size(0), N = L.N;
  const float* res = nullptr;
  if (residual.defined() && residual.numel()) {
    TORCH_CHECK(residual.scalar_type() == at::kFloat && residual.is_contiguous() && residual.numel() == M * N,
                "the residual must be a contiguous float32 [M, N]");
    res = residual.data_ptr<float>();
  }
  Activations once, &a = buffer(M * L.K, once);
  quantize(x.data_ptr<float>(), M, L.K, int(isa), a);
  auto y = at::empty({M, N}, x.options());
  float* out = y.data_ptr<float>();
  struct Chunk { int64_t part, t0, t1; };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < L.parts.size(); ++i) {
    const int64_t step = std::max<int64_t>(1, CHUNK / L.parts[i].tile_bytes());
    for (int64_t t = 0; t < L.parts[i].tiles; t += step) chunks.push_back({int64_t(i), t, std::min(L.parts[i].tiles, t + step)});
  }
  auto work = [&](int64_t i) {
    for (int64_t t = chunks[i].t0; t < chunks[i].t1; ++t) run_tile(int(isa), L.parts[chunks[i].part], a, t, out, N, res);
  };
  const int threads = int(std::min<int64_t>(at::get_num_threads(), int64_t(chunks.size())));
  if (threads <= 1 || omp_in_parallel()) {
    for (size_t i = 0; i < chunks.size(); ++i) work(int64_t(i));
  } else {
    run_chunks(chunks.size(), threads, work);
  }
  return y;
}

// torch.rms_norm's bits, without its eight dispatches: ATen's composite is
//     w * (x * rsqrt(sum(x * x, -1) / H + eps))        (pow 2 is x * x; mean is sum, then div_ by H)
// and the one step whose order of additions is ATen's own, the sum, is ATen's sum on the same tensor shape.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && weight.scalar_type() == at::kFloat &&
              weight.is_contiguous() && x.size(-1) == weight.numel(), "x [..., H] and weight [H] must be contiguous float32");
  const int64_t H = weight.numel(), rows = x.numel() / H;
  auto sq = at::empty_like(x);
  const float* in = x.data_ptr<float>();
  float* q = sq.data_ptr<float>();
  for (int64_t i = 0; i < rows * H; ++i) q[i] = in[i] * in[i];
  auto sums = at::sum(sq, {-1}, /*keepdim=*/true);
  const float* sum = sums.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float e = float(eps), n = float(H);
  auto out = at::empty_like(x);
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / std::sqrt(sum[r] / n + e);
    for (int64_t i = 0; i < H; ++i) o[r * H + i] = (in[r * H + i] * inv) * w[i];
  }
  return out;
}

}  // namespace

at::Tensor rope_attention(at::Tensor y, at::Tensor cos, at::Tensor sin, at::Tensor keys,
                             at::Tensor values, int64_t start, int64_t heads, double scale, int64_t isa);  // attention.cpp

namespace {

// A decoder layer's attention sub-layer in one call: h + o_proj(attention(rope(qkv(rms_norm(h))))), every step the
// lean forward's, with its bits (lean_forward.py).
at::Tensor attention_sublayer(at::Tensor h, at::Tensor norm, double eps, const Linears& qkv, at::Tensor cos,
                                 at::Tensor sin, at::Tensor keys, at::Tensor values, int64_t start,
                                 int64_t heads, double scale, const Linears& o, int64_t isa) {
  const int64_t n = h.size(-2);
  auto x = rms_norm(h, norm, eps);
  auto y = tiles_mm(x.view({n, -1}), qkv, at::Tensor(), isa);
  auto a = rope_attention(y, cos, sin, keys, values, start, heads, scale, isa);
  return tiles_mm(a.view({n, -1}), o, h, isa).view(h.sizes());
}

// A decoder layer's MLP sub-layer in one call: h + down(silu(gate) * up) over rms_norm(h), silu and the product
// ATen's own (the same kernels the lean forward and transformers call, so the same bits).
at::Tensor mlp_sublayer(at::Tensor h, at::Tensor norm, double eps, const Linears& gate_up, int64_t inner,
                           const Linears& down, int64_t isa) {
  const int64_t n = h.size(-2);
  auto x = rms_norm(h, norm, eps);
  auto y = tiles_mm(x.view({n, -1}), gate_up, at::Tensor(), isa);
  auto g = at::silu(y.narrow(1, 0, inner)).mul_(y.narrow(1, inner, y.size(1) - inner));
  return tiles_mm(g, down, h, isa).view(h.sizes());
}

}  // namespace

at::Tensor causal_attention(at::Tensor q, at::Tensor k, at::Tensor v, double scale, int64_t isa);  // attention.cpp
int64_t stream_read(at::Tensor buffer, bool wide);  // bandwidth.cpp
int64_t dot_peak(int64_t n, bool vnni);  // bandwidth.cpp
at::Tensor best_k_rows(const at::Tensor& logits, int64_t k, int64_t chunk);  // head_rows.cpp
at::Tensor q6k_rows(const at::Tensor& blocks, const at::Tensor& ids, int64_t width);  // head_rows.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("causal_attention", &causal_attention, "causal attention in one fixed order of arithmetic (attention.cpp)");
  m.def("rope_attention", &rope_attention, "a sub-layer's rotary embedding, cache writes and attention (attention.cpp)");
  pybind11::class_<Linears>(m, "Linears")
      .def(pybind11::init<std::vector<int64_t>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                          std::vector<at::Tensor>>())
      .def_readonly("kinds", &Linears::kinds)
      .def_readonly("in_features", &Linears::K)
      .def_readonly("out_features", &Linears::N)
      .def_readonly("nbytes", &Linears::nbytes);
  m.def("tiles_mm", &tiles_mm, "y = x @ [W_0; W_1; ...].T (+ biases) (+ residual), each W int4, int6 or int8 in tiles");
  m.def("rms_norm", &rms_norm, "torch.rms_norm's bits in one call");
  m.def("attention_sublayer", &attention_sublayer, "a decoder layer's attention sub-layer in one call");
  m.def("mlp_sublayer", &mlp_sublayer, "a decoder layer's MLP sub-layer in one call");
  m.def("stream_read", &stream_read, "reads a uint8 buffer once on every thread's share (the memory bandwidth probe)");
  m.def("dot_peak", &dot_peak, "runs the integer dot-product chains on every thread; returns the byte products made");
  m.def("best_k_rows", &best_k_rows, "the indices of each row's k largest logits (heads.best_k's set)");
  m.def("q6k_rows", &q6k_rows, "rows of a Q6_K tensor de-quantized from its blocks, gguf_codes' bits");
  m.def("best_isa", &best_isa, "0 generic, 1 AVX2 + FMA, 2 AVX-512 VNNI");
}
