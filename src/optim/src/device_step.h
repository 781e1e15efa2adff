// The CUDA side of the Optimizer classes (optimizer.cpp): the state arrays on the device and
// the Kernel::Cuda step of each optimizer. device_step.cpp is the one file that asks
// DS_OPTIM_HAVE_CUDA; without CUDA its functions are never reached (make_optimizer refuses
// Kernel::Cuda) and throw if they were.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/optim/kernels.h"
#include "ds/optim/optimizer.h"

namespace ds::optim::device {

// Whether this build has the CUDA kernels.
bool available();

// k state arrays of n floats on the current device. free() never throws (destructors).
class StateArrays {
 public:
  ~StateArrays() { free(); }
  void allocate(std::size_t k, std::size_t n);
  void free();
  float* operator[](std::size_t i) const { return arrays_[i]; }
  // Synchronous copies of all arrays from / to the host buffers (n floats each). Both wait
  // for the device first: a step may still run on the caller's non-blocking stream.
  void download(std::vector<HostBuffer>& host, std::size_t n) const;
  void upload(const std::vector<HostBuffer>& host, std::size_t n) const;

 private:
  std::vector<float*> arrays_;
};

// The Kernel::Cuda steps, on ctx.stream with ctx.device_control (StepContext).
void adam(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h,
          const StepContext& ctx);
void sgd(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h, const StepContext& ctx);
void adagrad(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h,
             const StepContext& ctx);

// Lamb on the device keeps one plan per segment layout (the engine passes the same segments
// every step); its trust ratios stay on the device.
class Lamb {
 public:
  Lamb();
  ~Lamb();
  void step(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n,
            std::span<const Segment> segments, const LambHyper& h, const StepContext& ctx);

 private:
  struct Plan;
  std::unique_ptr<Plan> plan_;
};

}  // namespace ds::optim::device
