// The table of the layer row kernels (GPT and Llama): one row per CPU kernel set, each the
// plain loops of layer_rows.inc compiled for that ISA (layer_rows.cpp). The op functions in
// kernels.cpp and llama_kernels.cpp take the row for ds::cpu_isa() once per call, so
// DS_CPU_ISA selects the copy that runs (the loader's target_clones choice could not be
// forced, so the lower copies went untested on AVX-512 machines). Private to ds_nn.
#pragma once

#include <cstdint>

#include "ds/core/cpu_features.h"

namespace ds::nn::kernels {

struct LayerRows {
  CpuIsa isa;
  // GPT
  void (*gelu_fwd_block)(float* out, const float* inp, std::int64_t n);
  void (*gelu_bwd_block)(float* dinp, const float* inp, const float* dout, std::int64_t n);
  void (*ln_fwd_row)(float* o, float* mean_out, float* rstd_out, const float* x, const float* w, const float* b,
                     std::int64_t C);
  void (*ln_bwd_rows)(float* dx, float* pw, float* pb, const float* dy, const float* x, const float* w,
                      const float* mean, const float* rstd, std::int64_t rows, std::int64_t C);
  void (*colsum_block)(float* dst, const float* src, std::int64_t rows, std::int64_t ld, std::int64_t width);
  void (*causal_softmax_row)(float* row, std::int64_t valid, std::int64_t T);
  void (*softmax_bwd_row)(float* dp, const float* p, std::int64_t valid, std::int64_t T);
  float (*xent_fwd_row)(const float* l, std::int64_t V, float* lse_out);
  void (*xent_bwd_row)(float* l, float lse, std::int64_t V, float k);
  void (*fill_bias_row)(float* o, const float* bias, const float* res, std::int64_t OC);
  void (*add_block)(float* a, const float* b, std::int64_t n);
  void (*emb_fwd_row)(float* o, const float* a, const float* p, std::int64_t C);
  // Llama
  void (*rms_fwd_row)(float* o, float* rstd_out, const float* x, const float* w, std::int64_t C, float eps);
  void (*rms_bwd_row)(float* dx, float* dw, const float* dy, const float* x, const float* w, float r,
                      std::int64_t C);
  void (*rope_row)(float* x, const float* c, const float* s, std::int64_t n_heads, std::int64_t hd, float sign);
  void (*swiglu_fwd_block)(float* o, const float* g, const float* u, std::int64_t n);
  void (*swiglu_bwd_block)(float* dg, float* du, const float* dy, const float* g, const float* u, std::int64_t n);
};

// The row for the ISA in use (read per call: take it once per op, not per row).
const LayerRows& layer_rows();

}  // namespace ds::nn::kernels
