// GPU training throughput of the built-in GPT (GptCuda) through the Engine, as a user's job
// runs it: forward, backward, step (AdamW, fp32 master, bf16 / fp16 / fp32 working dtype,
// gradient clipping) on one GPU.
//
//   bench_gpt_cuda [--layers 12 --heads 12 --embd 768 --block 1024 --vocab 50304
//                   --batch 16 --steps 40 --warmup 4 --dtype bf16|fp16|fp32 --tf32
//                   --profile_steps 3]
//
// Prints tokens/s and MFU = tokens/s x FLOPs per token (Gpt::flops_per_token: 6 N_matmul +
// 12 L C T, attention counted in full) / the datasheet dense peak (bf16/fp16 989.4 TFLOP/s on
// an H100/H200 SXM; fp32 66.9, TF32 494.7), and beside it the rate of one large cuBLAS GEMM
// in the same dtype measured in this run (8192^3, median of 20): the ceiling this GPU really
// reaches. The default shape is GPT-2 124M (vocab padded to 50304 as nanoGPT does).
// Check: the loss is finite and falls (last timed step's below the first step's; the four
// cycled batches are learnt). Headline: model TFLOP/s over the cuBLAS GEMM's, both measured
// here; --min_ratio X fails the run below X. The last line is its JSON: record
// (bench/README.md).
// Exit: 0, 1 a wrong result (or an error), 2 bad arguments, 3 below --min_ratio, 77 without a GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/cuda_check.h"
#include "ds/engine/engine.h"
#include "ds/nn/gpt_cuda.h"
#include "self_comm.h"
#include "bench_report.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One large GEMM in dtype dt (fp32 accumulation) on random data: the measured ceiling.
double gemm_tflops(ds::DType dt, bool tf32) {
  const int n = 8192;
  const std::size_t es = ds::dtype_size(dt), bytes = std::size_t(n) * n * es;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  DS_CUDA_CHECK(cudaMalloc(&a, bytes));
  DS_CUDA_CHECK(cudaMalloc(&b, bytes));
  DS_CUDA_CHECK(cudaMalloc(&c, bytes));
  {  // random bits of the right kind: values in [-1, 1) converted on the host
    std::vector<unsigned char> h(bytes);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (std::size_t i = 0; i < std::size_t(n) * n; ++i) {
      const float x = u(rng);
      if (dt == ds::DType::F32) {
        std::memcpy(&h[i * 4], &x, 4);
      } else {
        std::uint32_t bits;
        std::memcpy(&bits, &x, 4);
        std::uint16_t v;
        if (dt == ds::DType::BF16) {
          v = std::uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
        } else {  // fp16 of a value in [-1, 1): plain truncation of the mantissa is enough here
          const std::uint32_t sign = (bits >> 16) & 0x8000u;
          const int e = int((bits >> 23) & 0xff) - 127 + 15;
          v = e <= 0 ? std::uint16_t(sign) : std::uint16_t(sign | (std::uint32_t(e) << 10) | ((bits >> 13) & 0x3ffu));
        }
        std::memcpy(&h[i * 2], &v, 2);
      }
    }
    DS_CUDA_CHECK(cudaMemcpy(a, h.data(), bytes, cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMemcpy(b, h.data(), bytes, cudaMemcpyHostToDevice));
  }
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) DS_THROW("cublasCreate failed");
  const cudaDataType_t t = dt == ds::DType::F32 ? CUDA_R_32F : dt == ds::DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const cublasComputeType_t ct = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.f, beta = 0.f;
  auto run = [&] {
    if (cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, t, n, b, t, n, &beta, c, t, n, ct,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      DS_THROW("cublasGemmEx failed");
  };
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t e0, e1;
  DS_CUDA_CHECK(cudaEventCreate(&e0));
  DS_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    DS_CUDA_CHECK(cudaEventRecord(e0));
    run();
    DS_CUDA_CHECK(cudaEventRecord(e1));
    DS_CUDA_CHECK(cudaEventSynchronize(e1));
    float m = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * double(n) * n * n / (median(ms) * 1e-3) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t layers = 12, heads = 12, embd = 768, block = 1024, vocab = 50304, batch = 16;
  int steps = 40, warmup = 4;
  std::string dtype = "bf16";
  bool tf32 = false;
  int profile_steps = 3;  // per-op profile after the timed steps (0: none)
  double min_ratio = 0;
  std::string attention = "materialized";  // kernels.attention: materialized or flash
  std::int64_t attention_block = 256;      // kernels.attention_block
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_gpt_cuda: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--layers") layers = std::atoll(next());
    else if (a == "--heads") heads = std::atoll(next());
    else if (a == "--embd") embd = std::atoll(next());
    else if (a == "--block") block = std::atoll(next());
    else if (a == "--vocab") vocab = std::atoll(next());
    else if (a == "--batch") batch = std::atoll(next());
    else if (a == "--steps") steps = std::atoi(next());
    else if (a == "--warmup") warmup = std::atoi(next());
    else if (a == "--dtype") dtype = next();
    else if (a == "--tf32") tf32 = true;
    else if (a == "--profile_steps") profile_steps = std::atoi(next());
    else if (a == "--attention") attention = next();
    else if (a == "--attention_block") attention_block = std::atoll(next());
    else if (a == "--min_ratio") min_ratio = ds::bench::parse_min_ratio("bench_gpt_cuda", next());
    else {
      std::fprintf(stderr, "bench_gpt_cuda: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (attention != "materialized" && attention != "flash") {
    std::fprintf(stderr, "bench_gpt_cuda: --attention must be materialized or flash\n");
    return 2;
  }
  if (attention_block < 1) {
    std::fprintf(stderr, "bench_gpt_cuda: --attention_block must be at least 1\n");
    return 2;
  }
  if (dtype != "bf16" && dtype != "fp16" && dtype != "fp32") {
    std::fprintf(stderr, "bench_gpt_cuda: --dtype must be bf16, fp16 or fp32\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_gpt_cuda: no CUDA device visible: skipped\n");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const ds::DType dt = dtype == "bf16" ? ds::DType::BF16 : dtype == "fp16" ? ds::DType::F16 : ds::DType::F32;
    const double gemm_peak = gemm_tflops(dt, tf32);
    const double spec_peak = dt == ds::DType::F32 ? (tf32 ? 494.7 : 66.9) : 989.4;

    ds::nn::GptConfig g;
    g.n_layer = layers;
    g.n_head = heads;
    g.n_embd = embd;
    g.block_size = block;
    g.vocab_size = vocab;
    ds::nn::GptCudaAttention att;
    att.flash = attention == "flash";
    att.block = attention_block;
    ds::nn::GptCuda model(g, tf32, att);
    std::string cfg_text = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(batch) +
                           R"(, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "seed": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}})";
    if (dt == ds::DType::BF16) cfg_text += R"(, "bf16": {"enabled": true})";
    if (dt == ds::DType::F16) cfg_text += R"(, "fp16": {"enabled": true, "initial_scale_power": 12})";
    cfg_text += "}";
    auto init = ds::initialize(ds::config::parse_config_text(cfg_text, "bench_gpt_cuda config"), model, std::make_shared<ds::test::SelfComm>());
    ds::Engine& engine = *init.engine;

    // A few random batches, cycled (tokens uniform over the vocabulary).
    const std::size_t N = std::size_t(batch * block);
    std::mt19937 rng(3);
    std::uniform_int_distribution<std::int32_t> tok(0, std::int32_t(vocab - 1));
    std::vector<std::vector<std::int32_t>> data(4, std::vector<std::int32_t>(N + 1));
    for (auto& d : data)
      for (auto& t : d) t = tok(rng);

    std::vector<double> step_ms, fwd_ms, bwd_ms;
    float first_loss = 0, last_loss = 0;
    auto batch_of = [&](int s) {  // batch s: the cycled data, targets shifted by one
      const auto& d = data[std::size_t(s) % data.size()];
      ds::Batch b;
      b.inputs = std::span<const std::int32_t>(d.data(), N);
      b.targets = std::span<const std::int32_t>(d.data() + 1, N);
      b.batch = batch;
      b.seq = block;
      return b;
    };
    for (int s = 0; s < warmup + steps; ++s) {
      const ds::Batch b = batch_of(s);
      // Timed as a job runs it; the split (forward returns after its loss sync, backward is
      // synchronised here only in the split runs) comes from every other step.
      const bool split = s % 2 == 1;
      using clock = std::chrono::steady_clock;
      auto ms_since = [](clock::time_point t) { return std::chrono::duration<double, std::milli>(clock::now() - t).count(); };
      const auto t0 = clock::now();
      const float loss = engine.forward(b);
      const double f = ms_since(t0);
      engine.backward(loss);
      if (split) DS_CUDA_CHECK(cudaDeviceSynchronize());
      const double fb = ms_since(t0);
      engine.step();  // synchronises (the overflow / norm check reads two device scalars)
      DS_CUDA_CHECK(cudaDeviceSynchronize());
      const double ms = ms_since(t0);
      if (s == 0) first_loss = loss;
      last_loss = loss;
      if (s >= warmup) {
        if (!split) step_ms.push_back(ms);
        fwd_ms.push_back(f);
        if (split) bwd_ms.push_back(fb - f);
      }
    }
    // Per-op device time of 3 more steps (events around each op: a little slower than the
    // timed steps above, which ran without them).
    model.set_profiling(profile_steps > 0);
    for (int s = 0; s < profile_steps; ++s) {
      const ds::Batch b = batch_of(s);
      engine.backward(engine.forward(b));
      engine.step();
    }
    auto prof = model.profile();
    model.set_profiling(false);
    std::sort(prof.begin(), prof.end(), [](const auto& a, const auto& b) { return a.wall_s > b.wall_s; });
    double prof_total = 0;
    for (const auto& o : prof) prof_total += 1e3 * o.wall_s;
    if (profile_steps > 0) {
      const double ps = double(profile_steps);
      std::printf("per-op device time, mean of %d profiled steps (model ops only: %.2f ms per step)\n", profile_steps,
                  prof_total / ps);
      std::printf("| op | ms per step | %% | calls per step |\n| --- | --- | --- | --- |\n");
      for (const auto& o : prof)
        std::printf("| %s | %.3f | %.1f | %lld |\n", o.op.c_str(), 1e3 * o.wall_s / ps, 100.0 * 1e3 * o.wall_s / prof_total,
                    static_cast<long long>(o.calls / profile_steps));
    }

    const double ms = median(step_ms);
    const double tps = double(N) / (ms * 1e-3);
    const double tflops = tps * model.flops_per_token(block) / 1e12;
    std::printf("# bench_gpt_cuda: %s, GPT %lld layers, %lld heads, %lld wide, context %lld, vocab %lld (%.1f M "
                "parameters), micro-batch %lld, %s, AdamW via the Engine, median of %d unsplit steps after %d warm-up\n",
                prop.name, static_cast<long long>(layers), static_cast<long long>(heads), static_cast<long long>(embd),
                static_cast<long long>(block), static_cast<long long>(vocab), double(model.num_parameters()) / 1e6,
                static_cast<long long>(batch), dtype.c_str(), int(step_ms.size()), warmup);
    if (att.flash && dt != ds::DType::F32)
      std::printf("attention: flash (--attention flash)\n");
    else
      std::printf("attention: materialised, block-causal cuBLAS batched GEMMs (%lld-row query blocks) + causal softmax\n",
                  static_cast<long long>(att.block));
    std::printf("loss: first %.4f, last %.4f (ln V = %.4f)\n", first_loss, last_loss, std::log(double(vocab)));
    std::printf("split (medians): forward %.2f ms (incl. its loss sync), backward %.2f ms, step %.2f ms\n",
                median(fwd_ms), median(bwd_ms), ms - median(fwd_ms) - median(bwd_ms));
    std::printf("| dtype | step ms | tokens/s | model TFLOP/s | MFU (vs %.1f spec) | vs cuBLAS %s GEMM (%.1f TFLOP/s, this run) |\n",
                spec_peak, dtype.c_str(), gemm_peak);
    std::printf("| --- | --- | --- | --- | --- | --- |\n");
    std::printf("| %s | %.2f | %.0f | %.1f | %.1f%% | %.1f%% |\n", dtype.c_str(), ms, tps, tflops, 100.0 * tflops / spec_peak,
                100.0 * tflops / gemm_peak);
    std::printf("mfu %s: %.1f%% (target >= 40%% on an H200): %s\n", dtype.c_str(), 100.0 * tflops / spec_peak,
                tflops / spec_peak >= 0.40 ? "met" : "NOT met");
    ds::bench::Report report("bench_gpt_cuda");
    report.min_ratio(min_ratio);
    report["gpu"] = prop.name;
    report["dtype"] = dtype;
    report["attention"] = att.flash && dt != ds::DType::F32 ? "flash" : "materialized";
    report["params"] = model.num_parameters();
    report["batch"] = batch;
    report["block"] = block;
    report["step_ms"] = ms;
    report["tokens_per_s"] = tps;
    report["model_tflops"] = tflops;
    report["mfu"] = tflops / spec_peak;
    report["cublas_gemm_tflops"] = gemm_peak;
    report["loss_first"] = first_loss;
    report["loss_last"] = last_loss;
    report.check("the loss is finite and falls", std::isfinite(first_loss) && std::isfinite(last_loss) && last_loss < first_loss,
                 "first " + std::to_string(first_loss) + ", last " + std::to_string(last_loss));
    report.headline("model TFLOP/s / cuBLAS " + dtype + " GEMM TFLOP/s (measured here)", tflops / gemm_peak);
    return report.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt_cuda: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
