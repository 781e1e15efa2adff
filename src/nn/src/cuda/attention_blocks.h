// The causal softmax of ds/nn/cuda_kernels.h for a block-causal attention (GptCuda's
// materialised path, which multiplies only the query-block x key-prefix part of the [T, T]
// scores): the zeros above the diagonal are written only up to the end of each row's block of
// fill_block rows, i.e. only where the block-causal products read. fill_block 0: up to T, as
// causal_softmax_forward / causal_softmax_backward.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ds/core/dtype.h"

namespace ds::nn::cuda {

void causal_softmax_forward_blocks(void* att, const void* scores, float scale, std::int64_t BNH, std::int64_t T,
                                   std::int64_t fill_block, DType dt, cudaStream_t stream);
void causal_softmax_backward_blocks(void* dscores, const void* att, const void* datt, float scale, std::int64_t BNH,
                                    std::int64_t T, std::int64_t fill_block, DType dt, cudaStream_t stream);

}  // namespace ds::nn::cuda
