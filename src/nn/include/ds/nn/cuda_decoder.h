// CudaDecoder: what the CUDA decoders (GptCuda, LlamaCuda) share as ds::Module, the CUDA twin of
// ds::nn::Decoder (built only when DS_HAVE_CUDA). Parameters, their initialisation, the ZeRO-3
// groups and the FLOP count are those of the CPU model the GPU model mirrors; binding, the
// batch and context checks, the forward / evaluate / backward protocol, the last row of logits
// and sampling (the CPU models' sampler: the same logits give the same tokens) are done here,
// once. The model's own part (its layers, arena layout and backward) lives behind impl_.
//
// All work is enqueued on the model's own stream (device_stream()); forward() and evaluate()
// synchronise once to return the loss. backward() calls grad_ready(i) right after enqueueing
// parameter i's last gradient kernel (not waiting for it). Group brackets are host calls around
// enqueueing a group's kernels (release() comes before they have run on device_stream()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ds/core/module.h"

namespace ds::nn {

namespace cuda {
class DecoderCuda;  // the shared device part (internal to ds_nn)
}

class CudaDecoder : public Module {
 public:
  ~CudaDecoder() override;
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  std::vector<ParamInfo> parameters() const override;
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  std::vector<ParamGroup> parameter_groups() const override;
  void set_group_hooks(GroupHooks* hooks) override;
  Device device() const override { return Device::Cuda; }
  void* device_stream() const override;

  std::size_t num_parameters() const;
  // The CPU model's FLOP count (for MFU).
  double flops_per_token(std::int64_t seq = 0) const;

  // Logits of the token after `context` (last block_size tokens), copied to the host; and
  // sampling as the CPU model's generate. Overwrite the cached activations: call outside
  // forward/backward.
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  std::vector<std::int32_t> generate(std::span<const std::int32_t> context, int n_new,
                                     float temperature, std::uint64_t seed);

 protected:
  explicit CudaDecoder(std::unique_ptr<cuda::DecoderCuda> impl);
  std::unique_ptr<cuda::DecoderCuda> impl_;
};

}  // namespace ds::nn
