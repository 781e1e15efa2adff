#include "ds/io/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
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

#if defined(__x86_64__)
// Three interleaved streams (crc32 has a latency of 3 cycles and a throughput of 1 per
// cycle, so one stream runs at a third of the instruction's rate). Each block of 3 * kLong
// bytes is three independent CRC registers, joined by shifting the earlier ones over the
// later bytes: shifting a raw register over n zero bytes multiplies it by x^(8n) mod P, a
// linear map done with four byte tables (Mark Adler's crc32c.c method).
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

__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c0 = ~crc & 0xffffffffu;
  // Align to 8 bytes first (the three streams then load aligned words).
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7) != 0) {
    c0 = _mm_crc32_u8(std::uint32_t(c0), *p++);
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
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, d);
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
    c0 = _mm_crc32_u64(c0, v);
    p += 8;
    bytes -= 8;
  }
  std::uint32_t c32 = std::uint32_t(c0);
  while (bytes--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
bool have_sse42() { return __builtin_cpu_supports("sse4.2"); }
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
  static const bool hw = have_sse42();
  if (hw) return crc32c_sse42(data, bytes, crc);
#endif
  return crc32c_ref(data, bytes, crc);
}

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t bytes_b) {
  return multmodp(x2nmodp(bytes_b, 3), crc_a) ^ crc_b;
}

}  // namespace ds::io
