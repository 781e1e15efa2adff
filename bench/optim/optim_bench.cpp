// Optimizer step benchmark (not a test; bench/README.md).
//
// For each optimizer and precision: the fused step of ds::optim (Kernel::Cpu) in params/s
// and GB/s, beside a STREAM-style kernel with exactly the optimizer's access pattern (same
// arrays read, same arrays written in place, same fp16/bf16 gradient read and working write,
// one multiply-add per element) measured in the same run: the memory-bandwidth limit, the
// fastest of the pattern kernel with hardware prefetch only and with the kernels' software
// prefetch, and with a working copy, each with plain and with non-temporal working stores.
// Also torch.optim.AdamW(foreach=True) through /usr/bin/python3 for fp32 AdamW. Median of
// --repeats after one warm-up, ours and the pattern kernels timed in turn. Buffers are
// allocated and first-touched once.
//
// Check: before timing, one step of every optimizer and precision with the fast kernels
// (Kernel::Cpu) against the plain reference (Kernel::Ref) on the same inputs: master and
// states within 4 fp32 ulps, the working copy within 1 ulp of its dtype (tests/optim holds
// the exact bounds); a difference fails the run (exit 1). Headline: the median over the rows
// of ours / the pattern-kernel limit (GB/s); --min_ratio X fails the run (exit 3) below X.
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/core/half.h"
#include "ds/optim/optimizer.h"
#include "bench_report.h"
#include "simd.h"  // src/optim/src: the kernels' prefetch and vector rows, shared by the pattern kernel
#include "vec_avx2.h"
#include "vec_avx512.h"

using ds::DType;
using ds::TensorView;

namespace {

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Times the functions in turn, the starting one rotating each round (so a busy machine slows
// all alike); one warm-up call each; the median time of each.
std::vector<double> median_times(int repeats, const std::vector<std::function<void()>>& fs) {
  for (const auto& f : fs) f();
  std::vector<std::vector<double>> t(fs.size());
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t j0 = 0; j0 < fs.size(); ++j0) {
      const std::size_t j = (j0 + std::size_t(r)) % fs.size();
      const double t0 = now();
      fs[j]();
      t[j].push_back(now() - t0);
    }
  }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

// --- the STREAM-style pattern kernel -------------------------------------------------------
// rw arrays: read and written in place; ro arrays: read only; g: gradient (read, any dtype);
// w: working copy written from rw[0] (any dtype). x = x + (g + sum(ro)) * zero for every rw
// array, zero a runtime 0.0f: the same loads and stores, and one fused multiply-add per element,
// but the values stay as they are. (It used to add g + sum(ro): on the optimizer's own buffers
// that drove Adam's v and Adagrad's sum negative, so the timed optimizer steps took square
// roots of negative numbers and the NaN lanes fell to fast_div's exact-division path -- ours
// ran slower than it does on real data, Adagrad's compute ceiling read 2.0 instead of 3.4 G/s.)
// The AVX-512 version is specialised on the array counts and dtypes (a generic loop over the
// arrays costs ~20% of the bandwidth on one thread here, which would make the "limit" too
// easy) and runs the optimizer kernels' own loop, simd::stream_loop (two full vectors per
// iteration, masked tail), with or without their software prefetch and non-temporal working
// stores: the bench takes the fastest as the limit.
struct Pattern {
  std::vector<float*> rw, ro;
  TensorView g;  // data == nullptr: none
  TensorView w;  // data == nullptr: none
  float zero = 0;  // set from a volatile, so the compiler cannot drop the multiply-add
};

namespace simd = ds::optim::simd;

volatile float g_zero = 0.0f;

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
namespace on_avx512 {
using V = simd::Avx512;
#include "pattern_kernel.inc"
}  // namespace on_avx512
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace on_avx2 {
using V = simd::Avx2;
#include "pattern_kernel.inc"
}  // namespace on_avx2
#pragma GCC pop_options
#endif

void pattern_plain(const Pattern& pt, std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) {
    float acc = 0;
    if (pt.g.data) {
      if (pt.g.dtype == DType::F32) acc = pt.g.as<const float>()[i];
      else if (pt.g.dtype == DType::F16) acc = ds::f16_to_float(pt.g.as<const ds::f16>()[i]);
      else acc = ds::bf16_to_float(pt.g.as<const ds::bf16>()[i]);
    }
    for (float* r : pt.ro) acc += r[i];
    float first = acc;
    for (std::size_t j = 0; j < pt.rw.size(); ++j) { pt.rw[j][i] += acc * pt.zero; if (j == 0) first = pt.rw[j][i]; }
    if (pt.w.data) {
      if (pt.w.dtype == DType::F32) pt.w.as<float>()[i] = first;
      else if (pt.w.dtype == DType::F16) pt.w.as<ds::f16>()[i] = ds::float_to_f16(first);
      else pt.w.as<ds::bf16>()[i] = ds::float_to_bf16(first);
    }
  }
}

// prefetch: the optimizer kernels' software prefetch on or off; nt: the working copy (if any)
// written with non-temporal stores (simd::store16, as the kernels do from
// simd::kStreamWorkingBytes up) or plain ones.
// The vector row is that of the ISA in use (ds::cpu_isa(), DS_CPU_ISA lowers it), as the
// optimizers' kernels are chosen.
void run_pattern(const Pattern& pt, std::size_t n, bool prefetch, bool nt) {
  const ds::CpuIsa isa = ds::cpu_isa();
  const DType g = pt.g.data ? pt.g.dtype : simd::kNone, w = pt.w.data ? pt.w.dtype : simd::kNone;
#pragma omp parallel
  {
    const std::size_t t = std::size_t(omp_get_thread_num()), T = std::size_t(omp_get_num_threads());
    const std::size_t per = ((n + T - 1) / T + 15) & ~std::size_t(15);
    const std::size_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) {
      bool done = false;
#if defined(__x86_64__)
      if (isa == ds::CpuIsa::avx512) done = on_avx512::run_range(pt, g, w, lo, hi, prefetch, nt);
      if (isa == ds::CpuIsa::avx2) done = on_avx2::run_range(pt, g, w, lo, hi, prefetch, nt);
#endif
      if (!done) pattern_plain(pt, lo, hi);
    }
  }
}

// --- arguments -------------------------------------------------------------------------------
std::vector<long long> parse_list(const std::string& s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::stoll(x));
  return v;
}

double torch_adamw_seconds(const std::string& python, std::size_t n, int threads, int repeats) {
  const std::string cmd = "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184 OMP_NUM_THREADS=" +
                          std::to_string(threads) + " " + python + " " DS_OPTIM_BENCH_DIR "/torch_adamw.py " +
                          std::to_string(n) + " " + std::to_string(threads) + " " + std::to_string(repeats);
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  char line[512];
  double s = -1;
  while (std::fgets(line, sizeof line, f)) {
    const char* m = std::strstr(line, "median_s=");
    if (m) s = std::atof(m + 9);
  }
  pclose(f);
  return s;
}

// The optimizer every row times: the config's defaults, weight decay 0.01, SGD with momentum.
auto make_bench_optimizer(const char* type, ds::optim::Kernel kernel = ds::optim::Kernel::Cpu) {
  ds::config::OptimizerConfig cfg;
  cfg.type = type;
  cfg.weight_decay = 0.01;
  if (std::string(type) == "sgd") cfg.momentum = 0.9;
  return ds::optim::make_optimizer(cfg, kernel);
}

// Distance in units in the last place between two floats (0: same bits; signs handled).
std::int64_t ulps32(float a, float b) {
  std::int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  const std::int64_t ox = x < 0 ? std::int64_t(INT32_MIN) - x : x, oy = y < 0 ? std::int64_t(INT32_MIN) - y : y;
  return ox > oy ? ox - oy : oy - ox;
}
std::int64_t ulps16(std::uint16_t a, std::uint16_t b) {
  const std::int64_t ox = a & 0x8000 ? -std::int64_t(a & 0x7fff) : a, oy = b & 0x8000 ? -std::int64_t(b & 0x7fff) : b;
  return ox > oy ? ox - oy : oy - ox;
}

// One step of `type` with the fast kernels and with the reference on the same n inputs (two
// steps: the second sees non-zero state); the largest ulp distances of master + states and of
// the working copy.
std::pair<std::int64_t, std::int64_t> fast_vs_ref(const char* type, DType g, DType w, std::size_t n) {
  ds::HostBuffer grad32(n, DType::F32), grad(n, g == DType::U8 ? DType::F32 : g);
  for (std::size_t i = 0; i < n; ++i) grad32.as<float>()[i] = 1e-3f * float(int(i * 7 % 29) - 14) + 1e-5f * float(i % 3);
  ds::convert(grad32.data(), DType::F32, grad.data(), grad.dtype(), n);
  std::vector<float> master[2];
  std::vector<std::vector<float>> states[2];
  std::vector<std::uint16_t> work16[2];
  std::vector<float> work32[2];
  for (int k = 0; k < 2; ++k) {
    auto opt = make_bench_optimizer(type, k == 0 ? ds::optim::Kernel::Ref : ds::optim::Kernel::Cpu);
    opt->init_state(n);
    master[k].resize(n);
    for (std::size_t i = 0; i < n; ++i) master[k][i] = 0.01f * float(int(i % 97) - 48);
    work16[k].assign(n, 0);
    work32[k].assign(n, 0.f);
    const TensorView wv{w == DType::U8 ? nullptr : w == DType::F32 ? static_cast<void*>(work32[k].data()) : work16[k].data(), n,
                        w == DType::U8 ? DType::F32 : w};
    for (std::int64_t step = 1; step <= 2; ++step) {
      ds::optim::StepContext ctx;
      ctx.lr = 1e-3;
      ctx.step = step;
      opt->step(std::span<float>(master[k].data(), n), TensorView{grad.data(), n, grad.dtype()}, wv, {}, ctx);
    }
    for (auto& kv : opt->state_tensors()) states[k].emplace_back(kv.second.begin(), kv.second.end());
  }
  std::int64_t worst = 0, worst_w = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, ulps32(master[0][i], master[1][i]));
  for (std::size_t s = 0; s < states[0].size() && s < states[1].size(); ++s)
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, ulps32(states[0][s][i], states[1][s][i]));
  if (states[0].size() != states[1].size()) worst = INT64_MAX;
  for (std::size_t i = 0; i < n; ++i) {
    if (w == DType::F16 || w == DType::BF16) worst_w = std::max(worst_w, ulps16(work16[0][i], work16[1][i]));
    if (w == DType::F32) worst_w = std::max(worst_w, ulps32(work32[0][i], work32[1][i]));
  }
  return {worst, worst_w};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> sizes = {10000000, 100000000}, threads = {1, 2};
  int repeats = 5;
  std::string python;
  std::string only;
  double min_ratio = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "optim_bench: error: %s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--sizes") sizes = parse_list(next());
    else if (a == "--threads") threads = parse_list(next());
    else if (a == "--repeats") repeats = std::stoi(next());
    else if (a == "--python") python = next();
    else if (a == "--only") only = next();
    else if (a == "--min_ratio") min_ratio = ds::bench::parse_min_ratio("optim_bench", next());
    else {
      std::fprintf(stderr,
                   "usage: optim_bench [--sizes N,N] [--threads 1,2] [--repeats R] [--python /usr/bin/python3] "
                   "[--only adamw|sgd|adagrad|lamb] [--min_ratio X]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  const std::size_t nmax = std::size_t(*std::max_element(sizes.begin(), sizes.end()));
  std::printf("# optim_bench: cpu features: %s; kernels %s; repeats %d (median after 1 warm-up)\n",
              ds::cpu_features_string().c_str(), ds::cpu_isa_reason().c_str(), repeats);
  // Allocate and first-touch once (fresh pages are slow here).
  ds::HostBuffer p(nmax, DType::F32), s0(nmax, DType::F32), s1(nmax, DType::F32), g32(nmax, DType::F32);
  ds::HostBuffer g16(nmax, DType::F16), gbf16(nmax, DType::BF16), w16(nmax, DType::F16);
  for (std::size_t i = 0; i < nmax; ++i) {
    p.as<float>()[i] = 0.01f * float(i % 97);
    g32.as<float>()[i] = 1e-3f * float(int(i % 13) - 6);
  }
  ds::convert(g32.data(), DType::F32, g16.data(), DType::F16, nmax);
  ds::convert(g32.data(), DType::F32, gbf16.data(), DType::BF16, nmax);

  struct Variant { const char* opt; const char* prec; DType g, w; };
  const Variant variants[] = {
      {"adamw", "fp32", DType::F32, DType::U8}, {"adamw", "fp16", DType::F16, DType::F16}, {"adamw", "bf16", DType::BF16, DType::BF16},
      {"sgd", "fp32", DType::F32, DType::U8},   {"sgd", "bf16", DType::BF16, DType::BF16},
      {"adagrad", "fp32", DType::F32, DType::U8}, {"adagrad", "bf16", DType::BF16, DType::BF16},
      {"lamb", "fp32", DType::F32, DType::U8},  {"lamb", "bf16", DType::BF16, DType::BF16},
  };
  ds::bench::Report report("optim_bench");
  report.min_ratio(min_ratio);
  report["repeats"] = repeats;
  report["cpu_features"] = ds::cpu_features_string();
  report["isa"] = ds::isa_name(ds::cpu_isa());
  {  // the result check: fast kernels against the reference, one step (plus one on non-zero state)
    const std::size_t nc = 100003;  // odd: the vector loops' masked tails run too
    std::string worst_row;
    std::int64_t worst = 0, worst_w = 0;
    bool ok = true;
    for (const Variant& v : variants) {
      if (!only.empty() && only != v.opt) continue;
      const auto [m, wk] = fast_vs_ref(v.opt, v.g, v.w, nc);
      if (m > worst || wk > worst_w) worst_row = std::string(v.opt) + " " + v.prec;
      worst = std::max(worst, m);
      worst_w = std::max(worst_w, wk);
      ok = ok && m <= 4 && wk <= 1;
    }
    report.check("fast optimizer kernels equal the reference kernels (Kernel::Ref)", ok,
                 "largest distance over " + std::to_string(nc) + " params, 2 steps: master/state " + std::to_string(worst) +
                     " ulps (limit 4), working copy " + std::to_string(worst_w) + " ulps (limit 1)" +
                     (worst_row.empty() ? "" : ", at " + worst_row));
  }
  std::vector<double> ratios;
  nlohmann::json rows = nlohmann::json::array();
  const char* isa = ds::isa_name(ds::cpu_isa());
  std::printf("| isa | optimizer | precision | params | threads | B/param | ours G params/s | ours GB/s | pattern limit GB/s | ours / limit "
              "| pattern kernels GB/s (hw: hardware prefetch only, pf: + software prefetch, nt: non-temporal working stores) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (long long nn : sizes) {
    const std::size_t n = std::size_t(nn);
    for (long long th : threads) {
      omp_set_num_threads(int(th));
      for (const Variant& v : variants) {
        if (!only.empty() && only != v.opt) continue;
        auto opt = make_bench_optimizer(v.opt);
        opt->init_state(n);  // the optimizer's own state (first touch outside the timing)
        auto st = opt->state_tensors();
        const TensorView gv{v.g == DType::F32 ? g32.data() : v.g == DType::F16 ? g16.data() : gbf16.data(), n, v.g};
        const TensorView wv{v.w == DType::U8 ? nullptr : w16.data(), n, v.w == DType::U8 ? DType::F32 : v.w};
        const std::size_t half_io = v.g == DType::F32 ? 4 : 2;
        const std::size_t w_io = v.w == DType::U8 ? 0 : 2;
        std::int64_t step = 0;
        auto run_opt = [&] {
          ds::optim::StepContext ctx;
          ctx.lr = 1e-4;
          ctx.step = ++step;
          opt->step(std::span<float>(p.as<float>(), n), gv, wv, {}, ctx);
        };
        // The same access pattern, one multiply-add by zero per element, on the same buffers.
        std::vector<float*> states;
        for (auto& kv : st) states.push_back(kv.second.data());
        std::size_t bytes = 0;
        // The limit: the fastest median of the pattern kernel variants below (the most
        // demanding bound).
        std::vector<Pattern> passes;
        if (std::string(v.opt) == "lamb") {
          passes.push_back({{states[0], states[1]}, {p.as<float>()}, gv, {}});  // pass 1
          passes.push_back({{p.as<float>()}, {states[0], states[1]}, {}, wv});  // pass 2
          bytes = (4 + half_io + 2 * 8) + (12 + 4 + w_io);
        } else {
          passes.push_back({{p.as<float>()}, {}, gv, wv});
          for (float* s : states) passes[0].rw.push_back(s);
          bytes = (1 + states.size()) * 8 + half_io + w_io;
        }
        for (Pattern& pt : passes) pt.zero = g_zero;
        auto pattern = [&](bool pf, bool nt) { for (const Pattern& pt : passes) run_pattern(pt, n, pf, nt); };
        // The pattern variants: hardware prefetch only / + software prefetch, and, with a
        // working copy, each with plain and with non-temporal working stores.
        struct PatVariant { const char* name; bool pf, nt; };
        std::vector<PatVariant> pvs = {{"hw", false, false}, {"pf", true, false}};
        if (wv.data) {
          pvs.push_back({"hw+nt", false, true});
          pvs.push_back({"pf+nt", true, true});
        }
        std::vector<std::function<void()>> fs = {run_opt};
        for (const PatVariant& pv : pvs) fs.push_back([&, pv] { pattern(pv.pf, pv.nt); });
        const std::vector<double> med = median_times(repeats, fs);
        const double t_opt = med[0];
        std::size_t best = 1;
        for (std::size_t j = 2; j < med.size(); ++j)
          if (med[j] < med[best]) best = j;
        const double t_pat = med[best];
        std::string variants_gbs;
        for (std::size_t j = 1; j < med.size(); ++j) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%s%s %.1f", j > 1 ? ", " : "", pvs[j - 1].name, double(bytes) * double(n) / med[j] / 1e9);
          variants_gbs += buf;
        }
        const double gbs = double(bytes) * double(n) / t_opt / 1e9, lim = double(bytes) * double(n) / t_pat / 1e9;
        ratios.push_back(gbs / lim);
        rows.push_back({{"isa", isa}, {"optimizer", v.opt}, {"precision", v.prec}, {"params", nn}, {"threads", th},
                        {"bytes_per_param", bytes}, {"gparams_per_s", double(n) / t_opt / 1e9}, {"gbs", gbs},
                        {"limit_gbs", lim}, {"ratio", gbs / lim}});
        std::printf("| %s | %s | %s | %lldM | %lld | %zu | %.2f | %.1f | %.1f | %.2f | %s (limit: %s) |\n", isa, v.opt, v.prec,
                    nn / 1000000, th, bytes, double(n) / t_opt / 1e9, gbs, lim, gbs / lim, variants_gbs.c_str(),
                    pvs[best - 1].name);
        std::fflush(stdout);
      }
      if (!python.empty() && (only.empty() || only == "adamw")) {
        const double t = torch_adamw_seconds(python, n, int(th), repeats);
        if (t > 0) {
          report["torch_adamw"].push_back({{"params", nn}, {"threads", th}, {"gparams_per_s", double(n) / t / 1e9}});
          std::printf("| - | torch.optim.AdamW(foreach=True) 1.13 | fp32 | %lldM | %lld | 28 | %.3f | %.1f | - | - | - |\n", nn / 1000000,
                      th, double(n) / t / 1e9, 28.0 * double(n) / t / 1e9);
        } else {
          std::printf("| - | torch.optim.AdamW(foreach=True) | fp32 | %lldM | %lld | 28 | (failed to run %s) | | | | |\n", nn / 1000000, th,
                      python.c_str());
        }
        std::fflush(stdout);
      }
    }
  }
  // Compute ceiling: the same steps on 16384 cache-resident elements, one thread, timed in thread
  // CPU time (insensitive to other processes being scheduled): if this is well above the
  // memory limit in params/s, the kernel can hide its arithmetic behind the memory traffic.
  omp_set_num_threads(1);
  std::printf("\n| optimizer | precision | compute ceiling: 16 Ki cache-resident params, 1 thread (G params/s, thread CPU time) |\n| --- | --- | --- |\n");
  for (const Variant& v : variants) {
    if (!only.empty() && only != v.opt) continue;
    const std::size_t n = 16384;
    // Fresh parameters for each row: 25000 steps of the previous rows leave some of them
    // below 1e-18, whose squares (Lamb's norm) are denormal and run through microcode assists
    // (Lamb's ceiling read 0.8 instead of 1.3 G params/s).
    for (std::size_t i = 0; i < n; ++i) p.as<float>()[i] = 0.01f * float(i % 97);
    auto opt = make_bench_optimizer(v.opt);
    opt->init_state(n);
    const TensorView gv{v.g == DType::F32 ? g32.data() : v.g == DType::F16 ? g16.data() : gbf16.data(), n, v.g};
    const TensorView wv{v.w == DType::U8 ? nullptr : w16.data(), n, v.w == DType::U8 ? DType::F32 : v.w};
    std::vector<double> rates;
    std::int64_t step = 0;
    for (int r = 0; r < 5; ++r) {
      const int iters = 5000;
      const double t0 = thread_cpu_seconds();
      for (int k = 0; k < iters; ++k) {
        ds::optim::StepContext ctx;
        ctx.lr = 1e-4;
        ctx.step = ++step;
        opt->step(std::span<float>(p.as<float>(), n), gv, wv, {}, ctx);
      }
      rates.push_back(double(n) * iters / (thread_cpu_seconds() - t0) / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    std::printf("| %s | %s | %.2f |\n", v.opt, v.prec, rates[rates.size() / 2]);
    report["compute_ceiling_gparams_per_s"][std::string(v.opt) + "_" + v.prec] = rates[rates.size() / 2];
  }
  report["rows"] = rows;
  report.headline("ours / pattern-kernel limit (GB/s), median over " + std::to_string(ratios.size()) + " rows",
                  ds::bench::median(ratios));
  return report.finish();
}
