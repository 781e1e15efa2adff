// The Llama CUDA kernels (ds/nn/cuda_llama_kernels.h) against the CPU kernels of
// ds/nn/llama_kernels.h at awkward sizes (1 row, odd widths, rows wider than a block, more rows
// than one column chunk), in each working dtype (fp32, fp16, bf16). Inputs are random and
// rounded to the dtype on the host first, so both sides see the same values; the CPU kernel
// runs in fp32 on them. Forward outputs are poisoned (all-ones bytes: NaN in every dtype) so an
// element left unwritten fails; += outputs (RMSNorm dinp, dw) are prefilled with random values.
//
// Tolerance per element: |got - ref| <= rel(dt) * |ref| + 1e-5 * max|ref|, where
//  - rel(fp32) = 1e-5: fp32 on both sides, different summation orders (row sums over up to
//    12288 columns, dw over up to 300 rows) and expf ulps;
//  - rel(fp16) = 2e-3: the device rounds each output to fp16 once (<= 2^-11 relative, 2^-10
//    next to a rounding boundary), plus the fp32 error;
//  - rel(bf16) = 2e-2: one bf16 rounding (<= 2^-8, 2^-7 next to a boundary);
//  - the 1e-5 * max|ref| term absorbs cancellation (rope's x1 cos - x2 sin, RMSNorm's
//    w dy - x k) and fp16 subnormals.
// expand_kv_heads is a copy and must match bitwise; reduce_kv_heads (a sum over the group)
// uses the tolerance. The CPU side (inputs and references) runs before the device check, so
// without a GPU the test still exercises it and then exits 77.
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds/core/half.h"
#include "ds/nn/cuda_llama_kernels.h"
#include "ds/nn/llama_kernels.h"

namespace {

using ds::DType;
using cuda_test::Dev;
using cuda_test::randv;
using cuda_test::to_dtype;
namespace nc = ds::nn::cuda;
namespace k = ds::nn::kernels;
using i64 = std::int64_t;

const DType kDts[] = {DType::F32, DType::F16, DType::BF16};
bool g_gpu = false;
cudaStream_t g_stream = nullptr;

const char* dn(DType t) { return t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : "bf16"; }
double rel_tol(DType t) { return t == DType::F32 ? 1e-5 : t == DType::F16 ? 2e-3 : 2e-2; }

std::vector<float> rounded(const std::vector<float>& v, DType t) {
  if (t == DType::F32) return v;
  const auto b = to_dtype(v, t);
  std::vector<float> out(v.size());
  ds::convert(b.data(), t, out.data(), DType::F32, v.size());
  return out;
}

std::unique_ptr<Dev> up(const std::vector<float>& v, DType t) {
  const auto b = to_dtype(v, t);
  return std::make_unique<Dev>(b.data(), b.size());
}
std::unique_ptr<Dev> poisoned(std::size_t n, DType t) {
  std::vector<unsigned char> b(n * ds::dtype_size(t), 0xFF);
  return std::make_unique<Dev>(b.data(), b.size());
}
std::vector<float> down(const Dev& d, DType t, std::size_t n) {
  CU(cudaStreamSynchronize(g_stream));
  std::vector<unsigned char> b(n * ds::dtype_size(t));
  d.to_host(b.data());
  std::vector<float> out(n);
  ds::convert(b.data(), t, out.data(), DType::F32, n);
  return out;
}

void check(const std::string& what, const std::vector<float>& got, const std::vector<float>& ref, double rel) {
  double mx = 0;
  for (float x : ref) mx = std::max(mx, double(std::fabs(x)));
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!(d <= rel * std::fabs(double(ref[i])) + 1e-5 * mx)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT(bad == 0, "%s: %zu of %zu elements off, first [%zu] got %.8g ref %.8g (max|ref| %.3g)", what.c_str(), bad,
         ref.size(), first, bad ? double(got[first]) : 0.0, bad ? double(ref[first]) : 0.0, mx);
}

std::string ctx(const char* kernel, DType t, const std::string& sizes) {
  return std::string(kernel) + " " + dn(t) + " [" + sizes + "]";
}

void test_rmsnorm(i64 N, i64 C, unsigned seed) {
  const float eps = 1e-5f;
  const std::string sz = "N=" + std::to_string(N) + " C=" + std::to_string(C);
  for (DType t : kDts) {
    const auto x = rounded(randv(std::size_t(N * C), seed, 1.5f), t);
    auto w = rounded(randv(std::size_t(C), seed + 1, 0.3f), t);
    for (auto& v : w) v = rounded({1.0f + v}, t)[0];
    const auto dy = rounded(randv(std::size_t(N * C), seed + 2, 1.0f), t);
    const auto dx0 = rounded(randv(std::size_t(N * C), seed + 3, 0.5f), t);
    const auto dw0 = rounded(randv(std::size_t(C), seed + 4, 0.5f), t);
    // CPU reference (fp32 on the rounded values).
    std::vector<float> out(static_cast<std::size_t>(N * C)), rstd(static_cast<std::size_t>(N)), dx = dx0, dw = dw0;
    k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    k::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    if (!g_gpu) continue;
    auto dX = up(x, t), dW = up(w, t), dDy = up(dy, t), dDx = up(dx0, t), dDw = up(dw0, t);
    auto dOut = poisoned(std::size_t(N * C), t);
    std::vector<float> nan_r(static_cast<std::size_t>(N), std::nanf(""));
    Dev dR(nan_r.data(), nan_r.size() * 4);
    std::vector<float> poison_s(nc::rmsnorm_scratch_floats(N, C), std::nanf(""));
    Dev dS(poison_s.data(), poison_s.size() * 4);
    nc::rmsnorm_forward(dOut->ptr, dR.as<float>(), dX->ptr, dW->ptr, N, C, eps, t, g_stream);
    check(ctx("rmsnorm_forward out", t, sz), down(*dOut, t, out.size()), out, rel_tol(t));
    CU(cudaStreamSynchronize(g_stream));
    std::vector<float> r(static_cast<std::size_t>(N));
    dR.to_host(r.data());
    check(ctx("rmsnorm_forward rstd", t, sz), r, rstd, 1e-5);
    // Backward from the CPU's rstd (the same values on both sides).
    Dev dRc(rstd.data(), rstd.size() * 4);
    nc::rmsnorm_backward(dDx->ptr, dDw->ptr, dDy->ptr, dX->ptr, dW->ptr, dRc.as<float>(), N, C, dS.as<float>(), t,
                         g_stream);
    check(ctx("rmsnorm_backward dinp", t, sz), down(*dDx, t, dx.size()), dx, rel_tol(t));
    check(ctx("rmsnorm_backward dw", t, sz), down(*dDw, t, dw.size()), dw, rel_tol(t));
  }
}

void test_rope(i64 N, i64 T, i64 nh, i64 hd, i64 ld, unsigned seed) {
  const std::string sz = "N=" + std::to_string(N) + " T=" + std::to_string(T) + " heads=" + std::to_string(nh) +
                         " hd=" + std::to_string(hd) + " ld=" + std::to_string(ld);
  const i64 Tmax = T + 3;  // tables longer than the rows use, as the model's block_size
  std::vector<float> cs(std::size_t(Tmax * hd / 2)), sn(cs.size());
  k::rope_tables(cs.data(), sn.data(), Tmax, hd, 10000.0);
  for (DType t : kDts) {
    const auto x = rounded(randv(std::size_t(N * ld), seed, 1.0f), t);
    std::vector<float> f = x, b = x;
    k::rope_forward(f.data(), N, T, ld, nh, hd, cs.data(), sn.data());
    k::rope_backward(b.data(), N, T, ld, nh, hd, cs.data(), sn.data());
    if (!g_gpu) continue;
    Dev dc(cs.data(), cs.size() * 4), ds_(sn.data(), sn.size() * 4);
    auto dF = up(x, t), dB = up(x, t);
    nc::rope_forward(dF->ptr, N, T, ld, nh, hd, dc.as<float>(), ds_.as<float>(), t, g_stream);
    nc::rope_backward(dB->ptr, N, T, ld, nh, hd, dc.as<float>(), ds_.as<float>(), t, g_stream);
    // Columns past n_heads * hd are untouched on both sides (checked with the rest).
    check(ctx("rope_forward", t, sz), down(*dF, t, f.size()), f, rel_tol(t));
    check(ctx("rope_backward", t, sz), down(*dB, t, b.size()), b, rel_tol(t));
  }
}

void test_swiglu(i64 n, unsigned seed) {
  const std::string sz = "n=" + std::to_string(n);
  for (DType t : kDts) {
    const auto g = rounded(randv(std::size_t(n), seed, 3.0f), t);
    const auto u = rounded(randv(std::size_t(n), seed + 1, 1.0f), t);
    const auto dy = rounded(randv(std::size_t(n), seed + 2, 1.0f), t);
    std::vector<float> out(static_cast<std::size_t>(n)), dg(out.size()), du(out.size());
    k::swiglu_forward(out.data(), g.data(), u.data(), n);
    k::swiglu_backward(dg.data(), du.data(), dy.data(), g.data(), u.data(), n);
    if (!g_gpu) continue;
    auto dG = up(g, t), dU = up(u, t), dDy = up(dy, t);
    auto dOut = poisoned(std::size_t(n), t), dDg = poisoned(std::size_t(n), t), dDu = poisoned(std::size_t(n), t);
    nc::swiglu_forward(dOut->ptr, dG->ptr, dU->ptr, n, t, g_stream);
    nc::swiglu_backward(dDg->ptr, dDu->ptr, dDy->ptr, dG->ptr, dU->ptr, n, t, g_stream);
    check(ctx("swiglu_forward", t, sz), down(*dOut, t, out.size()), out, rel_tol(t));
    check(ctx("swiglu_backward dgate", t, sz), down(*dDg, t, dg.size()), dg, rel_tol(t));
    check(ctx("swiglu_backward dup", t, sz), down(*dDu, t, du.size()), du, rel_tol(t));
  }
}

void test_kv(i64 B, i64 T, i64 NH, i64 NKV, i64 hd, unsigned seed) {
  const std::string sz = "B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                         " NKV=" + std::to_string(NKV) + " hd=" + std::to_string(hd);
  const i64 group = NH / NKV;
  for (DType t : kDts) {
    const auto x = rounded(randv(std::size_t(B * T * NKV * hd), seed, 1.0f), t);
    const auto dyh = rounded(randv(std::size_t(B * NH * T * hd), seed + 1, 1.0f), t);
    std::vector<float> yh(dyh.size()), dx(x.size(), 0.0f);
    for (i64 b = 0; b < B; ++b)
      for (i64 h = 0; h < NH; ++h)
        for (i64 tt = 0; tt < T; ++tt)
          for (i64 d = 0; d < hd; ++d) {
            const std::size_t hi = std::size_t(((b * NH + h) * T + tt) * hd + d);
            const std::size_t xi = std::size_t((b * T + tt) * NKV * hd + (h / group) * hd + d);
            yh[hi] = x[xi];
            dx[xi] += dyh[hi];  // head order within the group, as the kernel
          }
    if (!g_gpu) continue;
    auto dX = up(x, t), dDyh = up(dyh, t);
    auto dYh = poisoned(yh.size(), t), dDx = poisoned(dx.size(), t);
    nc::expand_kv_heads(dYh->ptr, dX->ptr, B, T, NH, NKV, hd, t, g_stream);
    nc::reduce_kv_heads(dDx->ptr, dDyh->ptr, B, T, NH, NKV, hd, t, g_stream);
    const auto got = down(*dYh, t, yh.size());
    EXPECT(std::memcmp(got.data(), yh.data(), yh.size() * 4) == 0, "%s: not a bitwise copy",
           ctx("expand_kv_heads", t, sz).c_str());
    check(ctx("reduce_kv_heads", t, sz), down(*dDx, t, dx.size()), dx, rel_tol(t));
  }
}

}  // namespace

int main() {
  g_gpu = cuda_test::skip_without_gpu("test_cuda_llama_kernels") == 0;
  if (g_gpu) CU(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  // RMSNorm: one row, a width of 1, odd widths, more rows than one column chunk (128), a row
  // wider than a block's 256 threads and far wider (12288: a large model's hidden size).
  const i64 rms[][2] = {{1, 1}, {1, 7}, {3, 33}, {17, 96}, {5, 1000}, {2, 4099}, {300, 64}, {1, 12288}};
  unsigned seed = 100;
  for (const auto& s : rms) test_rmsnorm(s[0], s[1], seed += 10);
  // RoPE (N, T, heads, hd, ld): head dim 2, odd head counts, hd / 2 odd (17), a row stride
  // wider than the rotated heads (k inside a wider row), T = 1 and T = N, a wide head (258).
  const i64 rope[][5] = {{1, 1, 1, 2, 2}, {7, 3, 3, 6, 18}, {51, 17, 5, 34, 170}, {10, 5, 2, 8, 24},
                         {4, 4, 1, 258, 258}, {6, 1, 3, 4, 12}};
  for (const auto& s : rope) test_rope(s[0], s[1], s[2], s[3], s[4], seed += 10);
  for (i64 n : {i64(1), i64(7), i64(4097), i64(300001)}) test_swiglu(n, seed += 10);
  // KV heads (B, T, NH, NKV, hd): no grouping, groups of 3 and 8, one row.
  const i64 kv[][5] = {{1, 1, 1, 1, 2}, {2, 5, 6, 2, 6}, {3, 17, 8, 1, 10}, {2, 9, 4, 4, 16}};
  for (const auto& s : kv) test_kv(s[0], s[1], s[2], s[3], s[4], seed += 10);
  if (!g_gpu) {
    std::printf("test_cuda_llama_kernels: CPU references computed; no device: skipped\n");
    return 77;
  }
  CU(cudaStreamDestroy(g_stream));
  return cuda_test::finish("test_cuda_llama_kernels");
}
