// The attention's causal softmax rows (kernels.cpp: the explicit AVX-512 forms when the CPU has
// them, else the vectorized plain loops), shared with the Llama attention (llama_kernels.cpp).
#pragma once

#include <cstdint>

namespace ds::nn::kernels {

// Every row i of S[T, T] (scaled scores): softmax over entries 0..i in place, the rest zeroed.
void causal_softmax_rows(float* S, std::int64_t T);
// Every row i of dP[T, T]: dS = P * (dP - sum(P * dP)) over 0..i in place, the rest zeroed.
void causal_softmax_bwd_rows(float* dP, const float* P, std::int64_t T);

}  // namespace ds::nn::kernels
