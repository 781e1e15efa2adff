// Every CUDA optimizer / precision kernel against its CPU reference at awkward sizes
// (1, 7, 278011), with 16-byte aligned pointers (the 128-bit path plus its guarded tail) and
// misaligned ones (offset 4: the element-by-element path), every gradient dtype and every
// working dtype (none, fp32, fp16, bf16).
// Tolerances: Adam/SGD/Adagrad and the casts must match the CPU reference BITWISE (same
// fp32 operations, --fmad=false, IEEE sqrt/div on both); Lamb's moments bitwise, its master
// weights and trust ratios to 2e-6 relative (norm summation order), its working copy exactly
// the device master rounded; grad sums to 1e-12 relative (double, atomics).
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds/core/half.h"
#include "ds/optim/cuda_kernels.h"
#include "ds/optim/kernels.h"
#include "ds/precision/cuda_kernels.h"
#include "ds/precision/grad_stats.h"
#include "ds/precision/loss_scaler.h"

using ds::DType;
using ds::TensorView;
using cuda_test::Dev;
using cuda_test::randv;
using cuda_test::same;
using cuda_test::to_dtype;
namespace oc = ds::optim::cuda;
namespace pc = ds::precision::cuda;

namespace {

const std::size_t kSizes[] = {1, 7, 278011};
const DType kG[] = {DType::F32, DType::F16, DType::BF16};
const DType kW[] = {DType::U8, DType::F32, DType::F16, DType::BF16};  // U8: no working copy

std::string dn(DType t) { return t == DType::U8 ? std::string("none") : std::string(ds::dtype_name(t)); }

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
          std::vector<std::unique_ptr<Dev>> dst;
          for (auto& s : st) dst.push_back(std::make_unique<Dev>(s.data(), n * 4, offset));
          const std::size_t wb = wt == DType::U8 ? 0 : n * ds::dtype_size(wt);
          const DType wview = wt == DType::U8 ? DType::F32 : wt;
          std::vector<unsigned char> w(wb, 0), wd(wb, 0);
          Dev dw(w.data(), wb, offset);
          for (int step = 1; step <= 3; ++step) {
            auto gh = to_dtype(randv(n, 50 + step, 0.5f), gt);
            Dev dg(gh.data(), gh.size(), offset);
            TensorView hg{gh.data(), n, gt}, hw{wb ? w.data() : nullptr, n, wview};
            TensorView dgv{dg.ptr, n, gt}, dwv{wb ? dw.ptr : nullptr, n, wview};
            std::vector<float*> sp, dsp;
            for (auto& s : st) sp.push_back(s.data());
            for (auto& d : dst) dsp.push_back(d->as<float>());
            cpu(step, p.data(), sp, hg, hw, n);
            gpu(step, dp.as<float>(), dsp, dgv, dwv, n);
          }
          CU(cudaDeviceSynchronize());
          dp.to_host(pd.data());
          EXPECT(same(p.data(), pd.data(), n * 4), "%s master n=%zu grad=%s working=%s offset=%zu", name, n,
                 dn(gt).c_str(), dn(wt).c_str(), offset);
          for (int s = 0; s < nstates; ++s) {
            std::vector<float> sd(n);
            dst[s]->to_host(sd.data());
            EXPECT(same(st[s].data(), sd.data(), n * 4), "%s state %d n=%zu grad=%s offset=%zu", name, s, n,
                   dn(gt).c_str(), offset);
          }
          dw.to_host(wd.data());
          EXPECT(w == wd, "%s working n=%zu grad=%s working=%s offset=%zu", name, n, dn(gt).c_str(), dn(wt).c_str(),
                 offset);
        }
      }
    }
  }
}

ds::optim::AdamHyper adam_hyper(int step, bool adamw) {
  ds::optim::AdamHyper h;
  h.lr = 1e-2f; h.weight_decay = 0.05f; h.adam_w_mode = adamw; h.grad_scale = 0.25f;
  h.bc1 = float(1 - std::pow(0.9, step)); h.bc2 = float(1 - std::pow(0.999, step));
  return h;
}

void test_adam() {
  for (bool adamw : {true, false}) {
    elementwise_case(adamw ? "adamw" : "adam-l2", 2,
        [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
          ds::optim::adam_ref(p, s[0], s[1], g, w, n, adam_hyper(step, adamw));
        },
        [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
          oc::adam(p, s[0], s[1], g, w, n, adam_hyper(step, adamw), {}, nullptr);
        });
  }
}

ds::optim::SgdHyper sgd_hyper(int step, float momentum, bool nesterov, float dampening) {
  ds::optim::SgdHyper h;
  h.lr = 0.05f; h.momentum = momentum; h.dampening = dampening; h.weight_decay = 0.01f; h.nesterov = nesterov;
  h.first_step = step == 1;
  h.grad_scale = 0.5f;
  return h;
}

void test_sgd() {
  // Nesterov momentum; plain momentum with dampening; no momentum (no buffer at all).
  struct V { const char* name; float momentum; bool nesterov; float dampening; };
  for (const V& c : {V{"sgd-nesterov", 0.9f, true, 0.f}, V{"sgd-dampening", 0.8f, false, 0.1f}, V{"sgd-plain", 0.f, false, 0.f}}) {
    elementwise_case(c.name, c.momentum != 0.f ? 1 : 0,
        [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
          ds::optim::sgd_ref(p, s.empty() ? nullptr : s[0], g, w, n, sgd_hyper(step, c.momentum, c.nesterov, c.dampening));
        },
        [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
          oc::sgd(p, s.empty() ? nullptr : s[0], g, w, n, sgd_hyper(step, c.momentum, c.nesterov, c.dampening), {},
                  nullptr);
        });
  }
}

ds::optim::AdagradHyper adagrad_hyper(int step) {
  ds::optim::AdagradHyper h;
  h.clr = 0.05f / (1 + (step - 1) * 0.01f); h.weight_decay = 0.01f; h.grad_scale = 2.f;
  return h;
}

void test_adagrad() {
  elementwise_case("adagrad", 1,
      [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
        ds::optim::adagrad_ref(p, s[0], g, w, n, adagrad_hyper(step));
      },
      [&](int step, float* p, std::vector<float*>& s, TensorView g, TensorView w, std::size_t n) {
        oc::adagrad(p, s[0], g, w, n, adagrad_hyper(step), {}, nullptr);
      });
}

ds::optim::LambHyper lamb_hyper(int step) {
  ds::optim::LambHyper h;
  h.step_size = 1e-2f * std::sqrt(1 - std::pow(0.999f, step)) / (1 - std::pow(0.9f, step));
  h.weight_decay = 0.01f;
  h.grad_scale = 0.5f;
  return h;
}

// One Lamb configuration: 3 steps on the reference and the GPU.
void lamb_case(std::size_t n, const std::vector<ds::optim::Segment>& segs, DType gt, DType wt, std::size_t offset) {
  std::vector<float> p = randv(n, 2, 1.f), m(n, 0.f), v(n, 0.f), pd(n), md(n), vd(n);
  Dev dp(p.data(), n * 4, offset), dm(m.data(), n * 4, offset), dv(v.data(), n * 4, offset);
  const std::size_t wb = wt == DType::U8 ? 0 : n * ds::dtype_size(wt);
  const DType wview = wt == DType::U8 ? DType::F32 : wt;
  // The working copy starts as the master rounded (as in an engine), so elements in the
  // gaps between segments, which Lamb leaves alone, still match the master afterwards.
  std::vector<unsigned char> w = wb ? to_dtype(p, wt) : std::vector<unsigned char>(), wd(wb);
  Dev dw(w.data(), wb, offset);
  oc::LambPlan plan(segs, n);
  std::vector<float> coeffs(plan.num_segments()), dcoeffs(plan.num_segments());
  for (int step = 1; step <= 3; ++step) {
    auto gh = to_dtype(randv(n, 70 + step, 0.5f), gt);
    Dev dg(gh.data(), gh.size(), offset);
    ds::optim::lamb_ref(p.data(), m.data(), v.data(), TensorView{gh.data(), n, gt},
                        TensorView{wb ? w.data() : nullptr, n, wview}, n, segs, lamb_hyper(step), coeffs);
    oc::lamb(dp.as<float>(), dm.as<float>(), dv.as<float>(), TensorView{dg.ptr, n, gt},
             TensorView{wb ? dw.ptr : nullptr, n, wview}, n, plan, lamb_hyper(step), {}, nullptr);
  }
  CU(cudaDeviceSynchronize());
  dp.to_host(pd.data());
  dm.to_host(md.data());
  dv.to_host(vd.data());
  dw.to_host(wd.data());
  CU(cudaMemcpy(dcoeffs.data(), plan.d_coeffs(), dcoeffs.size() * 4, cudaMemcpyDeviceToHost));
  const std::string what = "n=" + std::to_string(n) + " segments=" + std::to_string(segs.size()) + " grad=" + dn(gt) +
                           " working=" + dn(wt) + " offset=" + std::to_string(offset);
  for (std::size_t s = 0; s < coeffs.size(); ++s)
    EXPECT(std::fabs(coeffs[s] - dcoeffs[s]) <= 2e-6f * coeffs[s], "lamb coeff %zu: %g vs %g (%s)", s, coeffs[s],
           dcoeffs[s], what.c_str());
  // The moments do not depend on the trust ratio: bitwise. Elements outside every segment
  // stay untouched on both sides.
  EXPECT(same(m.data(), md.data(), n * 4) && same(v.data(), vd.data(), n * 4), "lamb moments differ (%s)", what.c_str());
  const std::size_t bad = cuda_test::count_far(p.data(), pd.data(), n, 2e-6f, 1e-9f);
  EXPECT(bad == 0, "lamb: %zu master elements differ beyond 2e-6 (%s)", bad, what.c_str());
  if (wb) EXPECT(wd == to_dtype(pd, wt), "lamb working copy is not the device master rounded (%s)", what.c_str());
}

void test_lamb() {
  for (std::size_t offset : {std::size_t(0), std::size_t(4)})
    for (std::size_t n : kSizes)
      for (DType gt : kG)
        for (DType wt : kW) lamb_case(n, {}, gt, wt, offset);
  // Several tensors per launch: per-segment trust ratios, segments of 1 and 7 elements,
  // one longer than a 32 Ki chunk, gaps left untouched.
  const std::size_t n = 278011;
  const std::vector<std::vector<ds::optim::Segment>> layouts = {
      {{0, 1}, {1, 7}, {8, 100000}, {100008, n - 100008}}, {{3, 5}, {20, 70000}, {200000, 1}}};
  for (const auto& segs : layouts)
    for (DType gt : kG) lamb_case(n, segs, gt, DType::BF16, 0);
}

// With *d_skip != 0 every kernel returns without touching master, state or working copy.
void test_skip_leaves_everything() {
  const std::size_t n = 278011;
  std::vector<float> p = randv(n, 3, 1.f), g = randv(n, 4, 1.f), s1 = randv(n, 5, 1.f), s2 = randv(n, 6, 1.f);
  for (auto& x : s2) x = std::fabs(x);
  Dev dp(p.data(), n * 4), dg(g.data(), n * 4), d1(s1.data(), n * 4), d2(s2.data(), n * 4);
  std::vector<unsigned char> w(n * 2, 0x5a);
  Dev dw(w.data(), w.size());
  int skip = 1;
  std::int64_t step = 4;
  float gs = 0.5f;
  Dev dskip(&skip, 4), dstep(&step, 8), dgs(&gs, 4);
  oc::DeviceStepControl ctl;
  ctl.d_skip = dskip.as<int>();
  ctl.d_step = dstep.as<std::int64_t>();
  ctl.d_grad_scale = dgs.as<float>();
  ctl.lr = 0.1f;
  const TensorView gv{dg.ptr, n, DType::F32}, wv{dw.ptr, n, DType::BF16};
  oc::adam(dp.as<float>(), d1.as<float>(), d2.as<float>(), gv, wv, n, adam_hyper(1, true), ctl, nullptr);
  oc::sgd(dp.as<float>(), d1.as<float>(), gv, wv, n, sgd_hyper(2, 0.9f, true, 0.f), ctl, nullptr);
  oc::adagrad(dp.as<float>(), d2.as<float>(), gv, wv, n, adagrad_hyper(2), ctl, nullptr);
  oc::LambPlan plan({}, n);
  oc::lamb(dp.as<float>(), d1.as<float>(), d2.as<float>(), gv, wv, n, plan, lamb_hyper(2), ctl, nullptr);
  CU(cudaDeviceSynchronize());
  std::vector<float> back(n);
  std::vector<unsigned char> wback(w.size());
  dp.to_host(back.data());
  EXPECT(back == p, "a skipped step changed the master weights");
  d1.to_host(back.data());
  EXPECT(back == s1, "a skipped step changed the first state");
  d2.to_host(back.data());
  EXPECT(back == s2, "a skipped step changed the second state");
  dw.to_host(wback.data());
  EXPECT(wback == w, "a skipped step wrote the working copy");
}

void test_device_step_control() {
  // d_grad_scale and d_step give the same result as the host values.
  const std::size_t n = 1000;
  std::vector<float> p = randv(n, 3, 1.f), g = randv(n, 4, 1.f), m(n), v(n), pd(n);
  Dev dp(p.data(), n * 4), dg(g.data(), n * 4), dm(m.data(), n * 4), dv(v.data(), n * 4);
  int skip = 0;
  float gs = 0.125f;
  std::int64_t step = 3;
  Dev dskip(&skip, 4), dgs(&gs, 4), dstep(&step, 8);
  ds::optim::AdamHyper h;
  h.grad_scale = 2.f;
  oc::DeviceStepControl ctl;
  ctl.d_skip = dskip.as<int>();
  ctl.d_grad_scale = dgs.as<float>();
  ctl.d_step = dstep.as<std::int64_t>();
  oc::adam(dp.as<float>(), dm.as<float>(), dv.as<float>(), TensorView{dg.ptr, n, DType::F32}, {}, n, h, ctl, nullptr);
  h.grad_scale = 2.f * 0.125f;
  h.bc1 = float(1.0 - std::pow(double(0.9f), 3.0));
  h.bc2 = float(1.0 - std::pow(double(0.999f), 3.0));
  ds::optim::adam_ref(p.data(), m.data(), v.data(), TensorView{g.data(), n, DType::F32}, {}, n, h);
  CU(cudaDeviceSynchronize());
  dp.to_host(pd.data());
  EXPECT(same(p.data(), pd.data(), n * 4), "device grad scale / step count differ from the host values");
}

void test_grad_stats_unscale_cast() {
  // Offset 4, not 2: it breaks 16-byte alignment and keeps fp32 elements 4-byte aligned (a
  // float at an odd 2-byte address is a misaligned-address fault on the GPU, not a test).
  for (std::size_t offset : {std::size_t(0), std::size_t(4)}) {
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
        EXPECT(std::fabs(sum - ref.sum_of_squares) <= 1e-12 * ref.sum_of_squares, "grad_stats n=%zu %s: %.17g vs %.17g", n,
               dn(t).c_str(), sum, ref.sum_of_squares);
        EXPECT(flag == 0, "grad_stats flagged finite data n=%zu %s", n, dn(t).c_str());
        // A NaN at the end (the tail path), then an inf at the front (the vector path).
        for (std::size_t at : {n - 1, std::size_t(0)}) {
          std::vector<float> bad = randv(n, 9, 3.f);
          bad[at] = at == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
          auto hb = to_dtype(bad, t);
          Dev db(hb.data(), hb.size(), offset);
          flag = 0;
          dflag.from_host(&flag);
          pc::grad_stats(TensorView{db.ptr, n, t}, dsum.as<double>(), dflag.as<int>(), nullptr);
          dflag.to_host(&flag);
          EXPECT(flag == 1, "grad_stats missed a non-finite element at %zu n=%zu %s", at, n, dn(t).c_str());
        }
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
        EXPECT(back == to_dtype(f, t), "unscale_check n=%zu %s", n, dn(t).c_str());
        df2.to_host(&nf2);
        EXPECT(nf2 == 0, "unscale_check flagged finite data");
      }
      // Cast fp32 -> each dtype, bitwise equal to ds::convert (values past fp16's range too).
      std::vector<float> src = randv(n, 11, 100.f);
      if (n > 3) { src[1] = 70000.f; src[2] = -1e-6f; src[3] = 3e-8f; }
      Dev ds_(src.data(), n * 4, offset);
      for (DType t : kG) {
        std::vector<unsigned char> out(n * ds::dtype_size(t));
        Dev dd(out.data(), out.size(), offset);
        pc::cast_from_f32(ds_.as<float>(), TensorView{dd.ptr, n, t}, nullptr);
        dd.to_host(out.data());
        EXPECT(out == to_dtype(src, t), "cast_from_f32 n=%zu %s offset=%zu", n, dn(t).c_str(), offset);
      }
    }
  }
}

void test_scaler_prologue() {
  // The device state machine against ds::precision::LossScaler on random sequences.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 12; ++trial) {
    ds::precision::LossScalerConfig cfg;
    cfg.initial_scale_power = 8 + trial % 5;
    cfg.window = 1 + trial % 4;
    cfg.hysteresis = 1 + trial % 3;
    cfg.consecutive_hysteresis = trial % 2;
    cfg.raise_at_min_scale = false;
    cfg.min_scale = trial % 3 == 0 ? 64.0 : 1.0;  // some trials hit the floor
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
      dflag.from_host(&flag);
      const double prev = host.scale();
      host.update(ov);
      if (!ov) ++host_steps;
      pc::step_prologue(dst.as<pc::DeviceScalerState>(), cfg, dflag.as<int>(), dsum.as<double>(), 1.0f,
                        dskip.as<int>(), dgs.as<float>(), dnorm.as<float>(), dstep.as<std::int64_t>(), nullptr);
      dst.to_host(&st);
      dskip.to_host(&skip);
      dgs.to_host(&gs);
      dnorm.to_host(&norm);
      const ds::precision::LossScalerState hs = host.state(), ds_ = pc::from_device_state(st);
      EXPECT(ds_.cur_scale == hs.cur_scale && ds_.cur_hysteresis == hs.cur_hysteresis && ds_.cur_iter == hs.cur_iter &&
                 ds_.last_overflow_iter == hs.last_overflow_iter && ds_.consecutive_overflows == hs.consecutive_overflows,
             "trial %d step %d: device scale %g hyst %d iter %lld, host %g hyst %d iter %lld", trial, k, ds_.cur_scale,
             ds_.cur_hysteresis, (long long)ds_.cur_iter, hs.cur_scale, hs.cur_hysteresis, (long long)hs.cur_iter);
      EXPECT(skip == int(ov), "skip flag");
      if (!ov) {
        const double nrm = 4.0 / prev, coef = ds::precision::clip_coefficient(nrm, 1.0);
        EXPECT(gs == float(coef / prev), "grad scale %g vs %g", gs, float(coef / prev));
        EXPECT(norm == float(nrm), "grad norm %g vs %g", norm, float(nrm));
      } else {
        EXPECT(norm == -1.f, "an overflowed step reports norm %g, not -1", norm);
      }
      EXPECT(st.stuck == 0, "stuck without raise_at_min_scale");
    }
    dstep.to_host(&step);
    EXPECT(step == host_steps, "device step count %lld vs %lld", (long long)step, (long long)host_steps);
  }
}

}  // namespace

int main() {
  if (int rc = cuda_test::skip_without_gpu("test_cuda_optim_kernels")) return rc;
  test_adam();
  test_sgd();
  test_adagrad();
  test_lamb();
  test_skip_leaves_everything();
  test_device_step_control();
  test_grad_stats_unscale_cast();
  test_scaler_prologue();
  return cuda_test::finish("test_cuda_optim_kernels");
}
