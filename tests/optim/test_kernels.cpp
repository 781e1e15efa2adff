// Fast CPU kernels (*_cpu) against the references (*_ref) at awkward sizes, for every
// gradient dtype, working dtype and several thread counts.
//
// Tolerance: sgd must match BITWISE (master, state and working copy): both perform the same
// IEEE fp32 operations (explicit FMAs included) in the same order and nothing else is
// contracted (src/optim/src/elem_math.h). Adam and Adagrad too, except that the AVX-512
// kernels divide with simd::fast_div (reciprocal + Newton + remainder correction: correctly
// rounded except for underflowing remainders): master and states within 2 ulps, and in
// practice bitwise (the count of differing elements is printed). Lamb's elementwise math is
// the same too, but its two norms are summed in a different order (blocks of lanes vs one
// sequential double sum), which can move the fp32 trust ratio by an ulp: 2e-6 relative.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <algorithm>
#include <utility>
#include <map>
#include <optional>
#include <tuple>
#include <random>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/core/half.h"
#include "ds/optim/kernels.h"
// The private kernel header, for the streaming-store threshold (simd::stream_min_bytes).
#include "../../src/optim/src/kernel_set.h"
#include "../../src/optim/src/simd.h"
#include "scoped_isa.h"

using ds::DType;
using ds::TensorView;
using namespace ds::optim;

namespace {

const std::size_t kSizes[] = {1, 7, 278011};
const DType kGradTypes[] = {DType::F32, DType::F16, DType::BF16};
const DType kWorkTypes[] = {DType::U8 /*none*/, DType::F32, DType::F16, DType::BF16};

// Normal random vectors, memoised (generating them dominated the test time).
std::vector<float> randv(std::size_t n, unsigned seed, float scale) {
  static std::map<std::tuple<std::size_t, unsigned, float>, std::vector<float>> cache;
  auto& v = cache[{n, seed, scale}];
  if (v.size() != n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    v.resize(n);
    for (auto& x : v) x = scale * nd(rng);
  }
  return v;
}

// A gradient buffer of dtype t holding (rounded) values.
struct Grad {
  std::vector<unsigned char> bytes;
  TensorView view;
  Grad(const std::vector<float>& v, DType t) : bytes(v.size() * ds::dtype_size(t) + 1) {
    view = {bytes.data(), v.size(), t};
    ds::convert(v.data(), DType::F32, bytes.data(), t, v.size());
  }
};

struct Working {
  std::vector<unsigned char> bytes;
  TensorView view;
  Working(std::size_t n, DType t) {
    if (t == DType::U8) return;  // no working copy
    bytes.assign(n * ds::dtype_size(t) + 1, 0xAB);
    view = {bytes.data(), n, t};
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::size_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return i;
  return a.size();
}

// Distance in units in the last place (ordered bit patterns); NaN vs anything else: huge.
std::int64_t ulps(float a, float b) {
  auto key = [](float x) {
    std::int32_t i;
    std::memcpy(&i, &x, 4);
    return i < 0 ? std::int64_t(std::int32_t(0x80000000u) - i) : std::int64_t(i);
  };
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : std::int64_t(1) << 40;
  return std::llabs(key(a) - key(b));
}

// Max ulp distance and the number of elements that differ at all.
std::pair<std::int64_t, std::size_t> compare(const std::vector<float>& a, const std::vector<float>& b) {
  std::int64_t worst = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::int64_t u = ulps(a[i], b[i]);
    worst = std::max(worst, u);
    differ += u != 0;
  }
  return {worst, differ};
}

// Runs 3 steps of the fast and the reference kernel (same signature, bound by the caller) on
// equal inputs; master and states must agree within max_ulps (0: bitwise), and the fast
// kernel's working copy must be its own new master, converted.
template <class Run>
void compare_kernels(const char* what, std::size_t nstates, std::int64_t max_ulps, Run run) {
  std::size_t differing = 0, total = 0;
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (std::size_t n : kSizes) {
      for (DType gt : kGradTypes) {
        for (DType wt : kWorkTypes) {
          // Every working dtype with fp32 grads; otherwise none and the grad's own dtype.
          if (gt != DType::F32 && wt != DType::U8 && wt != gt) continue;
          std::vector<float> p_ref = randv(n, 1, 1.f), p_fast = p_ref;
          std::vector<std::vector<float>> s_ref(nstates, std::vector<float>(n, 0.f)), s_fast = s_ref;
          Working w_ref(n, wt), w_fast(n, wt);
          for (int step = 1; step <= 3; ++step) {
            Grad g(randv(n, 100 + step, 0.5f), gt);
            run(false, step, p_ref, s_ref, g.view, w_ref.view, n);
            run(true, step, p_fast, s_fast, g.view, w_fast.view, n);
          }
          const auto [worst, differ] = compare(p_ref, p_fast);
          ASSERT_LE(worst, max_ulps) << what << " n=" << n << " grad " << ds::dtype_name(gt) << " threads " << threads
                                     << " first diff at " << first_diff(p_ref, p_fast);
          differing += differ;
          total += n;
          for (std::size_t s = 0; s < nstates; ++s) ASSERT_LE(compare(s_ref[s], s_fast[s]).first, max_ulps) << what << " state " << s;
          if (max_ulps == 0) {
            ASSERT_EQ(w_ref.bytes, w_fast.bytes) << what << " working copy, n=" << n;
          }
          if (wt != DType::U8) {  // the working copy is the new master, converted
            std::vector<unsigned char> expect(w_fast.bytes.size(), 0xAB);
            ds::convert(p_fast.data(), DType::F32, expect.data(), wt, n);
            ASSERT_EQ(expect, w_fast.bytes) << what;
          }
        }
      }
    }
  }
  omp_set_num_threads(1);
  std::printf("%s: %zu of %zu master values differ from the reference (limit %lld ulps)\n", what, differing, total,
              static_cast<long long>(max_ulps));
}

}  // namespace

// DS_CPU_ISA=plain forces the portable loops of the fast kernels; they round exactly like
// the references.
struct PlainPath : ds_test::ScopedIsa {
  PlainPath() : ScopedIsa("plain") {}
};

// The kernel sets whose division is exact (the portable loops, AVX2's vdivps, NEON's fdiv) are bitwise
// equal to the references, Lamb's chunked norms aside.
void expect_bitwise_equal_to_ref(const char* isa) {
  ds_test::ScopedIsa scoped(isa);
  const std::string tag = std::string(" (") + isa + ")";
  compare_kernels(("adamw" + tag).c_str(), 2, 0, [&](bool fast, int step, std::vector<float>& p,
                                                   std::vector<std::vector<float>>& s, TensorView g, TensorView w,
                                                   std::size_t n) {
    AdamHyper h;
    h.lr = 1e-2f; h.weight_decay = 0.05f; h.grad_scale = 0.25f;
    h.bc1 = float(1 - std::pow(0.9, step)); h.bc2 = float(1 - std::pow(0.999, step));
    (fast ? adam_cpu : adam_ref)(p.data(), s[0].data(), s[1].data(), g, w, n, h);
  });
  compare_kernels(("adagrad" + tag).c_str(), 1, 0, [&](bool fast, int step, std::vector<float>& p,
                                                     std::vector<std::vector<float>>& s, TensorView g, TensorView w,
                                                     std::size_t n) {
    AdagradHyper h;
    h.clr = 0.05f; h.weight_decay = 0.01f;
    (fast ? adagrad_cpu : adagrad_ref)(p.data(), s[0].data(), g, w, n, h);
  });
  // Lamb: moments bitwise; the parameters within the norms' summation-order difference.
  const std::size_t n = 278011;
  std::vector<float> p1 = randv(n, 1, 1.f), p2 = p1, m1(n), v1(n), m2(n), v2(n);
  std::vector<float> g = randv(n, 7, 0.5f);
  const std::vector<Segment> segs = {{0, 5}, {5, 200000}, {200005, n - 200005}};
  LambHyper h;
  lamb_ref(p1.data(), m1.data(), v1.data(), TensorView{g.data(), n, DType::F32}, {}, n, segs, h, {});
  lamb_cpu(p2.data(), m2.data(), v2.data(), TensorView{g.data(), n, DType::F32}, {}, n, segs, h, {});
  EXPECT_TRUE(same_bits(m1, m2)) << isa;
  EXPECT_TRUE(same_bits(v1, v2)) << isa;
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(p1[i], p2[i], 2e-6f * std::fabs(p1[i]) + 1e-9f) << isa;
}

TEST(Kernels, PlainFallbackEqualsRefBitwise) { expect_bitwise_equal_to_ref("plain"); }

TEST(Kernels, Avx2RowEqualsRefBitwise) {
  const ds::CpuIsa best = ds::cpu_isa_best();
  if (best != ds::CpuIsa::avx2 && best != ds::CpuIsa::avx512) {
    std::printf("this CPU has no AVX2 row (best: %s): its other kernel sets are tested\n", ds::isa_name(best));
    return;
  }
  expect_bitwise_equal_to_ref("avx2");
}

TEST(Kernels, NeonRowEqualsRefBitwise) {
  const ds::CpuIsa best = ds::cpu_isa_best();
  if (best != ds::CpuIsa::neon) {
    std::printf("this CPU has no NEON row (best: %s): its other kernel sets are tested\n", ds::isa_name(best));
    return;
  }
  expect_bitwise_equal_to_ref("neon");
}

// The kernel table gives the row of exactly the ISA in use, and none for plain.
TEST(Kernels, KernelRowIsTheIsaInUse) {
  for (ds::CpuIsa isa : ds_test::runnable_isas()) {
    ds_test::ScopedIsa scoped(ds::isa_name(isa));
    const ds::optim::simd::KernelSet* row = ds::optim::simd::cpu_kernels();
    if (isa == ds::CpuIsa::plain) {
      EXPECT_EQ(row, nullptr);
    } else {
      ASSERT_NE(row, nullptr) << ds::isa_name(isa);
      EXPECT_EQ(row->isa, isa);
    }
  }
}

TEST(Kernels, AdamFastMatchesRefWithin2Ulps) {
  for (bool adamw : {true, false}) {
    for (bool bias : {true, false}) {
      compare_kernels(adamw ? "adamw" : "adam-l2", 2, 2, [&](bool fast, int step, std::vector<float>& p,
                                                           std::vector<std::vector<float>>& s, TensorView g,
                                                           TensorView w, std::size_t n) {
        AdamHyper h;
        h.lr = 1e-2f; h.weight_decay = 0.05f; h.adam_w_mode = adamw; h.grad_scale = 0.25f;
        h.bc1 = bias ? float(1 - std::pow(0.9, step)) : 1.f;
        h.bc2 = bias ? float(1 - std::pow(0.999, step)) : 1.f;
        (fast ? adam_cpu : adam_ref)(p.data(), s[0].data(), s[1].data(), g, w, n, h);
      });
    }
  }
}

TEST(Kernels, SgdFastEqualsRefBitwise) {
  struct V { float mom, damp, wd; bool nesterov; };
  for (V v : {V{0.f, 0.f, 0.f, false}, V{0.9f, 0.f, 0.01f, true}, V{0.9f, 0.1f, 0.f, false}}) {
    compare_kernels("sgd", 1, 0, [&](bool fast, int step, std::vector<float>& p, std::vector<std::vector<float>>& s,
                                  TensorView g, TensorView w, std::size_t n) {
      SgdHyper h;
      h.lr = 0.05f; h.momentum = v.mom; h.dampening = v.damp; h.weight_decay = v.wd; h.nesterov = v.nesterov;
      h.first_step = step == 1; h.grad_scale = 0.5f;
      (fast ? sgd_cpu : sgd_ref)(p.data(), v.mom != 0 ? s[0].data() : nullptr, g, w, n, h);
    });
  }
}

TEST(Kernels, AdagradFastMatchesRefWithin2Ulps) {
  compare_kernels("adagrad", 1, 2, [&](bool fast, int step, std::vector<float>& p, std::vector<std::vector<float>>& s,
                                    TensorView g, TensorView w, std::size_t n) {
    AdagradHyper h;
    h.clr = 0.05f / (1 + (step - 1) * 0.01f); h.eps = 1e-10f; h.weight_decay = 0.01f; h.grad_scale = 2.f;
    (fast ? adagrad_cpu : adagrad_ref)(p.data(), s[0].data(), g, w, n, h);
  });
}

TEST(Kernels, LambFastMatchesRefPerSegment) {
  const std::size_t n = 278011;
  std::vector<std::vector<Segment>> layouts = {
      {},                                                   // whole range
      {{0, n}},                                             // one explicit segment
      {{0, 1}, {1, 7}, {8, 100000}, {100008, n - 100008}},  // uneven, covering
      {{3, 5}, {20, 70000}, {70100, 65537}, {200000, 1}},   // gaps (left untouched)
  };
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (const auto& segs : layouts) {
      struct Combo { DType gt, wt; bool inside; };
      for (Combo cb : {Combo{DType::F32, DType::U8, false}, Combo{DType::F32, DType::F32, true},
                       Combo{DType::F16, DType::F16, false}, Combo{DType::BF16, DType::BF16, true},
                       Combo{DType::BF16, DType::F16, false}}) {
        const DType gt = cb.gt, wt = cb.wt;
        const bool inside = cb.inside;
        {
          {
            std::vector<float> p_ref = randv(n, 1, 1.f), p_fast = p_ref, p0 = p_ref;
            std::vector<float> m_ref(n), v_ref(n), m_fast(n), v_fast(n);
            Working w_ref(n, wt), w_fast(n, wt);
            const std::size_t ns = segs.empty() ? 1 : segs.size();
            std::vector<float> c_ref(ns), c_fast(ns);
            for (int step = 1; step <= 3; ++step) {
              Grad g(randv(n, 200 + step, 0.5f), gt);
              LambHyper h;
              h.step_size = 1e-2f * std::sqrt(1 - std::pow(0.999f, step)) / (1 - std::pow(0.9f, step));
              h.weight_decay = 0.01f; h.eps_inside_sqrt = inside; h.grad_scale = 0.5f;
              lamb_ref(p_ref.data(), m_ref.data(), v_ref.data(), g.view, w_ref.view, n, segs, h, c_ref);
              lamb_cpu(p_fast.data(), m_fast.data(), v_fast.data(), g.view, w_fast.view, n, segs, h, c_fast);
            }
            ASSERT_TRUE(same_bits(m_ref, m_fast));  // the moments do not depend on the norms
            ASSERT_TRUE(same_bits(v_ref, v_fast));
            for (std::size_t s = 0; s < ns; ++s) EXPECT_NEAR(c_ref[s], c_fast[s], 2e-6 * c_ref[s]);
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_NEAR(p_ref[i], p_fast[i], 2e-6f * std::fabs(p_ref[i]) + 1e-9f) << "i=" << i;
            if (segs.size() == 4 && segs[0].offset == 3) {  // the gaps stay untouched
              EXPECT_EQ(p_fast[0], p0[0]);
              EXPECT_EQ(p_fast[199999], p0[199999]);
              EXPECT_EQ(p_ref[n - 1], p0[n - 1]);
            }
          }
        }
      }
    }
  }
  omp_set_num_threads(1);
}

TEST(Kernels, LambMatchesDeepSpeedFormulaTranscription) {
  // FusedLamb written out in double, tensor by tensor, from DeepSpeed's FusedLamb.
  const std::size_t n = 1000;
  const std::vector<Segment> segs = {{0, 10}, {10, 490}, {500, 500}};
  std::vector<float> p = randv(n, 9, 1.f), m(n), v(n);
  std::vector<double> pd(p.begin(), p.end()), md(n), vd(n);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, mn = 0.01, mx = 10.0;
  std::vector<float> coeffs(segs.size());
  for (int t = 1; t <= 10; ++t) {
    std::vector<float> g = randv(n, 300 + t, t == 3 ? 0.f : 0.3f);  // step 3: zero grads
    LambHyper h;
    h.beta1 = float(b1); h.beta2 = float(b2); h.eps = float(eps); h.weight_decay = float(wd);
    h.step_size = float(lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)));
    lamb_cpu(p.data(), m.data(), v.data(), TensorView{g.data(), n, DType::F32}, TensorView{}, n, segs, h, coeffs);
    for (const Segment& s : segs) {
      std::vector<double> u(s.count);
      double pn = 0, un = 0;
      for (std::size_t j = 0; j < s.count; ++j) {
        const std::size_t i = s.offset + j;
        md[i] = b1 * md[i] + (1 - b1) * g[i];
        vd[i] = b2 * vd[i] + (1 - b2) * double(g[i]) * g[i];
        u[j] = md[i] / (std::sqrt(vd[i]) + eps) + wd * pd[i];
        pn += pd[i] * pd[i];
        un += u[j] * u[j];
      }
      double c = (pn == 0 || un == 0) ? 1.0 : std::clamp(std::sqrt(pn) / std::sqrt(un), mn, mx);
      const double step_size = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
      for (std::size_t j = 0; j < s.count; ++j) pd[s.offset + j] -= step_size * c * u[j];
    }
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-5 * std::fabs(pd[i]) + 1e-6) << "i=" << i;
}

TEST(Kernels, LambTrustRatioClampAndZeroNorms) {
  EXPECT_EQ(lamb_trust_ratio(0.0, 4.0, 0.01f, 10.f), 1.f);
  EXPECT_EQ(lamb_trust_ratio(4.0, 0.0, 0.01f, 10.f), 1.f);
  EXPECT_EQ(lamb_trust_ratio(1e6, 1.0, 0.01f, 10.f), 10.f);
  EXPECT_EQ(lamb_trust_ratio(1.0, 1e6, 0.01f, 10.f), 0.01f);
  EXPECT_FLOAT_EQ(lamb_trust_ratio(4.0, 1.0, 0.01f, 10.f), 2.f);
}

// Large working copies are written with non-temporal stores (simd::stream_working; the
// threshold is lowered to 0 here): same bytes as the plain stores, at awkward sizes, every
// working dtype, 1 and 3 threads, all four kernels; a misaligned copy takes the plain path.
TEST(Kernels, StreamingWorkingStoresEqualPlainStores) {
  struct Env {
    Env() { ds::optim::simd::stream_min_bytes() = 0; }
    ~Env() { ds::optim::simd::stream_min_bytes() = ds::optim::simd::kStreamWorkingBytes; }
  };
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (std::size_t n : {std::size_t(7), std::size_t(45), std::size_t(278011)}) {
      for (DType wt : {DType::F32, DType::F16, DType::BF16}) {
        for (std::size_t misalign : {std::size_t(0), std::size_t(2)}) {
          for (int kernel = 0; kernel < 4; ++kernel) {
            // Two runs from equal inputs: plain stores (default threshold), streaming (0).
            std::vector<float> p[2], m[2], v[2];
            ds::HostBuffer wb[2] = {ds::HostBuffer(n * 4 + 64), ds::HostBuffer(n * 4 + 64)};
            for (int run = 0; run < 2; ++run) {
              p[run] = randv(n, 1, 1.f);
              m[run].assign(n, 0.f);
              v[run].assign(n, 0.f);
              std::memset(wb[run].data(), 0xAB, wb[run].bytes());
              const TensorView w{static_cast<unsigned char*>(wb[run].data()) + misalign, n, wt};
              std::optional<Env> env;
              if (run == 1) env.emplace();
              for (int step = 1; step <= 2; ++step) {
                Grad g(randv(n, 400 + step, 0.5f), DType::BF16);
                if (kernel == 0) {
                  AdamHyper h;
                  h.weight_decay = 0.01f; h.bc1 = 0.1f; h.bc2 = 0.001f;
                  adam_cpu(p[run].data(), m[run].data(), v[run].data(), g.view, w, n, h);
                } else if (kernel == 1) {
                  SgdHyper h;
                  h.momentum = 0.9f; h.first_step = step == 1;
                  sgd_cpu(p[run].data(), m[run].data(), g.view, w, n, h);
                } else if (kernel == 2) {
                  AdagradHyper h;
                  adagrad_cpu(p[run].data(), m[run].data(), g.view, w, n, h);
                } else {
                  LambHyper h;
                  h.weight_decay = 0.01f;
                  lamb_cpu(p[run].data(), m[run].data(), v[run].data(), g.view, w, n, {}, h, {});
                }
              }
            }
            const std::size_t bytes = n * ds::dtype_size(wt) + misalign;
            ASSERT_TRUE(same_bits(p[0], p[1])) << "kernel " << kernel << " n " << n;
            ASSERT_TRUE(same_bits(m[0], m[1]) && same_bits(v[0], v[1])) << "kernel " << kernel << " n " << n;
            ASSERT_EQ(0, std::memcmp(wb[0].data(), wb[1].data(), wb[0].bytes()))
                << "kernel " << kernel << " n " << n << " working " << ds::dtype_name(wt) << " misalign " << misalign;
            std::vector<unsigned char> expect(bytes - misalign);
            ds::convert(p[1].data(), DType::F32, expect.data(), wt, n);
            ASSERT_EQ(0, std::memcmp(expect.data(), static_cast<unsigned char*>(wb[1].data()) + misalign, expect.size()))
                << "kernel " << kernel << " n " << n << " working " << ds::dtype_name(wt);
          }
        }
      }
    }
  }
  omp_set_num_threads(1);
}

TEST(Kernels, WorkingCopyConversionOfSpecialValues) {
  // SGD with lr 0 leaves p as is and writes it to the working copy: the vector fp16/bf16
  // stores (F16C, integer bf16 rounding, AVX512_BF16 with its denormal fallback) must equal
  // ds::convert for denormals, ties, overflow, inf and NaN, in the body and the masked tail.
  std::vector<float> p;
  const float specials[] = {0.f, -0.f, 1e-40f, -3e-39f, 1.1754942e-38f, 1.00390625f, 1.01171875f, 65504.f, 65520.f,
                            1e5f, -3.3e38f, 3.389e38f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            5.96e-8f, 2.98e-8f, 6.1e-5f, 1.0009765625f, 3.14159f};
  for (int rep = 0; rep < 7; ++rep)
    for (float x : specials) p.push_back(rep % 2 ? -x : x);
  std::vector<float> dn = randv(45, 3, 1e-39f);  // a vector of denormals only
  p.insert(p.end(), dn.begin(), dn.end());
  const std::size_t n = p.size();
  std::vector<float> zeros(n, 0.f);
  for (DType wt : {DType::F32, DType::F16, DType::BF16}) {
    Working w(n, wt);
    std::vector<float> q = p;
    SgdHyper h;
    h.lr = 0.f;
    sgd_cpu(q.data(), nullptr, TensorView{zeros.data(), n, DType::F32}, w.view, n, h);
    std::vector<unsigned char> expect(w.bytes.size(), 0xAB);
    ds::convert(q.data(), DType::F32, expect.data(), wt, n);  // q == p except inf*0 = NaN lanes
    EXPECT_EQ(expect, w.bytes) << ds::dtype_name(wt);
  }
}

TEST(Kernels, GradScaleIsFoldedIn) {
  // grads x 4 with grad_scale 1/4 == grads with grad_scale 1 (powers of two: exact).
  const std::size_t n = 4099;
  std::vector<float> g = randv(n, 5, 1.f), g4(n);
  for (std::size_t i = 0; i < n; ++i) g4[i] = 4.f * g[i];
  std::vector<float> p1 = randv(n, 6, 1.f), p2 = p1, m1(n), v1(n), m2(n), v2(n);
  AdamHyper h;
  h.bc1 = 0.1f; h.bc2 = 0.001f;
  adam_cpu(p1.data(), m1.data(), v1.data(), TensorView{g.data(), n, DType::F32}, {}, n, h);
  h.grad_scale = 0.25f;
  adam_cpu(p2.data(), m2.data(), v2.data(), TensorView{g4.data(), n, DType::F32}, {}, n, h);
  EXPECT_TRUE(same_bits(p1, p2));
}
