// Internal to ds_nn's GEMMs: the portable part of the blocking every kernel set shares (the
// AVX-512, AVX2 and NEON fp32 kernels, the bf16 kernel): the operand view, the tile order and
// the threads' split of it, and the per-thread packing buffers.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "ds/core/buffer.h"

namespace ds::nn::detail {

// Element (i, k) of op(X) where X is stored row-major with leading dimension ld.
struct View {
  const float* p;
  std::int64_t ld;
  bool trans;  // op(X) = X^T
  float at(std::int64_t i, std::int64_t k) const { return trans ? p[k * ld + i] : p[i * ld + k]; }
};

// f(i) for i in [first, last) by `step`: split statically over the team of the enclosing
// `omp parallel` when `team` (with the loop's barrier unless `nowait`), else all in order on
// the calling thread. The GEMMs open a parallel region only when they are large enough to
// split: on the KVM guests measured, an inactive one-thread region costs ~1.2 us and each
// of its loop barriers ~1.1 us, 3.5-5 us per small GEMM, and the attention runs 768 GEMMs of
// 10-20 us per step. (An orphaned `omp for` would bind to a caller's team instead: the
// attention calls the GEMMs from inside its own parallel loop.)
template <class F>
inline void for_range(bool team, bool nowait, std::int64_t first, std::int64_t last, std::int64_t step, F&& f) {
  if (!team) {
    for (std::int64_t i = first; i < last; i += step) f(i);
  } else if (nowait) {
#pragma omp for schedule(static) nowait
    for (std::int64_t i = first; i < last; i += step) f(i);
  } else {
#pragma omp for schedule(static)
    for (std::int64_t i = first; i < last; i += step) f(i);
  }
}

// Per-core L2 size (the tile order depends on it); 2 MiB when the system does not say.
inline std::uint64_t l2_bytes() {
  static const std::uint64_t b = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? std::uint64_t(v) : std::uint64_t(2) << 20;
  }();
  return b;
}

// The tile order every kernel uses: C in blocks of as many column panels as fit half the L2
// (panel_bytes each: the packed or in-place op(B) of one column panel over all of k), and
// inside a block the row strips outside, the block's panels inside each strip: the strip
// stays in L1, the block's B in the L2, and A comes through once per block. With `team` the
// threads split each block by row strips (static schedule: thread t gets the t-th range of
// strips of every block), the rows the other row-parallel ops give it too, so a thread reads
// mostly the activations it wrote. tile(i, j): row strip i, column panel j.
template <class Tile>
inline void for_each_tile(bool team, std::int64_t mp, std::int64_t np, std::uint64_t panel_bytes, Tile&& tile) {
  const std::int64_t nb = std::max<std::int64_t>(1, std::int64_t(l2_bytes() / 2 / std::max<std::uint64_t>(panel_bytes, 1)));
  for (std::int64_t j0 = 0; j0 < np; j0 += nb) {
    const std::int64_t nj = std::min(nb, np - j0);
    for_range(team, true, 0, mp * nj, 1, [&](std::int64_t t) { tile(t / nj, j0 + t % nj); });
  }
}

// run(team): in a parallel region of all threads when `par` (run(true), whose for_range loops
// split among them), else on the calling thread alone (run(false)) with no OpenMP region.
template <class Run>
inline void run_gemm(bool par, Run&& run) {
  if (par) {
#pragma omp parallel
    run(true);
  } else {
    run(false);
  }
}

// Packing buffers, one pair per calling thread (the attention runs one GEMM per thread):
// allocated at the first call, grown only when a larger GEMM arrives.
inline HostBuffer& pack_buffer(int which) {
  thread_local HostBuffer bufs[2];
  return bufs[which];
}
inline std::uint32_t* ensure(int which, std::size_t words) {
  HostBuffer& b = pack_buffer(which);
  if (b.bytes() < words * 4) b = HostBuffer(words * 4);
  return b.as<std::uint32_t>();
}

// op(B) rows contiguous in n (B not transposed, X = B seen as X(n, k) with x.trans) into a
// k-major panel of `width` columns: out[k][c] = B(k, n0 + c), one copy per k row, zeros past
// `valid` columns.
inline void copy_b_rows(float* out, const View& x, std::int64_t n0, std::int64_t valid, std::int64_t K,
                        std::int64_t width) {
  for (std::int64_t k = 0; k < K; ++k) {
    float* o = out + k * width;
    std::copy(x.p + k * x.ld + n0, x.p + k * x.ld + n0 + valid, o);
    std::fill(o + valid, o + width, 0.0f);
  }
}

// Transposed-A strips are packed kStripGroup at a time (they share each k row's cache lines).
constexpr std::int64_t kStripGroup = 8;

}  // namespace ds::nn::detail
