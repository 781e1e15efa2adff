#include "decoder_io.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::nn::detail {

void take_batch(const Batch& batch, std::int64_t block_size, std::int64_t V, const char* who,
                std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) {
  const std::int64_t B = batch.batch, T = batch.seq;
  DS_CHECK(B > 0 && T > 0, who << ": batch (" << B << ") and seq (" << T << ") must be > 0");
  DS_CHECK(T <= block_size, who << ": seq " << T << " exceeds block_size " << block_size);
  const std::size_t N = std::size_t(B * T);
  DS_CHECK(batch.inputs.size() == N && batch.targets.size() == N,
           who << ": inputs/targets must hold batch*seq = " << N << " tokens, got " << batch.inputs.size() << "/"
               << batch.targets.size());
  tokens.assign(batch.inputs.begin(), batch.inputs.end());
  targets.assign(batch.targets.begin(), batch.targets.end());
  for (std::size_t i = 0; i < N; ++i)
    DS_CHECK(tokens[i] >= 0 && tokens[i] < V && targets[i] >= 0 && targets[i] < V,
             who << ": token id out of range [0, " << V << ") at position " << i << " (input " << tokens[i]
                 << ", target " << targets[i] << ")");
}

void take_context(std::span<const std::int32_t> context, std::int64_t block_size, std::int64_t V, const char* who,
                  std::vector<std::int32_t>& tokens) {
  DS_CHECK(!context.empty(), who << ": empty context");
  const std::size_t T = std::min<std::size_t>(context.size(), std::size_t(block_size));
  tokens.assign(context.end() - std::ptrdiff_t(T), context.end());
  for (std::int32_t t : tokens) DS_CHECK(t >= 0 && t < V, who << ": token " << t << " outside [0, " << V << ")");
}

}  // namespace ds::nn::detail
