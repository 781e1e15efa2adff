// CUDA SGD: the element math of elem_math.h (bitwise the CPU reference: compiled with
// --fmad=false), multi-tensor over the flat range, 8 elements and 128-bit loads per thread,
// device-side skip / grad scale / step count (launch_elementwise, cuda_common.cuh).
#include "cuda_common.cuh"

namespace ds::optim::cuda {
namespace {

using namespace detail;

struct SgdOp {
  SgdHyper h;
  float* buf;
  __device__ void prepare(const DeviceStepControl& c) {
    h.grad_scale = device_grad_scale(h.grad_scale, c);
    if (c.d_step != nullptr) h.first_step = *c.d_step == 1;
  }
  template <int K>
  __device__ void apply(std::size_t i, float (&g)[K], float (&p)[K]) {
    if (buf == nullptr) {
#pragma unroll
      for (int k = 0; k < K; ++k) p[k] = ds::optim::detail::sgd_elem(g[k], nullptr, p[k], h);
      return;
    }
    float b[K];
    if (!h.first_step) load<K>(buf, i, b);
#pragma unroll
    for (int k = 0; k < K; ++k) p[k] = ds::optim::detail::sgd_elem(g[k], &b[k], p[k], h);
    store<K>(buf, i, b);
  }
};

}  // namespace

void sgd(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h,
         const DeviceStepControl& ctl, cudaStream_t stream) {
  DS_CHECK(buf != nullptr || h.momentum == 0.f, "sgd (CUDA): momentum " << h.momentum << " needs a momentum buffer");
  check_views(g, w, n, "sgd");
  SgdOp op{h, buf};
  launch_elementwise(op, p, g, w, n, {buf}, ctl, stream);
}

}  // namespace ds::optim::cuda
