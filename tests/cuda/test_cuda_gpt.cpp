// GptCuda against the CPU Gpt (the reference), at an awkward small size (3 heads of 16,
// vocab 67, T = 17 of block_size 20):
//   1. fp32 (no TF32): loss, every gradient (accumulated += onto random prefilled values),
//      the grad_ready order, evaluate(), logits_last(), and backward after evaluate throws.
//   2. bf16 and fp16 working dtype: loss and gradients against the fp32 CPU model run on the
//      same (rounded) parameter values, within the dtype's precision.
//   3. Training sanity: bf16 GptCuda + the device Adam on one fixed batch, the loss falls.
//   4. Bad input throws ds::Error (token id out of range, seq > block_size, mixed dtypes).
// Exit codes: 0 pass, 1 failure, 77 no GPU (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "model_test_util.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/nn/gpt.h"
#include "ds/nn/gpt_cuda.h"
#include "ds/optim/cuda_kernels.h"
#include "tokens.h"

using ds::DType;
using ds::TensorView;
using namespace cuda_test;  // Dev, randv, to_dtype, tokens, the model helpers and measures

namespace {

// Head size 16 (48 / 3) by default. Flash attention has kernels for head sizes 32, 64 and
// 128 only (else GptCuda falls back to the materialised path), so with --attention flash
// (ctest cuda.gpt_flash_attention) main() makes the model 64 wide with 2 heads: head size 32.
// --attention_block N (ctest cuda.gpt_attention_blocks) sets the materialised path's blocks.
ds::nn::GptCudaAttention kAttention;
ds::nn::GptConfig kCfg{/*n_layer*/ 2, /*n_head*/ 3, /*n_embd*/ 48, /*block_size*/ 20, /*vocab*/ 67};
constexpr std::uint64_t kSeed = 1234;
constexpr std::int64_t kB = 3, kT = 17;

std::string dname(DType t) { return std::string(ds::dtype_name(t)); }

std::vector<std::vector<float>> init_values(ds::Module& m) { return cuda_test::init_values(m, kSeed); }

// The CPU reference on host fp32 buffers; GptCuda on device buffers of dtype t (rounded to t).
struct CpuSide : cuda_test::CpuModel<ds::nn::Gpt> {
  CpuSide(const std::vector<std::vector<float>>& params, const std::vector<std::vector<float>>& grads)
      : CpuModel(params, grads, kCfg) {}
};
struct GpuSide : cuda_test::GpuModel<ds::nn::GptCuda> {
  GpuSide(const std::vector<std::vector<float>>& params, const std::vector<std::vector<float>>& grads, DType dt)
      : GpuModel(params, grads, dt, kCfg, /*allow_tf32=*/false, kAttention) {}
};

// ---- 1. fp32 against the CPU model ----
void test_fp32() {
  ds::nn::Gpt twin(kCfg);
  const auto infos = twin.parameters();
  const auto params = init_values(twin);
  {
    // GptCuda's parameter list and init are Gpt's.
    ds::nn::GptCuda probe(kCfg, false, kAttention);
    const auto ginfos = probe.parameters();
    bool same_list = ginfos.size() == infos.size();
    for (std::size_t i = 0; same_list && i < infos.size(); ++i)
      same_list = ginfos[i].name == infos[i].name && ginfos[i].shape == infos[i].shape;
    EXPECT(same_list, "GptCuda::parameters() differs from Gpt's");
    EXPECT(init_values(probe) == params, "GptCuda::init_parameters differs from Gpt's");
    EXPECT(probe.num_parameters() == twin.num_parameters(), "num_parameters %zu vs %zu", probe.num_parameters(),
           twin.num_parameters());
    EXPECT(probe.flops_per_token(17) == twin.flops_per_token(17), "flops_per_token differs");
  }
  // Prefilled gradients: backward must accumulate (+=) onto them.
  std::vector<std::vector<float>> grads;
  for (std::size_t i = 0; i < infos.size(); ++i) grads.push_back(randv(infos[i].numel(), 500 + unsigned(i), 1e-3f));
  CpuSide cpu(params, grads);
  GpuSide gpu(params, grads, DType::F32);
  const Tokens tok = make_tokens(kB, kT, kCfg.vocab_size, 11);
  const ds::Batch b = tok.batch();

  const float eval = gpu.m.evaluate(b);
  EXPECT(throws_error([&] { gpu.m.backward(1.f, {}); }, "forward"), "backward after evaluate() must throw");
  const float lc = cpu.m.forward(b), lg = gpu.m.forward(b);
  const double rel = std::fabs(double(lg) - double(lc)) / std::fabs(double(lc));
  std::printf("fp32: loss cpu %.7f gpu %.7f (rel %.2e), evaluate %.7f\n", lc, lg, rel, eval);
  EXPECT(rel <= 1e-5, "fp32 loss: cpu %.7f gpu %.7f rel %.3e", lc, lg, rel);
  EXPECT(std::fabs(double(eval) - double(lg)) <= 1e-6 * std::fabs(double(lg)), "evaluate %.8f vs forward %.8f", eval,
         lg);

  std::vector<std::size_t> order_c, order_g;
  cpu.m.backward(1.7f, [&](std::size_t i) { order_c.push_back(i); });
  gpu.m.backward(1.7f, [&](std::size_t i) { order_g.push_back(i); });
  const std::set<std::size_t> uniq(order_g.begin(), order_g.end());
  EXPECT(order_g.size() == infos.size() && uniq.size() == infos.size(),
         "grad_ready: %zu calls, %zu distinct, %zu parameters", order_g.size(), uniq.size(), infos.size());
  EXPECT(order_g == order_c, "grad_ready order differs from the CPU model's");
  double worst = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto gg = gpu.grad(i);
    const double den = max_abs(cpu.g[i]), err = max_diff(gg, cpu.g[i]) / (den > 0 ? den : 1.0);
    if (!(err <= worst)) { worst = err; worst_name = infos[i].name; }
    EXPECT(err <= 1e-4, "fp32 gradient '%s': max|gpu-cpu|/max|cpu| = %.3e (max|cpu| %.3e)", infos[i].name.c_str(), err,
           den);
  }
  std::printf("fp32: worst gradient error %.2e (%s) over %zu tensors\n", worst, worst_name.c_str(), infos.size());

  // logits_last with a context longer than block_size (its last block_size tokens count).
  const Tokens ctx = make_tokens(1, 25, kCfg.vocab_size, 12);
  const auto llc = cpu.m.logits_last(ctx.in), llg = gpu.m.logits_last(ctx.in);
  const double lerr = llg.size() == llc.size() ? max_diff(llg, llc) / max_abs(llc) : 1.0;
  std::printf("fp32: logits_last max|gpu-cpu|/max|cpu| = %.2e\n", lerr);
  EXPECT(llg.size() == std::size_t(kCfg.vocab_size) && lerr <= 1e-4, "logits_last error %.3e", lerr);
  EXPECT(throws_error([&] { gpu.m.backward(1.f, {}); }, "forward"), "backward after logits_last must throw");

  // Generation: the same sampler on (nearly) the same logits.
  const std::vector<std::int32_t> prompt(ctx.in.begin(), ctx.in.begin() + 5);
  expect_generation_close(cpu.m, gpu.m, prompt, kCfg.vocab_size, "fp32");
}

// ---- 2. bf16 / fp16 against the fp32 CPU model on the same rounded values ----
void test_half(DType t) {
  ds::nn::Gpt twin(kCfg);
  const auto infos = twin.parameters();
  auto params = init_values(twin);
  for (auto& p : params) p = rounded(p, t);  // exactly representable in t: both sides start equal
  // Zero gradients here (fp32 checked +=): a prefill would dilute the relative error.
  std::vector<std::vector<float>> grads;
  for (const auto& info : infos) grads.emplace_back(info.numel(), 0.0f);
  CpuSide cpu(params, grads);
  GpuSide gpu(params, grads, t);
  const Tokens tok = make_tokens(kB, kT, kCfg.vocab_size, 21);
  const float lc = cpu.m.forward(tok.batch()), lg = gpu.m.forward(tok.batch());
  const double rel = std::fabs(double(lg) - double(lc)) / std::fabs(double(lc));
  std::printf("%s: loss cpu(fp32) %.6f gpu %.6f (rel %.2e)\n", dname(t).c_str(), lc, lg, rel);
  EXPECT(rel <= 3e-2, "%s loss: cpu %.6f gpu %.6f rel %.3e", dname(t).c_str(), lc, lg, rel);
  cpu.m.backward(1.7f, {});
  gpu.m.backward(1.7f, {});
  // Tolerance: every activation (and every gradient) is rounded to the 16-bit dtype after
  // each op, ~30 rounded ops deep through forward and backward; unit roundoff is 2^-9 for
  // bf16 (8-bit significand) and 2^-12 for fp16, and a gradient summed over many rows of
  // rounded terms (LayerNorm, bias, embedding) loses a little more. The bounds leave ~10x
  // over the expected ~0.5% (bf16) / ~0.1% (fp16) relative L2 error.
  const double tol = t == DType::BF16 ? 0.08 : 0.02;
  expect_half_grads_close(gpu, cpu.g, infos, tol, dname(t));
}

// ---- 3. bf16 training on one fixed batch with the device Adam ----
void test_training() {
  const DType t = DType::BF16;
  ds::nn::GptCuda m(kCfg, false, kAttention);
  const auto infos = m.parameters();
  const auto init = init_values(m);
  // Flat storage as an engine lays it out: every tensor starts on a 64-element boundary.
  std::vector<std::size_t> off;
  std::size_t n = 0;
  for (const auto& info : infos) {
    off.push_back(n);
    n += (info.numel() + 63) / 64 * 64;
  }
  std::vector<float> master(n, 0.0f);
  for (std::size_t i = 0; i < infos.size(); ++i) std::copy(init[i].begin(), init[i].end(), master.begin() + std::ptrdiff_t(off[i]));
  const auto w16 = to_dtype(master, t);
  Dev dp(master.data(), n * 4), dm(nullptr, n * 4), dv(nullptr, n * 4), dw(w16.data(), w16.size()), dg(nullptr, n * 2);
  std::vector<TensorView> pv, gv;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    pv.push_back({dw.ptr + off[i] * 2, infos[i].numel(), t});
    gv.push_back({dg.ptr + off[i] * 2, infos[i].numel(), t});
  }
  m.bind(pv, gv);
  auto s = static_cast<cudaStream_t>(m.device_stream());
  const Tokens tok = make_tokens(4, 16, kCfg.vocab_size, 77);
  std::vector<float> losses;
  for (int step = 1; step <= 40; ++step) {
    losses.push_back(m.forward(tok.batch()));
    m.backward(1.0f, {});
    ds::optim::AdamHyper h;
    h.lr = 3e-3f;
    h.bc1 = float(1.0 - std::pow(double(h.beta1), double(step)));
    h.bc2 = float(1.0 - std::pow(double(h.beta2), double(step)));
    ds::optim::cuda::adam(dp.as<float>(), dm.as<float>(), dv.as<float>(), TensorView{dg.ptr, n, t},
                          TensorView{dw.ptr, n, t}, n, h, ds::optim::cuda::DeviceStepControl{}, s);
    CU(cudaMemsetAsync(dg.ptr, 0, n * 2, s));
  }
  CU(cudaStreamSynchronize(s));
  std::printf("bf16 training: loss step 1 %.4f, 10 %.4f, 20 %.4f, 40 %.4f\n", losses[0], losses[9], losses[19],
              losses[39]);
  bool finite = true;
  for (float l : losses) finite = finite && std::isfinite(l);
  EXPECT(finite, "a training loss is not finite");
  EXPECT(losses[39] < 0.5f * losses[0], "loss did not fall below half: %.4f -> %.4f", losses[0], losses[39]);
}

// ---- 4. bad input ----
void test_bad_input() {
  ds::nn::Gpt twin(kCfg);
  const auto infos = twin.parameters();
  const auto params = init_values(twin);
  std::vector<std::vector<float>> grads;
  for (const auto& info : infos) grads.emplace_back(info.numel(), 0.0f);
  GpuSide gpu(params, grads, DType::F32);
  std::string what;
  Tokens tok = make_tokens(2, 5, kCfg.vocab_size, 31);
  tok.in[7] = std::int32_t(kCfg.vocab_size);
  EXPECT(throws_error([&] { gpu.m.forward(tok.batch()); }, "out of range", &what), "token id %d must throw",
         tok.in[7]);
  std::printf("bad token: %s\n", what.c_str());
  tok.in[7] = -1;
  EXPECT(throws_error([&] { gpu.m.evaluate(tok.batch()); }, "out of range"), "token id -1 must throw");
  const Tokens longer = make_tokens(1, kCfg.block_size + 1, kCfg.vocab_size, 32);
  EXPECT(throws_error([&] { gpu.m.forward(longer.batch()); }, "block_size", &what), "seq > block_size must throw");
  std::printf("long seq: %s\n", what.c_str());
  // One gradient in another dtype.
  auto gv = gpu.gv;
  gv[3].dtype = DType::BF16;
  EXPECT(throws_error([&] { gpu.m.bind(gpu.pv, gv); }, "dtype", &what), "mixed dtypes must throw");
  std::printf("mixed dtypes: %s\n", what.c_str());
  // Host memory is not device memory.
  std::vector<float> host(gpu.pv[0].count);
  auto pv = gpu.pv;
  pv[0].data = host.data();
  EXPECT(throws_error([&] { gpu.m.bind(pv, gpu.gv); }, "device memory", &what), "host pointers must throw");
  std::printf("host pointer: %s\n", what.c_str());
  // Still usable after the rejected binds.
  const Tokens ok = make_tokens(2, 5, kCfg.vocab_size, 33);
  const float l = gpu.m.forward(ok.batch());
  EXPECT(std::isfinite(l), "forward after rejected binds: loss %f", l);
}

}  // namespace

// usage: test_cuda_gpt [--attention materialized|flash] [--attention_block N]
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--attention" && (std::string(argv[i + 1]) == "flash" ||
                                              std::string(argv[i + 1]) == "materialized")) {
      kAttention.flash = std::string(argv[++i]) == "flash";
    } else if (i + 1 < argc && a == "--attention_block" && std::atoll(argv[i + 1]) >= 1) {
      kAttention.block = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "test_cuda_gpt: error: bad argument '%s' (see the usage line in the source)\n", a.c_str());
      return 2;
    }
  }
  if (kAttention.flash) {
    kCfg.n_head = 2;
    kCfg.n_embd = 64;
  }
  if (int rc = cuda_test::skip_without_gpu("test_cuda_gpt")) return rc;
  try {
    test_fp32();
    test_half(DType::BF16);
    test_half(DType::F16);
    test_training();
    test_bad_input();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_cuda_gpt: error: %s\n", e.what());
    return 1;
  }
  return cuda_test::finish("test_cuda_gpt");
}
