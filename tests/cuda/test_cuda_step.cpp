// The fp16/bf16 optimizer step entirely on the device, as an engine runs it, against the
// same step on the CPU (ds::precision::LossScaler + grad_stats_ref + clip_coefficient + the
// *_ref optimizer kernels):
//
//   per step:  zero d_sumsq, d_found_inf
//              grad_stats(tensor t)               for each of several tensors (buckets)
//              step_prologue(...)                 dynamic/static loss scale, skip, clip
//              adam | sgd | adagrad | lamb (...)  one launch over all tensors, d_skip/d_step
//
// All steps (with overflowing ones, the first step among them) are enqueued on one stream
// with no host synchronisation in between; the results are read once at the end.
// With clipping off the grad multiplier is 1/scale (a power of two), so Adam, SGD and Adagrad
// must match the CPU bit for bit; with clipping on, the norm comes from a device sum in
// another order, so the multiplier may differ in its last bit: 1e-5 relative there.
// Also: global-norm clipping in place (unscale_check with the prologue's multiplier), the
// fused unscale + inf/NaN flag over several buffers, and the scaler stuck at its minimum.
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds/core/error.h"
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

// Several tensors in one flat range: awkward sizes, and offsets that leave most of them
// misaligned for the per-tensor grad_stats launches.
const std::size_t kTensor[] = {1, 7, 278011, 5, 64};
constexpr int kSteps = 12;
const std::set<int> kOverflowSteps = {1, 3, 4, 7};  // 1-based attempts with an inf/NaN gradient

enum class Opt { AdamW, Sgd, Adagrad, Lamb };
const char* opt_name(Opt o) {
  switch (o) {
    case Opt::AdamW: return "adamw";
    case Opt::Sgd: return "sgd";
    case Opt::Adagrad: return "adagrad";
    case Opt::Lamb: return "lamb";
  }
  return "?";
}

struct Layout {
  std::vector<ds::optim::Segment> segs;
  std::size_t n = 0;
  Layout() {
    for (std::size_t c : kTensor) { segs.push_back({n, c}); n += c; }
  }
};

// The hyperparameters both sides use. Step-dependent scalars: the CPU side computes them
// from its own step count exactly as the device does from *d_step (cuda_kernels.h).
constexpr float kLr = 0.01f, kLrDecay = 0.05f;

ds::optim::AdamHyper adam_h(std::int64_t step) {
  ds::optim::AdamHyper h;
  h.lr = kLr; h.weight_decay = 0.1f; h.adam_w_mode = true;
  h.bc1 = float(1.0 - std::pow(double(h.beta1), double(step)));
  h.bc2 = float(1.0 - std::pow(double(h.beta2), double(step)));
  return h;
}
ds::optim::SgdHyper sgd_h(std::int64_t step) {
  ds::optim::SgdHyper h;
  h.lr = kLr; h.momentum = 0.9f; h.dampening = 0.1f; h.weight_decay = 0.01f;
  h.first_step = step == 1;
  return h;
}
ds::optim::AdagradHyper adagrad_h(std::int64_t step) {
  ds::optim::AdagradHyper h;
  h.weight_decay = 0.01f;
  h.clr = float(double(kLr) / (1.0 + double(step - 1) * double(kLrDecay)));
  return h;
}
ds::optim::LambHyper lamb_h(std::int64_t step) {
  ds::optim::LambHyper h;
  h.weight_decay = 0.01f;
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(step)), bc2 = 1.0 - std::pow(double(h.beta2), double(step));
  h.step_size = float(double(kLr) * std::sqrt(bc2) / bc1);
  return h;
}

// Gradients of attempt k (1-based), already multiplied by the loss scale in a real run;
// overflowing attempts carry an inf or a NaN in one small tensor.
std::vector<float> grads_of(int k, const Layout& L) {
  std::vector<float> g = randv(L.n, 100 + k, 0.5f);
  if (kOverflowSteps.count(k)) {
    const std::size_t t = k % 2 ? 1 : 0;  // the 7-element or the 1-element tensor
    g[L.segs[t].offset + L.segs[t].count - 1] =
        k % 2 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  return g;
}

void pipeline_case(Opt opt, DType gt, DType wt, float clip, const ds::precision::LossScalerConfig& cfg) {
  const Layout L;
  const std::size_t n = L.n, es = ds::dtype_size(gt);
  const int nstate = opt == Opt::AdamW || opt == Opt::Lamb ? 2 : 1;
  const std::string what = std::string(opt_name(opt)) + " grad=" + std::string(ds::dtype_name(gt)) + " working=" +
                           std::string(ds::dtype_name(wt)) + " clip=" + std::to_string(clip) +
                           (cfg.dynamic ? " dynamic" : " static");

  // ---- CPU: the engine's step, plainly ----
  std::vector<float> p = randv(n, 7, 1.f);
  const std::vector<float> p0 = p;
  std::vector<std::vector<float>> st(nstate, std::vector<float>(n, 0.f));
  std::vector<unsigned char> w(n * ds::dtype_size(wt), 0);
  ds::precision::LossScaler scaler(cfg);
  std::int64_t steps = 0;
  float last_norm = 0.f;
  std::vector<std::vector<unsigned char>> gbytes;
  int grew = 0;
  for (int k = 1; k <= kSteps; ++k) {
    gbytes.push_back(to_dtype(grads_of(k, L), gt));
    const auto& gb = gbytes.back();
    double sumsq = 0.0;
    bool bad = false;
    for (const auto& s : L.segs) {
      const auto r = ds::precision::grad_stats_ref(TensorView{const_cast<unsigned char*>(gb.data()) + s.offset * es, s.count, gt});
      sumsq += r.sum_of_squares;
      bad = bad || r.has_inf_or_nan;
    }
    EXPECT(bad == (kOverflowSteps.count(k) == 1), "CPU reference: attempt %d overflow %d", k, int(bad));
    const double prev = scaler.scale();
    scaler.update(bad);
    grew += scaler.scale() > prev;
    if (bad) { last_norm = -1.f; continue; }
    ++steps;
    const double norm = std::sqrt(sumsq) / prev;
    const float gs = float(ds::precision::clip_coefficient(norm, clip) / prev);
    if (clip > 0.f) EXPECT(ds::precision::clip_coefficient(norm, clip) < 1.0, "attempt %d: clip %g is not active (norm %g)", k, double(clip), norm);
    last_norm = float(norm);
    const TensorView gv{const_cast<unsigned char*>(gb.data()), n, gt}, wv{w.data(), n, wt};
    switch (opt) {
      case Opt::AdamW: { auto h = adam_h(steps); h.grad_scale = gs; ds::optim::adam_ref(p.data(), st[0].data(), st[1].data(), gv, wv, n, h); break; }
      case Opt::Sgd: { auto h = sgd_h(steps); h.grad_scale = gs; ds::optim::sgd_ref(p.data(), st[0].data(), gv, wv, n, h); break; }
      case Opt::Adagrad: { auto h = adagrad_h(steps); h.grad_scale = gs; ds::optim::adagrad_ref(p.data(), st[0].data(), gv, wv, n, h); break; }
      case Opt::Lamb: { auto h = lamb_h(steps); h.grad_scale = gs; ds::optim::lamb_ref(p.data(), st[0].data(), st[1].data(), gv, wv, n, L.segs, h, {}); break; }
    }
  }

  if (cfg.dynamic) EXPECT(grew >= 1, "the sequence must grow the scale at least once (%s)", what.c_str());

  // ---- GPU: the same attempts, enqueued back to back ----
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Dev dp(p0.data(), n * 4), dw(nullptr, w.size());
  std::vector<std::unique_ptr<Dev>> dst;
  for (int i = 0; i < nstate; ++i) dst.push_back(std::make_unique<Dev>(nullptr, n * 4));
  std::vector<std::unique_ptr<Dev>> dg;
  for (const auto& gb : gbytes) dg.push_back(std::make_unique<Dev>(gb.data(), gb.size()));
  ds::precision::LossScaler fresh(cfg);
  pc::DeviceScalerState ds0 = pc::to_device_state(fresh.state());
  Dev dstate(&ds0, sizeof ds0), dsum(nullptr, 8), dfound(nullptr, 4), dskip(nullptr, 4), dgs(nullptr, 4),
      dnorm(nullptr, 4), dstep(nullptr, 8);
  oc::DeviceStepControl ctl;
  ctl.d_skip = dskip.as<int>();
  ctl.d_grad_scale = dgs.as<float>();
  ctl.d_step = dstep.as<std::int64_t>();
  ctl.bias_correction = true;
  ctl.lr = kLr;
  ctl.lr_decay = kLrDecay;
  std::unique_ptr<oc::LambPlan> plan;
  if (opt == Opt::Lamb) plan = std::make_unique<oc::LambPlan>(L.segs, n);
  for (int k = 1; k <= kSteps; ++k) {
    char* g = dg[k - 1]->ptr;
    CU(cudaMemsetAsync(dsum.ptr, 0, 8, s));
    CU(cudaMemsetAsync(dfound.ptr, 0, 4, s));
    for (const auto& sg : L.segs)
      pc::grad_stats(TensorView{g + sg.offset * es, sg.count, gt}, dsum.as<double>(), dfound.as<int>(), s);
    pc::step_prologue(dstate.as<pc::DeviceScalerState>(), cfg, dfound.as<int>(), dsum.as<double>(), clip,
                      dskip.as<int>(), dgs.as<float>(), dnorm.as<float>(), dstep.as<std::int64_t>(), s);
    const TensorView gv{g, n, gt}, wv{dw.ptr, n, wt};
    // Host-side hyperparameters carry everything but the step-dependent scalars (from
    // *d_step) and the multiplier (from *d_grad_scale): pass those of a wrong step on purpose.
    switch (opt) {
      case Opt::AdamW: oc::adam(dp.as<float>(), dst[0]->as<float>(), dst[1]->as<float>(), gv, wv, n, adam_h(1000), ctl, s); break;
      case Opt::Sgd: oc::sgd(dp.as<float>(), dst[0]->as<float>(), gv, wv, n, sgd_h(1000), ctl, s); break;
      case Opt::Adagrad: oc::adagrad(dp.as<float>(), dst[0]->as<float>(), gv, wv, n, adagrad_h(1000), ctl, s); break;
      case Opt::Lamb: oc::lamb(dp.as<float>(), dst[0]->as<float>(), dst[1]->as<float>(), gv, wv, n, *plan, lamb_h(1000), ctl, s); break;
    }
  }
  CU(cudaStreamSynchronize(s));
  CU(cudaStreamDestroy(s));

  std::vector<float> pd(n), sd(n);
  std::vector<unsigned char> wd(w.size());
  dp.to_host(pd.data());
  dw.to_host(wd.data());
  const bool exact = clip <= 0.f && opt != Opt::Lamb;
  const float rel = opt == Opt::Lamb ? 2e-5f : 1e-5f;
  if (exact) {
    EXPECT(same(p.data(), pd.data(), n * 4), "master differs from the CPU step (%s)", what.c_str());
  } else {
    const std::size_t bad = cuda_test::count_far(p.data(), pd.data(), n, rel, 1e-7f);
    EXPECT(bad == 0, "%zu master elements differ beyond %g (%s)", bad, double(rel), what.c_str());
  }
  for (int i = 0; i < nstate; ++i) {
    dst[i]->to_host(sd.data());
    if (exact) EXPECT(same(st[i].data(), sd.data(), n * 4), "state %d differs (%s)", i, what.c_str());
    else EXPECT(cuda_test::count_far(st[i].data(), sd.data(), n, rel, 1e-7f) == 0, "state %d differs (%s)", i, what.c_str());
  }
  EXPECT(wd == to_dtype(pd, wt), "working copy is not the device master rounded (%s)", what.c_str());
  EXPECT(!(p == p0), "the CPU reference did not move the weights (%s)", what.c_str());

  pc::DeviceScalerState dsf;
  dstate.to_host(&dsf);
  const auto hs = scaler.state(), gs = pc::from_device_state(dsf);
  EXPECT(gs.cur_scale == hs.cur_scale && gs.cur_iter == hs.cur_iter && gs.last_overflow_iter == hs.last_overflow_iter &&
             gs.cur_hysteresis == hs.cur_hysteresis && gs.consecutive_overflows == hs.consecutive_overflows,
         "scaler state: device scale %g iter %lld hyst %d, host scale %g iter %lld hyst %d (%s)", gs.cur_scale,
         (long long)gs.cur_iter, gs.cur_hysteresis, hs.cur_scale, (long long)hs.cur_iter, hs.cur_hysteresis, what.c_str());
  std::int64_t dsteps = 0;
  dstep.to_host(&dsteps);
  EXPECT(dsteps == steps, "device step count %lld, host %lld (%s)", (long long)dsteps, (long long)steps, what.c_str());
  float dn = 0.f;
  dnorm.to_host(&dn);
  EXPECT(std::fabs(dn - last_norm) <= 1e-6f * std::fabs(last_norm), "last grad norm %g vs %g (%s)", dn, last_norm,
         what.c_str());
}

void test_pipeline() {
  ds::precision::LossScalerConfig dyn;
  dyn.initial_scale_power = 12;
  dyn.window = 2;  // the scale also grows (attempts 10 and 12) between the overflows
  dyn.hysteresis = 2;
  dyn.raise_at_min_scale = true;
  for (Opt o : {Opt::AdamW, Opt::Sgd, Opt::Adagrad, Opt::Lamb}) {
    // ||g_scaled|| is about 260 and the scale 512..4096, so the unscaled norm is 0.06..0.5:
    // a clip of 0.02 is active on every step.
    for (float clip : {0.f, 0.02f}) {
      pipeline_case(o, DType::F16, DType::F16, clip, dyn);
      pipeline_case(o, DType::BF16, DType::BF16, clip, dyn);
    }
  }
  // fp32 gradients with a static scale (the caller still skips overflowed steps), and
  // consecutive hysteresis.
  pipeline_case(Opt::AdamW, DType::F32, DType::BF16, 1.f, ds::precision::LossScalerConfig::fixed(64.0));
  dyn.consecutive_hysteresis = true;
  dyn.hysteresis = 3;
  pipeline_case(Opt::AdamW, DType::F16, DType::F16, 0.f, dyn);
}

// Clipping in place: grad_stats over several buffers -> prologue -> unscale_check with the
// prologue's multiplier scales every buffer by clip_coefficient / scale.
void test_clip_in_place() {
  const Layout L;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const std::size_t es = ds::dtype_size(t);
    const auto gb = to_dtype(randv(L.n, 31, 2.f), t);
    Dev dg(gb.data(), gb.size()), dsum(nullptr, 8), dfound(nullptr, 4), dskip(nullptr, 4), dgs(nullptr, 4),
        dnorm(nullptr, 4), dflag2(nullptr, 4);
    ds::precision::LossScalerConfig cfg = ds::precision::LossScalerConfig::fixed(8.0);
    pc::DeviceScalerState st0 = pc::to_device_state(ds::precision::LossScaler(cfg).state());
    Dev dstate(&st0, sizeof st0);
    double sumsq = 0.0;
    for (const auto& s : L.segs) {
      pc::grad_stats(TensorView{dg.ptr + s.offset * es, s.count, t}, dsum.as<double>(), dfound.as<int>(), nullptr);
      sumsq += ds::precision::grad_stats_ref(TensorView{const_cast<unsigned char*>(gb.data()) + s.offset * es, s.count, t})
                   .sum_of_squares;
    }
    const float clip = 1.f;
    pc::step_prologue(dstate.as<pc::DeviceScalerState>(), cfg, dfound.as<int>(), dsum.as<double>(), clip,
                      dskip.as<int>(), dgs.as<float>(), dnorm.as<float>(), nullptr, nullptr);
    for (const auto& s : L.segs)
      pc::unscale_check(TensorView{dg.ptr + s.offset * es, s.count, t}, dgs.as<float>(), dflag2.as<int>(), nullptr);
    float gs = 0.f;
    dgs.to_host(&gs);
    const double norm = std::sqrt(sumsq) / 8.0;
    const double coef = ds::precision::clip_coefficient(norm, clip);
    EXPECT(coef < 0.5, "test data must be clipped (coef %g)", coef);
    EXPECT(std::fabs(double(gs) - coef / 8.0) <= 1e-6 * coef / 8.0, "clip multiplier %g vs %g (%s)", gs, coef / 8.0,
           std::string(ds::dtype_name(t)).c_str());
    // The device scaled every element by its own multiplier, in the buffer's dtype.
    std::vector<float> f(L.n);
    ds::convert(gb.data(), t, f.data(), DType::F32, L.n);
    for (auto& x : f) x *= gs;
    std::vector<unsigned char> back(gb.size());
    dg.to_host(back.data());
    EXPECT(back == to_dtype(f, t), "clipped gradients (%s)", std::string(ds::dtype_name(t)).c_str());
    // The clipped global norm is the clip value.
    double sq2 = 0.0;
    std::vector<float> fb(L.n);
    ds::convert(back.data(), t, fb.data(), DType::F32, L.n);
    for (float x : fb) sq2 += double(x) * double(x);
    EXPECT(std::fabs(std::sqrt(sq2) - clip) <= (t == DType::F32 ? 1e-5 : 1e-2), "clipped norm %g, want %g (%s)",
           std::sqrt(sq2), double(clip), std::string(ds::dtype_name(t)).c_str());
    int flag2 = 1;
    dflag2.to_host(&flag2);
    EXPECT(flag2 == 0, "unscale_check flagged finite data");
  }
}

// The fused unscale + inf/NaN check across several buffers feeding one flag: finite
// elements are scaled, the flag is set by any bad buffer and never cleared by a later one.
void test_unscale_flag_several_buffers() {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const std::size_t es = ds::dtype_size(t);
    float mult = 0.25f;
    Dev dm(&mult, 4), dflag(nullptr, 4);
    int flag = -1;
    std::vector<std::vector<float>> vals;
    for (std::size_t i = 0; i < 3; ++i) vals.push_back(randv(kTensor[i], 40 + unsigned(i), 1.f));
    vals[1][3] = std::numeric_limits<float>::infinity();  // the middle buffer
    vals[2][278000] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::unique_ptr<Dev>> bufs;
    for (std::size_t i = 0; i < 3; ++i) {
      auto b = to_dtype(vals[i], t);
      bufs.push_back(std::make_unique<Dev>(b.data(), b.size()));
    }
    pc::unscale_check(TensorView{bufs[0]->ptr, kTensor[0], t}, dm.as<float>(), dflag.as<int>(), nullptr);
    dflag.to_host(&flag);
    EXPECT(flag == 0, "flag set by a finite buffer (%s)", std::string(ds::dtype_name(t)).c_str());
    pc::unscale_check(TensorView{bufs[1]->ptr, kTensor[1], t}, dm.as<float>(), dflag.as<int>(), nullptr);
    dflag.to_host(&flag);
    EXPECT(flag == 1, "inf not flagged (%s)", std::string(ds::dtype_name(t)).c_str());
    // A clean buffer afterwards leaves the flag set.
    auto clean = to_dtype(randv(7, 44, 1.f), t);
    Dev dclean(clean.data(), clean.size());
    pc::unscale_check(TensorView{dclean.ptr, 7, t}, dm.as<float>(), dflag.as<int>(), nullptr);
    dflag.to_host(&flag);
    EXPECT(flag == 1, "a clean buffer cleared the flag (%s)", std::string(ds::dtype_name(t)).c_str());
    // NaN alone (fresh flag), and every finite element scaled.
    int zero = 0;
    dflag.from_host(&zero);
    pc::unscale_check(TensorView{bufs[2]->ptr, kTensor[2], t}, dm.as<float>(), dflag.as<int>(), nullptr);
    dflag.to_host(&flag);
    EXPECT(flag == 1, "NaN not flagged (%s)", std::string(ds::dtype_name(t)).c_str());
    std::vector<unsigned char> back(kTensor[2] * es);
    bufs[2]->to_host(back.data());
    std::vector<float> got(kTensor[2]), want(kTensor[2]);
    ds::convert(back.data(), t, got.data(), DType::F32, kTensor[2]);
    const auto rounded = to_dtype(vals[2], t);
    ds::convert(rounded.data(), t, want.data(), DType::F32, kTensor[2]);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < kTensor[2]; ++i) {
      if (i == 278000) { bad += !std::isnan(got[i]); continue; }
      const auto one = to_dtype({want[i] * 0.25f}, t);
      float w1;
      ds::convert(one.data(), t, &w1, DType::F32, 1);
      bad += got[i] != w1;
    }
    EXPECT(bad == 0, "%zu elements wrongly unscaled (%s)", bad, std::string(ds::dtype_name(t)).c_str());
  }
}

// At min_loss_scale with raise_at_min_scale the CPU scaler throws; the device prologue
// sets `stuck`, skips, and leaves the state as the CPU scaler leaves it when it throws.
void test_stuck_at_min_scale() {
  ds::precision::LossScalerConfig cfg;
  cfg.initial_scale_power = 3;
  cfg.min_scale = 4.0;
  cfg.hysteresis = 1;
  cfg.raise_at_min_scale = true;
  ds::precision::LossScaler host(cfg);
  pc::DeviceScalerState st = pc::to_device_state(host.state());
  int found = 1;
  Dev dstate(&st, sizeof st), dfound(&found, 4), dsum(nullptr, 8), dskip(nullptr, 4), dgs(nullptr, 4), dnorm(nullptr, 4),
      dstep(nullptr, 8);
  bool threw = false;
  for (int k = 0; k < 3; ++k) {  // 8 -> 4 (min), then stuck twice
    try {
      host.update(true);
    } catch (const ds::Error&) {
      threw = true;
    }
    pc::step_prologue(dstate.as<pc::DeviceScalerState>(), cfg, dfound.as<int>(), dsum.as<double>(), 0.f,
                      dskip.as<int>(), dgs.as<float>(), dnorm.as<float>(), dstep.as<std::int64_t>(), nullptr);
  }
  dstate.to_host(&st);
  int skip = 0;
  std::int64_t steps = -1;
  dskip.to_host(&skip);
  dstep.to_host(&steps);
  const auto hs = host.state(), gs = pc::from_device_state(st);
  EXPECT(threw, "the CPU scaler must throw at its minimum");
  EXPECT(st.stuck == 1, "device prologue did not report the stuck scale");
  EXPECT(skip == 1 && steps == 0, "a stuck step must be skipped (skip %d, steps %lld)", skip, (long long)steps);
  EXPECT(gs.cur_scale == 4.0 && gs.cur_scale == hs.cur_scale && gs.cur_iter == hs.cur_iter &&
             gs.consecutive_overflows == hs.consecutive_overflows && gs.last_overflow_iter == hs.last_overflow_iter,
         "stuck state: device scale %g iter %lld overflows %lld, host %g iter %lld overflows %lld", gs.cur_scale,
         (long long)gs.cur_iter, (long long)gs.consecutive_overflows, hs.cur_scale, (long long)hs.cur_iter,
         (long long)hs.consecutive_overflows);
}

}  // namespace

int main() {
  if (int rc = cuda_test::skip_without_gpu("test_cuda_step")) return rc;
  try {
    test_pipeline();
    test_clip_in_place();
    test_unscale_flag_several_buffers();
    test_stuck_at_min_scale();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_cuda_step: error: %s\n", e.what());
    return 1;
  }
  return cuda_test::finish("test_cuda_step");
}
