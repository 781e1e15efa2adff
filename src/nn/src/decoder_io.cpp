#include "decoder_io.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::nn::detail {

std::size_t check_batch(const Batch& batch, std::int64_t block_size, std::int64_t V, const char* who) {
  const std::int64_t B = batch.batch, T = batch.seq;
  DS_CHECK(B > 0 && T > 0, who << ": batch (" << B << ") and seq (" << T << ") must be > 0");
  DS_CHECK(T <= block_size, who << ": seq " << T << " exceeds block_size " << block_size);
  const std::size_t N = std::size_t(B * T);
  DS_CHECK(batch.inputs.size() == N && batch.targets.size() == N,
           who << ": inputs/targets must hold batch*seq = " << N << " tokens, got " << batch.inputs.size() << "/"
               << batch.targets.size());
  for (std::size_t i = 0; i < N; ++i) {
    const std::int32_t in = batch.inputs[i], out = batch.targets[i];
    DS_CHECK(in >= 0 && in < V && out >= 0 && out < V,
             who << ": token id out of range [0, " << V << ") at position " << i << " (input " << in
                 << ", target " << out << ")");
  }
  return N;
}

void take_batch(const Batch& batch, std::int64_t block_size, std::int64_t V, const char* who,
                std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) {
  check_batch(batch, block_size, V, who);
  tokens.assign(batch.inputs.begin(), batch.inputs.end());
  targets.assign(batch.targets.begin(), batch.targets.end());
}

namespace {

void check_ids(std::span<const std::int32_t> ids, std::int64_t V, const char* who, const char* what) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    DS_CHECK(ids[i] >= 0 && ids[i] < V,
             who << ": token id out of range [0, " << V << ") at position " << i << " (" << what << " " << ids[i] << ")");
}

}  // namespace

std::size_t take_layer_batch(const Batch& batch, std::int64_t block_size, std::int64_t V, const char* who,
                             bool need_inputs, bool need_targets, std::vector<std::int32_t>& tokens,
                             std::vector<std::int32_t>& targets) {
  const std::int64_t B = batch.batch, T = batch.seq;
  DS_CHECK(B > 0 && T > 0, who << ": batch (" << B << ") and seq (" << T << ") must be > 0");
  DS_CHECK(T <= block_size, who << ": seq " << T << " exceeds block_size " << block_size);
  const std::size_t N = std::size_t(B * T);
  if (need_inputs) {
    DS_CHECK(batch.inputs.size() == N, who << ": the first layer's inputs must hold batch*seq = " << N
                                           << " tokens, got " << batch.inputs.size());
    check_ids(batch.inputs, V, who, "input");
    tokens.assign(batch.inputs.begin(), batch.inputs.end());
  } else {
    tokens.assign(N, 0);
  }
  if (need_targets) {
    DS_CHECK(batch.targets.size() == N, who << ": the last layer's targets must hold batch*seq = " << N
                                            << " tokens, got " << batch.targets.size());
    check_ids(batch.targets, V, who, "target");
    targets.assign(batch.targets.begin(), batch.targets.end());
  }
  return N;
}

std::span<const std::int32_t> context_window(std::span<const std::int32_t> context, std::int64_t block_size,
                                             std::int64_t V, const char* who) {
  DS_CHECK(!context.empty(), who << ": empty context");
  const auto window = context.last(std::min<std::size_t>(context.size(), std::size_t(block_size)));
  for (std::int32_t t : window) DS_CHECK(t >= 0 && t < V, who << ": token " << t << " outside [0, " << V << ")");
  return window;
}

void take_context(std::span<const std::int32_t> context, std::int64_t block_size, std::int64_t V, const char* who,
                  std::vector<std::int32_t>& tokens) {
  const auto window = context_window(context, block_size, V, who);
  tokens.assign(window.begin(), window.end());
}

}  // namespace ds::nn::detail
