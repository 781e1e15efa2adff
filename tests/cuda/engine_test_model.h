// The small GPT and the training step shared by the engine-on-GPU tests
// (test_cuda_engine.cpp: one GPU vs the CPU engine; test_cuda_engine_mpi.cpp: several GPUs
// vs one process).
#pragma once

#include <cstdint>

#include "ds/core/module.h"
#include "ds/engine/engine.h"
#include "ds/nn/gpt.h"

namespace engine_test {

// 2 layers, 2 heads of 16, context 16, vocabulary 61; sequences of kT tokens.
inline ds::nn::GptConfig small_gpt() {
  ds::nn::GptConfig g;
  g.n_layer = 2;
  g.n_head = 2;
  g.n_embd = 32;
  g.block_size = 16;
  g.vocab_size = 61;
  return g;
}
constexpr std::int64_t kT = 15;
constexpr std::int32_t kMaxToken = 60;  // tokens are drawn from [0, kMaxToken]

// forward, backward, step; returns the forward loss.
inline float train_step(ds::Engine& e, const ds::Batch& b) {
  const float loss = e.forward(b);
  e.backward(loss);
  e.step();
  return loss;
}

}  // namespace engine_test
