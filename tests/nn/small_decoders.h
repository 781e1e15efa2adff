// The small GPT and Llama shapes the decoder tests share (3 layers, n_embd 16, block 8):
// every path runs in milliseconds, and the Llama has grouped-query attention.
#pragma once

#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"

namespace dstest {

inline ds::nn::GptConfig gpt_cfg() { return {3, 2, 16, 8, 13}; }

inline ds::nn::LlamaConfig llama_cfg(bool tie) {
  ds::nn::LlamaConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.intermediate_size = 20;
  c.block_size = 8;
  c.vocab_size = 11;
  c.tie_embeddings = tie;
  return c;
}

}  // namespace dstest
