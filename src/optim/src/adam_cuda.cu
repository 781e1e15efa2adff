// CUDA Adam/AdamW, SGD and Adagrad: the element math of elem_math.h (bitwise the CPU
// reference: compiled with --fmad=false), multi-tensor over the flat range, 8 elements and
// 128-bit loads per thread, device-side skip / grad scale / step count.
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

void adam(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h,
          const DeviceStepControl& ctl, cudaStream_t stream) {
  check_views(g, w, n, "adam");
  AdamOp op{h, m, v, ctl.bias_correction, {}};
  launch_elementwise(op, p, g, w, n, {m, v}, ctl, stream);
}

void sgd(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h,
         const DeviceStepControl& ctl, cudaStream_t stream) {
  DS_CHECK(buf != nullptr || h.momentum == 0.f, "sgd (CUDA): momentum " << h.momentum << " needs a momentum buffer");
  check_views(g, w, n, "sgd");
  SgdOp op{h, buf};
  launch_elementwise(op, p, g, w, n, {buf}, ctl, stream);
}

void adagrad(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h,
             const DeviceStepControl& ctl, cudaStream_t stream) {
  check_views(g, w, n, "adagrad");
  AdagradOp op{h, sum, ctl.lr, ctl.lr_decay};
  launch_elementwise(op, p, g, w, n, {sum}, ctl, stream);
}

}  // namespace ds::optim::cuda
