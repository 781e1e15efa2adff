// Decoder's LayerSequence side (ds/core/layer_sequence.h): the layers are the ZeRO-3 groups,
// and a range runs the model's run_layers / run_backward between the residual streams.
#include <algorithm>
#include <string>

#include "ds/core/error.h"
#include "ds/nn/decoder.h"
#include "decoder_io.h"

namespace ds::nn {

std::vector<LayerSpec> Decoder::layers() const {
  std::vector<LayerSpec> out;
  for (const ParamGroup& g : groups_) out.push_back({g.name, g.first, g.count});
  out.back().name = "head";  // the final norm's group, the LM head and the loss
  return out;
}

std::vector<TiedWeight> Decoder::tied_weights() const {
  if (!tied_head_) return {};
  const std::size_t embedding = groups_.front().first;
  return {{ps_.infos()[embedding].name, embedding, {0, num_layers() - 1}}};
}

std::vector<std::int64_t> Decoder::activation_shape(std::size_t boundary, const Batch& batch) const {
  DS_CHECK(boundary > 0 && boundary < num_layers(),
           name_ << "::activation_shape: boundary " << boundary << " outside 1 .. " << num_layers() - 1);
  return {batch.batch, batch.seq, width_};
}

void Decoder::prepare_layers(std::size_t first, std::size_t last) {
  if (hooks_) return;
  if (first == 0 && last == num_layers()) {
    ps_.prepare_forward();
    return;
  }
  for (std::size_t i = first; i < last; ++i) ps_.prepare_forward(groups_[i].first, groups_[i].count);
  if (tied_head_ && first > 0 && last == num_layers()) ps_.prepare_forward(groups_.front().first, 1);
}

float Decoder::forward_layers(const Batch& batch, std::size_t first, std::size_t last, std::span<const float> input,
                              std::span<float> output) {
  have_cache_ = false;
  const std::size_t n = num_layers();
  const std::string who = std::string(name_) + "::forward_layers";
  DS_CHECK(first < last && last <= n,
           who << ": layers [" << first << ", " << last << ") are not a non-empty range of the " << n << " layers");
  const std::size_t N = detail::take_layer_batch(batch, block_size_, vocab_, who.c_str(), first == 0, last == n,
                                                 tokens_, targets_);
  const std::size_t width = N * std::size_t(width_);
  DS_CHECK(input.size() == (first == 0 ? 0 : width),
           who << ": input holds " << input.size() << " floats; layer " << first << " takes "
               << (first == 0 ? 0 : width) << " (batch x seq x " << width_ << ", none for the embedding)");
  DS_CHECK(output.size() == (last == n ? 0 : width),
           who << ": output holds " << output.size() << " floats; layer " << last - 1 << " gives "
               << (last == n ? 0 : width) << " (batch x seq x " << width_ << ", none for the head)");
  ensure_scratch(batch.batch, batch.seq);
  if (first > 0) std::copy(input.begin(), input.end(), resid_[first - 1]);
  run_layers(tokens_.data(), batch.batch, batch.seq, first, last);
  float loss = 0.0f;
  if (last == n) {
    ModuleTimer loss_time(mprof_, modules_.model);
    loss = mean_loss(std::int64_t(N));
  } else {
    std::copy(resid_[last - 1], resid_[last - 1] + width, output.begin());
  }
  cached_first_ = first;
  cached_last_ = last;
  have_cache_ = true;
  return loss;
}

void Decoder::backward_layers(float scale, std::span<const float> output_grad, std::span<float> input_grad,
                              const std::function<void(std::size_t)>& grad_ready) {
  take_cache();
  const std::size_t n = num_layers(), first = cached_first_, last = cached_last_;
  const std::size_t width = std::size_t(B_ * T_ * width_);
  DS_CHECK(output_grad.size() == (last == n ? 0 : width),
           name_ << "::backward_layers: output_grad holds " << output_grad.size() << " floats; layers [" << first
                 << ", " << last << ") take " << (last == n ? 0 : width) << " (none when they end with the loss)");
  DS_CHECK(input_grad.size() == (first == 0 ? 0 : width),
           name_ << "::backward_layers: input_grad holds " << input_grad.size() << " floats; layers [" << first
                 << ", " << last << ") give " << (first == 0 ? 0 : width) << " (none from the embedding)");
  if (last < n) std::copy(output_grad.begin(), output_grad.end(), dres_);
  run_backward(scale, grad_ready, first, last);
  if (first > 0) std::copy(dres_, dres_ + width, input_grad.begin());
}

}  // namespace ds::nn
