// The CUDA side of the Optimizer classes (device_step.h): the only file of optimizer.cpp's
// that asks DS_OPTIM_HAVE_CUDA.
#include "device_step.h"

#include <algorithm>

#include "ds/core/error.h"

#if DS_OPTIM_HAVE_CUDA
#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#include "ds/optim/cuda_kernels.h"
#endif

namespace ds::optim::device {

#if DS_OPTIM_HAVE_CUDA

namespace {
cudaStream_t stream_of(const StepContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }
cuda::DeviceStepControl control_of(const StepContext& ctx) {
  return ctx.device_control ? *static_cast<const cuda::DeviceStepControl*>(ctx.device_control)
                            : cuda::DeviceStepControl{};
}
}  // namespace

bool available() { return true; }

void StateArrays::allocate(std::size_t k, std::size_t n) {
  free();
  arrays_.assign(k, nullptr);
  for (float*& a : arrays_) DS_CUDA_CHECK(cudaMalloc(&a, std::max<std::size_t>(n, 1) * sizeof(float)));
}

void StateArrays::free() {
  for (float* a : arrays_) cudaFree(a);  // no check: also runs from the destructor
  arrays_.clear();
}

void StateArrays::download(std::vector<HostBuffer>& host, std::size_t n) const {
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < arrays_.size(); ++i)
    DS_CUDA_CHECK(cudaMemcpy(host[i].data(), arrays_[i], n * sizeof(float), cudaMemcpyDeviceToHost));
}

void StateArrays::upload(const std::vector<HostBuffer>& host, std::size_t n) const {
  DS_CUDA_CHECK(cudaDeviceSynchronize());  // no step in flight may still read the old state
  for (std::size_t i = 0; i < arrays_.size(); ++i)
    DS_CUDA_CHECK(cudaMemcpy(arrays_[i], host[i].data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

void adam(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h,
          const StepContext& ctx) {
  cuda::adam(p, m, v, g, w, n, h, control_of(ctx), stream_of(ctx));
}

void sgd(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h, const StepContext& ctx) {
  cuda::sgd(p, buf, g, w, n, h, control_of(ctx), stream_of(ctx));
}

void adagrad(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h,
             const StepContext& ctx) {
  cuda::adagrad(p, sum, g, w, n, h, control_of(ctx), stream_of(ctx));
}

struct Lamb::Plan {
  cuda::LambPlan plan;
  std::vector<Segment> segments;
  Plan(std::span<const Segment> s, std::size_t n) : plan(s, n), segments(s.begin(), s.end()) {}
  bool fits(std::span<const Segment> s) const {
    return segments.size() == s.size() &&
           std::equal(s.begin(), s.end(), segments.begin(),
                      [](const Segment& a, const Segment& b) { return a.offset == b.offset && a.count == b.count; });
  }
};

void Lamb::step(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n,
                std::span<const Segment> segments, const LambHyper& h, const StepContext& ctx) {
  if (!plan_ || !plan_->fits(segments)) plan_ = std::make_unique<Plan>(segments, n);
  cuda::lamb(p, m, v, g, w, n, plan_->plan, h, control_of(ctx), stream_of(ctx));
}

#else  // without CUDA: make_optimizer refuses Kernel::Cuda, so none of this is reached

namespace {
[[noreturn]] void no_cuda() { DS_THROW("optimizer: the CUDA kernels were not built (configured without CUDA)"); }
}  // namespace

bool available() { return false; }
void StateArrays::allocate(std::size_t, std::size_t) { no_cuda(); }
void StateArrays::free() { arrays_.clear(); }
void StateArrays::download(std::vector<HostBuffer>&, std::size_t) const { no_cuda(); }
void StateArrays::upload(const std::vector<HostBuffer>&, std::size_t) const { no_cuda(); }
void adam(float*, float*, float*, TensorView, TensorView, std::size_t, const AdamHyper&, const StepContext&) {
  no_cuda();
}
void sgd(float*, float*, TensorView, TensorView, std::size_t, const SgdHyper&, const StepContext&) { no_cuda(); }
void adagrad(float*, float*, TensorView, TensorView, std::size_t, const AdagradHyper&, const StepContext&) {
  no_cuda();
}
struct Lamb::Plan {};
void Lamb::step(float*, float*, float*, TensorView, TensorView, std::size_t, std::span<const Segment>,
                const LambHyper&, const StepContext&) {
  no_cuda();
}

#endif

Lamb::Lamb() = default;
Lamb::~Lamb() = default;

}  // namespace ds::optim::device
