// Device time of each GPT layer kernel (ds/nn/cuda_kernels.h) at the GPT-2 124M shapes in
// bf16 (N = 16 x 1024 rows, C = 768, NH = 12, V = 50304), with the bytes each must move at
// least and the rate that gives, beside a device-to-device copy of 256 MiB measured in the
// same run (the bandwidth ceiling). Median of 20 launches after 3 warm-ups, CUDA events.
// LayerNorm backward is timed for both implementations (v1, v2), each also in its two halves
// (dinp only; dw and db only).
// Exit: 0, 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ds/core/cuda_check.h"
#include "ds/nn/cuda_kernels.h"

namespace kc = ds::nn::cuda;

namespace {

cudaStream_t g_stream;

double time_ms(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  DS_CUDA_CHECK(cudaEventCreate(&a));
  DS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> v;
  for (int i = 0; i < 20; ++i) {
    DS_CUDA_CHECK(cudaEventRecord(a, g_stream));
    f();
    DS_CUDA_CHECK(cudaEventRecord(b, g_stream));
    DS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    v.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A device buffer of n bf16 values drawn from N(0, 1) (n floats for fp32 buffers).
void* dev_random(std::size_t n, std::size_t es, unsigned seed) {
  std::vector<unsigned char> h(n * es);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) {
    float x = nd(rng);
    if (es == 4) {
      std::memcpy(&h[i * 4], &x, 4);
    } else {
      std::uint32_t u;
      std::memcpy(&u, &x, 4);
      const std::uint16_t b = std::uint16_t(u >> 16);
      std::memcpy(&h[i * 2], &b, 2);
    }
  }
  void* d = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(h.size(), 16)));
  DS_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_layers_cuda: no CUDA device visible: skipped\n");
    return 77;
  }
  try {
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    const ds::DType dt = ds::DType::BF16;
    const std::int64_t B = 16, T = 1024, C = 768, NH = 12, V = 50304, N = B * T, BNH = B * NH;
    const double es = 2;
    // Copy ceiling.
    const std::size_t cb = std::size_t(256) << 20;
    void *c0 = nullptr, *c1 = nullptr;
    DS_CUDA_CHECK(cudaMalloc(&c0, cb));
    DS_CUDA_CHECK(cudaMalloc(&c1, cb));
    const double copy_ms = time_ms([&] { DS_CUDA_CHECK(cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, g_stream)); });
    const double copy_gbs = 2.0 * double(cb) / (copy_ms * 1e-3) / 1e9;
    cudaFree(c0);
    cudaFree(c1);

    void* x = dev_random(std::size_t(4 * N * C), 2, 1);      // [N, 4C] room
    void* y = dev_random(std::size_t(4 * N * C), 2, 2);
    void* z = dev_random(std::size_t(4 * N * C), 2, 3);
    void* w = dev_random(std::size_t(4 * C), 2, 4);
    void* bvec = dev_random(std::size_t(4 * C), 2, 5);
    void* gw = dev_random(std::size_t(4 * C), 2, 6);
    void* gb = dev_random(std::size_t(4 * C), 2, 7);
    float* mean = static_cast<float*>(dev_random(std::size_t(N), 4, 8));
    float* rstd = static_cast<float*>(dev_random(std::size_t(N), 4, 9));
    float* lse = static_cast<float*>(dev_random(std::size_t(N), 4, 10));
    float* losses = static_cast<float*>(dev_random(std::size_t(N), 4, 11));
    std::size_t sf = std::max({kc::layernorm_scratch_floats(N, C), kc::bias_scratch_floats(N, 4 * C), std::size_t(V * C)});
    float* scratch = static_cast<float*>(dev_random(sf, 4, 12));
    void* att = dev_random(std::size_t(BNH * T * T), 2, 13);
    void* logits = dev_random(std::size_t(N * V), 2, 14);
    std::vector<std::int32_t> ht(static_cast<std::size_t>(N));
    std::mt19937 rng(15);
    for (auto& t : ht) t = std::int32_t(rng() % std::uint32_t(V));
    std::int32_t* tok = nullptr;
    DS_CUDA_CHECK(cudaMalloc(&tok, ht.size() * 4));
    DS_CUDA_CHECK(cudaMemcpy(tok, ht.data(), ht.size() * 4, cudaMemcpyHostToDevice));
    // layernorm stats that make sense (the backward reads them)
    kc::layernorm_forward(y, mean, rstd, x, w, bvec, N, C, dt, g_stream);
    DS_CUDA_CHECK(cudaStreamSynchronize(g_stream));

    struct Row { std::string op; double ms, bytes; };
    std::vector<Row> rows;
    auto add = [&](const std::string& op, double bytes, const std::function<void()>& f) {
      rows.push_back({op, time_ms(f), bytes});
    };
    const double nc = double(N * C) * es;
    add("layernorm fwd", 2 * nc, [&] { kc::layernorm_forward(y, mean, rstd, x, w, bvec, N, C, dt, g_stream); });
    // layernorm_backward whole and in its two halves.
    {
      const std::string v = "layernorm bwd";
      add(v + " (dinp, dw, db)", 4 * nc,
          [&] { kc::layernorm_backward(z, gw, gb, y, x, w, mean, rstd, N, C, scratch, dt, g_stream); });
      add(v + ": dinp only", 4 * nc,
          [&] { kc::layernorm_backward(z, nullptr, nullptr, y, x, w, mean, rstd, N, C, scratch, dt, g_stream); });
      add(v + ": dw, db only", 2 * nc,
          [&] { kc::layernorm_backward(nullptr, gw, gb, y, x, w, mean, rstd, N, C, scratch, dt, g_stream); });
    }
    for (std::int64_t oc : {C, 3 * C, 4 * C}) {
      const double b = double(N * oc) * es;
      add("bias grad OC=" + std::to_string(oc), b, [&] { kc::bias_backward(gb, y, N, oc, scratch, dt, g_stream); });
      add("bias add OC=" + std::to_string(oc), 2 * b, [&] { kc::add_bias_residual(y, bvec, nullptr, N, oc, dt, g_stream); });
    }
    add("bias + residual add OC=768", 3 * nc, [&] { kc::add_bias_residual(y, bvec, x, N, C, dt, g_stream); });
    add("gelu fwd 4C", 2 * 4 * nc, [&] { kc::gelu_forward(y, x, 4 * N * C, dt, g_stream); });
    add("gelu bwd 4C", 3 * 4 * nc, [&] { kc::gelu_backward(z, x, y, 4 * N * C, dt, g_stream); });
    const double tt = double(BNH * T * T) * es;
    add("causal softmax fwd (in place)", 2 * tt, [&] { kc::causal_softmax_forward(att, att, 0.125f, BNH, T, dt, g_stream); });
    add("causal softmax bwd", 3 * tt, [&] { kc::causal_softmax_backward(att, att, att, 0.125f, BNH, T, dt, g_stream); });
    add("split_qkv", 2 * 3 * nc, [&] { kc::split_qkv(y, z, logits, x, N / T, T, C, NH, dt, g_stream); });
    add("merge_heads", 2 * nc, [&] { kc::merge_heads(y, x, N / T, T, C, NH, dt, g_stream); });
    const double nv = double(N * V) * es;
    add("cross-entropy fwd", nv, [&] { kc::crossentropy_forward(losses, lse, logits, tok, N, V, dt, g_stream); });
    add("cross-entropy bwd (in place)", 2 * nv, [&] { kc::crossentropy_backward(logits, lse, tok, N, V, 1.f, dt, g_stream); });
    add("embedding bwd", nc + double(V * C) * (4 * 3 + es * 2),
        [&] { kc::embedding_backward(logits /* V x C of room */, nullptr, y, tok, B, T, C, V, scratch, dt, g_stream); });

    std::printf("# bench_layers_cuda: bf16, N=%lld C=%lld NH=%lld T=%lld V=%lld; D2D copy %.0f GB/s (read + write, "
                "256 MiB, this run)\n",
                static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(NH), static_cast<long long>(T),
                static_cast<long long>(V), copy_gbs);
    std::printf("| kernel | ms | least bytes (MB) | GB/s | of copy |\n| --- | --- | --- | --- | --- |\n");
    for (const auto& r : rows)
      std::printf("| %s | %.4f | %.1f | %.0f | %.2f |\n", r.op.c_str(), r.ms, r.bytes / 1e6,
                  r.bytes / (r.ms * 1e-3) / 1e9, r.bytes / (r.ms * 1e-3) / 1e9 / copy_gbs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_layers_cuda: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
