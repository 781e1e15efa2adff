// CUDA Adam/AdamW: the element math of elem_math.h (bitwise the CPU reference: compiled with
// --fmad=false), multi-tensor over the flat range, 8 elements and 128-bit loads per thread,
// device-side skip / grad scale / step count (launch_elementwise, cuda_common.cuh).
#include "cuda_common.cuh"

namespace ds::optim::cuda {
namespace {

using namespace detail;

struct AdamOp {
  AdamHyper h;
  float* m;
  float* v;
  bool bias_correction;
  ds::optim::detail::AdamDerived d;
  __device__ void prepare(const DeviceStepControl& c) {
    h.grad_scale = device_grad_scale(h.grad_scale, c);
    if (c.d_step != nullptr && bias_correction) {
      const double t = double(*c.d_step);
      h.bc1 = float(1.0 - pow(double(h.beta1), t));
      h.bc2 = float(1.0 - pow(double(h.beta2), t));
    }
    d = ds::optim::detail::adam_derived(h);
  }
  template <int K>
  __device__ void apply(std::size_t i, float (&g)[K], float (&p)[K]) {
    float mr[K], vr[K];
    load<K>(m, i, mr);
    load<K>(v, i, vr);
#pragma unroll
    for (int k = 0; k < K; ++k) p[k] = ds::optim::detail::adam_elem(g[k], mr[k], vr[k], p[k], h, d);
    store<K>(m, i, mr);
    store<K>(v, i, vr);
  }
};

}  // namespace

void adam(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h,
          const DeviceStepControl& ctl, cudaStream_t stream) {
  check_views(g, w, n, "adam");
  AdamOp op{h, m, v, ctl.bias_correction, {}};
  launch_elementwise(op, p, g, w, n, {m, v}, ctl, stream);
}

}  // namespace ds::optim::cuda
