// Token batches of the model tests on the GPU (test_cuda_gpt.cpp, test_cuda_llama.cpp) and of
// the engine tests under MPI (engine_fixture.h): B rows of T inputs and their T targets, and
// the ds::Batch that views them. Host code only; needs nothing beyond ds_core.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ds/core/module.h"

namespace cuda_test {

struct Tokens {
  std::vector<std::int32_t> in, tg;
  std::int64_t B = 0, T = 0;
  ds::Batch batch() const {
    ds::Batch b;
    b.inputs = in;
    b.targets = tg;
    b.batch = B;
    b.seq = T;
    return b;
  }
};

// B x T inputs, then B x T targets, drawn uniformly from [0, V) by mt19937(seed).
inline Tokens make_tokens(std::int64_t B, std::int64_t T, std::int64_t V, unsigned seed) {
  Tokens t;
  t.B = B;
  t.T = T;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> d(0, std::int32_t(V - 1));
  for (std::int64_t i = 0; i < B * T; ++i) t.in.push_back(d(rng));
  for (std::int64_t i = 0; i < B * T; ++i) t.tg.push_back(d(rng));
  return t;
}

}  // namespace cuda_test
