// Model-state memory per rank: what the engine really allocated (Engine::memory_report) and
// the ZeRO paper's estimate (arXiv:1910.02054 §5), like DeepSpeed's
// estimate_zero2_model_states_mem_needs but with the paper's accounting:
//   stage 0: wP + wP + (4 + K)P            (w = working bytes/param: 2 for fp16/bf16, 4 for fp32)
//   stage 1: wP + wP + (4 + K)P/N          mixed-precision Adam (K = 8): 2P + 2P + 12P/N
//   stage 2: wP + wP/N + (4 + K)P/N        mixed-precision Adam: 2P + (2 + 12)P/N
// K = optimizer state bytes per parameter (Adam/AdamW/Lamb 8, SGD with momentum 4,
// SGD without 0, Adagrad 4); 4P = fp32 master weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds/core/dtype.h"

namespace ds::engine {

struct ModelStateBytes {
  std::size_t params = 0;           // working parameters (fp32 | fp16 | bf16)
  std::size_t grads = 0;            // gradients (working dtype) + communication scratch
  std::size_t master = 0;           // fp32 master weights (this rank's slice under ZeRO)
  std::size_t optimizer_state = 0;  // optimizer moments etc. (this rank's slice under ZeRO)
  std::size_t comm_scratch = 0;     // engine only: all-gather staging, comm-dtype copies
  std::size_t total() const { return params + grads + master + optimizer_state + comm_scratch; }
  std::string to_string() const;    // "params 1.2 MiB, grads ..., master ..., optimizer ..., total ..."
};

// Optimizer state bytes per parameter for a DeepSpeed optimizer name ("adam", "adamw",
// "lamb", "sgd", "adagrad"); `sgd_momentum` says whether SGD keeps a momentum buffer.
std::size_t optimizer_state_bytes_per_param(const std::string& optimizer_type, bool sgd_momentum = true);

// The paper's per-rank bytes for `num_params` parameters on `world_size` data-parallel ranks.
ModelStateBytes estimate_model_states_bytes(std::size_t num_params, int world_size, int zero_stage,
                                            DType working_dtype = DType::F16,
                                            std::size_t optimizer_bytes_per_param = 8);

}  // namespace ds::engine
