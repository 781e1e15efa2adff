// Every CUDA nn kernel (ds/nn/cuda_kernels.h) against the plain references of
// tests/nn/kernels_ref.h (run in double) at awkward sizes, in each working dtype (fp32, fp16,
// bf16). Inputs are random (fresh per case, never zeros) and rounded to the dtype on the host
// first, so the device and the reference see the same values; forward outputs are poisoned
// (all-ones bytes: NaN in every dtype) so an element left unwritten fails; += outputs are
// pre-filled with random values; every device buffer has guard bytes on both sides that must
// survive (out-of-bounds writes); scratch buffers are poisoned too (a kernel must not read
// them before writing).
//
// Tolerance per element: |got - ref| <= rel(dt) * |ref| + 2e-5 * max|ref|, where
//  - rel(fp32) = 1e-5: fp32 arithmetic vs double (summation order, expf / tanhf ulps);
//  - rel(fp16) = 2e-3: one rounding of the output is <= 2^-11 relative (<= 2^-10 when the
//    fp32 value sits next to a rounding boundary), plus the fp32 error;
//  - rel(bf16) = 2e-2: one rounding is <= 2^-8 relative (2^-7 next to a boundary);
//  - the 2e-5 * max|ref| term absorbs fp32 cancellation (sums of terms of the tensor's
//    magnitude that nearly cancel) and fp16 subnormals.
// fp32-only outputs (LayerNorm mean / rstd, log-sum-exp, losses, mean) use rel(fp32), their
// inputs being the same rounded values. Layout kernels and convert must match bitwise.
// On failure: kernel, dtype, sizes, tensor, count of bad elements, first bad index with both
// values, max abs error and where. At the end: per kernel, checks and the worst err / tol.
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds/core/half.h"
#include "ds/nn/cuda_kernels.h"
#include "../nn/kernels_ref.h"

namespace {

using ds::DType;
using cuda_test::randv;
using cuda_test::to_dtype;
namespace nc = ds::nn::cuda;
namespace ref = ds::nn::ref;
using i64 = std::int64_t;

const DType kDts[] = {DType::F32, DType::F16, DType::BF16};
constexpr double kAbsFrac = 2e-5;

cudaStream_t g_stream = nullptr;
std::string g_kernel = "(none)";
std::string g_ctx = "(none)";

const char* dn(DType t) { return t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : t == DType::BF16 ? "bf16" : "?"; }
std::size_t es(DType t) { return ds::dtype_size(t); }
double rel_tol(DType t) { return t == DType::F32 ? 1e-5 : t == DType::F16 ? 2e-3 : 2e-2; }

void set_ctx(const char* kernel, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_kernel = kernel;
  g_ctx = std::string(kernel) + " [" + buf + "]";
}

struct Stat {
  int checks = 0, failed = 0;
  double worst = 0;  // max over checks of max err / tol
  std::string worst_where;
};
std::map<std::string, Stat> g_stats;

void fail_here() {
  ++cuda_test::g_failures;
  ++g_stats[g_kernel].failed;
}

// Waits for the stream; a CUDA error here (an illegal address, ...) poisons the context:
// report the running case and stop.
void sync() {
  cudaError_t e = cudaStreamSynchronize(g_stream);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL: CUDA error %s (%s) after %s\n", cudaGetErrorName(e), cudaGetErrorString(e),
                 g_ctx.c_str());
    std::exit(1);
  }
}

// ---------------------------------------------------------------- host values
std::vector<float> q(const std::vector<float>& v, DType dt) {  // rounded to dt, as fp32
  const auto b = to_dtype(v, dt);
  std::vector<float> r(v.size());
  ds::convert(b.data(), dt, r.data(), DType::F32, v.size());
  return r;
}
std::vector<float> rnd(i64 n, unsigned seed, float scale, float shift = 0.f) {
  auto v = randv(std::size_t(n), seed, scale);
  for (auto& x : v) x += shift;
  return v;
}
std::vector<double> D(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
std::vector<std::int32_t> tokens_of(i64 n, i64 V, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> u(0, std::int32_t(V - 1));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = u(rng);
  return t;
}

// ---------------------------------------------------------------- device buffers with guards
struct Buf {
  static constexpr std::size_t kGuard = 256;
  static constexpr unsigned char kGuardByte = 0xA5;
  std::string name;
  char* base = nullptr;
  char* ptr = nullptr;
  std::size_t bytes = 0, off = 0, total = 0;

  Buf(const char* nm, std::size_t nbytes, std::size_t offset = 0) : name(nm), bytes(nbytes), off(offset) {
    total = nbytes + 2 * kGuard + offset;
    CU(cudaMalloc(reinterpret_cast<void**>(&base), total));
    CU(cudaMemset(base, kGuardByte, total));
    ptr = base + kGuard + offset;
    poison();
  }
  Buf(const char* nm, const std::vector<float>& v, DType dt, std::size_t offset = 0) : Buf(nm, v.size() * es(dt), offset) {
    up(to_dtype(v, dt).data());
  }
  Buf(const char* nm, const std::vector<std::int32_t>& v) : Buf(nm, v.size() * 4) { up(v.data()); }
  ~Buf() { cudaFree(base); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  template <typename T = void> T* p() const { return reinterpret_cast<T*>(ptr); }
  float* f() const { return reinterpret_cast<float*>(ptr); }
  void up(const void* h) {
    if (bytes) CU(cudaMemcpy(ptr, h, bytes, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
  }
  void up(const std::vector<float>& v, DType dt) { up(to_dtype(v, dt).data()); }
  void poison() {  // 0xFF bytes: NaN in fp32, fp16 and bf16
    if (bytes) CU(cudaMemset(ptr, 0xFF, bytes));
    CU(cudaDeviceSynchronize());
  }
  std::vector<unsigned char> raw() const {
    std::vector<unsigned char> h(bytes);
    if (bytes) CU(cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<float> get(DType dt) const {
    const auto h = raw();
    std::vector<float> r(bytes / es(dt));
    ds::convert(h.data(), dt, r.data(), DType::F32, r.size());
    return r;
  }
  void check_guards() const {
    std::vector<unsigned char> h(total);
    CU(cudaMemcpy(h.data(), base, total, cudaMemcpyDeviceToHost));
    const std::size_t lo = kGuard + off, hi = lo + bytes;
    std::size_t bad = 0;
    long long first = 0;
    for (std::size_t i = 0; i < total; ++i) {
      if (i >= lo && i < hi) continue;
      if (h[i] != kGuardByte) {
        if (bad++ == 0) first = i < lo ? -(long long)(lo - i) : (long long)(i - hi);
      }
    }
    ++g_stats[g_kernel].checks;
    if (bad) {
      fail_here();
      std::fprintf(stderr, "FAIL %s buffer '%s': %zu guard bytes overwritten (out-of-bounds write); first at %lld bytes %s\n",
                   g_ctx.c_str(), name.c_str(), bad, first < 0 ? -first : first, first < 0 ? "before the start" : "after the end");
    }
  }
};

// ---------------------------------------------------------------- comparisons
// extra_abs: an absolute allowance on top of the relative one, for outputs whose rounding
// error is amplified (LayerNorm's dinp by rstd, which is 1/sqrt(eps) ~ 316 for C = 1).
void compare(const char* what, const std::vector<float>& got, const std::vector<double>& want, DType out_dt,
             double extra_abs = 0) {
  Stat& st = g_stats[g_kernel];
  ++st.checks;
  if (got.size() != want.size()) {
    fail_here();
    std::fprintf(stderr, "FAIL %s %s: size %zu, expected %zu\n", g_ctx.c_str(), what, got.size(), want.size());
    return;
  }
  double mx = 0;
  for (double w : want) mx = std::fmax(mx, std::fabs(w));
  // fp16 outputs below its smallest normal (6.1e-5) are multiples of 2^-24: one such step
  // is the least error a correctly rounded result can be judged by.
  const double subnormal_step = out_dt == DType::F16 ? 5.9604644775390625e-08 : 0.0;
  const double rel = rel_tol(out_dt), abs = kAbsFrac * mx + 1e-30 + subnormal_step + extra_abs;
  std::size_t bad = 0, first = 0, at = 0, nan = 0;
  double max_err = 0, worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double tol = rel * std::fabs(want[i]) + abs;
    const bool ok = err <= tol;  // NaN fails
    if (!ok) {
      if (bad++ == 0) first = i;
      if (std::isnan(got[i])) ++nan;
    }
    const double ratio = ok ? err / tol : std::numeric_limits<double>::infinity();
    if (!(err <= max_err) || (std::isnan(err) && at == 0 && max_err == 0)) {
      max_err = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
      at = i;
    }
    worst = std::fmax(worst, ratio);
  }
  if (worst > st.worst || st.worst_where.empty()) {
    st.worst = worst;
    st.worst_where = g_ctx + " " + what;
  }
  if (bad) {
    fail_here();
    std::fprintf(stderr,
                 "FAIL %s %s (%s): %zu of %zu elements out of tolerance (%zu NaN%s); first #%zu got %.9g want %.9g; "
                 "max abs err %.3g at #%zu (got %.9g want %.9g); max|ref| %.4g; tol %.0e*|ref| + %.3g\n",
                 g_ctx.c_str(), what, dn(out_dt), bad, got.size(), nan, nan ? ": unwritten elements?" : "", first,
                 double(got[first]), want[first], max_err, at, double(got[at]), want[at], mx, rel, abs);
  }
}

// Bitwise equality of element arrays (layout kernels, convert, determinism).
void compare_bits(const char* what, const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                  std::size_t elem) {
  Stat& st = g_stats[g_kernel];
  ++st.checks;
  if (got.size() != want.size()) {
    fail_here();
    std::fprintf(stderr, "FAIL %s %s: %zu bytes, expected %zu\n", g_ctx.c_str(), what, got.size(), want.size());
    return;
  }
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size() / elem; ++i)
    if (std::memcmp(got.data() + i * elem, want.data() + i * elem, elem) != 0 && bad++ == 0) first = i;
  if (bad) {
    fail_here();
    unsigned long long g = 0, w = 0;
    std::memcpy(&g, got.data() + first * elem, elem);
    std::memcpy(&w, want.data() + first * elem, elem);
    std::fprintf(stderr, "FAIL %s %s: %zu of %zu elements differ bitwise; first #%zu got 0x%llx want 0x%llx\n",
                 g_ctx.c_str(), what, bad, got.size() / elem, first, g, w);
  }
}

// ---------------------------------------------------------------- LayerNorm
// layernorm_backward (rows of C <= 1024 take the fused kernel, wider rows the three-kernel
// path) on rows x (already rounded to dt) with the saved fp32 stats of the double forward (rm, rr).
// mask: bit 0 dinp, bit 1 dw, bit 2 db passed (the others null). misalign: 0 none, 1 every
// dt tensor one element off 16-byte alignment, 2 only dout (v2's scalar fallback).
void check_ln_backward(DType dt, i64 N, i64 C, const std::vector<float>& x, const std::vector<float>& w,
                       const std::vector<double>& rm, const std::vector<double>& rr, unsigned& seed,
                       int mask = 7, int misalign = 0) {
  set_ctx("layernorm_backward", "dt=%s N=%lld C=%lld%s%s%s misalign=%d", dn(dt), (long long)N,
          (long long)C, mask & 1 ? " dinp" : "", mask & 2 ? " dw" : "", mask & 4 ? " db" : "", misalign);
  std::vector<float> mf(rm.begin(), rm.end()), rf(rr.begin(), rr.end());  // the saved fp32 stats
  const auto dy = q(rnd(N * C, ++seed, 1.f), dt);
  const auto dx0 = q(rnd(N * C, ++seed, 1.f), dt);
  const auto dw0 = q(rnd(C, ++seed, 1.f), dt);
  const auto db0 = q(rnd(C, ++seed, 1.f), dt);
  auto rdx = D(dx0), rdw = D(dw0), rdb = D(db0);
  ref::layernorm_backward<double>(rdx.data(), rdw.data(), rdb.data(), D(dy).data(), D(x).data(), D(w).data(),
                                  D(mf).data(), D(rf).data(), N, C);
  const std::size_t o_all = misalign == 1 ? es(dt) : 0, o_dy = misalign != 0 ? es(dt) : 0;
  Buf dout("dout", dy, dt, o_dy), dinp("inp", x, dt, o_all), dwt("w", w, dt, o_all), dm("mean", mf, DType::F32),
      dr("rstd", rf, DType::F32), gx("dinp", dx0, dt, o_all), gw("dw", dw0, dt, o_all), gb("db", db0, dt, o_all),
      scr("scratch", nc::layernorm_scratch_floats(N, C) * 4);
  void* px = mask & 1 ? gx.ptr : nullptr;
  void* pw = mask & 2 ? gw.ptr : nullptr;
  void* pb = mask & 4 ? gb.ptr : nullptr;
  nc::layernorm_backward(px, pw, pb, dout.ptr, dinp.ptr, dwt.ptr, dm.f(), dr.f(), N, C, scr.f(), dt, g_stream);
  sync();
  // dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm xhat)): fp32 rounding (an FMA
  // contraction, say) in the bracket is multiplied by rstd.
  double max_rstd = 0, max_w = 0, max_dy = 0;
  for (float r : rf) max_rstd = std::fmax(max_rstd, double(r));
  for (float v : w) max_w = std::fmax(max_w, std::fabs(double(v)));
  for (float v : dy) max_dy = std::fmax(max_dy, std::fabs(double(v)));
  // A null output is untouched (its buffer keeps the initial values).
  compare("dinp", gx.get(dt), mask & 1 ? rdx : D(dx0), dt, 4 * 1.2e-7 * max_rstd * max_w * max_dy);
  compare("dw", gw.get(dt), mask & 2 ? rdw : D(dw0), dt);
  compare("db", gb.get(dt), mask & 4 ? rdb : D(db0), dt);
  for (const Buf* p : {&gx, &gw, &gb, &scr}) p->check_guards();
  // Deterministic: the same inputs give the same bits.
  const auto r1x = gx.raw(), r1w = gw.raw(), r1b = gb.raw();
  gx.up(dx0, dt);
  gw.up(dw0, dt);
  gb.up(db0, dt);
  scr.poison();
  nc::layernorm_backward(px, pw, pb, dout.ptr, dinp.ptr, dwt.ptr, dm.f(), dr.f(), N, C, scr.f(), dt, g_stream);
  sync();
  compare_bits("dinp (rerun, determinism)", gx.raw(), r1x, es(dt));
  compare_bits("dw (rerun, determinism)", gw.raw(), r1w, es(dt));
  compare_bits("db (rerun, determinism)", gb.raw(), r1b, es(dt));
}

void test_layernorm() {
  unsigned seed = 1000;
  for (DType dt : kDts)
    for (i64 N : {1, 7, 333, 2100})
      for (i64 C : {1, 3, 64, 770}) {
        if (N == 2100 && C < 64) continue;
        const std::size_t nc_ = std::size_t(N * C);
        const auto x = q(rnd(N * C, ++seed, 2.f, 3.f), dt);  // mean far from 0: two-pass variance
        const auto w = q(rnd(C, ++seed, 0.2f, 1.f), dt);
        const auto b = q(rnd(C, ++seed, 0.2f), dt);
        std::vector<double> ro(nc_), rm(static_cast<std::size_t>(N)), rr(static_cast<std::size_t>(N));
        ref::layernorm_forward<double>(ro.data(), rm.data(), rr.data(), D(x).data(), D(w).data(), D(b).data(), N, C);
        {
          set_ctx("layernorm_forward", "dt=%s N=%lld C=%lld", dn(dt), (long long)N, (long long)C);
          Buf dx("inp", x, dt), dw("w", w, dt), db("b", b, dt), dout("out", nc_ * es(dt)), dm("mean", N * 4),
              dr("rstd", N * 4);
          nc::layernorm_forward(dout.ptr, dm.f(), dr.f(), dx.ptr, dw.ptr, db.ptr, N, C, dt, g_stream);
          sync();
          compare("out", dout.get(dt), ro, dt);
          compare("mean", dm.get(DType::F32), rm, DType::F32);
          compare("rstd", dr.get(DType::F32), rr, DType::F32);
          for (const Buf* p : {&dout, &dm, &dr}) p->check_guards();
        }
        check_ln_backward(dt, N, C, x, w, rm, rr, seed);
      }
  // Backward only: the fused kernel's vector path (C % 8 == 0, C <= 1024: 1..4 segments of 256
  // columns), its scalar fallback (C % 8 != 0, misaligned pointers), C > 1024 (the
  // three-kernel path, with null outputs and misaligned pointers too), many rows (more rows
  // than the fused kernel has blocks), and null outputs.
  struct Case { i64 N, C; int mask, misalign; };
  const Case cases[] = {{1, 8, 7, 0},      {9, 256, 7, 0},   {333, 512, 7, 0},  {2100, 768, 7, 0},
                        {333, 1024, 7, 0}, {77, 1025, 7, 0}, {20000, 768, 7, 0}, {20000, 770, 7, 0},
                        {20000, 1, 7, 0},  {333, 768, 7, 1}, {333, 768, 7, 2},  {333, 770, 7, 1},
                        {2100, 768, 1, 0}, {2100, 768, 6, 0}, {2100, 768, 2, 0}, {2100, 768, 4, 0},
                        {2100, 768, 5, 0}, {333, 770, 6, 0}, {333, 770, 1, 0},  {333, 770, 3, 1},
                        {333, 1100, 6, 0}, {333, 1100, 1, 0}, {333, 1100, 7, 1}};
  for (DType dt : kDts)
    for (const Case& c : cases) {
      if (c.N == 20000 && dt == DType::F16) continue;  // host time: the large rows in fp32 and bf16
      const auto x = q(rnd(c.N * c.C, ++seed, 2.f, 3.f), dt);
      const auto w = q(rnd(c.C, ++seed, 0.2f, 1.f), dt);
      const auto b = q(rnd(c.C, ++seed, 0.2f), dt);
      std::vector<double> ro(std::size_t(c.N * c.C)), rm(static_cast<std::size_t>(c.N)),
          rr(static_cast<std::size_t>(c.N));
      ref::layernorm_forward<double>(ro.data(), rm.data(), rr.data(), D(x).data(), D(w).data(), D(b).data(), c.N,
                                     c.C);
      check_ln_backward(dt, c.N, c.C, x, w, rm, rr, seed, c.mask, c.misalign);
    }
}

// ---------------------------------------------------------------- bias + residual, bias grad
void test_bias() {
  unsigned seed = 2000;
  for (DType dt : kDts)
    for (i64 N : {1, 7, 333})
      for (i64 OC : {1, 3, 64, 770})
        for (int variant = 0; variant < 3; ++variant)  // 0: bias + residual, 1: bias, 2: residual
          for (std::size_t off : {std::size_t(0), es(dt)}) {
            set_ctx("add_bias_residual", "dt=%s N=%lld OC=%lld %s offset=%zu", dn(dt), (long long)N, (long long)OC,
                    variant == 0 ? "bias+residual" : variant == 1 ? "bias" : "residual", off);
            const auto o = q(rnd(N * OC, ++seed, 1.f), dt);
            const auto bias = q(rnd(OC, ++seed, 1.f), dt);
            const auto res = q(rnd(N * OC, ++seed, 1.f), dt);
            std::vector<double> want(o.size());
            for (i64 n = 0; n < N; ++n)
              for (i64 c = 0; c < OC; ++c) {
                const std::size_t i = std::size_t(n * OC + c);
                want[i] = double(o[i]) + (variant != 2 ? double(bias[std::size_t(c)]) : 0.0) +
                          (variant != 1 ? double(res[i]) : 0.0);
              }
            Buf dout("out", o, dt, off), dbias("bias", bias, dt, off), dres("residual", res, dt, off);
            nc::add_bias_residual(dout.ptr, variant != 2 ? dbias.ptr : nullptr, variant != 1 ? dres.ptr : nullptr, N, OC,
                                  dt, g_stream);
            sync();
            compare("out", dout.get(dt), want, dt);
            dout.check_guards();
          }
  for (DType dt : kDts)
    for (i64 N : {1, 7, 333, 20000})
      for (i64 OC : {1, 3, 64, 770}) {
        set_ctx("bias_backward", "dt=%s N=%lld OC=%lld", dn(dt), (long long)N, (long long)OC);
        const auto dy = q(rnd(N * OC, ++seed, 1.f), dt);
        const auto db0 = q(rnd(OC, ++seed, 1.f), dt);
        std::vector<double> want = D(db0);
        for (i64 n = 0; n < N; ++n)
          for (i64 c = 0; c < OC; ++c) want[std::size_t(c)] += double(dy[std::size_t(n * OC + c)]);
        Buf ddy("dout", dy, dt), gb("dbias", db0, dt), scr("scratch", nc::bias_scratch_floats(N, OC) * 4);
        nc::bias_backward(gb.ptr, ddy.ptr, N, OC, scr.f(), dt, g_stream);
        sync();
        compare("dbias", gb.get(dt), want, dt);
        gb.check_guards();
        scr.check_guards();
        const auto r1 = gb.raw();
        gb.up(db0, dt);
        scr.poison();
        nc::bias_backward(gb.ptr, ddy.ptr, N, OC, scr.f(), dt, g_stream);
        sync();
        compare_bits("dbias (rerun, determinism)", gb.raw(), r1, es(dt));
      }
}

// ---------------------------------------------------------------- GELU, mean, convert
void test_gelu_mean_convert() {
  unsigned seed = 3000;
  for (DType dt : kDts)
    for (i64 n : {1, 7, 333, 100003})
      for (std::size_t off : {std::size_t(0), es(dt)}) {
        const auto x = q(rnd(n, ++seed, 2.5f), dt);
        const auto dy = q(rnd(n, ++seed, 1.f), dt);
        std::vector<double> fw(x.size()), bw(x.size());
        ref::gelu_forward<double>(fw.data(), D(x).data(), n);
        ref::gelu_backward<double>(bw.data(), D(x).data(), D(dy).data(), n);
        {
          set_ctx("gelu_forward", "dt=%s n=%lld offset=%zu", dn(dt), (long long)n, off);
          Buf dx("inp", x, dt, off), dout("out", x.size() * es(dt), off);
          nc::gelu_forward(dout.ptr, dx.ptr, n, dt, g_stream);
          sync();
          compare("out", dout.get(dt), fw, dt);
          dout.check_guards();
          // in place (out aliases inp)
          nc::gelu_forward(dx.ptr, dx.ptr, n, dt, g_stream);
          sync();
          compare("out (in place)", dx.get(dt), fw, dt);
        }
        {
          set_ctx("gelu_backward", "dt=%s n=%lld offset=%zu", dn(dt), (long long)n, off);
          Buf dx("inp", x, dt, off), ddy("dout", dy, dt, off), dinp("dinp", x.size() * es(dt), off);
          nc::gelu_backward(dinp.ptr, dx.ptr, ddy.ptr, n, dt, g_stream);
          sync();
          compare("dinp", dinp.get(dt), bw, dt);
          dinp.check_guards();
          nc::gelu_backward(ddy.ptr, dx.ptr, ddy.ptr, n, dt, g_stream);  // dinp aliases dout
          sync();
          compare("dinp (aliasing dout)", ddy.get(dt), bw, dt);
          ddy.check_guards();
        }
      }
  for (i64 n : {1, 7, 333, 100003}) {
    set_ctx("mean", "n=%lld", (long long)n);
    const auto x = rnd(n, ++seed, 1.f, 0.5f);
    double s = 0;
    for (float v : x) s += v;
    Buf dx("x", x, DType::F32), dout("out", 4);
    nc::mean(dout.f(), dx.f(), n, g_stream);
    sync();
    compare("out", dout.get(DType::F32), {s / double(n)}, DType::F32);
    dout.check_guards();
    const auto r1 = dout.raw();
    dout.poison();
    nc::mean(dout.f(), dx.f(), n, g_stream);
    sync();
    compare_bits("out (rerun, determinism)", dout.raw(), r1, 4);
  }
  const float specials[] = {0.f, -0.f, 1.f, -2.5f, 65504.f, 1e30f, -1e30f, 6e-8f, 1e-6f, 3.0e-39f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            1.00048828125f /* f16 tie */, 1.00390625f /* bf16 tie */};
  for (DType from : kDts)
    for (DType to : kDts)
      for (i64 n : {1, 7, 333, 100003})
        for (std::size_t off : {std::size_t(0), std::size_t(4)}) {
          set_ctx("convert", "%s->%s n=%lld offset=%zu", dn(from), dn(to), (long long)n, off);
          auto x = rnd(n, ++seed, 3.f);
          for (std::size_t i = 0; i < x.size() && i < sizeof specials / sizeof specials[0]; ++i) x[i] = specials[i];
          const auto src = to_dtype(x, from);
          std::vector<unsigned char> want(std::size_t(n) * es(to));
          if (from != DType::F32 && to != DType::F32 && from != to) {
            // The host converts half <-> half through fp32 (exact: fp32 holds every fp16 and
            // bf16 value), as the device kernel must.
            std::vector<float> mid(static_cast<std::size_t>(n));
            ds::convert(src.data(), from, mid.data(), DType::F32, std::size_t(n));
            ds::convert(mid.data(), DType::F32, want.data(), to, std::size_t(n));
          } else {
            ds::convert(src.data(), from, want.data(), to, std::size_t(n));
          }
          Buf ds_("src", src.size(), off), dd("dst", want.size(), off);
          ds_.up(src.data());
          nc::convert(dd.ptr, to, ds_.ptr, from, n, g_stream);
          sync();
          compare_bits("dst", dd.raw(), want, es(to));
          dd.check_guards();
        }
}

// ---------------------------------------------------------------- embedding
void test_embedding() {
  unsigned seed = 4000;
  struct Shape { i64 B, T, C, V; };
  const Shape shapes[] = {{1, 1, 1, 1}, {2, 5, 3, 5}, {3, 33, 64, 1000}, {2, 7, 770, 5}, {2, 9, 64, 50304}};
  for (DType dt : kDts)
    for (const Shape& s : shapes) {
      const i64 rows = s.B * s.T;
      const auto tok = tokens_of(rows, s.V, ++seed);
      const auto wte = q(rnd(s.V * s.C, ++seed, 1.f), dt);
      const auto wpe = q(rnd(s.T * s.C, ++seed, 1.f), dt);
      {
        set_ctx("embedding_forward", "dt=%s B=%lld T=%lld C=%lld V=%lld", dn(dt), (long long)s.B, (long long)s.T,
                (long long)s.C, (long long)s.V);
        std::vector<double> want(std::size_t(rows * s.C));
        ref::embedding_forward<double>(want.data(), tok.data(), D(wte).data(), D(wpe).data(), s.B, s.T, s.C);
        Buf dtok("tokens", tok), dwte("wte", wte, dt), dwpe("wpe", wpe, dt), dout("out", want.size() * es(dt));
        nc::embedding_forward(dout.ptr, dtok.p<std::int32_t>(), dwte.ptr, dwpe.ptr, s.B, s.T, s.C, dt, g_stream);
        sync();
        compare("out", dout.get(dt), want, dt);
        dout.check_guards();
      }
      {
        set_ctx("embedding_backward", "dt=%s B=%lld T=%lld C=%lld V=%lld", dn(dt), (long long)s.B, (long long)s.T,
                (long long)s.C, (long long)s.V);
        const auto dy = q(rnd(rows * s.C, ++seed, 1.f), dt);
        auto rte = D(wte), rpe = D(wpe);  // the pre-filled gradients: wte / wpe values
        ref::embedding_backward<double>(rte.data(), rpe.data(), D(dy).data(), tok.data(), s.B, s.T, s.C);
        Buf dtok("tokens", tok), gte("dwte", wte, dt), gpe("dwpe", wpe, dt), ddy("dout", dy, dt),
            scr("scratch", std::size_t(s.V * s.C) * 4);
        nc::embedding_backward(gte.ptr, gpe.ptr, ddy.ptr, dtok.p<std::int32_t>(), s.B, s.T, s.C, s.V, scr.f(), dt,
                               g_stream);
        sync();
        compare("dwte", gte.get(dt), rte, dt);
        compare("dwpe", gpe.get(dt), rpe, dt);
        for (const Buf* p : {&gte, &gpe, &scr}) p->check_guards();
      }
    }
}

// ---------------------------------------------------------------- attention layouts
i64 head_index(i64 i, i64 T, i64 NH, i64 hs, i64 row) {
  const i64 d = i % hs, t = (i / hs) % T, h = (i / (hs * T)) % NH, b = i / (hs * T * NH);
  return (b * T + t) * row + h * hs + d;
}

void test_layouts() {
  unsigned seed = 5000;
  struct Shape { i64 B, T, C, NH; };
  // hs 16 / 32 / 64 / 8 take the 16-byte fast path (hs 8 is one bf16 unit), hs 3 and 1 the
  // per-element kernels.
  const Shape shapes[] = {{1, 1, 3, 1}, {2, 5, 64, 4}, {2, 33, 96, 3}, {1, 7, 768, 12}, {3, 2, 5, 5}, {2, 3, 48, 6}};
  for (DType dt : kDts)
    for (const Shape& s : shapes) {
      const std::size_t e = es(dt);
      const i64 n = s.B * s.T * s.C, hs = s.C / s.NH;
      auto put = [&](std::vector<unsigned char>& dst, i64 di, const std::vector<unsigned char>& src, i64 si) {
        std::memcpy(dst.data() + std::size_t(di) * e, src.data() + std::size_t(si) * e, e);
      };
      char sz[128];
      std::snprintf(sz, sizeof sz, "dt=%s B=%lld T=%lld C=%lld NH=%lld", dn(dt), (long long)s.B, (long long)s.T,
                    (long long)s.C, (long long)s.NH);
      {
        set_ctx("split_qkv", "%s", sz);
        const auto qkv = to_dtype(rnd(3 * n, ++seed, 1.f), dt);
        std::vector<unsigned char> wq(std::size_t(n) * e), wk(wq.size()), wv(wq.size());
        for (i64 i = 0; i < n; ++i) {
          const i64 si = head_index(i, s.T, s.NH, hs, 3 * s.C);
          put(wq, i, qkv, si);
          put(wk, i, qkv, si + s.C);
          put(wv, i, qkv, si + 2 * s.C);
        }
        Buf dqkv("qkv", qkv.size()), dq("q", wq.size()), dk("k", wq.size()), dv("v", wq.size());
        dqkv.up(qkv.data());
        nc::split_qkv(dq.ptr, dk.ptr, dv.ptr, dqkv.ptr, s.B, s.T, s.C, s.NH, dt, g_stream);
        sync();
        compare_bits("q", dq.raw(), wq, e);
        compare_bits("k", dk.raw(), wk, e);
        compare_bits("v", dv.raw(), wv, e);
        for (const Buf* p : {&dq, &dk, &dv}) p->check_guards();
      }
      {
        set_ctx("merge_qkv", "%s", sz);
        const auto gq = to_dtype(rnd(n, ++seed, 1.f), dt), gk = to_dtype(rnd(n, ++seed, 1.f), dt),
                   gv = to_dtype(rnd(n, ++seed, 1.f), dt);
        std::vector<unsigned char> want(std::size_t(3 * n) * e);
        for (i64 i = 0; i < n; ++i) {
          const i64 di = head_index(i, s.T, s.NH, hs, 3 * s.C);
          put(want, di, gq, i);
          put(want, di + s.C, gk, i);
          put(want, di + 2 * s.C, gv, i);
        }
        Buf dq("dq", gq.size()), dk("dk", gk.size()), dv("dv", gv.size()), dqkv("dqkv", want.size());
        dq.up(gq.data());
        dk.up(gk.data());
        dv.up(gv.data());
        nc::merge_qkv(dqkv.ptr, dq.ptr, dk.ptr, dv.ptr, s.B, s.T, s.C, s.NH, dt, g_stream);
        sync();
        compare_bits("dqkv", dqkv.raw(), want, e);
        dqkv.check_guards();
      }
      {
        set_ctx("merge_heads", "%s", sz);
        const auto yh = to_dtype(rnd(n, ++seed, 1.f), dt);
        std::vector<unsigned char> want(yh.size());
        for (i64 i = 0; i < n; ++i) put(want, head_index(i, s.T, s.NH, hs, s.C), yh, i);
        Buf dyh("yh", yh.size()), dy("y", yh.size());
        dyh.up(yh.data());
        nc::merge_heads(dy.ptr, dyh.ptr, s.B, s.T, s.C, s.NH, dt, g_stream);
        sync();
        compare_bits("y", dy.raw(), want, e);
        dy.check_guards();
        set_ctx("split_heads", "%s", sz);
        Buf back("yh", yh.size());
        nc::split_heads(back.ptr, dy.ptr, s.B, s.T, s.C, s.NH, dt, g_stream);
        sync();
        compare_bits("yh (split_heads(merge_heads(yh)))", back.raw(), yh, e);
        back.check_guards();
      }
    }
}

// ---------------------------------------------------------------- causal softmax
void softmax_ref(std::vector<double>& att, const std::vector<float>& sc, double scale, i64 BNH, i64 T) {
  att.assign(std::size_t(BNH * T * T), 0.0);
  for (i64 r = 0; r < BNH * T; ++r) {
    const i64 i = r % T;
    const float* s = sc.data() + r * T;
    double* a = att.data() + r * T;
    double m = -INFINITY, sum = 0;
    for (i64 j = 0; j <= i; ++j) m = std::fmax(m, scale * s[j]);
    for (i64 j = 0; j <= i; ++j) sum += std::exp(scale * s[j] - m);
    for (i64 j = 0; j <= i; ++j) a[j] = std::exp(scale * s[j] - m) / sum;
  }
}

void test_softmax() {
  unsigned seed = 6000;
  struct Shape { i64 BNH, T; };
  const Shape shapes[] = {{3, 1}, {2, 5}, {2, 33}, {1, 64}, {2, 1030}};
  const float nanf = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : kDts)
    for (const Shape& s : shapes)
      for (float scale : {0.125f, 1.f}) {
        const i64 n = s.BNH * s.T * s.T;
        // Scores: random at j <= i, NaN above the diagonal (must not be read).
        auto sc = q(rnd(n, ++seed, 3.f), dt);
        for (i64 r = 0; r < s.BNH * s.T; ++r)
          for (i64 j = r % s.T + 1; j < s.T; ++j) sc[std::size_t(r * s.T + j)] = nanf;
        std::vector<double> want;
        softmax_ref(want, sc, scale, s.BNH, s.T);
        char sz[128];
        std::snprintf(sz, sizeof sz, "dt=%s BNH=%lld T=%lld scale=%g", dn(dt), (long long)s.BNH, (long long)s.T,
                      double(scale));
        {
          set_ctx("causal_softmax_forward", "%s", sz);
          Buf dsc("scores", sc, dt), datt("att", std::size_t(n) * es(dt));
          nc::causal_softmax_forward(datt.ptr, dsc.ptr, scale, s.BNH, s.T, dt, g_stream);
          sync();
          compare("att", datt.get(dt), want, dt);
          datt.check_guards();
          set_ctx("causal_softmax_forward", "%s in place", sz);
          nc::causal_softmax_forward(dsc.ptr, dsc.ptr, scale, s.BNH, s.T, dt, g_stream);
          sync();
          compare("att (aliasing scores)", dsc.get(dt), want, dt);
          dsc.check_guards();
        }
        {
          // att: the rounded softmax, NaN above the diagonal; datt random, NaN above too.
          std::vector<float> att(want.begin(), want.end());
          att = q(att, dt);
          auto dat = q(rnd(n, ++seed, 1.f), dt);
          for (i64 r = 0; r < s.BNH * s.T; ++r)
            for (i64 j = r % s.T + 1; j < s.T; ++j) att[std::size_t(r * s.T + j)] = dat[std::size_t(r * s.T + j)] = nanf;
          std::vector<double> gw(std::size_t(n), 0.0);
          for (i64 r = 0; r < s.BNH * s.T; ++r) {
            const i64 i = r % s.T;
            const float* p = att.data() + r * s.T;
            const float* d = dat.data() + r * s.T;
            double dot = 0;
            for (i64 j = 0; j <= i; ++j) dot += double(p[j]) * d[j];
            for (i64 j = 0; j <= i; ++j) gw[std::size_t(r * s.T + j)] = double(scale) * p[j] * (d[j] - dot);
          }
          set_ctx("causal_softmax_backward", "%s", sz);
          Buf datt("att", att, dt), ddat("datt", dat, dt), dds("dscores", std::size_t(n) * es(dt));
          nc::causal_softmax_backward(dds.ptr, datt.ptr, ddat.ptr, scale, s.BNH, s.T, dt, g_stream);
          sync();
          compare("dscores", dds.get(dt), gw, dt);
          dds.check_guards();
          set_ctx("causal_softmax_backward", "%s in place", sz);
          nc::causal_softmax_backward(ddat.ptr, datt.ptr, ddat.ptr, scale, s.BNH, s.T, dt, g_stream);
          sync();
          compare("dscores (aliasing datt)", ddat.get(dt), gw, dt);
          ddat.check_guards();
        }
      }
}

// ---------------------------------------------------------------- cross-entropy
void test_crossentropy() {
  unsigned seed = 7000;
  struct Case { i64 N, V; float scale, shift; };
  // The last two: large-magnitude logits (exp would overflow without the max subtraction;
  // fp16 keeps them below 65504).
  const Case cases[] = {{1, 1, 2.f, 0.f},    {7, 5, 2.f, 0.f},      {3, 50304, 2.f, 0.f}, {5, 1000, 2.f, 0.f},
                        {333, 64, 2.f, 0.f}, {4, 50304, 300.f, 1000.f}, {6, 7, 300.f, -1000.f}};
  for (DType dt : kDts)
    for (const Case& c : cases)
      for (std::size_t off : {std::size_t(0), std::size_t(4)}) {
        const auto x = q(rnd(c.N * c.V, ++seed, c.scale, c.shift), dt);
        const auto tg = tokens_of(c.N, c.V, ++seed);
        std::vector<double> lse(std::size_t(c.N)), loss(std::size_t(c.N));
        ref::crossentropy_forward<double>(lse.data(), D(x).data(), tg.data(), c.N, c.V);
        for (i64 r = 0; r < c.N; ++r) loss[std::size_t(r)] = lse[std::size_t(r)] - double(x[std::size_t(r * c.V + tg[std::size_t(r)])]);
        char sz[128];
        std::snprintf(sz, sizeof sz, "dt=%s N=%lld V=%lld logits %g*randn%+g offset=%zu", dn(dt), (long long)c.N,
                      (long long)c.V, double(c.scale), double(c.shift), off);
        Buf dx("logits", x, dt, off), dtg("targets", tg);
        {
          set_ctx("crossentropy_forward", "%s", sz);
          Buf dloss("losses", std::size_t(c.N) * 4), dlse("lse", std::size_t(c.N) * 4);
          nc::crossentropy_forward(dloss.f(), dlse.f(), dx.ptr, dtg.p<std::int32_t>(), c.N, c.V, dt, g_stream);
          sync();
          compare("losses", dloss.get(DType::F32), loss, DType::F32);
          compare("lse", dlse.get(DType::F32), lse, DType::F32);
          dloss.check_guards();
          dlse.check_guards();
        }
        for (float gscale : {1.f, 0.5f}) {
          set_ctx("crossentropy_backward", "%s scale=%g", sz, double(gscale));
          // The saved lse as fp32 (the reference uses the same rounded values).
          std::vector<float> lf(lse.begin(), lse.end());
          auto want = D(x);
          ref::crossentropy_backward<double>(want.data(), D(lf).data(), tg.data(), c.N, c.V, double(gscale));
          Buf dlse("lse", lf, DType::F32);
          dx.up(x, dt);
          nc::crossentropy_backward(dx.ptr, dlse.f(), dtg.p<std::int32_t>(), c.N, c.V, gscale, dt, g_stream);
          sync();
          compare("dlogits (in place)", dx.get(dt), want, dt);
          dx.check_guards();
        }
      }
}

}  // namespace

int main() {
  if (int rc = cuda_test::skip_without_gpu("test_cuda_nn_kernels")) return rc;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    CU(cudaStreamCreate(&g_stream));
    struct Group { const char* name; void (*fn)(); };
    const Group groups[] = {{"layernorm", test_layernorm},         {"bias", test_bias},
                            {"gelu/mean/convert", test_gelu_mean_convert}, {"embedding", test_embedding},
                            {"layouts", test_layouts},             {"causal softmax", test_softmax},
                            {"cross-entropy", test_crossentropy}};
    for (const Group& g : groups) {
      const auto a = std::chrono::steady_clock::now();
      g.fn();
      std::printf("group %-18s %.2f s\n", g.name,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
      std::fflush(stdout);
    }
    CU(cudaStreamDestroy(g_stream));
  } catch (const std::exception& e) {
    ++cuda_test::g_failures;
    std::fprintf(stderr, "FAIL exception in %s: %s\n", g_ctx.c_str(), e.what());
  }
  for (const auto& [k, s] : g_stats)
    std::printf("%-24s %4d checks %3d failed  worst err/tol %.3g (%s)\n", k.c_str(), s.checks, s.failed, s.worst,
                s.worst_where.c_str());
  std::printf("total %.2f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return cuda_test::finish("test_cuda_nn_kernels");
}
