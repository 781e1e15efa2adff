// Causal flash attention (ds/nn/cuda_flash.h) against a double-precision host reference:
// forward o, lse and the exact backward dq, dk, dv, at awkward sizes (T = 1, T not a multiple
// of the 64-row tile, a single tile, several tiles, hs 32 / 64 / 128), fp16 and bf16, then the
// GPT-2 124M attention shape (BNH 192, T 1024, hs 64, bf16): timing (median of 10, cudaEvent)
// and the full-size result of two heads against the reference.
//
// Inputs q, k, v, dout ~ N(0, 1), rounded to dt on the host; the reference uses the rounded
// values, so only the kernel's own roundings count. Error metric per tensor:
// max|gpu - ref| / max(max|ref|, 1e-3) (the floor: T = 1 has dq = dk = 0 exactly).
// Tolerances: bf16 2e-2, fp16 4e-3. The kernels round P = softmax (forward and backward) and
// dS = P (dP - D) to dt before the tensor-core products (fp32 accumulation), D uses o as
// stored in dt, and each output is rounded once: a handful of roundings of unit roundoff u
// (bf16 2^-9 = 2.0e-3, fp16 2^-11 = 4.9e-4), mostly averaging out over the 64..1030-term sums.
// Worst expected ~3u relative to the tensor's max; the tolerances are ~10u (bf16) and ~8u
// (fp16), far below what any indexing or masking error produces (those are O(1)).
// Every output is poisoned with NaN before the call (every element must be written; NaN fails).
// Determinism: o, lse, dk, dv must be bitwise equal on a second run; dq is summed over the key
// blocks with fp32 atomicAdd (order-dependent), so only the number of differing dq elements
// is reported.
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds/core/half.h"
#include "ds/nn/cuda_flash.h"

using ds::DType;
using cuda_test::Dev;
using cuda_test::randv;
using cuda_test::to_dtype;
namespace fc = ds::nn::cuda;

namespace {

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

// Heads h0 .. h0+nh-1 of [BNH, T, hs] inputs (fp32 values, already rounded to dt).
Ref reference(const float* q, const float* k, const float* v, const float* dout, std::int64_t h0, std::int64_t nh,
              std::int64_t T, std::int64_t hs, double scale) {
  Ref r;
  const std::size_t n = std::size_t(nh * T * hs);
  r.o.assign(n, 0.0);
  r.dq.assign(n, 0.0);
  r.dk.assign(n, 0.0);
  r.dv.assign(n, 0.0);
  r.lse.assign(std::size_t(nh * T), 0.0);
  std::vector<double> s(static_cast<std::size_t>(T)), dp(static_cast<std::size_t>(T));
  for (std::int64_t h = 0; h < nh; ++h) {
    const std::int64_t in = (h0 + h) * T * hs, out = h * T * hs;
    auto Q = [&](std::int64_t t, std::int64_t d) { return double(q[in + t * hs + d]); };
    auto K = [&](std::int64_t t, std::int64_t d) { return double(k[in + t * hs + d]); };
    auto V = [&](std::int64_t t, std::int64_t d) { return double(v[in + t * hs + d]); };
    auto DO = [&](std::int64_t t, std::int64_t d) { return double(dout[in + t * hs + d]); };
    for (std::int64_t i = 0; i < T; ++i) {
      double m = -INFINITY;
      for (std::int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (std::int64_t d = 0; d < hs; ++d) acc += Q(i, d) * K(j, d);
        s[std::size_t(j)] = scale * acc;
        m = std::max(m, s[std::size_t(j)]);
      }
      double l = 0;
      for (std::int64_t j = 0; j <= i; ++j) l += std::exp(s[std::size_t(j)] - m);
      r.lse[std::size_t(h * T + i)] = m + std::log(l);
      double D = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[std::size_t(j)] - m) / l;
        s[std::size_t(j)] = p;  // s now holds P
        double acc = 0;
        for (std::int64_t d = 0; d < hs; ++d) {
          r.o[std::size_t(out + i * hs + d)] += p * V(j, d);
          acc += DO(i, d) * V(j, d);
        }
        dp[std::size_t(j)] = acc;
        D += p * acc;
      }
      for (std::int64_t j = 0; j <= i; ++j) {
        const double p = s[std::size_t(j)];
        const double ds = p * (dp[std::size_t(j)] - D);
        for (std::int64_t d = 0; d < hs; ++d) {
          r.dq[std::size_t(out + i * hs + d)] += scale * ds * K(j, d);
          r.dk[std::size_t(out + j * hs + d)] += scale * ds * Q(i, d);
          r.dv[std::size_t(out + j * hs + d)] += p * DO(i, d);
        }
      }
    }
  }
  return r;
}

std::vector<float> to_f32(const std::vector<unsigned char>& b, DType t) {
  std::vector<float> f(b.size() / ds::dtype_size(t));
  ds::convert(b.data(), t, f.data(), DType::F32, f.size());
  return f;
}

// Compares gpu[off .. off+ref.size()) against ref; returns the error metric, prints a line
// naming the worst element (head, t, d) and the NaN count when it fails.
double check(const char* what, const std::string& tag, const std::vector<float>& gpu, std::size_t off,
             const std::vector<double>& ref, std::int64_t T, std::int64_t hs, double tol) {
  double maxref = 0, maxerr = 0;
  std::size_t worst = 0, nans = 0, first_bad = SIZE_MAX;
  for (std::size_t e = 0; e < ref.size(); ++e) maxref = std::max(maxref, std::fabs(ref[e]));
  const double denom = std::max(maxref, 1e-3);
  for (std::size_t e = 0; e < ref.size(); ++e) {
    const double g = gpu[off + e];
    const double err = std::isfinite(g) ? std::fabs(g - ref[e]) : INFINITY;  // NaN / inf: worst
    nans += !std::isfinite(g);
    if (!(err <= tol * denom) && first_bad == SIZE_MAX) first_bad = e;
    if (err > maxerr) {
      maxerr = err;
      worst = e;
    }
  }
  const double rel = maxerr / denom;
  auto where = [&](std::size_t e) {
    char buf[96];
    if (hs > 0)
      std::snprintf(buf, sizeof buf, "(head %lld, t %lld, d %lld)", (long long)(e / std::size_t(T * hs)),
                    (long long)(e / std::size_t(hs) % std::size_t(T)), (long long)(e % std::size_t(hs)));
    else
      std::snprintf(buf, sizeof buf, "(head %lld, t %lld)", (long long)(e / std::size_t(T)),
                    (long long)(e % std::size_t(T)));
    return std::string(buf);
  };
  const bool ok = rel <= tol;
  EXPECT(ok, "%s %s: err %.3e > tol %.1e (max|ref| %.3e); worst %s gpu %.6g ref %.6g; first bad %s gpu %.6g ref %.6g; "
             "non-finite %zu of %zu",
         tag.c_str(), what, rel, tol, maxref, where(worst).c_str(), double(gpu[off + worst]), ref[worst],
         first_bad == SIZE_MAX ? "-" : where(first_bad).c_str(), first_bad == SIZE_MAX ? 0.0 : double(gpu[off + first_bad]),
         first_bad == SIZE_MAX ? 0.0 : ref[first_bad], nans, ref.size());
  return rel;
}

// Device state of one problem: inputs, outputs (poisoned by run()), scratch.
struct Problem {
  DType dt;
  std::int64_t BNH, T, hs;
  float scale;
  std::size_t n;
  std::vector<float> qf, kf, vf, dof;  // host inputs, rounded to dt
  Dev q, k, v, dout, o, dq, dk, dv, lse, scratch;
  cudaStream_t stream = nullptr;

  static std::vector<float> rounded(std::size_t n, unsigned seed, DType dt) {
    return to_f32(to_dtype(randv(n, seed, 1.f), dt), dt);
  }
  Problem(DType dt_, std::int64_t BNH_, std::int64_t T_, std::int64_t hs_, unsigned seed)
      : dt(dt_), BNH(BNH_), T(T_), hs(hs_), scale(float(1.0 / std::sqrt(double(hs_)))),
        n(std::size_t(BNH_ * T_ * hs_)),
        qf(rounded(n, seed, dt)), kf(rounded(n, seed + 1, dt)), vf(rounded(n, seed + 2, dt)),
        dof(rounded(n, seed + 3, dt)),
        q(to_dtype(qf, dt).data(), n * ds::dtype_size(dt)), k(to_dtype(kf, dt).data(), n * ds::dtype_size(dt)),
        v(to_dtype(vf, dt).data(), n * ds::dtype_size(dt)), dout(to_dtype(dof, dt).data(), n * ds::dtype_size(dt)),
        o(nullptr, n * ds::dtype_size(dt)), dq(nullptr, n * ds::dtype_size(dt)), dk(nullptr, n * ds::dtype_size(dt)),
        dv(nullptr, n * ds::dtype_size(dt)), lse(nullptr, std::size_t(BNH_ * T_) * 4),
        scratch(nullptr, fc::flash_backward_scratch_floats(BNH_, T_, hs_) * 4) {
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Problem() { cudaStreamDestroy(stream); }

  void poison() {
    for (Dev* d : {&o, &dq, &dk, &dv, &lse, &scratch}) CU(cudaMemset(d->ptr, 0xFF, d->bytes));  // NaN in every dtype
    CU(cudaDeviceSynchronize());
  }
  void forward() { fc::flash_attention_forward(o.ptr, lse.as<float>(), q.ptr, k.ptr, v.ptr, BNH, T, hs, scale, dt, stream); }
  void backward() {
    fc::flash_attention_backward(dq.ptr, dk.ptr, dv.ptr, q.ptr, k.ptr, v.ptr, o.ptr, dout.ptr, lse.as<float>(),
                                 scratch.as<float>(), BNH, T, hs, scale, dt, stream);
  }
  std::vector<float> get(const Dev& d, DType t) const {
    CU(cudaStreamSynchronize(stream));
    std::vector<unsigned char> b(d.bytes);
    d.to_host(b.data());
    return to_f32(b, t);
  }
  std::vector<unsigned char> bits(const Dev& d) const {
    CU(cudaStreamSynchronize(stream));
    std::vector<unsigned char> b(d.bytes);
    d.to_host(b.data());
    return b;
  }
};

// Compares heads h0 .. h0+nh-1 of the problem's outputs with the reference.
void compare(Problem& p, std::int64_t h0, std::int64_t nh, const std::string& tag) {
  const double tol = p.dt == DType::BF16 ? 2e-2 : 4e-3;
  const Ref r = reference(p.qf.data(), p.kf.data(), p.vf.data(), p.dof.data(), h0, nh, p.T, p.hs, double(p.scale));
  const std::size_t off = std::size_t(h0 * p.T * p.hs), loff = std::size_t(h0 * p.T);
  const double eo = check("o", tag, p.get(p.o, p.dt), off, r.o, p.T, p.hs, tol);
  const double el = check("lse", tag, p.get(p.lse, DType::F32), loff, r.lse, p.T, 0, tol);
  const double eq = check("dq", tag, p.get(p.dq, p.dt), off, r.dq, p.T, p.hs, tol);
  const double ek = check("dk", tag, p.get(p.dk, p.dt), off, r.dk, p.T, p.hs, tol);
  const double ev = check("dv", tag, p.get(p.dv, p.dt), off, r.dv, p.T, p.hs, tol);
  std::printf("%-40s err o %.2e lse %.2e dq %.2e dk %.2e dv %.2e (tol %.0e)\n", tag.c_str(), eo, el, eq, ek, ev, tol);
}

// Second run: o, lse, dk, dv bitwise equal; dq reported.
void determinism(Problem& p, const std::string& tag) {
  const auto o1 = p.bits(p.o), l1 = p.bits(p.lse), q1 = p.bits(p.dq), k1 = p.bits(p.dk), v1 = p.bits(p.dv);
  p.poison();
  p.forward();
  p.backward();
  EXPECT(cuda_test::same(o1.data(), p.bits(p.o).data(), o1.size()), "%s: o differs on a second run", tag.c_str());
  EXPECT(cuda_test::same(l1.data(), p.bits(p.lse).data(), l1.size()), "%s: lse differs on a second run", tag.c_str());
  EXPECT(cuda_test::same(k1.data(), p.bits(p.dk).data(), k1.size()), "%s: dk differs on a second run", tag.c_str());
  EXPECT(cuda_test::same(v1.data(), p.bits(p.dv).data(), v1.size()), "%s: dv differs on a second run", tag.c_str());
  const auto q2 = p.bits(p.dq);
  const std::size_t es = ds::dtype_size(p.dt);
  std::size_t diff = 0;
  for (std::size_t e = 0; e < q1.size() / es; ++e) diff += std::memcmp(q1.data() + e * es, q2.data() + e * es, es) != 0;
  std::printf("%-40s determinism: o/lse/dk/dv bitwise equal on a rerun; dq (fp32 atomics) %zu of %zu elements differ\n",
              tag.c_str(), diff, q1.size() / es);
}

std::string tag_of(DType dt, std::int64_t BNH, std::int64_t T, std::int64_t hs) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s BNH=%lld T=%lld hs=%lld", std::string(ds::dtype_name(dt)).c_str(), (long long)BNH,
                (long long)T, (long long)hs);
  return buf;
}

void correctness() {
  struct Case {
    std::int64_t BNH, T, hs;
  };
  const Case cases[] = {{3, 1, 64}, {2, 17, 64}, {2, 64, 64}, {2, 130, 64}, {1, 1030, 64}, {2, 100, 128}, {2, 77, 32}};
  unsigned seed = 100;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (const Case& c : cases) {
      if (!fc::flash_attention_supported(dt, c.hs)) {
        std::printf("%-40s not supported: skipped\n", tag_of(dt, c.BNH, c.T, c.hs).c_str());
        continue;
      }
      const std::string tag = tag_of(dt, c.BNH, c.T, c.hs);
      Problem p(dt, c.BNH, c.T, c.hs, seed += 10);
      p.poison();
      p.forward();
      p.backward();
      CU(cudaStreamSynchronize(p.stream));
      CU(cudaGetLastError());
      compare(p, 0, c.BNH, tag);
      if (c.T == 130) determinism(p, tag);
    }
  }
}

void api_checks() {
  EXPECT(fc::flash_attention_supported(DType::BF16, 64) && fc::flash_attention_supported(DType::F16, 64) &&
             fc::flash_attention_supported(DType::BF16, 128),
         "hs 64 / 128 in fp16 / bf16 must be supported");
  EXPECT(!fc::flash_attention_supported(DType::F32, 64) && !fc::flash_attention_supported(DType::BF16, 48),
         "fp32 and hs 48 are not supported");
  bool threw = false;
  try {
    fc::flash_attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 64, 1.f, DType::F32, nullptr);
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT(threw, "an unsupported dtype must throw");
}

void bench_124m() {
  const std::int64_t BNH = 192, T = 1024, hs = 64;
  const DType dt = DType::BF16;
  const std::string tag = tag_of(dt, BNH, T, hs);
  Problem p(dt, BNH, T, hs, 7);
  p.poison();
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn) {
    for (int w = 0; w < 2; ++w) fn();
    std::vector<float> ms;
    for (int it = 0; it < 10; ++it) {
      CU(cudaEventRecord(e0, p.stream));
      fn();
      CU(cudaEventRecord(e1, p.stream));
      CU(cudaEventSynchronize(e1));
      float t = 0;
      CU(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 0.5 * double(ms[4] + ms[5]);
  };
  const double fwd_ms = time_ms([&] { p.forward(); });
  const double bwd_ms = time_ms([&] { p.backward(); });
  CU(cudaGetLastError());
  const double fwd_flop = 4.0 * double(BNH) * double(T) * double(T) * double(hs) / 2.0;
  const double bwd_flop = 2.5 * fwd_flop;
  std::printf("%-40s forward  %.3f ms  %.1f TFLOP/s (causal %.2f GFLOP)\n", tag.c_str(), fwd_ms,
              fwd_flop / (fwd_ms * 1e-3) / 1e12, fwd_flop / 1e9);
  std::printf("%-40s backward %.3f ms  %.1f TFLOP/s (causal %.2f GFLOP)\n", tag.c_str(), bwd_ms,
              bwd_flop / (bwd_ms * 1e-3) / 1e12, bwd_flop / 1e9);
  CU(cudaEventDestroy(e0));
  CU(cudaEventDestroy(e1));
  // The full-size results of the first and the last head.
  compare(p, 0, 1, tag + " head 0");
  compare(p, BNH - 1, 1, tag + " head 191");
  determinism(p, tag);
}

}  // namespace

int main() {
  if (const int rc = cuda_test::skip_without_gpu("test_cuda_flash")) return rc;
  try {
    api_checks();
    correctness();
    bench_124m();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 1;
  }
  return cuda_test::finish("test_cuda_flash");
}
