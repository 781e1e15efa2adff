// One pipeline stage's layers of a GPT alone, as a ds::Module that a one-rank ds::Engine
// trains: the pipeline benchmark's reference (pipe_bench.cpp), the compute of a stage
// without the pipe. Its parameters are those the layers [first, last) own, as the pipeline's
// stage holds them; a tied weight the range reads but does not own (the GPT's head reads the
// embedding) lives here, outside the engine, as the pipeline's last stage keeps its copy.
// Where the range does not start at the embedding it reads a fixed input activation, and
// where it does not end with the loss its backward starts from a fixed output gradient:
// the same shapes, so the same kernels and FLOPs, as the stage inside the pipe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/error.h"
#include "ds/core/layer_sequence.h"
#include "ds/core/module.h"
#include "ds/nn/gpt.h"

namespace ds::bench {

class StageAlone : public Module {
 public:
  StageAlone(const nn::GptConfig& cfg, std::size_t first_layer, std::size_t last_layer)
      : gpt_(cfg), seq_(*layer_sequence_of(gpt_)), all_(gpt_.parameters()), first_(first_layer), last_(last_layer) {
    const std::vector<LayerSpec> layers = seq_.layers();
    DS_CHECK(first_ < last_ && last_ <= layers.size(), "stage layers [" << first_ << ", " << last_ << ") of "
                                                                         << layers.size());
    n_layers_ = layers.size();
    first_param_ = layers[first_].first;
    end_param_ = layers[last_ - 1].first + layers[last_ - 1].count;
    std::size_t outside = 0;
    for (std::size_t i = 0; i < all_.size(); ++i)
      if (!owns(i)) outside += all_[i].numel();
    outside_values_ = HostBuffer(outside, DType::F32);
    outside_grads_ = HostBuffer(outside, DType::F32);
  }

  bool owns(std::size_t model_index) const { return model_index >= first_param_ && model_index < end_param_; }

  // Elements of the tied weights the range reads but another stage owns: the copy a pipeline
  // stage keeps outside its engine (values and gradients, the working dtype each).
  std::size_t foreign_tied_numel() const {
    std::size_t n = 0;
    for (const TiedWeight& t : seq_.tied_weights()) {
      bool used = false;
      for (std::size_t l : t.layers) used = used || (l >= first_ && l < last_);
      if (used && !owns(t.parameter)) n += all_[t.parameter].numel();
    }
    return n;
  }

  std::vector<ParamInfo> parameters() const override {
    return {all_.begin() + std::ptrdiff_t(first_param_), all_.begin() + std::ptrdiff_t(end_param_)};
  }

  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override {
    std::vector<std::span<float>> whole;
    float* outside = outside_values_.as<float>();
    for (std::size_t i = 0; i < all_.size(); ++i) {
      if (owns(i)) {
        whole.push_back(params[i - first_param_]);
      } else {
        whole.emplace_back(outside, all_[i].numel());
        outside += all_[i].numel();
      }
    }
    gpt_.init_parameters(whole, seed);
  }

  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override {
    DS_CHECK(params.empty() || params[0].dtype == DType::F32, "the stage reference runs in fp32");
    std::vector<TensorView> p, g;
    float* value = outside_values_.as<float>();
    float* grad = outside_grads_.as<float>();
    for (std::size_t i = 0; i < all_.size(); ++i) {
      if (owns(i)) {
        p.push_back(params[i - first_param_]);
        g.push_back(grads[i - first_param_]);
      } else {
        p.push_back(TensorView{value, all_[i].numel(), DType::F32});
        g.push_back(TensorView{grad, all_[i].numel(), DType::F32});
        value += all_[i].numel();
        grad += all_[i].numel();
      }
    }
    gpt_.bind(p, g);
  }

  float forward(const Batch& batch) override {
    size_boundaries(batch);
    return seq_.forward_layers(batch, first_, last_, input_, output_);
  }

  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override {
    seq_.backward_layers(scale, output_grad_, input_grad_, [&](std::size_t i) {
      if (owns(i)) grad_ready(i - first_param_);
    });
  }

 private:
  // The boundary activations' buffers, filled once with small fixed values.
  void size_boundaries(const Batch& batch) {
    auto sized = [&](std::vector<float>& v, std::size_t boundary) {
      std::size_t n = 1;
      for (std::int64_t d : seq_.activation_shape(boundary, batch)) n *= std::size_t(d);
      if (v.size() == n) return;
      v.resize(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = 0.01f * float(int(i % 17) - 8);
    };
    if (first_ > 0) {
      sized(input_, first_);
      input_grad_.resize(input_.size());
    }
    if (last_ < n_layers_) {
      sized(output_grad_, last_);
      output_.resize(output_grad_.size());
    }
  }

  nn::Gpt gpt_;
  LayerSequence& seq_;
  std::vector<ParamInfo> all_;
  std::size_t first_, last_, n_layers_ = 0, first_param_ = 0, end_param_ = 0;
  HostBuffer outside_values_, outside_grads_;  // parameters of other stages (the tied embedding)
  std::vector<float> input_, output_, output_grad_, input_grad_;
};

}  // namespace ds::bench
