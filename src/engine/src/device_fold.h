// The fold of ZeRO-3 on a CUDA device: this rank's fp32 gradient piece += a reduced piece
// (device_fold.cu) -- add_into_f32.h's job where the bytes are device memory. Declared without
// CUDA headers (the stream as void*); built only with CUDA (DS_PRECISION_HAVE_CUDA).
#pragma once

#include "ds/core/buffer.h"

namespace ds::engine::cuda {

// acc[j] += float(src[j]) for j < src.count; src F32 / F16 / BF16; enqueued on `stream`.
void add_into_f32(float* acc, TensorView src, void* stream);

}  // namespace ds::engine::cuda
