// What the same-bits-on-any-thread-count tests share: a computation run with a given number of
// OpenMP threads, and a bit-for-bit comparison of two results.
#pragma once

#include <omp.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

namespace ds::test {

// f() with omp_set_num_threads(threads), the previous setting restored after.
template <class F>
auto on_threads(int threads, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto r = f();
  omp_set_num_threads(before);
  return r;
}

// Empty when a and b hold the same bits, else where they first differ.
inline std::string first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]))
      return "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " against " + std::to_string(b[i]);
  return "";
}

}  // namespace ds::test
