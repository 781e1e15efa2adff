// Optimizers over flat fp32 master weights: Adam, AdamW, SGD, Adagrad, Lamb with
// DeepSpeed's names, parameters and defaults (DeepSpeed's runtime/config.py optimizer section and
// its FusedAdam / FusedLamb / torch.optim semantics; docs/user/optimizers.md).
//
// Contract: init_state(n) once (n = all parameters, or this rank's ZeRO slice), then step()
// once per successful optimizer step over the same n elements. step() is ONE fused pass:
// it reads the gradient (fp32/fp16/bf16) times ctx.grad_scale, updates the state and the fp32
// master, and writes the new master converted to the working dtype when a working view is
// given. Lamb needs a second pass for its trust ratio (per Segment). Not thread-safe: one
// step() at a time per optimizer; the kernels use OpenMP threads internally.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/optim/params.h"
#include "ds/optim/segment.h"

namespace ds::optim {

struct StepContext {
  double lr = 0.0;
  std::int64_t step = 1;      // 1-based count of successful steps, including this one
  double grad_scale = 1.0;    // multiply each gradient by this first (1/loss_scale x clip coefficient)
  std::optional<std::array<double, 2>> betas;  // scheduler override (OneCycle); Adam/AdamW/Lamb only
  void* stream = nullptr;     // Kernel::Cuda: the cudaStream_t to enqueue on (nullptr: legacy default)
  // Kernel::Cuda: a const cuda::DeviceStepControl* (ds/optim/cuda_kernels.h) whose device
  // skip flag and grad_scale the kernels read on the stream, so the engine's boundary step
  // needs no host round trip (void* keeps CUDA headers out); nullptr: no device control.
  const void* device_control = nullptr;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;  // "adam", "adamw", "sgd", "adagrad", "lamb"
  // Allocates and initialises the state for n elements (zeros; Adagrad's sum starts at
  // initial_accumulator_value). Call once; calling again re-initialises.
  virtual void init_state(std::size_t n) = 0;
  // master.size() == grad.count == n (init_state's n); working.data == nullptr or
  // working.count == n. grad dtype F32/F16/BF16; working dtype F32/F16/BF16.
  virtual void step(std::span<float> master, TensorView grad, TensorView working,
                    std::span<const Segment> segments, const StepContext& ctx) = 0;
  // The names of the state arrays, in state_tensors() order (SGD without momentum: none).
  virtual std::vector<std::string> state_names() const = 0;
  // The value every element of a fresh state array i holds (Adagrad's sum:
  // initial_accumulator_value; everything else 0).
  virtual float initial_state_value(std::size_t /*i*/) const { return 0.f; }
  // One update of master.size() elements whose state the CALLER holds: state[i] points at
  // master.size() floats of state_names()[i], where the kernel runs (host memory for
  // Kernel::Cpu/Ref). The same kernels and the same results as step() over those elements;
  // needs no init_state() and leaves the optimizer's own state alone. NVMe offload streams a
  // partition through it one sub-group at a time. Elementwise optimizers only: Lamb throws
  // (its trust ratio needs whole tensors).
  virtual void step_piece(std::span<float> master, TensorView grad, TensorView working, std::span<float* const> state,
                          const StepContext& ctx) = 0;
  // Named state arrays of n floats each (checkpoints read and write them in place):
  // adam/adamw/lamb: exp_avg, exp_avg_sq; sgd: momentum_buffer (only with momentum != 0);
  // adagrad: sum.
  virtual std::vector<std::pair<std::string, std::span<float>>> state_tensors() = 0;
  // Lamb only: the trust ratios of the last step, one per segment (empty for the others).
  virtual std::span<const float> last_lamb_coeffs() const { return {}; }
  // Kernel::Cuda keeps its state on the device: state_tensors() then returns HOST copies that
  // are current only after download_state() (synchronous), and upload_state() copies them
  // back to the device (checkpoint load). No-ops for the CPU kernels.
  virtual void download_state() {}
  virtual void upload_state() {}
};

// Cpu: the fast CPU kernels; Ref: the plain references; Cuda: the CUDA kernels of
// ds/optim/cuda_kernels.h (only when built with CUDA: DS_OPTIM_HAVE_CUDA), with step()'s
// master, grad and working on the current device and ctx.stream as the stream. Lamb's trust
// ratios stay on the device there (last_lamb_coeffs() is empty).
enum class Kernel { Cpu, Ref, Cuda };

// Validates the hyperparameters (errors name optimizer.params.<key>); unknown type names
// optimizer.type; Kernel::Cuda in a build without CUDA throws.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerParams& cfg, Kernel kernel = Kernel::Cpu);

}  // namespace ds::optim
