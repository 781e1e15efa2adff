#include "ds/io/checksum.h"

#include <array>
#include <cstdlib>
#include <cstring>

#include "ds/core/cpu_features.h"
#include "ds/core/env.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#endif

namespace ds::io {

namespace {
constexpr std::uint32_t kPoly = 0x82F63B78u;  // 0x1EDC6F41 reflected

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();

// GF(2) polynomial arithmetic modulo the CRC polynomial, bit-reflected (bit 31 is x^0), as in
// zlib's crc32_combine: a * b mod P.
constexpr std::uint32_t multmodp(std::uint32_t a, std::uint32_t b) {
  std::uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// kX2n[k] = x^(2^k) mod P.
constexpr std::array<std::uint32_t, 64> make_x2n() {
  std::array<std::uint32_t, 64> t{};
  std::uint32_t p = 1u << 30;  // x^1
  t[0] = p;
  for (int k = 1; k < 64; ++k) t[k] = p = multmodp(p, p);
  return t;
}
constexpr auto kX2n = make_x2n();

// x^(n * 2^k) mod P.
constexpr std::uint32_t x2nmodp(std::uint64_t n, unsigned k) {
  std::uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = multmodp(kX2n[k & 63], p);
    n >>= 1;
    ++k;
  }
  return p;
}

#if defined(__x86_64__) || defined(__aarch64__)
// Three interleaved streams (the CRC-32C instruction, SSE4.2's crc32 or ARMv8's crc32c*, has
// a latency of 2-3 cycles and a throughput of 1 per cycle, so one stream runs at a third to a
// half of its rate). Each block of 3 * kLong bytes is three independent CRC registers, joined
// by shifting the earlier ones over the later bytes: shifting a raw register over n zero bytes
// multiplies it by x^(8n) mod P, a linear map done with four byte tables (Mark Adler's
// crc32c.c method).
constexpr std::size_t kLong = 8192;

struct ShiftTable {
  std::uint32_t t[4][256];
};
constexpr ShiftTable make_shift(std::size_t bytes) {
  ShiftTable s{};
  const std::uint32_t k = x2nmodp(bytes, 3);
  for (int b = 0; b < 4; ++b)
    for (std::uint32_t i = 0; i < 256; ++i) s.t[b][i] = multmodp(k, i << (8 * b));
  return s;
}
constexpr ShiftTable kShiftLong = make_shift(kLong);

inline std::uint32_t shift(const ShiftTable& s, std::uint32_t c) {
  return s.t[0][c & 0xff] ^ s.t[1][(c >> 8) & 0xff] ^ s.t[2][(c >> 16) & 0xff] ^ s.t[3][c >> 24];
}

// The instruction on one byte and on 8 bytes, the target that enables it, and whether the CPU
// has it.
#if defined(__x86_64__)
#define DS_CRC_TARGET __attribute__((target("sse4.2")))
DS_CRC_TARGET inline std::uint32_t crc_u8(std::uint32_t c, unsigned char b) { return _mm_crc32_u8(c, b); }
DS_CRC_TARGET inline std::uint64_t crc_u64(std::uint64_t c, std::uint64_t v) { return _mm_crc32_u64(c, v); }
bool have_crc_instruction() { return __builtin_cpu_supports("sse4.2"); }
#else
// Optional in ARMv8.0, part of every ARMv8.1 and later CPU (Neoverse, Grace, Graviton 2 on).
#define DS_CRC_TARGET __attribute__((target("+crc")))
DS_CRC_TARGET inline std::uint32_t crc_u8(std::uint32_t c, unsigned char b) { return __crc32cb(c, b); }
DS_CRC_TARGET inline std::uint64_t crc_u64(std::uint64_t c, std::uint64_t v) { return __crc32cd(std::uint32_t(c), v); }
bool have_crc_instruction() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#endif

DS_CRC_TARGET std::uint32_t crc32c_three_streams(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c0 = ~crc & 0xffffffffu;
  // Align to 8 bytes first (the three streams then load aligned words).
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7) != 0) {
    c0 = crc_u8(std::uint32_t(c0), *p++);
    --bytes;
  }
  while (bytes >= 3 * kLong) {
    std::uint64_t c1 = 0, c2 = 0;
    const unsigned char* end = p + kLong;
    do {
      std::uint64_t a, b, d;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + kLong, 8);
      std::memcpy(&d, p + 2 * kLong, 8);
      c0 = crc_u64(c0, a);
      c1 = crc_u64(c1, b);
      c2 = crc_u64(c2, d);
      p += 8;
    } while (p < end);
    c0 = shift(kShiftLong, std::uint32_t(c0)) ^ std::uint32_t(c1);
    c0 = shift(kShiftLong, std::uint32_t(c0)) ^ std::uint32_t(c2);
    p += 2 * kLong;
    bytes -= 3 * kLong;
  }
  while (bytes >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c0 = crc_u64(c0, v);
    p += 8;
    bytes -= 8;
  }
  std::uint32_t c32 = std::uint32_t(c0);
  while (bytes--) c32 = crc_u8(c32, *p++);
  return ~c32;
}
#endif  // __x86_64__ || __aarch64__

#if defined(__x86_64__)

// Carry-less multiplication folding on 512-bit registers (VPCLMULQDQ; Intel's "Fast CRC
// Computation Using PCLMULQDQ", Gopal et al. 2009, widened to AVX-512). Bit-reflected
// convention: bit k of a 128-bit lane is the coefficient of x^(127-k), so a lane holding
// qwords (L, H) is L(x) x^64 + H(x); clmul of two reflected qwords yields their product
// times x. Moving a lane D bits further along the message multiplies it by x^D:
//   L x^(D+64) + H x^D  ==  clmul(L, x^(D+63) mod P) ^ clmul(H, x^(D-1) mod P)   (mod P),
// a value of at most 96 bits, so lanes stay 128 bits wide. The constants are computed with
// the same GF(2) arithmetic as crc32c_combine. What is left (one 128-bit lane congruent to
// the message so far) is fed to the crc32 instruction as 16 message bytes.
// GCC 12 reports its own _mm512_undefined_* placeholders in the intrinsic headers as
// uninitialized (a false positive of the header, not of this code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
constexpr std::uint64_t fold_const(unsigned exponent) {
  return std::uint64_t(x2nmodp(exponent, 0)) << 32;  // reflected 32-bit -> reflected 64-bit
}
struct FoldK {
  std::uint64_t lo, hi;
};
constexpr FoldK fold_k(unsigned bits) { return {fold_const(bits + 63), fold_const(bits - 1)}; }
constexpr FoldK kFold2048 = fold_k(2048), kFold512 = fold_k(512), kFold384 = fold_k(384), kFold256 = fold_k(256),
                kFold128 = fold_k(128);

__attribute__((target("avx512f,vpclmulqdq"))) inline __m512i fold512(__m512i acc, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11), next,
                                   0x96);
}
__attribute__((target("pclmul,sse4.2"))) inline __m128i fold128(__m128i lane, FoldK k) {
  __m128i kk = _mm_set_epi64x(std::int64_t(k.hi), std::int64_t(k.lo));
  return _mm_xor_si128(_mm_clmulepi64_si128(lane, kk, 0x00), _mm_clmulepi64_si128(lane, kk, 0x11));
}

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) std::uint32_t crc32c_avx512(const void* data, std::size_t bytes,
                                                                                       std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  // bytes >= 256 (the caller checks). The initial register is XORed into the first 4
  // message bytes: the same CRC as starting the register there.
  const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(std::int64_t(kFold2048.hi), std::int64_t(kFold2048.lo)));
  const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(std::int64_t(kFold512.hi), std::int64_t(kFold512.lo)));
  __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128(int(~crc))));
  __m512i a1 = _mm512_loadu_si512(p + 64), a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
  p += 256;
  bytes -= 256;
  while (bytes >= 256) {
    a0 = fold512(a0, k2048, _mm512_loadu_si512(p));
    a1 = fold512(a1, k2048, _mm512_loadu_si512(p + 64));
    a2 = fold512(a2, k2048, _mm512_loadu_si512(p + 128));
    a3 = fold512(a3, k2048, _mm512_loadu_si512(p + 192));
    p += 256;
    bytes -= 256;
  }
  a1 = fold512(a0, k512, a1);
  a2 = fold512(a1, k512, a2);
  a3 = fold512(a2, k512, a3);
  while (bytes >= 64) {
    a3 = fold512(a3, k512, _mm512_loadu_si512(p));
    p += 64;
    bytes -= 64;
  }
  __m128i x = _mm512_extracti32x4_epi32(a3, 3);
  x = _mm_xor_si128(x, fold128(_mm512_extracti32x4_epi32(a3, 2), kFold128));
  x = _mm_xor_si128(x, fold128(_mm512_extracti32x4_epi32(a3, 1), kFold256));
  x = _mm_xor_si128(x, fold128(_mm512_castsi512_si128(a3), kFold384));
  std::uint64_t c = _mm_crc32_u64(0, std::uint64_t(_mm_cvtsi128_si64(x)));
  c = _mm_crc32_u64(c, std::uint64_t(_mm_extract_epi64(x, 1)));
  while (bytes >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    bytes -= 8;
  }
  std::uint32_t c32 = std::uint32_t(c);
  while (bytes--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#pragma GCC diagnostic pop
bool have_avx512_clmul() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("sse4.2");
}
#endif
}  // namespace

std::uint32_t crc32c_ref(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (std::size_t i = 0; i < bytes; ++i) c = kTable[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return ~c;
}

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) {
#if defined(__x86_64__)
  static const bool fold =
      have_avx512_clmul() && cpu_isa() == CpuIsa::avx512 && !env::get_bool("DS_CRC32C_NO_AVX512");
  if (fold && bytes >= 256) return crc32c_avx512(data, bytes, crc);
#endif
  return crc32c_streams(data, bytes, crc);
}

std::uint32_t crc32c_streams(const void* data, std::size_t bytes, std::uint32_t crc) {
#if defined(__x86_64__) || defined(__aarch64__)
  static const bool hw = have_crc_instruction();
  if (hw) return crc32c_three_streams(data, bytes, crc);
#endif
  return crc32c_ref(data, bytes, crc);
}

bool crc32c_streams_available() {
#if defined(__x86_64__) || defined(__aarch64__)
  return have_crc_instruction();
#else
  return false;
#endif
}

std::uint32_t crc32c_fold(const void* data, std::size_t bytes, std::uint32_t crc) {
#if defined(__x86_64__)
  if (have_avx512_clmul() && bytes >= 256) return crc32c_avx512(data, bytes, crc);
#endif
  return crc32c_streams(data, bytes, crc);
}

bool crc32c_fold_available() {
#if defined(__x86_64__)
  return have_avx512_clmul();
#else
  return false;
#endif
}

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t bytes_b) {
  return multmodp(x2nmodp(bytes_b, 3), crc_a) ^ crc_b;
}

}  // namespace ds::io
