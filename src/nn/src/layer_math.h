// The scalar math the layer row kernels share (layer_rows.inc) and the AVX-512 softmax rows
// mirror (kernels.cpp): a vectorizable exp and tanh. Private to ds_nn.
#pragma once

#include <bit>
#include <cstdint>

namespace ds::nn::kernels {

// Cephes expf: x = n ln2 + r (ln2 split in a high and a low part), exp(r) by a degree-6
// polynomial. Shared by the scalar fast_exp and its AVX-512 form below.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp(x) to ~2 ulp over [-87, 88]; inputs outside are clamped.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : x;  // ternaries, not std::min/max: these vectorize
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by the 1.5 * 2^23 trick (no floor(): a libm call without SSE4.1).
  const float fx = (x * kLog2e + kRound) - kRound;
  const float r = x - fx * kLn2Hi - fx * kLn2Lo;
  float y = kExpP[0];
#pragma GCC unroll 6
  for (int i = 1; i < 6; ++i) y = y * r + kExpP[i];
  y = y * (r * r) + r + 1.0f;
  const std::uint32_t bits = std::uint32_t(std::int32_t(fx) + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

}  // namespace ds::nn::kernels
