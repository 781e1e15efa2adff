// CUDA Lamb over a LambPlan: pass 1 (one block per chunk) updates the moments and writes the
// chunk's ||p||^2 and ||u||^2; a per-segment kernel sums the chunk partials in a fixed
// order (deterministic) into the trust ratio; pass 2 applies p -= step_size*c*u and writes
// the working copy. Element math: elem_math.h, as the CPU reference.
#include <vector>

#include "cuda_common.cuh"

namespace ds::optim::cuda {
namespace {

using namespace detail;

constexpr std::size_t kChunk = 1 << 15;
struct Chunk { std::uint32_t seg; std::size_t lo, hi; };

__device__ __forceinline__ void block_sum2(double& a, double& b) {
  __shared__ double sa[kThreads], sb[kThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) { sa[threadIdx.x] += sa[threadIdx.x + s]; sb[threadIdx.x] += sb[threadIdx.x + s]; }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
  __syncthreads();
}

__device__ float step_size_of(const LambHyper& h, const DeviceStepControl& c) {
  if (c.d_step == nullptr) return h.step_size;
  if (!c.bias_correction) return c.lr;
  const double t = double(*c.d_step);
  const double bc1 = 1.0 - pow(double(h.beta1), t), bc2 = 1.0 - pow(double(h.beta2), t);
  return float(double(c.lr) * sqrt(bc2) / bc1);
}

template <typename G>
__global__ void lamb_pass1(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v, const G* __restrict__ g,
                           const Chunk* chunks, std::size_t nchunk, double* partials, LambHyper h, DeviceStepControl c) {
  if (c.d_skip != nullptr && *c.d_skip != 0) return;
  h.grad_scale = device_grad_scale(h.grad_scale, c);
  for (std::size_t ci = blockIdx.x; ci < nchunk; ci += gridDim.x) {
    const Chunk ch = chunks[ci];
    double ps = 0, us = 0;
    for (std::size_t i = ch.lo + threadIdx.x; i < ch.hi; i += blockDim.x) {
      float mi = m[i], vi = v[i];
      const float pi = p[i];
      ds::optim::detail::lamb_moments(to_f(g[i]), mi, vi, h);
      m[i] = mi;
      v[i] = vi;
      const float u = ds::optim::detail::lamb_update_dir(mi, vi, pi, h);
      ps += double(pi) * double(pi);
      us += double(u) * double(u);
    }
    block_sum2(ps, us);
    if (threadIdx.x == 0) { partials[2 * ci] = ps; partials[2 * ci + 1] = us; }
  }
}

__global__ void lamb_coeffs(const std::uint32_t* seg_first, std::size_t nseg, const double* partials, float* coeffs,
                            LambHyper h, DeviceStepControl c) {
  if (c.d_skip != nullptr && *c.d_skip != 0) return;
  for (std::size_t s = blockIdx.x; s < nseg; s += gridDim.x) {
    double ps = 0, us = 0;
    for (std::uint32_t k = seg_first[s] + threadIdx.x; k < seg_first[s + 1]; k += blockDim.x) {
      ps += partials[2 * k];
      us += partials[2 * k + 1];
    }
    block_sum2(ps, us);
    if (threadIdx.x == 0) {
      float coeff = 1.f;
      if (ps > 0.0 && us > 0.0) {
        double r = sqrt(ps) / sqrt(us);
        if (r > double(h.max_coeff)) r = h.max_coeff;
        if (r < double(h.min_coeff)) r = h.min_coeff;
        coeff = float(r);
      }
      coeffs[s] = coeff;
    }
  }
}

template <typename W>
__global__ void lamb_pass2(float* __restrict__ p, const float* __restrict__ m, const float* __restrict__ v,
                           W* __restrict__ w, const Chunk* chunks, std::size_t nchunk, const float* coeffs,
                           LambHyper h, DeviceStepControl c) {
  if (c.d_skip != nullptr && *c.d_skip != 0) return;
  const float step_size = step_size_of(h, c);
  for (std::size_t ci = blockIdx.x; ci < nchunk; ci += gridDim.x) {
    const Chunk ch = chunks[ci];
    const float sc = step_size * coeffs[ch.seg];
    for (std::size_t i = ch.lo + threadIdx.x; i < ch.hi; i += blockDim.x) {
      const float u = ds::optim::detail::lamb_update_dir(m[i], v[i], p[i], h);
      const float pn = ds::optim::detail::lamb_apply(p[i], u, sc);
      p[i] = pn;
      if constexpr (!std::is_same_v<W, NoWorking>) w[i] = from_f<W>(pn);
    }
  }
}

}  // namespace

LambPlan::LambPlan(std::span<const Segment> segments, std::size_t n) : n_(n) {
  const Segment whole{0, n};
  if (segments.empty()) segments = std::span<const Segment>(&whole, 1);
  std::vector<Chunk> chunks;
  std::vector<std::uint32_t> first;
  std::size_t end = 0;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    DS_CHECK(segments[s].offset >= end && segments[s].offset + segments[s].count <= n,
             "lamb (CUDA): segments must be sorted, disjoint and within the " << n << " elements");
    end = segments[s].offset + segments[s].count;
    first.push_back(std::uint32_t(chunks.size()));
    for (std::size_t lo = segments[s].offset; lo < end; lo += kChunk)
      chunks.push_back({std::uint32_t(s), lo, std::min(end, lo + kChunk)});
  }
  first.push_back(std::uint32_t(chunks.size()));
  nseg_ = segments.size();
  nchunk_ = chunks.size();
  DS_CUDA_CHECK(cudaMalloc(&d_chunks_, std::max<std::size_t>(1, nchunk_) * sizeof(Chunk)));
  DS_CUDA_CHECK(cudaMalloc(&d_seg_first_, first.size() * sizeof(std::uint32_t)));
  DS_CUDA_CHECK(cudaMalloc(&d_partials_, std::max<std::size_t>(1, nchunk_) * 2 * sizeof(double)));
  DS_CUDA_CHECK(cudaMalloc(&d_coeffs_, nseg_ * sizeof(float)));
  if (nchunk_) DS_CUDA_CHECK(cudaMemcpy(d_chunks_, chunks.data(), nchunk_ * sizeof(Chunk), cudaMemcpyHostToDevice));
  DS_CUDA_CHECK(cudaMemcpy(d_seg_first_, first.data(), first.size() * sizeof(std::uint32_t), cudaMemcpyHostToDevice));
  DS_CUDA_CHECK(cudaMemset(d_partials_, 0, std::max<std::size_t>(1, nchunk_) * 2 * sizeof(double)));
}

LambPlan::~LambPlan() {
  cudaFree(d_chunks_);
  cudaFree(d_seg_first_);
  cudaFree(d_partials_);
  cudaFree(d_coeffs_);
}

void lamb(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const LambPlan& plan,
          const LambHyper& h, const DeviceStepControl& ctl, cudaStream_t stream) {
  DS_CHECK(n == plan.n_, "lamb (CUDA): the plan was built for " << plan.n_ << " elements, the step has " << n);
  check_views(g, w, n, "lamb");
  if (n == 0) return;
  const Chunk* chunks = static_cast<const Chunk*>(plan.d_chunks_);
  const unsigned cblocks = unsigned(std::min<std::size_t>(std::max<std::size_t>(plan.nchunk_, 1), 65535));
  dispatch(g, w, [&]<typename G, typename W>() {
    lamb_pass1<G><<<cblocks, kThreads, 0, stream>>>(p, m, v, static_cast<const G*>(g.data), chunks, plan.nchunk_,
                                                   plan.d_partials_, h, ctl);
    DS_CUDA_CHECK_LAUNCH();
    lamb_coeffs<<<unsigned(std::min<std::size_t>(plan.nseg_, 65535)), kThreads, 0, stream>>>(
        plan.d_seg_first_, plan.nseg_, plan.d_partials_, plan.d_coeffs_, h, ctl);
    DS_CUDA_CHECK_LAUNCH();
    lamb_pass2<W><<<cblocks, kThreads, 0, stream>>>(p, m, v, static_cast<W*>(w.data), chunks, plan.nchunk_,
                                                   plan.d_coeffs_, h, ctl);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::optim::cuda
