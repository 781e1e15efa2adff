// Per-element optimizer math shared by the references and the fast kernels' plain fallback.
// Private header. Compiled with -ffp-contract=off (CMakeLists) so no FMA changes rounding:
// the AVX-512 kernels perform the same IEEE operations in the same order, bit for bit.
#pragma once

#include <cmath>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/optim/kernels.h"
#include "elem_math.h"

namespace ds::optim::detail {

// Views need not be aligned to their element size (a working copy may start at any byte of
// a packed buffer; the vector kernels load and store unaligned), so element i goes through
// memcpy, which compiles to one plain move.
template <class T>
inline T load_elem(const void* base, std::size_t i) {
  T x;
  std::memcpy(&x, static_cast<const unsigned char*>(base) + i * sizeof(T), sizeof(T));
  return x;
}
template <class T>
inline void store_elem(void* base, std::size_t i, T x) {
  std::memcpy(static_cast<unsigned char*>(base) + i * sizeof(T), &x, sizeof(T));
}

inline float load_grad(const TensorView& g, std::size_t i) {
  switch (g.dtype) {
    case DType::F16: return f16_to_float(load_elem<f16>(g.data, i));
    case DType::BF16: return bf16_to_float(load_elem<bf16>(g.data, i));
    default: return load_elem<float>(g.data, i);
  }
}

inline void store_working(const TensorView& w, std::size_t i, float x) {
  switch (w.dtype) {
    case DType::F16: store_elem(w.data, i, float_to_f16(x)); break;
    case DType::BF16: store_elem(w.data, i, float_to_bf16(x)); break;
    default: store_elem(w.data, i, x); break;
  }
}

inline void check_views(const TensorView& g, const TensorView& w, std::size_t n, const char* who) {
  DS_CHECK(g.dtype == DType::F32 || g.dtype == DType::F16 || g.dtype == DType::BF16,
           who << ": gradient dtype must be fp32, fp16 or bf16, got " << dtype_name(g.dtype));
  DS_CHECK(g.count >= n && (g.data != nullptr || n == 0),
           who << ": gradient view holds " << g.count << " elements, the step needs " << n);
  if (w.data != nullptr) {
    DS_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16,
             who << ": working dtype must be fp32, fp16 or bf16, got " << dtype_name(w.dtype));
    DS_CHECK(w.count >= n, who << ": working view holds " << w.count << " elements, the step needs " << n);
  }
}

inline void check_segments(std::span<const Segment> segs, std::size_t n, const char* who) {
  std::size_t end = 0;
  for (const Segment& s : segs) {
    DS_CHECK(s.offset >= end && s.offset + s.count <= n,
             who << ": segments must be sorted, disjoint and within the " << n
                 << " elements; got segment [" << s.offset << ", " << s.offset + s.count << ")");
    end = s.offset + s.count;
  }
}

}  // namespace ds::optim::detail
