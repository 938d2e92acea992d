// The two steps of a verifier step's exact head re-scoring (heads.RescoredHead) that a dozen small ATen and numpy
// operations made, each slow right after the head's matmul, with cold caches: the best k logits of each row
// (heads.best_k) and the exact rows of a Q6_K head (gguf_pack.ExactRows). Both give what the code they replace gives.

#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

float fp16(uint16_t h);  // lowbit_kernel.cpp: exact, as numpy's float16 -> float32

namespace {

constexpr int64_t Q6K_WEIGHTS = 256, Q6K_BYTES = 210;

// Each whole chunk's maximum of a row of logits, and whether any of its values is NaN. A maximum is exact, so the
// order of the comparisons does not matter (a tie of -0 and +0 compares equal either way).
__attribute__((target("avx2"))) bool chunk_maxima(const float* v, int64_t chunks, int64_t chunk, float* out) {
  __m256 nan = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const float* x = v + c * chunk;
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= chunk; i += 8) {
      const __m256 y = _mm256_loadu_ps(x + i);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
      m = _mm256_max_ps(m, y);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float best = lanes[0];
    for (int l = 1; l < 8; ++l) best = lanes[l] > best ? lanes[l] : best;
    for (; i < chunk; ++i) {
      if (std::isnan(x[i])) return true;
      best = x[i] > best ? x[i] : best;
    }
    out[c] = best;
  }
  return _mm256_movemask_ps(nan) != 0;
}

}  // namespace

// The indices of each row's k largest logits (float32 [M, V] -> int64 [M, k]): the set topk gives, in another order,
// by heads.best_k's method (see there) in one call: the k largest logits lie in the k chunks with the largest maxima,
// so only those chunks (and the tail past the last whole one) are ranked. Where that set is not unique (a NaN, a tie
// at the k-th maximum or the k-th logit) ATen's topk of the row decides, as in best_k.
at::Tensor best_k_rows(const at::Tensor& logits, int64_t k, int64_t chunk) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1 && k > 0 && chunk > 0,
              "logits must be float32 [M, V] with contiguous rows");
  const int64_t M = logits.size(0), V = logits.size(1), chunks = V / chunk;
  TORCH_CHECK(chunks >= 2 * k, "best_k_rows needs at least ", 2 * k, " chunks of ", chunk, " logits, not ", chunks);
  auto out = at::empty({M, k}, logits.options().dtype(at::kLong));
  int64_t* ids = out.data_ptr<int64_t>();
  std::vector<float> maxima(chunks);
  std::vector<int32_t> order(chunks);
  std::vector<std::pair<float, int64_t>> near;
  for (int64_t r = 0; r < M; ++r) {
    const float* v = logits.data_ptr<float>() + r * logits.stride(0);
    bool unique = !chunk_maxima(v, chunks, chunk, maxima.data());
    if (unique) {
      for (int64_t c = 0; c < chunks; ++c) order[c] = int32_t(c);
      std::partial_sort(order.begin(), order.begin() + k + 1, order.end(),
                        [&](int32_t a, int32_t b) { return maxima[a] > maxima[b]; });
      unique = maxima[order[k - 1]] > maxima[order[k]];
    }
    if (unique) {
      near.clear();
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < chunk; ++j) near.emplace_back(v[order[i] * chunk + j], order[i] * chunk + j);
      for (int64_t j = chunks * chunk; j < V; ++j) {
        unique &= !std::isnan(v[j]);  // topk ranks a NaN first: best_k's check sees it
        near.emplace_back(v[j], j);
      }
      if (unique) {
        std::partial_sort(near.begin(), near.begin() + k + 1, near.end(),
                          [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) { return a.first > b.first; });
        unique = near[k - 1].first > near[k].first;
      }
    }
    if (unique) {
      for (int64_t i = 0; i < k; ++i) ids[r * k + i] = near[i].second;
    } else {
      out[r].copy_(std::get<1>(at::topk(logits[r], k)));
    }
  }
  return out;
}

// Rows `ids` of a Q6_K tensor from its raw blocks (uint8 [rows, bytes], ggml's layout: 128 bytes of low nibbles, 64
// of high 2-bit fields, 16 int8 scales, fp16 d per 256 weights) -> float32 [len(ids), width], de-quantized as
// gguf_codes does: w = float(q - 32) * (float(d) * float(scale)), one rounding each, so the same bits.
at::Tensor q6k_rows(const at::Tensor& blocks, const at::Tensor& ids, int64_t width) {
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.stride(1) == 1,
              "blocks must be uint8 [rows, bytes] with contiguous rows");
  TORCH_CHECK(width % Q6K_WEIGHTS == 0 && blocks.size(1) == width / Q6K_WEIGHTS * Q6K_BYTES,
              "a Q6_K row of ", width, " weights is ", width / Q6K_WEIGHTS * Q6K_BYTES, " bytes, not ", blocks.size(1));
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "ids must be int64 [n]");
  const auto index = ids.contiguous();
  const int64_t n = index.size(0), rows = blocks.size(0);
  const int64_t* id = index.data_ptr<int64_t>();
  auto out = at::empty({n, width}, at::kFloat);
  float* w = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < rows, "row ", id[i], " is outside the tensor's ", rows);
    const uint8_t* row = blocks.data_ptr<uint8_t>() + id[i] * blocks.stride(0);
    for (int64_t b = 0; b < width / Q6K_WEIGHTS; ++b) {
      const uint8_t *ql = row + b * Q6K_BYTES, *qh = ql + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(ql + 192);
      const float d = fp16(uint16_t(ql[208] | (ql[209] << 8)));
      float* o = w + i * width + b * Q6K_WEIGHTS;
      for (int j = 0; j < Q6K_WEIGHTS; ++j) {  // half h of the block; in it, nibble f of byte j % 64, field j / 32
        const int h = j / 128, k = j % 128;
        const int low = (ql[64 * h + k % 64] >> (4 * (k / 64))) & 15, high = (qh[32 * h + k % 32] >> (2 * (k / 32))) & 3;
        o[j] = float((low | (high << 4)) - 32) * (d * float(sc[j / 16]));
      }
    }
  }
  return out;
}
