// Autoregressive sampling shared by the built-in GPTs (Gpt on the CPU, GptCuda on a GPU), so
// the same next-token logits give the same tokens on both.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace ds::nn {

// Appends n_new tokens to context (empty: starts from token 0), each drawn from
// softmax(logits / temperature) of logits_last(tokens so far) -- temperature <= 0: the argmax --
// by inverse-CDF sampling with a 53-bit uniform from mt19937_64(seed) (platform-independent,
// unlike std:: distributions). Returns the new tokens.
std::vector<std::int32_t> sample_tokens(
    std::span<const std::int32_t> context, int n_new, float temperature, std::uint64_t seed,
    const std::function<std::vector<float>(std::span<const std::int32_t>)>& logits_last);

}  // namespace ds::nn
