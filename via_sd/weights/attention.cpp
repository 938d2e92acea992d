// Causal attention in one fixed order of arithmetic, for every CPU forward (verifier, slim verifier, drafter).
//
// torch's SDPA hands its products to MKL's sgemm, which picks its code by the CPU's vendor and instruction set,
// so the same prompt gave other bits (and, at a near-tie, another token) on an AMD and an Intel machine. Here
// every query row r of a pass over R new rows and T keys attends to keys 0 .. T - R + r (causal after a cache of
// T - R), and each (row, head) computes exactly:
//     s_t  = dot8(q, k_t) * scale              dot8: lane l sums q[i] * k_t[i] for i = l mod 8, in order of i;
//                                              the lanes then add as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
//     e_t  = exp_fixed(s_t - max_t s_t)        one sequence of IEEE mul / add (below), no libm
//     Z    = e_0 + e_1 + ... in order of t
//     o[i] = (e_0 * v_0[i] + e_1 * v_1[i] + ... in order of t) / Z
// The AVX-512 and AVX2 paths and the generic loop run that sequence to the bit (built with -ffp-contract=off: no fused
// multiply-add), so a row never depends on the other rows of its pass, the thread count, the vendor or the ISA:
// a pass over k rows gives each row the bits its one-token step gives.

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

namespace {

constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f;  // ln 2 in two parts (Cody-Waite): n * LN2_HI is exact for |n| < 512
constexpr float LN2_LO = -2.12194440e-4f;
constexpr float EXP_FLOOR = -87.0f;  // below it e^x < 2^-125: kept a normal float, far below any weight's share
// e^r on |r| <= ln2 / 2 (Taylor to r^7: relative error < 1e-7)
constexpr float C7 = 1.98412698e-4f, C6 = 1.38888889e-3f, C5 = 8.33333333e-3f, C4 = 4.16666667e-2f,
                C3 = 1.66666667e-1f, C2 = 0.5f;

inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// e^x for x <= 0; the AVX2 path's exp8 runs the same operations lane by lane.
inline float exp_fixed(float x) {
  x = x < EXP_FLOOR ? EXP_FLOOR : x;
  float n = std::floor(x * LOG2E + 0.5f);
  float r = (x - n * LN2_HI) - n * LN2_LO;
  float p = C7;
  p = p * r + C6;
  p = p * r + C5;
  p = p * r + C4;
  p = p * r + C3;
  p = p * r + C2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * from_bits(uint32_t(int32_t(n) + 127) << 23);
}

inline float tree8(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

float dot_generic(const float* q, const float* k, int64_t D) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= D; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + q[i + l] * k[i + l];
  for (int l = 0; i < D; ++i, ++l) lane[l] = lane[l] + q[i] * k[i];
  return tree8(lane);
}

void accumulate_generic(float* acc, const float* v, float e, int64_t D) {
  for (int64_t i = 0; i < D; ++i) acc[i] = acc[i] + e * v[i];
}

void exp_generic(float* s, int64_t n, float m) {
  for (int64_t t = 0; t < n; ++t) s[t] = exp_fixed(s[t] - m);
}

#define AVX2_TARGET __attribute__((target("avx2,fma")))

AVX2_TARGET float dot_avx2(const float* q, const float* k, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i)));
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  for (int l = 0; i < D; ++i, ++l) lane[l] = lane[l] + q[i] * k[i];
  return tree8(lane);
}

// s[t] = dot8(q, k_t) * sc for the n keys k_t = k + t * stride: eight keys at a time, each in its own register with
// dot_avx2's lanes and order (eight independent chains where one key's is a chain of D / 8 dependent adds), then
// each key's tree8 through hadds: (l0 + l1, l2 + l3 | l4 + l5, l6 + l7), pairs of those, the two halves added.
AVX2_TARGET void dots_avx2(const float* q, const float* k, int64_t stride, int64_t n, int64_t D, float sc, float* s) {
  int64_t t = 0;
  if (D % 8 == 0)
    for (; t + 8 <= n; t += 8) {
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t i = 0; i < D; i += 8) {
        const __m256 qi = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; ++j)
          acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(qi, _mm256_loadu_ps(k + (t + j) * stride + i)));
      }
      const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
      const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
      const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      const __m128 hi = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
      _mm256_storeu_ps(s + t, _mm256_mul_ps(_mm256_set_m128(hi, lo), _mm256_set1_ps(sc)));
    }
  for (; t < n; ++t) s[t] = dot_avx2(q, k + t * stride, D) * sc;
}

// o[i] = o[i] + e_0 * v_0[i] + e_1 * v_1[i] + ... in order of t (v_t = v + t * stride): each output its own chain,
// 64 outputs at a time kept in registers over the n keys (no load and store of the sums per key).
AVX2_TARGET void weighted_sum_avx2(const float* v, int64_t stride, const float* e, int64_t n, int64_t D, float* o) {
  int64_t i0 = 0;
  for (; i0 + 64 <= D; i0 += 64) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_loadu_ps(o + i0 + 8 * j);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 et = _mm256_set1_ps(e[t]);
      const float* vt = v + t * stride + i0;
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(et, _mm256_loadu_ps(vt + 8 * j)));
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + i0 + 8 * j, acc[j]);
  }
  for (int64_t t = 0; t < n && i0 < D; ++t)
    for (int64_t i = i0; i < D; ++i) o[i] = o[i] + e[t] * v[t * stride + i];
}

AVX2_TARGET __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(EXP_FLOOR));
  __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
                           _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
  __m256 p = _mm256_set1_ps(C7);
  for (float c : {C6, C5, C4, C3, C2, 1.0f, 1.0f}) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2_TARGET void exp_avx2(float* s, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) _mm256_storeu_ps(s + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv)));
  for (; t < n; ++t) s[t] = exp_fixed(s[t] - m);
}

// ---------------------------------------------------------------- AVX-512: the AVX2 path's arithmetic, twice as wide
// Every lane runs the AVX2 path's sequence of IEEE operations on the same values, so the bits are the same. Only the
// weighted sum takes it: the scores stay on dots_avx2 (two keys' eight lanes in one register measured slower than one
// key's in each), and exp is a few percent of a pass.
#define AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))

// weighted_sum_avx2 with 64 outputs at a time in four 16-lane registers; the rest of the outputs by it.
AVX512_TARGET void weighted_sum_avx512(const float* v, int64_t stride, const float* e, int64_t n, int64_t D, float* o) {
  int64_t i0 = 0;
  for (; i0 + 64 <= D; i0 += 64) {
    __m512 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm512_loadu_ps(o + i0 + 16 * j);
    for (int64_t t = 0; t < n; ++t) {
      const __m512 et = _mm512_set1_ps(e[t]);
      const float* vt = v + t * stride + i0;
      for (int j = 0; j < 4; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(et, _mm512_loadu_ps(vt + 16 * j)));
    }
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + i0 + 16 * j, acc[j]);
  }
  if (i0 < D) weighted_sum_avx2(v + i0, stride, e, n, D - i0, o + i0);
}

struct View {  // a [B, H, T, D] tensor with a contiguous last dimension
  const float* data;
  int64_t sb, sh, st;
  explicit View(const at::Tensor& x)
      : data(x.data_ptr<float>()), sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)) {}
  const float* at(int64_t b, int64_t h, int64_t t) const { return data + b * sb + h * sh + t * st; }
};

}  // namespace

// The order above is per (row, head); the loops are arranged for the cache. A work item is up to QUERIES queries
// (heads x rows) that share a kv head; its scores, then its weighted sums, run over the keys KEYS at a time, every
// query taking the block in turn while it is in L1 (one query at a time over all the keys re-read K and V from L2 for
// every query: 6 heads x 8 rows read each key 48 times). A query's sums carry over from block to block in o.
constexpr int64_t KEYS = 32, QUERIES = 16;

at::Tensor causal_attention(at::Tensor q, at::Tensor k, at::Tensor v, double scale, int64_t isa) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [batch, heads, rows, head_dim]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat, "q, k, v must be float32");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "head_dim must be contiguous");
  const int64_t B = q.size(0), H = q.size(1), R = q.size(2), D = q.size(3), KH = k.size(1), T = k.size(2);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D && H % KH == 0 && T >= R,
              "k and v must be [batch, kv_heads, keys >= rows, head_dim] with heads a multiple of kv_heads");
  TORCH_CHECK(isa >= 0 && isa <= 2, "isa is 0 (generic), 1 (AVX2) or 2 (AVX-512), not ", isa);
  TORCH_CHECK(isa < 2 || __builtin_cpu_supports("avx512f"),
              "this CPU cannot run the AVX-512 path");
  auto out = at::empty({B, R, H, D}, q.options());
  const View Q(q), K(k), V(v);
  float* o = out.data_ptr<float>();
  const float sc = float(scale);
  const int64_t group = H / KH, per_kv = group * R, chunks = (per_kv + QUERIES - 1) / QUERIES, past = T - R;
  at::parallel_for(0, B * KH * chunks, 1, [&](int64_t i0, int64_t i1) {
    std::unique_ptr<float[]> scores(new float[QUERIES * T]);  // not zeroed: every score read is written first
    float* sum[QUERIES];
    const float* query[QUERIES];
    int64_t seen[QUERIES];
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t c = item % chunks, kh = (item / chunks) % KH, b = item / (chunks * KH);
      const int64_t first = c * QUERIES, count = std::min(QUERIES, per_kv - first);
      int64_t most = 0;
      for (int64_t j = 0; j < count; ++j) {  // query j: head kh * group + (first + j) / R, row (first + j) % R
        const int64_t h = kh * group + (first + j) / R, r = (first + j) % R;
        query[j] = Q.at(b, h, r), seen[j] = past + r + 1, sum[j] = o + ((b * R + r) * H + h) * D;
        most = std::max(most, seen[j]);
      }
      for (int64_t t0 = 0; t0 < most; t0 += KEYS)
        for (int64_t j = 0; j < count; ++j) {
          const int64_t n = std::min(seen[j], t0 + KEYS) - t0;
          float* s = scores.get() + j * T + t0;
          if (n <= 0) continue;
          if (isa >= 1) dots_avx2(query[j], K.at(b, kh, t0), K.st, n, D, sc, s);  // AVX-512's pairs of keys: slower
          else for (int64_t t = 0; t < n; ++t) s[t] = dot_generic(query[j], K.at(b, kh, t0 + t), D) * sc;
        }
      float z[QUERIES];
      for (int64_t j = 0; j < count; ++j) {
        float* s = scores.get() + j * T;
        const int64_t n = seen[j];
        float m = s[0];
        for (int64_t t = 1; t < n; ++t) m = std::max(m, s[t]);
        if (isa >= 1) exp_avx2(s, n, m); else exp_generic(s, n, m);
        z[j] = 0.0f;
        for (int64_t t = 0; t < n; ++t) z[j] = z[j] + s[t];
        std::fill(sum[j], sum[j] + D, 0.0f);
      }
      for (int64_t t0 = 0; t0 < most; t0 += KEYS)
        for (int64_t j = 0; j < count; ++j) {
          const int64_t n = std::min(seen[j], t0 + KEYS) - t0;
          const float* e = scores.get() + j * T + t0;
          if (n <= 0) continue;
          if (isa == 2) weighted_sum_avx512(V.at(b, kh, t0), V.st, e, n, D, sum[j]);
          else if (isa == 1) weighted_sum_avx2(V.at(b, kh, t0), V.st, e, n, D, sum[j]);
          else for (int64_t t = 0; t < n; ++t) accumulate_generic(sum[j], V.at(b, kh, t0 + t), e[t], D);
        }
      for (int64_t j = 0; j < count; ++j)
        for (int64_t i = 0; i < D; ++i) sum[j][i] = sum[j][i] / z[j];
    }
  });
  return out;
}

// A sub-layer's attention after its q/k/v matmul, in one call: y [R, W] holds each new row's q (heads), k and v
// (kv_heads each) side by side, head_dim D apiece; the rotary embedding turns q and k as transformers does,
//     x * cos + rotate_half(x) * sin  ==  x * cos + roll(x, D / 2) * sin_signed   (sin's first half negated)
// each term one IEEE product and then one sum (no fused multiply-add), k and v go into the cache buffers
// [1, capacity, kv_heads, D] at rows start .. start + R - 1, and the rows attend causally over keys
// 0 .. start + R - 1 (causal_attention above). The same bits as those operations made one by one in torch.
at::Tensor rope_attention(at::Tensor y, at::Tensor cos, at::Tensor sin, at::Tensor keys,
                             at::Tensor values, int64_t start, int64_t heads, double scale, int64_t isa) {
  const int64_t R = y.size(0), KH = keys.size(2), D = keys.size(3), end = start + R;
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat && y.is_contiguous() && y.size(1) == (heads + 2 * KH) * D,
              "y must be a contiguous float32 [rows, (heads + 2 kv_heads) head_dim]");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.numel() == R * D && cos.is_contiguous() && sin.is_contiguous() &&
              cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos and sin must be float32 [rows, head_dim]");
  TORCH_CHECK(keys.sizes() == values.sizes() && keys.dim() == 4 && keys.size(0) == 1 && keys.size(1) >= end &&
              keys.is_contiguous() && values.is_contiguous() && keys.scalar_type() == at::kFloat &&
              values.scalar_type() == at::kFloat && D % 2 == 0 && heads % KH == 0,
              "the cache buffers must be contiguous float32 [1, capacity >= start + rows, kv_heads, head_dim]");
  auto q = at::empty({1, R, heads, D}, y.options());
  const float* in = y.data_ptr<float>();
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  float *qo = q.data_ptr<float>(), *ko = keys.data_ptr<float>(), *vo = values.data_ptr<float>();
  const int64_t W = y.size(1), half = D / 2;
  for (int64_t r = 0; r < R; ++r) {
    const float *cr = c + r * D, *sr = s + r * D;
    for (int64_t j = 0; j < heads + KH; ++j) {
      const float* x = in + r * W + j * D;
      float* o = j < heads ? qo + (r * heads + j) * D : ko + ((start + r) * KH + j - heads) * D;
      for (int64_t i = 0; i < D; ++i) {
        const float a = x[i] * cr[i], b = x[i < half ? i + half : i - half] * sr[i];
        o[i] = a + b;
      }
    }
    std::memcpy(vo + (start + r) * KH * D, in + r * W + (heads + KH) * D, sizeof(float) * KH * D);
  }
  return causal_attention(q.transpose(1, 2), keys.narrow(1, 0, end).transpose(1, 2),
                          values.narrow(1, 0, end).transpose(1, 2), scale, isa);
}
