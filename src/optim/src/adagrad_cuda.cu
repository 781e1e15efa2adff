// CUDA Adagrad: the element math of elem_math.h (bitwise the CPU reference: compiled with
// --fmad=false), multi-tensor over the flat range, 8 elements and 128-bit loads per thread,
// device-side skip / grad scale / step count (launch_elementwise, cuda_common.cuh).
#include "cuda_common.cuh"

namespace ds::optim::cuda {
namespace {

using namespace detail;

struct AdagradOp {
  AdagradHyper h;
  float* sum;
  float lr, lr_decay;
  __device__ void prepare(const DeviceStepControl& c) {
    h.grad_scale = device_grad_scale(h.grad_scale, c);
    if (c.d_step != nullptr) h.clr = float(double(lr) / (1.0 + double(*c.d_step - 1) * double(lr_decay)));
  }
  template <int K>
  __device__ void apply(std::size_t i, float (&g)[K], float (&p)[K]) {
    float s[K];
    load<K>(sum, i, s);
#pragma unroll
    for (int k = 0; k < K; ++k) p[k] = ds::optim::detail::adagrad_elem(g[k], s[k], p[k], h);
    store<K>(sum, i, s);
  }
};

}  // namespace

void adagrad(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h,
             const DeviceStepControl& ctl, cudaStream_t stream) {
  check_views(g, w, n, "adagrad");
  AdagradOp op{h, sum, ctl.lr, ctl.lr_decay};
  launch_elementwise(op, p, g, w, n, {sum}, ctl, stream);
}

}  // namespace ds::optim::cuda
