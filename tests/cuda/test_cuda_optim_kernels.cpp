// Every CUDA optimizer / precision kernel against its CPU reference at awkward sizes
// (1, 7, 278011, and misaligned pointers that force the scalar path).
// Tolerances: Adam/SGD/Adagrad and the casts must match the CPU reference BITWISE (same
// fp32 operations, --fmad=false, IEEE sqrt/div on both); Lamb to 2e-6 relative (norm
// summation order); grad sums to 1e-12 relative (double, atomics).
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ds/core/half.h"
#include "ds/optim/cuda_kernels.h"
#include "ds/optim/kernels.h"
#include "ds/precision/cuda_kernels.h"
#include "ds/precision/grad_stats.h"
#include "ds/precision/loss_scaler.h"

using ds::DType;
using ds::TensorView;
namespace oc = ds::optim::cuda;
namespace pc = ds::precision::cuda;

static int g_failures = 0;
#define EXPECT(cond, ...)                                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      ++g_failures;                                                    \
      std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fprintf(stderr, "\n");                                      \
    }                                                                  \
  } while (0)
#define CU(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace {

// A device copy of a host byte buffer, `offset` bytes into a fresh allocation (offset 4
// breaks 16-byte alignment and exercises the scalar path).
struct Dev {
  void* base = nullptr;
  char* ptr = nullptr;
  std::size_t bytes = 0;
  Dev(const void* host, std::size_t nbytes, std::size_t offset = 0) : bytes(nbytes) {
    CU(cudaMalloc(&base, nbytes + offset + 16));
    ptr = static_cast<char*>(base) + offset;
    if (nbytes) CU(cudaMemcpy(ptr, host, nbytes, cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(base); }
  template <typename T> T* as() { return reinterpret_cast<T*>(ptr); }
  void to_host(void* host) const { if (bytes) CU(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost)); }
};

std::vector<float> randv(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * nd(rng);
  return v;
}

std::vector<unsigned char> to_dtype(const std::vector<float>& v, DType t) {
  std::vector<unsigned char> b(v.size() * ds::dtype_size(t));
  ds::convert(v.data(), DType::F32, b.data(), t, v.size());
  return b;
}

bool same(const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

const std::size_t kSizes[] = {1, 7, 278011};
const DType kG[] = {DType::F32, DType::F16, DType::BF16};
const DType kW[] = {DType::U8, DType::F32, DType::F16, DType::BF16};  // U8: no working copy

// Runs 3 steps on the CPU reference and on the GPU; compares p, states, working bitwise.
template <class CpuStep, class GpuStep>
void elementwise_case(const char* name, int nstates, CpuStep cpu, GpuStep gpu) {
  for (std::size_t offset : {std::size_t(0), std::size_t(4)}) {
    for (std::size_t n : kSizes) {
      for (DType gt : kG) {
        for (DType wt : kW) {
          std::vector<float> p = randv(n, 1, 1.f), pd(n);
          std::vector<std::vector<float>> st(nstates, std::vector<float>(n, 0.1f));
          Dev dp(p.data(), n * 4, offset);
          std::vector<Dev*> ds;
          for (auto& s : st) ds.push_back(new Dev(s.data(), n * 4, offset));
          const std::size_t wb = wt == DType::U8 ? 0 : n * ds::dtype_size(wt);
          std::vector<unsigned char> w(wb, 0), wd(wb, 0);
          Dev dw(w.data(), wb, offset);
          for (int step = 1; step <= 3; ++step) {
            auto gh = to_dtype(randv(n, 50 + step, 0.5f), gt);
            Dev dg(gh.data(), gh.size(), offset);
            TensorView hg{gh.data(), n, gt}, hw{wb ? w.data() : nullptr, n, wt == DType::U8 ? DType::F32 : wt};
            TensorView dgv{dg.ptr, n, gt}, dwv{wb ? dw.ptr : nullptr, n, wt == DType::U8 ? DType::F32 : wt};
            std::vector<float*> sp, dsp;
            for (auto& s : st) sp.push_back(s.data());
            for (auto* d : ds) dsp.push_back(d->as<float>());
            cpu(step, p.data(), sp, hg, hw, n);
            gpu(step, dp.as<float>(), dsp, dgv, dwv, n);
          }
          CU(cudaDeviceSynchronize());
          dp.to_host(pd.data());
          EXPECT(same(p.data(), pd.data(), n * 4), "%s master n=%zu grad=%s offset=%zu", name, n,
                 std::string(ds::dtype_name(gt)).c_str(), offset);
          for (int s = 0; s < nstates; ++s) {
            std::vector<float> sd(n);
            ds[s]->to_host(sd.data());
            EXPECT(same(st[s].data(), sd.data(), n * 4), "%s state %d n=%zu", name, s, n);
          }
          dw.to_host(wd.data());
          EXPECT(w == wd, "%s working n=%zu", name, n);
          for (auto* d : ds) delete d;
        }
      }
    }
  }
}

void test_adam() {
  for (bool adamw : {true, false}) {
    auto hyper = [&](int step) {
      ds::optim::AdamHyper h;
      h.lr = 1e-2f; h.weight_decay = 0.05f; h.adam_w_mode = adamw; h.grad_scale = 0.25f;
      h.bc1 = float(1 - std::pow(0.9, step)); h.bc2 = float(1 - std::pow(0.999, step));
      return h;
    };
    elementwise_case(adamw ? "adamw" : "adam-l2", 2,
        [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
          ds::optim::adam_ref(p, s[0], s[1], g, w, n, hyper(step));
        },
        [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
          oc::adam(p, s[0], s[1], g, w, n, hyper(step), {}, nullptr);
        });
  }
}

void test_sgd_adagrad() {
  auto sh = [](int step) {
    ds::optim::SgdHyper h;
    h.lr = 0.05f; h.momentum = 0.9f; h.weight_decay = 0.01f; h.nesterov = true; h.first_step = step == 1;
    h.grad_scale = 0.5f;
    return h;
  };
  elementwise_case("sgd", 1,
      [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
        ds::optim::sgd_ref(p, s[0], g, w, n, sh(step));
      },
      [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
        oc::sgd(p, s[0], g, w, n, sh(step), {}, nullptr);
      });
  auto ah = [](int step) {
    ds::optim::AdagradHyper h;
    h.clr = 0.05f / (1 + (step - 1) * 0.01f); h.weight_decay = 0.01f; h.grad_scale = 2.f;
    return h;
  };
  elementwise_case("adagrad", 1,
      [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
        ds::optim::adagrad_ref(p, s[0], g, w, n, ah(step));
      },
      [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
        oc::adagrad(p, s[0], g, w, n, ah(step), {}, nullptr);
      });
}

void test_lamb() {
  const std::size_t n = 278011;
  const std::vector<std::vector<ds::optim::Segment>> layouts = {
      {}, {{0, 1}, {1, 7}, {8, 100000}, {100008, n - 100008}}, {{3, 5}, {20, 70000}, {200000, 1}}};
  for (const auto& segs : layouts) {
    for (DType gt : kG) {
      std::vector<float> p = randv(n, 2, 1.f), m(n), v(n), pd(n);
      Dev dp(p.data(), n * 4), dm(m.data(), n * 4), dv(v.data(), n * 4);
      std::vector<unsigned char> w(n * 2), wd(n * 2);
      Dev dw(w.data(), n * 2);
      oc::LambPlan plan(segs, n);
      std::vector<float> coeffs(plan.num_segments()), dcoeffs(plan.num_segments());
      for (int step = 1; step <= 3; ++step) {
        auto gh = to_dtype(randv(n, 70 + step, 0.5f), gt);
        Dev dg(gh.data(), gh.size());
        ds::optim::LambHyper h;
        h.step_size = 1e-2f * std::sqrt(1 - std::pow(0.999f, step)) / (1 - std::pow(0.9f, step));
        h.weight_decay = 0.01f;
        ds::optim::lamb_ref(p.data(), m.data(), v.data(), TensorView{gh.data(), n, gt}, TensorView{w.data(), n, DType::BF16},
                            n, segs, h, coeffs);
        oc::lamb(dp.as<float>(), dm.as<float>(), dv.as<float>(), TensorView{dg.ptr, n, gt},
                 TensorView{dw.ptr, n, DType::BF16}, n, plan, h, {}, nullptr);
      }
      CU(cudaDeviceSynchronize());
      dp.to_host(pd.data());
      CU(cudaMemcpy(dcoeffs.data(), plan.d_coeffs(), dcoeffs.size() * 4, cudaMemcpyDeviceToHost));
      for (std::size_t s = 0; s < coeffs.size(); ++s)
        EXPECT(std::fabs(coeffs[s] - dcoeffs[s]) <= 2e-6f * coeffs[s], "lamb coeff %zu: %g vs %g", s, coeffs[s], dcoeffs[s]);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) bad += std::fabs(p[i] - pd[i]) > 2e-6f * std::fabs(p[i]) + 1e-9f;
      EXPECT(bad == 0, "lamb: %zu elements differ beyond 2e-6 (segments %zu)", bad, segs.size());
    }
  }
}

void test_device_step_control() {
  // A skipped step leaves everything untouched; d_grad_scale and d_step match host values.
  const std::size_t n = 1000;
  std::vector<float> p = randv(n, 3, 1.f), g = randv(n, 4, 1.f), m(n), v(n), pd(n);
  Dev dp(p.data(), n * 4), dg(g.data(), n * 4), dm(m.data(), n * 4), dv(v.data(), n * 4);
  int skip = 1;
  float gs = 0.125f;
  std::int64_t step = 1;
  Dev dskip(&skip, 4), dgs(&gs, 4), dstep(&step, 8);
  ds::optim::AdamHyper h;
  oc::DeviceStepControl ctl;
  ctl.d_skip = dskip.as<int>();
  oc::adam(dp.as<float>(), dm.as<float>(), dv.as<float>(), TensorView{dg.ptr, n, DType::F32}, {}, n, h, ctl, nullptr);
  CU(cudaDeviceSynchronize());
  dp.to_host(pd.data());
  EXPECT(p == pd, "skipped step changed the master weights");
  skip = 0;
  CU(cudaMemcpy(dskip.ptr, &skip, 4, cudaMemcpyHostToDevice));
  ctl.d_grad_scale = dgs.as<float>();
  ctl.d_step = dstep.as<std::int64_t>();
  oc::adam(dp.as<float>(), dm.as<float>(), dv.as<float>(), TensorView{dg.ptr, n, DType::F32}, {}, n, h, ctl, nullptr);
  h.grad_scale = 0.125f;
  h.bc1 = float(1.0 - std::pow(double(0.9f), 1.0));
  h.bc2 = float(1.0 - std::pow(double(0.999f), 1.0));
  ds::optim::adam_ref(p.data(), m.data(), v.data(), TensorView{g.data(), n, DType::F32}, {}, n, h);
  CU(cudaDeviceSynchronize());
  dp.to_host(pd.data());
  EXPECT(same(p.data(), pd.data(), n * 4), "device grad scale / step count differ from the host values");
}

void test_grad_stats_unscale_cast() {
  for (std::size_t offset : {std::size_t(0), std::size_t(2)}) {
    for (std::size_t n : kSizes) {
      for (DType t : kG) {
        auto h = to_dtype(randv(n, 9, 3.f), t);
        Dev d(h.data(), h.size(), offset);
        double zero = 0;
        int nf = 0;
        Dev dsum(&zero, 8), dflag(&nf, 4);
        pc::grad_stats(TensorView{d.ptr, n, t}, dsum.as<double>(), dflag.as<int>(), nullptr);
        double sum;
        int flag;
        dsum.to_host(&sum);
        dflag.to_host(&flag);
        const auto ref = ds::precision::grad_stats_ref(TensorView{h.data(), n, t});
        EXPECT(std::fabs(sum - ref.sum_of_squares) <= 1e-12 * ref.sum_of_squares, "grad_stats n=%zu", n);
        EXPECT(flag == 0, "grad_stats flagged finite data");
        // Inject a NaN at the end (tail path).
        std::vector<float> bad = randv(n, 9, 3.f);
        bad[n - 1] = std::numeric_limits<float>::quiet_NaN();
        auto hb = to_dtype(bad, t);
        Dev db(hb.data(), hb.size(), offset);
        pc::grad_stats(TensorView{db.ptr, n, t}, dsum.as<double>(), dflag.as<int>(), nullptr);
        dflag.to_host(&flag);
        EXPECT(flag == 1, "grad_stats missed a NaN n=%zu", n);
        // Unscale in place by 1/8 (exact) and compare with the host.
        float mult = 0.125f;
        int nf2 = 0;
        Dev dm(&mult, 4), df2(&nf2, 4);
        pc::unscale_check(TensorView{d.ptr, n, t}, dm.as<float>(), df2.as<int>(), nullptr);
        std::vector<unsigned char> back(h.size());
        d.to_host(back.data());
        std::vector<float> f(n);
        ds::convert(h.data(), t, f.data(), DType::F32, n);
        for (auto& x : f) x *= 0.125f;
        EXPECT(back == to_dtype(f, t), "unscale_check n=%zu", n);
        df2.to_host(&nf2);
        EXPECT(nf2 == 0, "unscale_check flagged finite data");
      }
      // Cast fp32 -> each dtype, bitwise equal to ds::convert.
      std::vector<float> src = randv(n, 11, 100.f);
      Dev ds_(src.data(), n * 4, offset);
      for (DType t : kG) {
        std::vector<unsigned char> out(n * ds::dtype_size(t));
        Dev dd(out.data(), out.size(), offset);
        pc::cast_from_f32(ds_.as<float>(), TensorView{dd.ptr, n, t}, nullptr);
        dd.to_host(out.data());
        EXPECT(out == to_dtype(src, t), "cast_from_f32 n=%zu", n);
      }
    }
  }
}

void test_scaler_prologue() {
  // The device state machine against ds::precision::LossScaler on scripted sequences.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 12; ++trial) {
    ds::precision::LossScalerConfig cfg;
    cfg.initial_scale_power = 8 + trial % 5;
    cfg.window = 1 + trial % 4;
    cfg.hysteresis = 1 + trial % 3;
    cfg.consecutive_hysteresis = trial % 2;
    cfg.raise_at_min_scale = false;
    ds::precision::LossScaler host(cfg);
    pc::DeviceScalerState st = pc::to_device_state(host.state());
    Dev dst(&st, sizeof st);
    int flag = 0, skip = 0;
    double sumsq = 16.0;  // ||g_scaled|| = 4
    float gs = 0, norm = 0;
    std::int64_t step = 0;
    Dev dflag(&flag, 4), dsum(&sumsq, 8), dskip(&skip, 4), dgs(&gs, 4), dnorm(&norm, 4), dstep(&step, 8);
    std::int64_t host_steps = 0;
    for (int k = 0; k < 60; ++k) {
      const bool ov = rng() % 3 == 0;
      flag = ov;
      CU(cudaMemcpy(dflag.ptr, &flag, 4, cudaMemcpyHostToDevice));
      const double prev = host.scale();
      host.update(ov);
      if (!ov) ++host_steps;
      pc::step_prologue(dst.as<pc::DeviceScalerState>(), cfg, dflag.as<int>(), dsum.as<double>(), 1.0f,
                        dskip.as<int>(), dgs.as<float>(), dnorm.as<float>(), dstep.as<std::int64_t>(), nullptr);
      dst.to_host(&st);
      dskip.to_host(&skip);
      dgs.to_host(&gs);
      EXPECT(st.cur_scale == host.scale() && st.cur_hysteresis == host.state().cur_hysteresis,
             "trial %d step %d: device scale %g hyst %d, host %g hyst %d", trial, k, st.cur_scale, st.cur_hysteresis,
             host.scale(), host.state().cur_hysteresis);
      EXPECT(skip == int(ov), "skip flag");
      if (!ov) {
        const double n = 4.0 / prev, coef = ds::precision::clip_coefficient(n, 1.0);
        EXPECT(gs == float(coef / prev), "grad scale %g vs %g", gs, float(coef / prev));
      }
    }
    dstep.to_host(&step);
    EXPECT(step == host_steps, "device step count %lld vs %lld", (long long)step, (long long)host_steps);
  }
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device visible: skipping\n");
    return 77;
  }
  test_adam();
  test_sgd_adagrad();
  test_lamb();
  test_device_step_control();
  test_grad_stats_unscale_cast();
  test_scaler_prologue();
  if (g_failures) {
    std::printf("%d failure(s)\n", g_failures);
    return 1;
  }
  std::printf("all CUDA kernel checks passed\n");
  return 0;
}
