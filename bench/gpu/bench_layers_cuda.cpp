// Device time of each GPT layer kernel (ds/nn/cuda_kernels.h) at the GPT-2 124M shapes in
// bf16 (N = 16 x 1024 rows, C = 768, NH = 12, V = 50304), with the bytes each must move at
// least and the rate that gives, beside a device-to-device copy of 256 MiB measured in the
// same run (the bandwidth ceiling). Median of 20 launches after 3 warm-ups, CUDA events.
// LayerNorm backward is timed whole and in its two halves (dinp only; dw and db only).
//
// Check: after timing, each timed call runs once more at 2 x 1024 rows (the same C, NH, T
// and V) on random bf16 inputs and its output is compared with the plain references the
// tests use (tests/nn/kernels_ref.h in double; tests/cuda/test_cuda_nn_kernels.cpp's
// tolerance): |got - ref| <= 2e-2 |ref| + 2e-5 max|ref| for bf16 outputs, 1e-5 |ref| for the
// fp32 ones (LayerNorm mean / rstd, log-sum-exp, losses), bitwise for the layout kernels.
// Outputs start as NaN bytes, so an element left unwritten counts as wrong. Any wrong element
// fails the run. Headline: the median over the kernels of their GB/s / the copy's GB/s;
// --min_ratio X fails the run below X. The last line is its JSON: record (bench/README.md).
//
//   bench_layers_cuda [--min_ratio X]
//
// Exit: 0, 1 a wrong result (or a CUDA error), 2 bad arguments, 3 below --min_ratio,
// 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ds/core/cuda_check.h"
#include "ds/core/half.h"
#include "ds/nn/cuda_kernels.h"
#include "bench_report.h"
#include "kernels_ref.h"  // tests/nn: the plain references of the kernel tests

namespace kc = ds::nn::cuda;
namespace ref = ds::nn::ref;
using ds::DType;
using i64 = std::int64_t;

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

// A device buffer of n bf16 values drawn from N(0, 1) (n floats for fp32 buffers): 1 Mi
// drawn values repeated, which is all the timing needs and keeps the host quick.
void* dev_random(std::size_t n, std::size_t es, unsigned seed) {
  const std::size_t distinct = std::min<std::size_t>(n, std::size_t(1) << 20);
  std::vector<unsigned char> h(n * es);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < distinct; ++i) {
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
  for (std::size_t i = distinct; i < n; i += distinct)
    std::memcpy(&h[i * es], h.data(), std::min(distinct, n - i) * es);
  void* d = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(h.size(), 16)));
  DS_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

// ---------------------------------------------------------------- the check
constexpr DType kDt = DType::BF16;
constexpr double kRelBf16 = 2e-2, kRelF32 = 1e-5, kAbsFrac = 2e-5;

std::vector<float> rnd(i64 n, unsigned seed, float scale, float shift = 0.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = scale * nd(rng) + shift;
  return v;
}
std::vector<unsigned char> to_bf16(const std::vector<float>& v) {
  std::vector<unsigned char> b(v.size() * 2);
  ds::convert(v.data(), DType::F32, b.data(), kDt, v.size());
  return b;
}
std::vector<float> q(const std::vector<float>& v) {  // rounded to bf16, as fp32
  const auto b = to_bf16(v);
  std::vector<float> r(v.size());
  ds::convert(b.data(), kDt, r.data(), DType::F32, v.size());
  return r;
}
std::vector<double> D(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
std::vector<std::int32_t> tokens_of(i64 n, i64 V, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> u(0, std::int32_t(V - 1));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = u(rng);
  return t;
}

// A device buffer of the check: uploaded (bf16 or fp32 values, tokens) or, without values,
// all-ones bytes (NaN in bf16 and fp32) so that an element a kernel leaves unwritten is wrong.
// Complete on the device when constructed; reads wait for the benchmark's stream.
struct Dev {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit Dev(std::size_t nbytes) : bytes(nbytes) {
    DS_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(nbytes, 16)));
    DS_CUDA_CHECK(cudaMemset(ptr, 0xFF, nbytes));
    DS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  Dev(const void* host, std::size_t nbytes) : Dev(nbytes) { upload(host); }
  Dev(const std::vector<float>& v, DType dt) : Dev(v.size() * ds::dtype_size(dt)) {
    if (dt == DType::F32)
      upload(v.data());
    else
      upload(to_bf16(v).data());
  }
  explicit Dev(const std::vector<std::int32_t>& v) : Dev(v.data(), v.size() * 4) {}
  ~Dev() { cudaFree(ptr); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void upload(const void* host) {
    DS_CUDA_CHECK(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  float* f() const { return static_cast<float*>(ptr); }
  std::int32_t* i() const { return static_cast<std::int32_t*>(ptr); }
  std::vector<unsigned char> raw() const {
    DS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    DS_CUDA_CHECK(cudaGetLastError());
    std::vector<unsigned char> h(bytes);
    DS_CUDA_CHECK(cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<float> get(DType dt) const {
    const auto h = raw();
    std::vector<float> r(bytes / ds::dtype_size(dt));
    ds::convert(h.data(), dt, r.data(), DType::F32, r.size());
    return r;
  }
};

// Wrong elements of one kernel's outputs, and the first one seen (the evidence).
struct Tally {
  std::size_t bad = 0, total = 0;
  std::string first;
  bool run = false;
};

// |got - want| <= rel |want| + 2e-5 max|want| + extra_abs (NaN is wrong).
void compare(Tally& t, const char* what, const std::vector<float>& got, const std::vector<double>& want, double rel,
             double extra_abs = 0) {
  t.run = true;
  t.total += want.size();
  if (got.size() != want.size()) {
    t.bad += want.size();
    if (t.first.empty()) t.first = std::string(what) + ": size " + std::to_string(got.size()) + ", expected " +
                                   std::to_string(want.size());
    return;
  }
  double mx = 0;
  for (double w : want) mx = std::fmax(mx, std::fabs(w));
  const double abs = kAbsFrac * mx + 1e-30 + extra_abs;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(double(got[i]) - want[i]) <= rel * std::fabs(want[i]) + abs) continue;
    if (t.bad++ == 0 && t.first.empty()) {
      char s[200];
      std::snprintf(s, sizeof s, "%s #%zu: got %.9g, want %.9g (tolerance %.0e |ref| + %.3g)", what, i, double(got[i]),
                    want[i], rel, abs);
      t.first = s;
    }
  }
}

void compare_bits(Tally& t, const char* what, const std::vector<unsigned char>& got,
                  const std::vector<unsigned char>& want, std::size_t es) {
  t.run = true;
  t.total += want.size() / es;
  for (std::size_t i = 0; i < want.size() / es; ++i) {
    if (i * es + es <= got.size() && std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0) continue;
    if (t.bad++ == 0 && t.first.empty()) t.first = std::string(what) + " #" + std::to_string(i) + " differs bitwise";
  }
}

// Index in a [B,T,row] tensor of element i of a [B,NH,T,hs] one (the layout kernels' map).
i64 head_index(i64 i, i64 T, i64 NH, i64 hs, i64 row) {
  const i64 d = i % hs, t = (i / hs) % T, h = (i / (hs * T)) % NH, b = i / (hs * T * NH);
  return (b * T + t) * row + h * hs + d;
}

struct Row {
  std::string op;
  double ms, bytes;
  Tally check;
};

Tally& tally(std::vector<Row>& rows, const std::string& op) {
  for (auto& r : rows)
    if (r.op == op) return r.check;
  DS_THROW("bench_layers_cuda: no timed row '" << op << "' to check");
}

// Runs every row's check at B rows of T (the other sizes as timed).
void check_rows(std::vector<Row>& rows, i64 B, i64 T, i64 C, i64 NH, i64 V) {
  const i64 N = B * T, BNH = B * NH;
  const std::size_t nc = std::size_t(N * C);
  unsigned seed = 100;
  // LayerNorm forward, then backward (whole and each half) from the double forward's stats
  // rounded to fp32, as the forward saves them.
  const auto x = q(rnd(N * C, ++seed, 2.f, 3.f)), w = q(rnd(C, ++seed, 0.2f, 1.f)), b = q(rnd(C, ++seed, 0.2f));
  std::vector<double> ro(nc), rm(static_cast<std::size_t>(N)), rr(static_cast<std::size_t>(N));
  ref::layernorm_forward<double>(ro.data(), rm.data(), rr.data(), D(x).data(), D(w).data(), D(b).data(), N, C);
  {
    Tally& t = tally(rows, "layernorm fwd");
    Dev dx(x, kDt), dw(w, kDt), db(b, kDt), dout(nc * 2), dm(std::size_t(N) * 4), dr(std::size_t(N) * 4);
    kc::layernorm_forward(dout.ptr, dm.f(), dr.f(), dx.ptr, dw.ptr, db.ptr, N, C, kDt, g_stream);
    compare(t, "out", dout.get(kDt), ro, kRelBf16);
    compare(t, "mean", dm.get(DType::F32), rm, kRelF32);
    compare(t, "rstd", dr.get(DType::F32), rr, kRelF32);
  }
  {
    const std::vector<float> mf(rm.begin(), rm.end()), rf(rr.begin(), rr.end());
    const auto dy = q(rnd(N * C, ++seed, 1.f)), dx0 = q(rnd(N * C, ++seed, 1.f)), dw0 = q(rnd(C, ++seed, 1.f)),
               db0 = q(rnd(C, ++seed, 1.f));
    auto rdx = D(dx0), rdw = D(dw0), rdb = D(db0);
    ref::layernorm_backward<double>(rdx.data(), rdw.data(), rdb.data(), D(dy).data(), D(x).data(), D(w).data(),
                                    D(mf).data(), D(rf).data(), N, C);
    // dinp's fp32 rounding inside the bracket is multiplied by rstd (as in the kernel test).
    double max_rstd = 0, max_w = 0, max_dy = 0;
    for (float r : rf) max_rstd = std::fmax(max_rstd, double(r));
    for (float v : w) max_w = std::fmax(max_w, std::fabs(double(v)));
    for (float v : dy) max_dy = std::fmax(max_dy, std::fabs(double(v)));
    const double dinp_abs = 4 * 1.2e-7 * max_rstd * max_w * max_dy;
    struct Half { const char* op; int mask; };
    for (const Half& h : {Half{"layernorm bwd (dinp, dw, db)", 7}, Half{"layernorm bwd: dinp only", 1},
                          Half{"layernorm bwd: dw, db only", 6}}) {
      Tally& t = tally(rows, h.op);
      Dev ddy(dy, kDt), dinp(x, kDt), dwt(w, kDt), dm(mf, DType::F32), dr(rf, DType::F32), gx(dx0, kDt), gw(dw0, kDt),
          gb(db0, kDt), scr(kc::layernorm_scratch_floats(N, C) * 4);
      kc::layernorm_backward(h.mask & 1 ? gx.ptr : nullptr, h.mask & 2 ? gw.ptr : nullptr, h.mask & 4 ? gb.ptr : nullptr,
                             ddy.ptr, dinp.ptr, dwt.ptr, dm.f(), dr.f(), N, C, scr.f(), kDt, g_stream);
      // A null output keeps what it held.
      compare(t, "dinp", gx.get(kDt), h.mask & 1 ? rdx : D(dx0), kRelBf16, dinp_abs);
      compare(t, "dw", gw.get(kDt), h.mask & 2 ? rdw : D(dw0), kRelBf16);
      compare(t, "db", gb.get(kDt), h.mask & 4 ? rdb : D(db0), kRelBf16);
    }
  }
  // Bias gradient (+=) and bias (+ residual) add, in place.
  for (i64 oc : {C, 3 * C, 4 * C}) {
    const auto dy = q(rnd(N * oc, ++seed, 1.f)), db0 = q(rnd(oc, ++seed, 1.f));
    std::vector<double> want = D(db0);
    for (i64 n = 0; n < N; ++n)
      for (i64 c = 0; c < oc; ++c) want[std::size_t(c)] += double(dy[std::size_t(n * oc + c)]);
    Dev ddy(dy, kDt), gb(db0, kDt), scr(kc::bias_scratch_floats(N, oc) * 4);
    kc::bias_backward(gb.ptr, ddy.ptr, N, oc, scr.f(), kDt, g_stream);
    compare(tally(rows, "bias grad OC=" + std::to_string(oc)), "dbias", gb.get(kDt), want, kRelBf16);
  }
  for (int variant = 0; variant < 4; ++variant) {  // bias only at C, 3C, 4C; bias + residual at C
    const i64 oc = variant == 1 ? 3 * C : variant == 2 ? 4 * C : C;
    const bool residual = variant == 3;
    const auto o = q(rnd(N * oc, ++seed, 1.f)), bias = q(rnd(oc, ++seed, 1.f)), res = q(rnd(N * oc, ++seed, 1.f));
    std::vector<double> want(o.size());
    for (i64 n = 0; n < N; ++n)
      for (i64 c = 0; c < oc; ++c) {
        const std::size_t i = std::size_t(n * oc + c);
        want[i] = double(o[i]) + double(bias[std::size_t(c)]) + (residual ? double(res[i]) : 0.0);
      }
    Dev dout(o, kDt), dbias(bias, kDt), dres(res, kDt);
    kc::add_bias_residual(dout.ptr, dbias.ptr, residual ? dres.ptr : nullptr, N, oc, kDt, g_stream);
    compare(tally(rows, residual ? "bias + residual add OC=" + std::to_string(oc) : "bias add OC=" + std::to_string(oc)),
            "out", dout.get(kDt), want, kRelBf16);
  }
  // GELU forward and backward over the 4C activations.
  {
    const i64 n = 4 * N * C;
    const auto gx = q(rnd(n, ++seed, 2.5f)), gdy = q(rnd(n, ++seed, 1.f));
    std::vector<double> fw(gx.size()), bw(gx.size());
    ref::gelu_forward<double>(fw.data(), D(gx).data(), n);
    ref::gelu_backward<double>(bw.data(), D(gx).data(), D(gdy).data(), n);
    Dev dx(gx, kDt), ddy(gdy, kDt), dout(gx.size() * 2), dinp(gx.size() * 2);
    kc::gelu_forward(dout.ptr, dx.ptr, n, kDt, g_stream);
    compare(tally(rows, "gelu fwd 4C"), "out", dout.get(kDt), fw, kRelBf16);
    kc::gelu_backward(dinp.ptr, dx.ptr, ddy.ptr, n, kDt, g_stream);
    compare(tally(rows, "gelu bwd 4C"), "dinp", dinp.get(kDt), bw, kRelBf16);
  }
  // Causal softmax: NaN above the diagonal in the inputs (must not be read); forward in place
  // as timed; backward with dscores aliasing datt.
  {
    const float scale = 0.125f, nanf = std::numeric_limits<float>::quiet_NaN();
    const std::size_t n = std::size_t(BNH * T * T);
    auto sc = q(rnd(i64(n), ++seed, 3.f));
    auto dat = q(rnd(i64(n), ++seed, 1.f));
    for (i64 r = 0; r < BNH * T; ++r)
      for (i64 j = r % T + 1; j < T; ++j) sc[std::size_t(r * T + j)] = dat[std::size_t(r * T + j)] = nanf;
    std::vector<double> att(n, 0.0);
    for (i64 r = 0; r < BNH * T; ++r) {
      const i64 i = r % T;
      const float* s = sc.data() + r * T;
      double* a = att.data() + r * T;
      double m = -INFINITY, sum = 0;
      for (i64 j = 0; j <= i; ++j) m = std::fmax(m, double(scale) * s[j]);
      for (i64 j = 0; j <= i; ++j) sum += std::exp(double(scale) * s[j] - m);
      for (i64 j = 0; j <= i; ++j) a[j] = std::exp(double(scale) * s[j] - m) / sum;
    }
    {
      Dev dsc(sc, kDt);
      kc::causal_softmax_forward(dsc.ptr, dsc.ptr, scale, BNH, T, kDt, g_stream);
      compare(tally(rows, "causal softmax fwd (in place)"), "att", dsc.get(kDt), att, kRelBf16);
    }
    std::vector<float> pa = q(std::vector<float>(att.begin(), att.end()));
    for (i64 r = 0; r < BNH * T; ++r)
      for (i64 j = r % T + 1; j < T; ++j) pa[std::size_t(r * T + j)] = nanf;
    std::vector<double> want(n, 0.0);
    for (i64 r = 0; r < BNH * T; ++r) {
      const i64 i = r % T;
      const float* p = pa.data() + r * T;
      const float* d = dat.data() + r * T;
      double dot = 0;
      for (i64 j = 0; j <= i; ++j) dot += double(p[j]) * d[j];
      for (i64 j = 0; j <= i; ++j) want[std::size_t(r * T + j)] = double(scale) * p[j] * (d[j] - dot);
    }
    Dev datt(pa, kDt), ddat(dat, kDt);
    kc::causal_softmax_backward(ddat.ptr, datt.ptr, ddat.ptr, scale, BNH, T, kDt, g_stream);
    compare(tally(rows, "causal softmax bwd"), "dscores", ddat.get(kDt), want, kRelBf16);
  }
  // Attention layouts: bitwise.
  {
    const i64 n = N * C, hs = C / NH;
    auto put = [](std::vector<unsigned char>& dst, i64 di, const std::vector<unsigned char>& src, i64 si) {
      std::memcpy(dst.data() + std::size_t(di) * 2, src.data() + std::size_t(si) * 2, 2);
    };
    const auto qkv = to_bf16(rnd(3 * n, ++seed, 1.f));
    std::vector<unsigned char> wq(std::size_t(n) * 2), wk(wq.size()), wv(wq.size());
    for (i64 i = 0; i < n; ++i) {
      const i64 si = head_index(i, T, NH, hs, 3 * C);
      put(wq, i, qkv, si);
      put(wk, i, qkv, si + C);
      put(wv, i, qkv, si + 2 * C);
    }
    Dev dqkv(qkv.data(), qkv.size()), dq(wq.size()), dk(wq.size()), dv(wq.size());
    kc::split_qkv(dq.ptr, dk.ptr, dv.ptr, dqkv.ptr, B, T, C, NH, kDt, g_stream);
    Tally& t = tally(rows, "split_qkv");
    compare_bits(t, "q", dq.raw(), wq, 2);
    compare_bits(t, "k", dk.raw(), wk, 2);
    compare_bits(t, "v", dv.raw(), wv, 2);
    const auto yh = to_bf16(rnd(n, ++seed, 1.f));
    std::vector<unsigned char> want(yh.size());
    for (i64 i = 0; i < n; ++i) put(want, head_index(i, T, NH, hs, C), yh, i);
    Dev dyh(yh.data(), yh.size()), dy(yh.size());
    kc::merge_heads(dy.ptr, dyh.ptr, B, T, C, NH, kDt, g_stream);
    compare_bits(tally(rows, "merge_heads"), "y", dy.raw(), want, 2);
  }
  // Cross-entropy forward, then backward in place from the saved fp32 log-sum-exp.
  {
    const auto lx = q(rnd(N * V, ++seed, 2.f));
    const auto tg = tokens_of(N, V, ++seed);
    std::vector<double> lse(static_cast<std::size_t>(N)), loss(static_cast<std::size_t>(N));
    {
      const auto dlx = D(lx);
      ref::crossentropy_forward<double>(lse.data(), dlx.data(), tg.data(), N, V);
    }
    for (i64 r = 0; r < N; ++r)
      loss[std::size_t(r)] = lse[std::size_t(r)] - double(lx[std::size_t(r * V + tg[std::size_t(r)])]);
    Dev dx(lx, kDt), dtg(tg), dloss(std::size_t(N) * 4), dlse(std::size_t(N) * 4);
    kc::crossentropy_forward(dloss.f(), dlse.f(), dx.ptr, dtg.i(), N, V, kDt, g_stream);
    Tally& t = tally(rows, "cross-entropy fwd");
    compare(t, "losses", dloss.get(DType::F32), loss, kRelF32);
    compare(t, "lse", dlse.get(DType::F32), lse, kRelF32);
    const std::vector<float> lf(lse.begin(), lse.end());
    std::vector<double> want = D(lx);
    ref::crossentropy_backward<double>(want.data(), D(lf).data(), tg.data(), N, V, 1.0);
    Dev slse(lf, DType::F32);
    kc::crossentropy_backward(dx.ptr, slse.f(), dtg.i(), N, V, 1.f, kDt, g_stream);
    compare(tally(rows, "cross-entropy bwd (in place)"), "dlogits", dx.get(kDt), want, kRelBf16);
  }
  // Embedding backward into wte (+=), no wpe, as timed.
  {
    const auto dte0 = q(rnd(V * C, ++seed, 1.f)), dy = q(rnd(N * C, ++seed, 1.f));
    const auto tok = tokens_of(N, V, ++seed);
    std::vector<double> want = D(dte0);
    ref::embedding_backward<double>(want.data(), nullptr, D(dy).data(), tok.data(), B, T, C);
    Dev gte(dte0, kDt), ddy(dy, kDt), dtok(tok), scr(std::size_t(V * C) * 4);
    kc::embedding_backward(gte.ptr, nullptr, ddy.ptr, dtok.i(), B, T, C, V, scr.f(), kDt, g_stream);
    compare(tally(rows, "embedding bwd"), "dwte", gte.get(kDt), want, kRelBf16);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double min_ratio = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min_ratio" && i + 1 < argc) {
      min_ratio = ds::bench::parse_min_ratio("bench_layers_cuda", argv[++i]);
    } else {
      std::fprintf(stderr, "bench_layers_cuda: error: %s '%s' (usage: bench_layers_cuda [--min_ratio X])\n",
                   a == "--min_ratio" ? "a value is needed after" : "unknown argument", a.c_str());
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_layers_cuda: no CUDA device visible: skipped\n");
    return 77;
  }
  try {
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const ds::DType dt = ds::DType::BF16;
    const std::int64_t B = 16, T = 1024, C = 768, NH = 12, V = 50304, N = B * T, BNH = B * NH;
    const std::int64_t check_B = 2;
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

    std::vector<Row> rows;
    auto add = [&](const std::string& op, double bytes, const std::function<void()>& f) {
      rows.push_back({op, time_ms(f), bytes, {}});
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
    DS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    for (void* p : {x, y, z, w, bvec, gw, gb, att, logits}) cudaFree(p);
    for (float* p : {mean, rstd, lse, losses, scratch}) cudaFree(p);
    cudaFree(tok);

    check_rows(rows, check_B, T, C, NH, V);

    std::printf("# bench_layers_cuda: %s, bf16, N=%lld C=%lld NH=%lld T=%lld V=%lld; D2D copy %.0f GB/s (read + write, "
                "256 MiB, this run); checked at N=%lld against the CPU reference\n",
                prop.name, static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(NH),
                static_cast<long long>(T), static_cast<long long>(V), copy_gbs, static_cast<long long>(check_B * T));
    std::printf("| kernel | ms | least bytes (MB) | GB/s | of copy | wrong / checked |\n"
                "| --- | --- | --- | --- | --- | --- |\n");
    ds::bench::Report report("bench_layers_cuda");
    report.min_ratio(min_ratio);
    report["gpu"] = prop.name;
    report["dtype"] = "bf16";
    report["rows_timed"] = N;
    report["rows_checked"] = check_B * T;
    report["copy_gb_s"] = copy_gbs;
    report["rows"] = nlohmann::json::array();
    std::vector<double> ratios;
    for (const auto& r : rows) {
      const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
      ratios.push_back(gbs / copy_gbs);
      std::printf("| %s | %.4f | %.1f | %.0f | %.2f | %zu / %zu |\n", r.op.c_str(), r.ms, r.bytes / 1e6, gbs,
                  gbs / copy_gbs, r.check.bad, r.check.total);
      report["rows"].push_back({{"kernel", r.op}, {"ms", r.ms}, {"bytes", r.bytes}, {"gb_s", gbs},
                                {"ratio", gbs / copy_gbs}, {"wrong", r.check.bad}, {"checked", r.check.total}});
      report.check(r.op + " vs the CPU reference", r.check.run && r.check.bad == 0,
                   !r.check.run ? std::string("not checked")
                                : std::to_string(r.check.bad) + " of " + std::to_string(r.check.total) +
                                      " elements wrong" + (r.check.first.empty() ? "" : "; first: " + r.check.first));
    }
    report.headline("layer kernel GB/s / D2D cudaMemcpy GB/s (this run), median over the kernels",
                    ds::bench::median(ratios));
    return report.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_layers_cuda: error: %s\n", e.what());
    return 1;
  }
}
