// CUDA precision kernels: fused grad stats (sum of squares + inf/NaN flag), fused unscale +
// check, fp32 -> fp16/bf16 cast, and the loss-scale/clip step prologue on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ds/core/cuda_check.h"
#include "ds/core/cuda_convert.cuh"
#include "ds/core/cuda_vec.cuh"
#include "ds/core/error.h"
#include "ds/precision/cuda_kernels.h"

namespace ds::precision::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kIlp = 8;

using ds::cuda::from_f;
using ds::cuda::to_f;

using ds::cuda::aligned16;
using ds::cuda::load8;
using ds::cuda::store8;

unsigned blocks_for(std::size_t items) { return ds::cuda::grid_blocks(std::int64_t(items), kThreads, 65535); }

template <typename T>
__global__ void grad_stats_kernel(const T* __restrict__ g, std::size_t n, std::size_t nvec, double* sumsq, int* found) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  double acc = 0.0;
  bool bad = false;
  for (std::size_t t = tid; t < nvec; t += stride) {
    float r[8];
    load8(g, t * kIlp, r);
#pragma unroll
    for (int k = 0; k < 8; ++k) { acc += double(r[k]) * double(r[k]); bad |= !isfinite(r[k]); }
  }
  for (std::size_t i = nvec * kIlp + tid; i < n; i += stride) {
    const float x = to_f(g[i]);
    acc += double(x) * double(x);
    bad |= !isfinite(x);
  }
  __shared__ double s[kThreads];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if (int(threadIdx.x) < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sumsq, s[0]);
  if (bad) *found = 1;
}

template <typename T>
__global__ void unscale_kernel(T* __restrict__ g, std::size_t n, std::size_t nvec, const float* mult, int* found) {
  const float m = *mult;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  bool bad = false;
  for (std::size_t t = tid; t < nvec; t += stride) {
    float r[8];
    load8(g, t * kIlp, r);
#pragma unroll
    for (int k = 0; k < 8; ++k) { bad |= !isfinite(r[k]); r[k] = r[k] * m; }
    store8(g, t * kIlp, r);
  }
  for (std::size_t i = nvec * kIlp + tid; i < n; i += stride) {
    const float x = to_f(g[i]);
    bad |= !isfinite(x);
    g[i] = from_f<T>(x * m);
  }
  if (bad) *found = 1;
}

template <typename T>
__global__ void cast_kernel(const float* __restrict__ src, T* __restrict__ dst, std::size_t n, std::size_t nvec) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t t = tid; t < nvec; t += stride) {
    float r[8];
    load8(src, t * kIlp, r);
    store8(dst, t * kIlp, r);
  }
  for (std::size_t i = nvec * kIlp + tid; i < n; i += stride) dst[i] = from_f<T>(src[i]);
}

// The LossScaler state machine (loss_scaler.cpp), on the device.
__global__ void prologue_kernel(DeviceScalerState* st, LossScalerConfig cfg, const int* found, const double* sumsq,
                                float clip, int* skip, float* grad_scale, float* grad_norm, std::int64_t* step) {
  const bool overflow = *found != 0;
  const double prev = st->cur_scale;
  bool stuck = false;
  if (overflow) st->consecutive_overflows += 1; else st->consecutive_overflows = 0;
  if (!cfg.dynamic) {
    if (overflow) st->last_overflow_iter = st->cur_iter;
    st->cur_iter += 1;
  } else if (overflow) {
    if (cfg.hysteresis == 1 || st->cur_hysteresis == 1) {
      if (st->cur_scale == cfg.min_scale && cfg.raise_at_min_scale) stuck = true;
      else st->cur_scale = fmax(st->cur_scale / 2.0, cfg.min_scale);
    } else {
      st->cur_hysteresis -= 1;
    }
    if (!stuck) {
      st->last_overflow_iter = st->cur_iter;
      st->cur_iter += 1;
    }
  } else {
    if (cfg.consecutive_hysteresis) st->cur_hysteresis = cfg.hysteresis;
    const std::int64_t stable = st->cur_iter - st->last_overflow_iter - 1;
    if (stable > 0 && stable % cfg.window == 0) {
      if (!cfg.consecutive_hysteresis) st->cur_hysteresis = cfg.hysteresis;
      st->cur_scale *= 2.0;
    }
    st->cur_iter += 1;
  }
  if (stuck) st->stuck = 1;
  if (overflow) {
    *skip = 1;
    *grad_norm = -1.f;
    return;
  }
  const double norm = sqrt(*sumsq) / prev;
  double coef = 1.0;
  if (clip > 0.f) {
    const double c = double(clip) / (norm + 1e-6);
    coef = c < 1.0 ? c : 1.0;
  }
  *skip = 0;
  *grad_scale = float(coef / prev);
  *grad_norm = float(norm);
  if (step != nullptr) *step += 1;
}

__global__ void pack_stats_kernel(const double* sumsq, const int* found, StepInputs in, double* red) {
  const StepStats st = pack_step_stats(*sumsq, *found, in);
  for (int k = 0; k < 4; ++k) red[k] = st.v[k];
}

__global__ void decide_kernel(const double* red, const double* sumsq, const int* found, StepInputs in,
                              StepDecision* out, int* skip, float* grad_scale) {
  const StepStats st{{red[0], red[1], red[2], red[3]}};
  const StepDecision d = decide_step(st, *sumsq, *found, in);
  *out = d;
  *skip = d.skip;
  *grad_scale = float(d.grad_scale);
}

template <class F>
void by_dtype(DType t, const char* who, F&& f) {
  ds::cuda::by_dtype(t, who, f);
}

}  // namespace

void grad_stats(TensorView g, double* d_sumsq, int* d_found_inf, cudaStream_t stream) {
  by_dtype(g.dtype, "grad_stats (CUDA)", [&]<typename T>() {
    if (g.count == 0) return;
    const std::size_t nvec = aligned16(g.data) ? g.count / kIlp : 0;
    grad_stats_kernel<T><<<blocks_for(nvec ? nvec : g.count), kThreads, 0, stream>>>(
        static_cast<const T*>(g.data), g.count, nvec, d_sumsq, d_found_inf);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void unscale_check(TensorView g, const float* d_multiplier, int* d_found_inf, cudaStream_t stream) {
  by_dtype(g.dtype, "unscale_check (CUDA)", [&]<typename T>() {
    if (g.count == 0) return;
    const std::size_t nvec = aligned16(g.data) ? g.count / kIlp : 0;
    unscale_kernel<T><<<blocks_for(nvec ? nvec : g.count), kThreads, 0, stream>>>(
        static_cast<T*>(g.data), g.count, nvec, d_multiplier, d_found_inf);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void cast_from_f32(const float* src, TensorView dst, cudaStream_t stream) {
  by_dtype(dst.dtype, "cast_from_f32 (CUDA)", [&]<typename T>() {
    if (dst.count == 0) return;
    const std::size_t nvec = aligned16(src) && aligned16(dst.data) ? dst.count / kIlp : 0;
    cast_kernel<T><<<blocks_for(nvec ? nvec : dst.count), kThreads, 0, stream>>>(src, static_cast<T*>(dst.data),
                                                                                 dst.count, nvec);
    DS_CUDA_CHECK_LAUNCH();
  });
}

DeviceScalerState to_device_state(const LossScalerState& s) {
  return {s.cur_scale, s.cur_iter, s.last_overflow_iter, s.consecutive_overflows, s.cur_hysteresis, 0};
}
LossScalerState from_device_state(const DeviceScalerState& s) {
  LossScalerState r;
  r.cur_scale = s.cur_scale;
  r.cur_iter = s.cur_iter;
  r.last_overflow_iter = s.last_overflow_iter;
  r.consecutive_overflows = s.consecutive_overflows;
  r.cur_hysteresis = s.cur_hysteresis;
  return r;
}

void step_prologue(DeviceScalerState* state, const LossScalerConfig& cfg, const int* d_found_inf,
                   const double* d_sumsq, float clip, int* d_skip, float* d_grad_scale, float* d_grad_norm,
                   std::int64_t* d_step, cudaStream_t stream) {
  prologue_kernel<<<1, 1, 0, stream>>>(state, cfg, d_found_inf, d_sumsq, clip, d_skip, d_grad_scale, d_grad_norm, d_step);
  DS_CUDA_CHECK_LAUNCH();
}

void pack_step_stats(const double* d_sumsq, const int* d_found_inf, const StepInputs& in, double* d_red,
                     cudaStream_t stream) {
  pack_stats_kernel<<<1, 1, 0, stream>>>(d_sumsq, d_found_inf, in, d_red);
  DS_CUDA_CHECK_LAUNCH();
}

void decide_step(const double* d_red, const double* d_sumsq, const int* d_found_inf, const StepInputs& in,
                 StepDecision* d_out, int* d_skip, float* d_grad_scale, cudaStream_t stream) {
  decide_kernel<<<1, 1, 0, stream>>>(d_red, d_sumsq, d_found_inf, in, d_out, d_skip, d_grad_scale);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::precision::cuda
