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

// The chains are written in assembly: GCC 12 keeps an array of vector accumulators in registers by copying each one to
// a new register every round (24 moves for 12 products), which halved the peak this probe read on AMD Zen 5.
__attribute__((target("avx512f,avx512vnni"))) int64_t dots512(int64_t n) {
  alignas(64) int32_t out[CHAINS * 16];
  const int32_t w = 0x03030303, x = 0x05050505;
#define Z(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define D(i) "vpdpbusd %%zmm13, %%zmm12, %%zmm" #i "\n\t"
#define S(i) "vmovdqu32 %%zmm" #i ", " #i "*64(%[out])\n\t"
  __asm__ volatile(
      "vpbroadcastd %k[w], %%zmm12\n\t"
      "vpbroadcastd %k[x], %%zmm13\n\t"
      Z(0) Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11)
      "test %[n], %[n]\n\t"
      "jle 2f\n\t"
      "1:\n\t"
      D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
      : [n] "+r"(n)
      : [w] "r"(w), [x] "r"(x), [out] "r"(out)
      : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11", "zmm12",
        "zmm13", "memory", "cc");
#undef Z
#undef D
#undef S
  int64_t sum = 0;
  for (int i = 0; i < CHAINS * 16; ++i) sum += out[i];
  return sum;
}

// AVX2's product: vpmaddubsw (pairs of byte products to 16 bits), vpmaddwd by ones (to 32 bits), vpaddd; six chains
// twice a round, each product made anew (the compiler had hoisted the two products out of the loop).
__attribute__((target("avx2"))) int64_t dots256(int64_t n) {
  alignas(32) int32_t out[6 * 8];
  const int32_t w = 0x03030303, x = 0x05050505, one = 0x00010001;
#define Z(i) "vpxor %%ymm" #i ", %%ymm" #i ", %%ymm" #i "\n\t"
#define P(i, t) "vpmaddubsw %%ymm13, %%ymm12, %%ymm" #t "\n\t" "vpmaddwd %%ymm14, %%ymm" #t ", %%ymm" #t "\n\t" \
                "vpaddd %%ymm" #t ", %%ymm" #i ", %%ymm" #i "\n\t"
#define S(i) "vmovdqu %%ymm" #i ", " #i "*32(%[out])\n\t"
  __asm__ volatile(
      "vmovd %k[w], %%xmm12\n\t"
      "vpbroadcastd %%xmm12, %%ymm12\n\t"
      "vmovd %k[x], %%xmm13\n\t"
      "vpbroadcastd %%xmm13, %%ymm13\n\t"
      "vmovd %k[one], %%xmm14\n\t"
      "vpbroadcastd %%xmm14, %%ymm14\n\t"
      Z(0) Z(1) Z(2) Z(3) Z(4) Z(5)
      "test %[n], %[n]\n\t"
      "jle 2f\n\t"
      "1:\n\t"
      P(0, 6) P(1, 7) P(2, 8) P(3, 9) P(4, 10) P(5, 11)
      P(0, 6) P(1, 7) P(2, 8) P(3, 9) P(4, 10) P(5, 11)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      S(0) S(1) S(2) S(3) S(4) S(5)
      "vzeroupper\n\t"
      : [n] "+r"(n)
      : [w] "r"(w), [x] "r"(x), [one] "r"(one), [out] "r"(out)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "memory", "cc");
#undef Z
#undef P
#undef S
  int64_t sum = 0;
  for (int i = 0; i < 6 * 8; ++i) sum += out[i];
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
