// Training throughput of the built-in GPT (or, --model llama, the Llama-style decoder of the
// same depth, width and context: RMSNorm, rotary, grouped-query attention with --kv_heads,
// default n_head / 2, SwiGLU of Llama's width rule) on the CPU, our side:
// tokens/s of forward + backward + the library's fused AdamW step (ds::optim::adam_cpu), and
// the compute bound (model FLOPs/token over the sgemm rate OpenBLAS reaches here, measured in
// the same run). --profile adds the per-op CPU-time split of a GPT step (run it on 1 thread).
// bench/train/run.sh runs this beside the same GPT in PyTorch and prints the table.
//
// Check: the loss is finite and falls (the median of the last 5 steps' below the first step's:
// one batch of the embedded corpus -- step 12 of this run -- has a loss far above its
// neighbours', so the last step alone is not a measure). Headline: tokens/s of
// the median step over the compute bound measured here; --min_ratio X fails the run below X.
// The last stdout line is its JSON: record (bench/README.md), which bench/train/run.sh reads.
//
//   bench_train [--model gpt|llama] [--dtype fp32|bf16|fp16] [--steps N] [--warmup N] [--layers 4]
//               [--heads 4] [--kv_heads N] [--embd 256] [--seq 128] [--vocab 256] [--batch 8] [--min_ratio X]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/core/half.h"
#include "ds/data/dataset.h"
#include "ds/data/sampler.h"
#include "ds/nn/gemm.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/optim/kernels.h"
#include "bench_report.h"

namespace {

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median sgemm GFLOP/s at the model's widest GEMM shape (BT x MLP width x C) and at n = 1024.
double sgemm_gflops(int M, int N, int K, int reps, double (*clock)() = now) {
  ds::HostBuffer a(std::size_t(M) * K, ds::DType::F32), b(std::size_t(N) * K, ds::DType::F32),
      c(std::size_t(M) * N, ds::DType::F32);
  for (std::size_t i = 0; i < a.count(); ++i) a.as<float>()[i] = float(i % 7) * 0.1f;
  for (std::size_t i = 0; i < b.count(); ++i) b.as<float>()[i] = float(i % 5) * 0.1f;
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = clock();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.as<float>(), K, b.as<float>(), K,
                0.0f, c.as<float>(), N);
    if (r >= 2) t.push_back(clock() - t0);
  }
  std::sort(t.begin(), t.end());
  return 2.0 * M * N * K / t[t.size() / 2] / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype = "fp32", model_type = "gpt";
  int steps = 20, warmup = 3, kv_heads = 0;
  ds::nn::GptConfig cfg{4, 4, 256, 128, 256};
  std::int64_t B = 8;
  bool gemm_bf16 = false, verbose = false, profile = false;
  double min_ratio = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--dtype") dtype = next();
    else if (a == "--model") model_type = next();
    else if (a == "--kv_heads") kv_heads = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--layers") cfg.n_layer = std::stoi(next());
    else if (a == "--heads") cfg.n_head = std::stoi(next());
    else if (a == "--embd") cfg.n_embd = std::stoi(next());
    else if (a == "--seq") cfg.block_size = std::stoi(next());
    else if (a == "--vocab") cfg.vocab_size = std::stoi(next());
    else if (a == "--batch") B = std::stoi(next());
    else if (a == "--min_ratio") min_ratio = ds::bench::parse_min_ratio("bench_train", next());
    else if (a == "--verbose") verbose = true;
    else if (a == "--profile") profile = true;
    else if (a == "--gemm") gemm_bf16 = next() == "bf16";
    else { std::fprintf(stderr, "bench_train: error: unknown flag %s\n", a.c_str()); return 2; }
  }
  if (model_type != "gpt" && model_type != "llama") {
    std::fprintf(stderr, "bench_train: error: --model %s: expected gpt or llama\n", model_type.c_str());
    return 2;
  }
  if (model_type == "llama" && profile) {
    std::fprintf(stderr, "bench_train: error: --profile times the GPT's ops only (not with --model llama)\n");
    return 2;
  }
  const bool is_llama = model_type == "llama";
  const ds::DType dt = ds::parse_dtype(dtype);
  const std::int64_t T = cfg.block_size;
  // One of the two models; the loop below sees a ds::Module and these three views of it.
  std::unique_ptr<ds::nn::Gpt> gpt;
  std::unique_ptr<ds::nn::Llama> llama;
  std::function<void(ds::nn::Precision)> set_precision;
  std::function<ds::nn::Precision()> precision;
  std::function<double(std::int64_t)> flops_per_token;
  std::int64_t mlp_width = 4 * cfg.n_embd;  // the widest GEMM's N (the bound's model shape)
  if (is_llama) {
    ds::nn::LlamaConfig lc;
    lc.n_layer = cfg.n_layer;
    lc.n_head = cfg.n_head;
    lc.n_kv_head = kv_heads > 0 ? kv_heads : std::max<std::int64_t>(1, cfg.n_head / 2);
    lc.n_embd = cfg.n_embd;
    lc.block_size = cfg.block_size;
    lc.vocab_size = cfg.vocab_size;
    llama = std::make_unique<ds::nn::Llama>(lc);
    mlp_width = llama->config().intermediate_size;
    set_precision = [m = llama.get()](ds::nn::Precision p) { m->set_gemm_precision(p); };
    precision = [m = llama.get()] { return m->gemm_precision(); };
    flops_per_token = [m = llama.get()](std::int64_t t) { return m->flops_per_token(t); };
  } else {
    gpt = std::make_unique<ds::nn::Gpt>(cfg);
    set_precision = [m = gpt.get()](ds::nn::Precision p) { m->set_gemm_precision(p); };
    precision = [m = gpt.get()] { return m->gemm_precision(); };
    flops_per_token = [m = gpt.get()](std::int64_t t) { return m->flops_per_token(t); };
  }
  ds::Module& model = is_llama ? static_cast<ds::Module&>(*llama) : static_cast<ds::Module&>(*gpt);
  if (gemm_bf16) set_precision(ds::nn::Precision::BF16);
  auto infos = model.parameters();
  // Engine-like flat storage: fp32 master + Adam moments, working params/grads in dt.
  std::size_t P = 0;
  for (const auto& p : infos) P += p.numel();
  ds::HostBuffer master(P, ds::DType::F32), m1(P, ds::DType::F32), m2(P, ds::DType::F32);
  ds::HostBuffer work(P, dt), grad(P, dt);
  std::vector<std::span<float>> spans;
  std::vector<ds::TensorView> pv, gv;
  std::size_t off = 0;
  const std::size_t es = ds::dtype_size(dt);
  for (auto& p : infos) {
    spans.push_back({master.as<float>() + off, p.numel()});
    pv.push_back({static_cast<char*>(work.data()) + off * es, p.numel(), dt});
    gv.push_back({static_cast<char*>(grad.data()) + off * es, p.numel(), dt});
    off += p.numel();
  }
  model.init_parameters(spans, 1234);
  ds::convert(master.data(), ds::DType::F32, work.data(), dt, P);
  model.bind(pv, gv);

  auto data = ds::data::TextDataset::embedded();
  ds::data::Loader loader(data, T, ds::data::DistributedSampler(data.num_samples(T), 1, 0, std::size_t(B), true, 1, true));

  double t_fwd = 0, t_bwd = 0, t_opt = 0, t_total = 0, cpu_total = 0, cpu_opt = 0;
  float loss = 0, first_loss = 0;
  std::vector<double> step_s;
  std::vector<double> losses;
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int s = 0; s < warmup + steps; ++s) {
    ds::Batch batch = loader.next();
    if (profile && s == warmup) gpt->set_profiling(true);
    const double c0 = cpu_now();
    const double t0 = now();
    loss = model.forward(batch);
    if (s == 0) first_loss = loss;
    losses.push_back(loss);
    if (verbose) std::printf("step %d loss %.4f\n", s, loss);
    const double t1 = now();
    model.backward(1.0f, {});
    const double t2 = now();
    const double cb = cpu_now();
    // The library's fused AdamW (ds::optim::adam_cpu, what the engine runs) over the flat
    // fp32 master, reading the grads and writing the working params in the working dtype;
    // then zero the grads.
    ds::optim::AdamHyper h;
    h.lr = lr;
    h.beta1 = b1;
    h.beta2 = b2;
    h.eps = eps;
    h.weight_decay = wd;
    h.bc1 = 1.0f - std::pow(b1, float(s + 1));
    h.bc2 = 1.0f - std::pow(b2, float(s + 1));
    ds::optim::adam_cpu(master.as<float>(), m1.as<float>(), m2.as<float>(), ds::TensorView{grad.data(), P, dt},
                        ds::TensorView{work.data(), P, dt}, P, h);
    std::memset(grad.data(), 0, grad.bytes());
    const double t3 = now();
    const double c3 = cpu_now();
    if (s >= warmup) {
      t_fwd += t1 - t0; t_bwd += t2 - t1; t_opt += t3 - t2; t_total += t3 - t0;
      step_s.push_back(t3 - t0);
      cpu_total += c3 - c0; cpu_opt += c3 - cb;
    }
  }
  // Linear forward, input and weight gradients (attention is always the own kernel when the
  // CPU has AVX-512).
  const std::string gemm_name =
      precision() == ds::nn::Precision::BF16 ? std::string("own-bf16")
                                                        : std::string(ds::nn::own_f32_for_layers() ? "own-f32" : "openblas");
  const double tokens = double(B * T) * steps;
  const double tps = tokens / t_total;
  const double fpt = flops_per_token(T);
  const int threads = omp_get_max_threads();
  const double gf_model = sgemm_gflops(int(B * T), int(mlp_width), int(cfg.n_embd), 10);
  const double gf_1024 = sgemm_gflops(1024, 1024, 1024, 5);
  const double bound = std::max(gf_model, gf_1024) * 1e9 / fpt;
  // The same rate per CPU-second (all threads' CPU time): with cpu_ms_per_step, a comparison
  // that a loaded machine distorts far less than wall time.
  const double gf_1024_cpu = sgemm_gflops(1024, 1024, 1024, 5, cpu_now);
  const double tps_median = double(B * T) / ds::bench::median(step_s);
  ds::bench::Report report("bench_train");
  report.min_ratio(min_ratio);
  report["impl"] = "dstrain";
  report["model"] = model_type;
  report["dtype"] = dtype;
  report["threads"] = threads;
  report["tokens_per_s"] = tps;
  report["tokens_per_s_median"] = tps_median;
  report["fwd_ms"] = 1e3 * t_fwd / steps;
  report["bwd_ms"] = 1e3 * t_bwd / steps;
  report["opt_ms"] = 1e3 * t_opt / steps;
  report["flops_per_token"] = fpt;
  report["sgemm_gflops_model"] = gf_model;
  report["sgemm_gflops_1024"] = gf_1024;
  report["bound_tokens_per_s"] = bound;
  report["cpu_ms_per_step"] = 1e3 * cpu_total / steps;
  report["sgemm_gflops_1024_cpu"] = gf_1024_cpu;
  report["loss_first"] = first_loss;
  report["loss_last"] = loss;
  report["params"] = P;
  report["steps"] = steps;
  report["gemm"] = gemm_name;
  report["openblas_core"] = openblas_get_corename();
  const std::size_t recent = std::min<std::size_t>(5, losses.size());
  const double recent_median = ds::bench::median({losses.end() - std::ptrdiff_t(recent), losses.end()});
  report["loss_recent_median"] = recent_median;
  report.check("the loss is finite and falls",
               std::isfinite(first_loss) && std::isfinite(recent_median) && recent_median < first_loss,
               "first " + std::to_string(first_loss) + ", median of the last " + std::to_string(recent) + " " +
                   std::to_string(recent_median) + " after " + std::to_string(warmup + steps) + " steps");
  report.headline("tokens/s (median step) / compute bound (sgemm measured here)", tps_median / bound);
  {
    std::printf("dstrain %s %lldL %lldH%s %lld wide, seq %lld, vocab %lld, batch %lld, %s, %d threads, %zu params\n",
                is_llama ? "Llama" : "GPT", (long long)cfg.n_layer, (long long)cfg.n_head,
                is_llama ? (" (" + std::to_string(llama->config().n_kv_head) + " kv, MLP " +
                            std::to_string(mlp_width) + ")").c_str()
                         : "",
                (long long)cfg.n_embd, (long long)T,
                (long long)cfg.vocab_size, (long long)B, dtype.c_str(), threads, P);
    std::printf("  linear GEMMs: %s (CPU kernel set %s, OpenBLAS core %s)\n", gemm_name.c_str(),
                ds::isa_name(ds::cpu_isa()), openblas_get_corename());
    std::printf("  tokens/s %.0f  (fwd %.1f ms, bwd %.1f ms, adamw %.1f ms per step)  loss %.3f -> %.3f\n", tps,
                1e3 * t_fwd / steps, 1e3 * t_bwd / steps, 1e3 * t_opt / steps, first_loss, loss);
    std::printf("  model %.1f MFLOP/token; sgemm %.0f GFLOP/s (model shape), %.0f GFLOP/s (n=1024); "
                "bound %.0f tokens/s; achieved %.0f%% of bound\n",
                fpt / 1e6, gf_model, gf_1024, bound, 100.0 * tps / bound);
  }
  if (profile) {
    // Per-op split of the step by process CPU time (run with OMP_NUM_THREADS=1 for a clean
    // split: with more threads it includes OpenMP spin-waits), and by elapsed time (where a
    // multi-threaded step spends its time; GFLOP/s by elapsed time).
    const double step_ms = 1e3 * cpu_total / steps;
    const double gf_cpu = gf_1024_cpu;
    std::printf("\nper-op CPU time per step (%d threads; step %.1f ms CPU, %.0f tokens/s by CPU time):\n",
                threads, step_ms, double(B * T) / (cpu_total / steps));
    std::printf("| op | ms/step | share | GFLOP/s | wall ms/step | GFLOP/s (wall) |\n"
                "| --- | --- | --- | --- | --- | --- |\n");
    double gemm_ms = 0, other_ms = 0, acc = 0, wall_acc = 0;
    for (const auto& e : gpt->profile()) {
      if (e.calls == 0) continue;
      const double ms = 1e3 * e.cpu_s / steps, wms = 1e3 * e.wall_s / steps;
      acc += ms;
      wall_acc += wms;
      (e.flops > 0 ? gemm_ms : other_ms) += ms;
      if (e.flops > 0)
        std::printf("| %s | %.2f | %.1f%% | %.1f | %.2f | %.1f |\n", e.op.c_str(), ms, 100 * ms / step_ms,
                    e.flops / e.cpu_s / 1e9, wms, e.flops / e.wall_s / 1e9);
      else
        std::printf("| %s | %.2f | %.1f%% | - | %.2f | - |\n", e.op.c_str(), ms, 100 * ms / step_ms, wms);
    }
    const double opt_ms = 1e3 * cpu_opt / steps;
    const double wall_step = 1e3 * t_total / steps, wall_opt = 1e3 * t_opt / steps;
    std::printf("| optimizer (AdamW + grad zero + param copy) | %.2f | %.1f%% | - | %.2f | - |\n", opt_ms,
                100 * opt_ms / step_ms, wall_opt);
    std::printf("| rest (loader, loss, timers) | %.2f | %.1f%% | - | %.2f | - |\n", step_ms - acc - opt_ms,
                100 * (step_ms - acc - opt_ms) / step_ms, wall_step - wall_acc - wall_opt);
    std::printf("GEMM ops (linear, attention incl. softmax): %.1f ms (%.0f%%); other model ops %.1f ms\n", gemm_ms,
                100 * gemm_ms / step_ms, other_ms);
    const double bound_ms = fpt * double(B * T) / (gf_cpu * 1e9) * 1e3;
    std::printf("bound by CPU time: sgemm n=1024 %.1f GFLOP/s -> %.1f ms/step; this step is at %.0f%% of it\n",
                gf_cpu, bound_ms, 100 * bound_ms / step_ms);
  }
  return report.finish();
}
