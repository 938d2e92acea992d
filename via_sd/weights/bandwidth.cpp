// The machine's two limits for the low-bit kernel, each probe timed by kernel_breakdown.py:
// - memory read bandwidth, measured the way a memory benchmark does (STREAM's read side): every thread streams its
//   own contiguous share of a buffer far larger than the caches through vector loads, four independent
//   accumulators deep, and nothing is written back;
// - the integer dot-product peak: every thread runs twelve independent chains of the instruction the kernel's
//   products are made of (AVX-512 VNNI's vpdpbusd, 64 byte products; AVX2's vpmaddubsw + vpmaddwd + vpaddd, 32),
//   on registers only. No kernel can multiply its weights by a row faster than this.

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <cstdint>
#include <vector>

namespace {

__attribute__((target("avx512f"))) uint64_t read512(const uint8_t* p, int64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 256 <= n; i += 256) {
    a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_loadu_si512(p + i + 192));
  }
  return _mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d)));
}

__attribute__((target("avx2"))) uint64_t read256(const uint8_t* p, int64_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 128 <= n; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  return uint64_t(_mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 1) ^ _mm256_extract_epi64(x, 2) ^
                  _mm256_extract_epi64(x, 3));
}

constexpr int CHAINS = 12;

__attribute__((target("avx512f,avx512vnni"))) int64_t dots512(int64_t n) {
  __m512i acc[CHAINS], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
    __asm__ volatile("" : "+v"(w));  // a new w each time: the loop cannot be folded
  }
  int64_t sum = 0;
  for (int i = 0; i < CHAINS; ++i) sum += _mm512_reduce_add_epi32(acc[i]);
  return sum;
}

__attribute__((target("avx2"))) int64_t dots256(int64_t n) {
  __m256i acc[CHAINS], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5), one = _mm256_set1_epi16(1);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_set1_epi32(i);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), one));
    __asm__ volatile("" : "+v"(w));
  }
  int64_t sum = 0;
  for (int i = 0; i < CHAINS; ++i) sum += _mm256_extract_epi32(acc[i], 0);
  return sum;
}

}  // namespace

// Runs `n` rounds of the dot-product chains on every thread; returns the byte products made (int8 x uint8
// multiply-adds), so products / seconds is the machine's peak. vnni: AVX-512 VNNI (else AVX2).
int64_t dot_peak(int64_t n, bool vnni) {
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> sums(threads, 0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) sums[t] = vnni ? dots512(n) : dots256(n);
  });
  static volatile int64_t sink;  // the sums are kept: the chains cannot be dropped
  for (int64_t s : sums) sink = sink + s;
  return threads * n * CHAINS * (vnni ? 64 : 32);
}

// Reads all of `buffer` (uint8, contiguous) once, split in one contiguous share per thread; returns a checksum so
// the loads cannot be dropped. wide: 512-bit loads (else 256-bit).
int64_t stream_read(at::Tensor buffer, bool wide) {
  TORCH_CHECK(buffer.scalar_type() == at::kByte && buffer.is_contiguous(), "buffer must be contiguous uint8");
  const uint8_t* p = buffer.data_ptr<uint8_t>();
  const int64_t n = buffer.numel(), threads = at::get_num_threads(), share = (n / threads) & ~int64_t(255);
  std::vector<uint64_t> sums(threads, 0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) sums[t] = wide ? read512(p + t * share, share) : read256(p + t * share, share);
  });
  uint64_t all = 0;
  for (uint64_t s : sums) all ^= s;
  return int64_t(all);
}
