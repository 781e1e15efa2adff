// What the token decoders (Gpt, Llama and their CUDA twins) check and keep of a training batch
// or a sampling context: one set of checks, with the same messages, for all.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ds/core/module.h"

namespace ds::nn::detail {

// Checks a batch (sizes > 0, seq <= block_size, batch x seq tokens, ids in [0, vocab));
// returns batch x seq. Errors start with `who` ("Gpt::forward").
std::size_t check_batch(const Batch& batch, std::int64_t block_size, std::int64_t vocab, const char* who);
// check_batch, then copies its inputs and targets.
void take_batch(const Batch& batch, std::int64_t block_size, std::int64_t vocab, const char* who,
                std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets);

// A layer range's batch (LayerSequence::forward_layers): sizes > 0 and seq <= block_size
// always; the inputs (ids checked) when the range starts with the embedding, copied into
// tokens (else tokens is batch x seq zeros: the blocks read positions, not ids); the targets
// when it ends with the loss. Returns batch x seq.
std::size_t take_layer_batch(const Batch& batch, std::int64_t block_size, std::int64_t vocab, const char* who,
                             bool need_inputs, bool need_targets, std::vector<std::int32_t>& tokens,
                             std::vector<std::int32_t>& targets);

// The last block_size tokens of a non-empty context, ids checked.
std::span<const std::int32_t> context_window(std::span<const std::int32_t> context, std::int64_t block_size,
                                             std::int64_t vocab, const char* who);
// context_window copied into tokens.
void take_context(std::span<const std::int32_t> context, std::int64_t block_size, std::int64_t vocab,
                  const char* who, std::vector<std::int32_t>& tokens);

// Array lengths in the activation arenas: multiples of 16 floats (64-byte aligned).
constexpr std::int64_t pad16(std::int64_t n) { return (n + 15) / 16 * 16; }

// Carves a model's arrays out of an activation arena, each on a 16-float boundary.
struct ArenaCarve {
  float* next;
  float* operator()(std::int64_t n) {
    float* r = next;
    next += pad16(n);
    return r;
  }
};

}  // namespace ds::nn::detail
