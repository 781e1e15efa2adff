// Private helpers of the fast CPU kernels that do not depend on the ISA: the (grad dtype,
// working dtype) dispatch, the OpenMP range split, the streaming-store choice and the software
// prefetch. The vector rows are vec_<isa>.h; the kernels written over them kernel_bodies.inc;
// the table of rows kernel_set.h.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/core/error.h"

namespace ds::optim::simd {

// Working-copy kinds in the dispatch: the DTypes, plus two internal sentinels.
inline constexpr DType kNone = DType::U8;          // no working copy
inline constexpr DType kBf16Native = DType::I64;  // bf16 through AVX512_BF16's vcvtneps2bf16

// Calls f.template operator()<G, W>() for the runtime dtypes (w = kNone: no working copy);
// a bf16 working copy is kBf16Native when native_bf16 (the row and the CPU have it).
template <class F>
void dispatch(DType g, DType w, bool native_bf16, F&& f) {
  auto with_w = [&]<DType G>() {
    switch (w) {
      case DType::F32: f.template operator()<G, DType::F32>(); break;
      case DType::F16: f.template operator()<G, DType::F16>(); break;
      case DType::BF16:
        if (native_bf16) f.template operator()<G, kBf16Native>();
        else f.template operator()<G, DType::BF16>();
        break;
      default: f.template operator()<G, kNone>(); break;
    }
  };
  switch (g) {
    case DType::F16: with_w.template operator()<DType::F16>(); break;
    case DType::BF16: with_w.template operator()<DType::BF16>(); break;
    default: with_w.template operator()<DType::F32>(); break;
  }
}

// Below this many elements one thread does it all (a parallel region costs a few us).
inline constexpr std::size_t kMinParallel = 1 << 15;

// Non-temporal working-copy stores (store_w's nt) from this many bytes of working copy up
// (twice a core's L2 on the AVX-512 CI machine): the step streams 7-10x as many bytes of state through the caches
// in the same pass, so a copy this large would not stay cached for the next forward pass
// anyway, and the stores skip the read-for-ownership of every line (bench/optim: faster from
// 10M parameters on). Below it, plain stores leave the copy in cache.
inline constexpr std::size_t kStreamWorkingBytes = std::size_t(4) << 20;

// The threshold stream_working() uses: kStreamWorkingBytes. Not a user setting; the kernel
// tests (which include this private header) lower it to 0 to cover the streaming stores at
// small, awkward sizes, and put it back.
inline std::size_t& stream_min_bytes() {
  static std::size_t bytes = kStreamWorkingBytes;
  return bytes;
}

// Whether a step over n elements writes working copy w (dtype wt; null: none) with
// non-temporal stores: large enough, and aligned for them (64 bytes; the kernels' vectors
// start at 16-element multiples, so every full fp32 vector is then 64-byte and every 16-bit
// one 32-byte aligned).
inline bool stream_working(const void* w, std::size_t n, DType wt) {
  if (w == nullptr || (reinterpret_cast<std::uintptr_t>(w) % 64) != 0) return false;
  return n * dtype_size(wt) >= stream_min_bytes();
}

// Splits [0, n) into one contiguous range per thread, boundaries on 16-element (64-byte)
// multiples, and calls chunk(lo, hi) on each.
template <class Chunk>
void parallel_ranges(std::size_t n, Chunk&& chunk) {
  const int nt = n < kMinParallel ? 1 : omp_get_max_threads();
  if (nt <= 1) {
    if (n) chunk(std::size_t(0), n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const std::size_t t = std::size_t(omp_get_thread_num()), T = std::size_t(omp_get_num_threads());
    const std::size_t per = ((n + T - 1) / T + 15) & ~std::size_t(15);
    const std::size_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) chunk(lo, hi);
  }
}

// Software prefetch distance, in bytes ahead of the element being processed, per stream.
// The hardware prefetchers alone let the compute-heavier kernels (a square root and a
// division per element) fall 5-15% behind a plain streaming kernel with the same bytes,
// most at 2 threads; a prefetch per 64-byte line this far ahead closes most of that gap
// (bench/optim: the pattern kernel uses the same loop, so the limit gains it too).
inline constexpr std::size_t kPrefetchBytes = 1024;

// Prefetches, kPrefetchBytes ahead, the lines that elements [i, i + 32) of a stream of
// element size E bytes will need: 2 lines for fp32, 1 for fp16/bf16.
template <std::size_t E>
inline void prefetch32(const void* base, std::size_t i) {
  const char* a = static_cast<const char*>(base) + i * E + kPrefetchBytes;
  __builtin_prefetch(a, 0, 3);
  if constexpr (E == 4) __builtin_prefetch(a + 64, 0, 3);
}

// The gradient stream (dtype G) and the working-copy stream (W, kNone: nothing).
template <DType G>
inline void prefetch_g32(const void* g, std::size_t i) {
  prefetch32<G == DType::F32 ? 4 : 2>(g, i);
}
// Not with non-temporal stores (nt): a prefetch would read the line those stores avoid reading.
template <DType W>
inline void prefetch_w32(const void* w, std::size_t i, bool nt) {
  if (nt) return;
  if constexpr (W == DType::F32) prefetch32<4>(w, i);
  else if constexpr (W != kNone) prefetch32<2>(w, i);
}


}  // namespace ds::optim::simd
