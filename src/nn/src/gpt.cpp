#include "ds/nn/gpt.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>
#include <ctime>

#include "ds/core/error.h"
#include "ds/core/spin_wait.h"
#include "ds/nn/kernels.h"
#include "decoder_io.h"
#include "sampling.h"

namespace ds::nn {

namespace k = kernels;

// Op profiler: one entry per op name; a scope adds its process CPU time and elapsed time
// (clock_gettime costs well under 1 us; the ops take 50 us and more). Inside the forward's
// parallel region only thread 0 records: the forward ops' times are those of its share of
// the sequences, which the threads run side by side. A forward op also names its module
// (module_trees.h): while the flops profiler's profile is set, its elapsed time goes there.
enum Op : int {
  kEmbFwd, kLnFwd, kQkvFwd, kAttFwd, kAttProjFwd, kFcFwd, kGeluFwd, kFcProjFwd, kLmHeadFwd, kXentFwd,
  kXentBwd, kLmHeadBwd, kFcProjBwd, kGeluBwd, kFcBwd, kLnBwd, kAttProjBwd, kAttBwd, kQkvBwd, kEmbBwd,
  kParamsFwd, kGradFold, kNumOps
};
constexpr const char* kOpNames[kNumOps] = {
    "embedding fwd", "layernorm fwd", "qkv linear fwd", "attention fwd", "attn proj linear fwd",
    "fc linear fwd", "gelu fwd", "fc proj linear fwd", "lm head fwd", "cross-entropy fwd",
    "cross-entropy bwd", "lm head bwd", "fc proj linear bwd", "gelu bwd", "fc linear bwd",
    "layernorm bwd", "attn proj linear bwd", "attention bwd", "qkv linear bwd", "embedding bwd",
    "half dtype: params to fp32, zero grads", "grad fold + grad_ready"};

struct GptProf {
  Gpt* g;
  int op;
  double flops;
  int module;
  double t0 = 0, w0 = 0;
  static double clock_s(clockid_t id) {
    timespec ts;
    clock_gettime(id, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  GptProf(Gpt* gpt, int o, double f = 0, int m = -1)
      : g((gpt->profiling_ || (m >= 0 && gpt->mprof_)) && omp_get_thread_num() == 0 ? gpt : nullptr), op(o),
        flops(f), module(m) {
    if (!g) return;
    t0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    w0 = clock_s(CLOCK_MONOTONIC);
  }
  ~GptProf() {
    if (!g) return;
    const double wall = clock_s(CLOCK_MONOTONIC) - w0;
    if (g->profiling_) g->prof_.add(std::size_t(op), clock_s(CLOCK_PROCESS_CPUTIME_ID) - t0, wall, flops);
    if (module >= 0 && g->mprof_) g->mprof_->add_seconds(module, wall);
  }
};

void Gpt::set_profiling(bool on) {
  profiling_ = on;
  prof_.reset(kOpNames);
}

Gpt::Gpt(const GptConfig& cfg) : Decoder("Gpt", cfg.block_size, cfg.vocab_size, cfg.n_embd, true), cfg_(cfg) {
  DS_CHECK(cfg.n_layer > 0 && cfg.n_head > 0 && cfg.n_embd > 0 && cfg.block_size > 0 &&
               cfg.vocab_size > 0,
           "GptConfig: n_layer, n_head, n_embd, block_size and vocab_size must all be > 0 (got "
               << cfg.n_layer << ", " << cfg.n_head << ", " << cfg.n_embd << ", " << cfg.block_size
               << ", " << cfg.vocab_size << ")");
  DS_CHECK(cfg.n_embd % cfg.n_head == 0,
           "GptConfig: n_embd (" << cfg.n_embd << ") must be divisible by n_head (" << cfg.n_head << ")");
  const std::int64_t C = cfg.n_embd;
  wte_ = ps_.add("wte.weight", {cfg.vocab_size, C});
  wpe_ = ps_.add("wpe.weight", {cfg.block_size, C});
  for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    LayerIdx L;
    L.ln1w = ps_.add(p + "ln_1.weight", {C});
    L.ln1b = ps_.add(p + "ln_1.bias", {C});
    L.qkvw = ps_.add(p + "attn.c_attn.weight", {3 * C, C});
    L.qkvb = ps_.add(p + "attn.c_attn.bias", {3 * C});
    L.projw = ps_.add(p + "attn.c_proj.weight", {C, C});
    L.projb = ps_.add(p + "attn.c_proj.bias", {C});
    L.ln2w = ps_.add(p + "ln_2.weight", {C});
    L.ln2b = ps_.add(p + "ln_2.bias", {C});
    L.fcw = ps_.add(p + "mlp.c_fc.weight", {4 * C, C});
    L.fcb = ps_.add(p + "mlp.c_fc.bias", {4 * C});
    L.fcprojw = ps_.add(p + "mlp.c_proj.weight", {C, 4 * C});
    L.fcprojb = ps_.add(p + "mlp.c_proj.bias", {C});
    layers_.push_back(L);
  }
  lnfw_ = ps_.add("ln_f.weight", {C});
  lnfb_ = ps_.add("ln_f.bias", {C});
  groups_.push_back({"embed", wte_, 2});
  for (std::size_t l = 0; l < layers_.size(); ++l) groups_.push_back({"h." + std::to_string(l), layers_[l].ln1w, 12});
  groups_.push_back({"final", lnfw_, 2});
  const auto& infos = ps_.infos();
  gemm_grad_.assign(infos.size(), 0);
  gemm_grad_[wte_] = 1;
  for (const LayerIdx& P : layers_)
    for (std::size_t id : {P.qkvw, P.projw, P.fcw, P.fcprojw}) gemm_grad_[id] = 1;
  finished_ = std::vector<std::atomic<int>>(infos.size());
  claimed_ = std::vector<std::atomic<bool>>(infos.size());
  folded_ = std::vector<std::atomic<bool>>(infos.size());
  done_order_.reserve(infos.size());
  modules_ = gpt_modules(cfg_, infos);
}

// Each parameter from the seed and its own index: any range gives what the whole model does.
bool Gpt::init_parameter_range(std::size_t first, std::span<const std::span<float>> params, std::uint64_t seed) {
  const auto& infos = ps_.infos();
  DS_CHECK(first + params.size() <= infos.size(),
           "Gpt::init_parameter_range: parameters " << first << "+" << params.size() << " of " << infos.size());
  const float proj_std = 0.02f / std::sqrt(2.0f * float(cfg_.n_layer));
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::size_t i = first + k;
    const std::string& n = infos[i].name;
    DS_CHECK(params[k].size() == infos[i].numel(),
             "Gpt::init_parameters: '" << n << "' needs " << infos[i].numel() << " floats, got "
                                       << params[k].size());
    const bool is_ln = n.find("ln_") != std::string::npos;
    const bool is_bias = n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    if (is_bias) init_constant(params[k], 0.0f);
    else if (is_ln) init_constant(params[k], 1.0f);
    else if (n.find("c_proj.weight") != std::string::npos) init_normal(params[k], proj_std, seed, i);
    else init_normal(params[k], 0.02f, seed, i);
  }
  return true;
}

std::int64_t Gpt::arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const {
  const std::int64_t C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size, NH = cfg_.n_head;
  // Attention probabilities: B*NH*T*T <= (BT/T)*NH*T*T = BT*NH*T <= cap_bt*NH*cap_t.
  const std::int64_t att = N * NH * T;
  const auto pad = detail::pad16;
  const std::int64_t per_layer = pad(N * C) * 4 + pad(N) * 4 + pad(3 * N * C) + pad(att) +
                                 pad(4 * N * C) * 2;
  // Checkpointing keeps one block's activations (the residual streams stay for every block).
  const std::int64_t kept = checkpointing ? 1 : L;
  return per_layer * kept + pad(N * C) * (L + 1) + pad(N * C) + pad(N) * 3 + pad(N * V) + pad(N * C) * 3 +
         pad(3 * N * C) + pad(4 * N * C) + pad(T * T) * slots;
}

void Gpt::ensure_scratch(std::int64_t B, std::int64_t T) {
  float* arena = grow_arena(B, T);
  if (!arena) return;
  detail::ArenaCarve take{arena};
  const std::int64_t N = cap_bt_, C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size;
  const std::int64_t att = N * cfg_.n_head * cap_t_;
  acts_.assign(std::size_t(L), LayerAct{});
  for (std::size_t l = 0; l < (ckpt_ ? 1 : acts_.size()); ++l) {
    LayerAct& a = acts_[l];
    a.ln1 = take(N * C); a.ln1_mean = take(N); a.ln1_rstd = take(N);
    a.qkv = take(3 * N * C); a.att = take(att); a.atty = take(N * C); a.x1 = take(N * C);
    a.ln2 = take(N * C); a.ln2_mean = take(N); a.ln2_rstd = take(N);
    a.fch = take(4 * N * C); a.fch_gelu = take(4 * N * C);
  }
  if (ckpt_) std::fill(acts_.begin() + 1, acts_.end(), acts_[0]);  // every block in one block's space
  resid_.resize(std::size_t(L + 1));
  for (auto& r : resid_) r = take(N * C);
  lnf_ = take(N * C); lnf_mean_ = take(N); lnf_rstd_ = take(N); lse_ = take(N);
  logits_ = take(N * V);
  dres_ = take(N * C); dln_ = take(N * C); datty_ = take(N * C);
  dqkv_ = take(3 * N * C); dfch_ = take(4 * N * C);
  datt_scratch_ = take(cap_t_ * cap_t_ * att_slots_);
}

// Forward stages: 0 the embeddings, 1 .. n_layer the blocks, n_layer + 1 ln_f, n_layer + 2
// the tied head (the embeddings' group again). Backward stages: 0 the cross-entropy and the
// head, 1 ln_f, 2 .. n_layer + 1 the blocks from the last, n_layer + 2 the embeddings.
std::size_t Gpt::forward_group(int stage) const {
  const int L = int(layers_.size());
  return stage == L + 2 ? 0 : std::size_t(stage);
}

std::size_t Gpt::backward_group(int stage) const {
  const int L = int(layers_.size());
  if (stage == 0 || stage == L + 2) return 0;
  if (stage == 1) return std::size_t(L + 1);
  return std::size_t(L + 2 - stage);  // stage 2 -> block L-1 (group L)
}

void Gpt::run_layers(const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::size_t first,
                     std::size_t last) {
  ensure_scratch(B, T);
  B_ = B;
  T_ = T;
  const int s_begin = int(first), s_end = last == num_layers() ? num_stages() : int(last);
  // Each thread runs the whole forward on its own sequences (every op is row-local): no
  // barrier between ops, and each thread's activations stay in its own caches. The kernels
  // called inside run single-threaded.
  const int threads = int(std::min<std::int64_t>(B, omp_get_max_threads()));
  auto region = [&](int s0, int s1) {
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      // threads <= B: every thread has at least one sequence.
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const std::int64_t b0 = B * t / nt, b1 = B * (t + 1) / nt;
      forward_rows(tokens + b0 * T, b0, b1 - b0, T, s0, s1);
    }
  };
  if (!hooks_) {
    { GptProf pf(this, kParamsFwd, 0, modules_.model); prepare_layers(first, last); }
    region(s_begin, s_end);
    return;
  }
  // ZeRO-3: a region per stage, inside its group's bracket (half dtypes convert the group's
  // parameters there; the head reuses the embeddings' fp32 copy). The same rows per thread
  // and the same kernels: the same bits as one region.
  for (int st = s_begin; st < s_end; ++st) {
    const std::size_t grp = forward_group(st);
    GroupUse use(hooks_, grp, Pass::Forward);
    if (st != num_stages() - 1) {
      GptProf pf(this, kParamsFwd, 0, modules_.model);
      ps_.prepare_forward(groups_[grp].first, groups_[grp].count);
    }
    region(st, st + 1);
  }
}

void Gpt::forward_rows(const std::int32_t* tokens, std::int64_t b0, std::int64_t B, std::int64_t T, int s0,
                       int s1) {
  const std::int64_t C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size, N = B * T, r0 = b0 * T;
  const int L = int(layers_.size());
  auto at = [&](float* p, std::int64_t width) { return p + r0 * width; };
  if (s0 == 0) {
    GptProf pf(this, kEmbFwd, 0, modules_.embed);  // wte and wpe in one kernel
    k::embedding_forward(at(resid_[0], C), tokens, ps_.w(wte_), ps_.w(wpe_), B, T, C);
  }
  for (std::size_t l = std::size_t(std::max(s0, 1) - 1); int(l) < std::min(s1 - 1, L); ++l) {
    const LayerIdx& P = layers_[l];
    const LayerAct& a = acts_[l];
    const BlockModules& M = modules_.blocks[l];
    const float* x = at(resid_[l], C);
    {
      GptProf pf(this, kLnFwd, 0, M.norm_1);
      k::layernorm_forward(at(a.ln1, C), at(a.ln1_mean, 1), at(a.ln1_rstd, 1), x, ps_.w(P.ln1w), ps_.w(P.ln1b), N, C);
    }
    {
      GptProf pf(this, kQkvFwd, 2.0 * double(N) * double(3 * C) * double(C), M.q);
      k::linear_forward(at(a.qkv, 3 * C), at(a.ln1, C), ps_.w(P.qkvw), ps_.w(P.qkvb), nullptr, N, C, 3 * C, prec_);
    }
    {
      GptProf pf(this, kAttFwd, 4.0 * double(B * NH) * double(T) * double(T) * double(C / NH), M.attn);
      k::attention_forward(at(a.atty, C), a.att + b0 * NH * T * T, at(a.qkv, 3 * C), B, T, C, NH);
    }
    {
      GptProf pf(this, kAttProjFwd, 2.0 * double(N) * double(C) * double(C), M.attn_out);
      k::linear_forward(at(a.x1, C), at(a.atty, C), ps_.w(P.projw), ps_.w(P.projb), x, N, C, C, prec_);
    }
    {
      GptProf pf(this, kLnFwd, 0, M.norm_2);
      k::layernorm_forward(at(a.ln2, C), at(a.ln2_mean, 1), at(a.ln2_rstd, 1), at(a.x1, C), ps_.w(P.ln2w), ps_.w(P.ln2b), N, C);
    }
    {
      GptProf pf(this, kFcFwd, 2.0 * double(N) * double(4 * C) * double(C), M.up);
      k::linear_forward(at(a.fch, 4 * C), at(a.ln2, C), ps_.w(P.fcw), ps_.w(P.fcb), nullptr, N, C, 4 * C, prec_);
    }
    { GptProf pf(this, kGeluFwd, 0, M.mlp); k::gelu_forward(at(a.fch_gelu, 4 * C), at(a.fch, 4 * C), 4 * N * C); }
    {
      GptProf pf(this, kFcProjFwd, 2.0 * double(N) * double(4 * C) * double(C), M.down);
      k::linear_forward(at(resid_[l + 1], C), at(a.fch_gelu, 4 * C), ps_.w(P.fcprojw), ps_.w(P.fcprojb), at(a.x1, C), N, 4 * C, C, prec_);
    }
  }
  if (s0 <= L + 1 && L + 1 < s1) {
    GptProf pf(this, kLnFwd, 0, modules_.final_norm);
    k::layernorm_forward(at(lnf_, C), at(lnf_mean_, 1), at(lnf_rstd_, 1), at(resid_.back(), C), ps_.w(lnfw_), ps_.w(lnfb_), N, C);
  }
  if (L + 2 < s1) {
    GptProf pf(this, kLmHeadFwd, 2.0 * double(N) * double(V) * double(C), modules_.head);
    k::linear_forward(at(logits_, V), at(lnf_, C), ps_.w(wte_), nullptr, nullptr, N, C, V, prec_);
  }
}

float Gpt::mean_loss(std::int64_t N) {
  GptProf pf(this, kXentFwd);
  return Decoder::mean_loss(N);
}

void Gpt::run_backward(float scale, const std::function<void(std::size_t)>& grad_ready, std::size_t first,
                       std::size_t last) {
  // Layer i (0 < i <= n_layer) is backward stage n_layer + 2 - i; the head stages 0 and 1, the
  // embedding stage n_layer + 2.
  bwd_s0_ = last == num_layers() ? 0 : num_stages() - int(last);
  bwd_s1_ = num_stages() - int(first);
  // With several threads, each runs the whole backward on its own sequences, as a rank would,
  // with the kernels single-threaded: thread 0 into the gradients, every other thread into its
  // own fp32 partial, added in once every thread has passed the parameter. On the 2-vCPU guests
  // measured, two 1-thread processes on half the batch each made ~10% more tokens/s than one
  // process splitting every op between 2 threads (which waits for the slower vCPU at every op's
  // barrier); the partials cost (threads - 1) x the parameters in fp32, so past kMaxPartialBytes
  // the ops split instead.
  const int threads = int(std::min<std::int64_t>(B_, omp_get_max_threads()));
  const std::size_t total = ps_.total_numel();
  const bool split = threads > 1 && std::size_t(threads - 1) * total * sizeof(float) <= kMaxPartialBytes;
  // Half working dtypes on an own GEMM kernel: the Linear weight gradients go straight into
  // the engine's 16-bit gradients as their tiles are stored (no shadow to zero and fold);
  // with partials they go through the fp32 shadow, which the partials are added to.
  const bool direct = !split && ps_.dtype() != DType::F32 && own_gemm_for_layers(prec_);
  for (const LayerIdx& P : layers_)
    for (std::size_t id : {P.qkvw, P.projw, P.fcw, P.fcprojw}) ps_.set_direct_grad(id, direct);
  { GptProf pf(this, kParamsFwd, 0); ps_.prepare_backward(); }
  if (split) run_backward_partials(scale, grad_ready, threads, total);
  else run_backward_shared(scale, grad_ready);
}

void Gpt::run_backward_shared(float scale, const std::function<void(std::size_t)>& grad_ready) {
  auto done = [&](std::size_t id) {
    GptProf pf(this, kGradFold);
    ps_.finish_grad(id, grad_ready);
  };
  if (!hooks_) {
    backward_rows(0, B_, nullptr, -1, scale, done, bwd_s0_, bwd_s1_);
    return;
  }
  for (int st = bwd_s0_; st < bwd_s1_; ++st) {
    GroupUse use(hooks_, backward_group(st), Pass::Backward);
    backward_rows(0, B_, nullptr, -1, scale, done, st, st + 1);
  }
}

// The per-thread backward's shared state: the partials and thread 0's reports to grad_ready.
// A parameter's gradient is final once every thread has passed it; then its partials are added
// into the gradient, in thread order (the same bits whoever adds them). The thread that passed
// it first does that, when it next finishes a parameter of its own: a thread ahead of the
// others takes the folds, not the one behind, whose vCPU may be the slower (with the last
// thread to pass a parameter adding its partials, bf16 on 2 threads made ~1.7% fewer tokens/s
// than with the partials added after a barrier, medians of 8 interleaved pairs; this way, even
// with it). Thread 0 (the caller's thread, where MPI may be called) reports the folded
// gradients to grad_ready in its own completion order as it goes, so the engine starts its
// bucket reductions during the backward, not after it. Past its last parameter a thread folds
// whatever is left as it becomes final.
struct Gpt::PartialsPass {
  Gpt& gpt;
  const std::function<void(std::size_t)>& grad_ready;
  float scale;
  int threads;
  std::size_t total;  // floats per partial (every parameter)
  float* partial;     // threads - 1 partials, one after the other
  std::size_t reported = 0;  // how many of done_order_ grad_ready has had
  std::exception_ptr report_error;

  void report_folded() {
    if (report_error) return;
    try {
      while (reported < gpt.done_order_.size() &&
             gpt.folded_[gpt.done_order_[reported]].load(std::memory_order_acquire)) {
        GptProf pf(&gpt, kGradFold);
        const std::size_t id = gpt.done_order_[reported++];
        if (grad_ready) grad_ready(id);
      }
    } catch (...) {
      report_error = std::current_exception();  // rethrown after the region (an exception may not leave it)
    }
  }
  void fold(std::size_t id, int nt) {
    GptProf pf(&gpt, kGradFold);
    float* g = gpt.ps_.g(id);  // grad += partial 1 + partial 2 + ..., in thread order
    for (int u = 1; u < nt; ++u)
      k::add_inplace(g, partial + std::size_t(u - 1) * total + gpt.ps_.offset(id),
                     std::int64_t(gpt.ps_.infos()[id].numel()));
    gpt.ps_.fold_grad(id);  // half dtypes: the fp32 sum into the 16-bit gradient
    gpt.folded_[id].store(true, std::memory_order_release);
  }
  // Whether every thread has passed parameter id (acquire: their writes to it are visible).
  bool final_grad(std::size_t id, int nt) const {
    return gpt.finished_[id].load(std::memory_order_acquire) == nt;
  }
  void run_thread(int s0, int s1);
  // Stages [s0, s1) in one parallel region; every gradient the region passed is folded and
  // reported when it returns.
  void region(int s0, int s1) {
#pragma omp parallel num_threads(threads)
    run_thread(s0, s1);
    report_folded();  // the region's end: every gradient it passed is folded
    if (report_error) std::rethrow_exception(report_error);
  }
};

// One thread's share of a region: its sequences' backward, folding the gradients it passed
// first as they become final.
void Gpt::PartialsPass::run_thread(int s0, int s1) {
  // threads <= B_: every thread has at least one sequence.
  const int nt = omp_get_num_threads(), t = omp_get_thread_num();
  const std::int64_t b0 = gpt.B_ * t / nt, b1 = gpt.B_ * (t + 1) / nt;
  float* part = t == 0 ? nullptr : partial + std::size_t(t - 1) * total;
  // The parameters this thread passed (thread 0's list is done_order_, which grad_ready
  // follows) and those it passed first.
  std::vector<std::size_t> mine, first;
  std::vector<std::size_t>& passed = t == 0 ? gpt.done_order_ : mine;
  const std::size_t from = passed.size();  // earlier regions' parameters are all folded
  passed.reserve(gpt.ps_.infos().size());
  first.reserve(gpt.ps_.infos().size());
  std::size_t next_fold = 0;  // into `first`
  gpt.backward_rows(b0, b1 - b0, part, t, scale, [&](std::size_t id) {
    passed.push_back(id);
    if (gpt.finished_[id].fetch_add(1, std::memory_order_acq_rel) == 0) first.push_back(id);
    for (; next_fold < first.size() && final_grad(first[next_fold], nt); ++next_fold)
      if (!gpt.claimed_[first[next_fold]].exchange(true, std::memory_order_acq_rel)) fold(first[next_fold], nt);
    if (t == 0) report_folded();
  }, s0, s1);
  for (std::size_t i = from; i < passed.size(); ++i) {
    const std::size_t id = passed[i];
    spin_then_yield([&] { return final_grad(id, nt); }, 4096);
    if (!gpt.claimed_[id].exchange(true, std::memory_order_acq_rel)) fold(id, nt);
    if (t == 0) report_folded();
  }
}

void Gpt::run_backward_partials(float scale, const std::function<void(std::size_t)>& grad_ready, int threads,
                                std::size_t total) {
  const std::size_t need = std::size_t(threads - 1) * total;
  if (partial_.count() < need) partial_ = HostBuffer(need, DType::F32);
  done_order_.clear();
  for (std::size_t id = 0; id < ps_.infos().size(); ++id) {
    finished_[id].store(0, std::memory_order_relaxed);
    claimed_[id].store(false, std::memory_order_relaxed);
    folded_[id].store(false, std::memory_order_relaxed);
  }
  PartialsPass pass{*this, grad_ready, scale, threads, total, partial_.as<float>(), 0, nullptr};
  if (!hooks_) {
    pass.region(bwd_s0_, bwd_s1_);
    return;
  }
  // ZeRO-3: a region per stage inside its group's bracket; the gradients a stage completes
  // are folded and reported before its release.
  for (int st = bwd_s0_; st < bwd_s1_; ++st) {
    GroupUse use(hooks_, backward_group(st), Pass::Backward);
    pass.region(st, st + 1);
  }
}

// One backward_rows call: its rows, and where its gradients go: the ParamSet's, or the
// thread's partial. A partial's Linear weights are written by their GEMM (overwrite: no
// zeroing); the other parameters' parts (biases, LayerNorms, the position table) are zeroed
// first, and wte's is first written by the LM head's GEMM, then added to by the embedding
// backward (zeroed first when the call's stages start past the head).
struct Gpt::RowsPass {
  ParamSet& ps;
  std::int64_t b0, B, T, N, r0;  // sequences [b0, b0 + B); rows [r0, r0 + N)
  float* part;
  bool overwrite;  // part != nullptr
  const std::function<void(std::size_t)>& done;
  template <class E>
  E* at(E* p, std::int64_t width) const { return p + r0 * width; }
  float* g(std::size_t id) const { return part ? part + ps.offset(id) : ps.g(id); }
  k::HalfGrad half(std::size_t id) const {  // (backward() turns direct gradients off when there are partials)
    if (part || !ps.direct_grad(id)) return k::HalfGrad{};
    return k::HalfGrad{ps.bound_grad(id), ps.dtype() == DType::BF16};
  }
};

void Gpt::backward_rows(std::int64_t b0, std::int64_t B, float* part, int att_slot, float scale,
                        const std::function<void(std::size_t)>& done, int s0, int s1) {
  const std::int64_t T = T_;
  const int L = int(layers_.size());
  const RowsPass r{ps_, b0, B, T, B * T, b0 * T, part, part != nullptr, done};
  auto in = [&](int st) { return s0 <= st && st < s1; };
  if (part && s0 == bwd_s0_)
    for (std::size_t id = 0; id < gemm_grad_.size(); ++id)
      if (!gemm_grad_[id] || (id == wte_ && bwd_s0_ > 0))
        std::memset(r.g(id), 0, ps_.infos()[id].numel() * sizeof(float));
  if (in(0)) head_backward(r, scale);
  if (in(1)) final_norm_backward(r);
  // The attention's dP scratch: this thread's slot, or a slot for each of the kernel's threads.
  float* att_scratch = datt_scratch_ + std::int64_t(std::max(att_slot, 0)) * T * T;
  const int att_slots = att_slot >= 0 ? 1 : att_slots_;
  for (std::size_t li = layers_.size(); li-- > 0;) {
    if (!in(L + 1 - int(li))) continue;  // block li is stage n_layer + 1 - li
    // Checkpointing: block li's activations again from its input (these rows, the forward's
    // kernels: the same bits); the last block's are still there from the forward.
    if (ckpt_ && int(li) + 1 < L) forward_rows(tokens_.data() + r.r0, b0, B, T, int(li) + 1, int(li) + 2);
    mlp_backward(r, li);
    attention_backward(r, li, att_scratch, att_slots);
  }
  if (in(L + 2)) embedding_backward(r);
}

void Gpt::head_backward(const RowsPass& r, float scale) {
  const std::int64_t C = cfg_.n_embd, V = cfg_.vocab_size, N = r.N;
  // Fused softmax + cross-entropy gradient, in place over the logits (the mean over the batch).
  {
    GptProf pf(this, kXentBwd, 0);
    k::crossentropy_backward(r.at(logits_, V), r.at(lse_, 1), targets_.data() + r.r0, N, V, scale, B_ * r.T);
  }
  // LM head (tied to wte): dwte += dlogits^T lnf ; dlnf = dlogits wte.
  {
    GptProf pf(this, kLmHeadBwd, 2 * 2.0 * double(N) * double(V) * double(C));
    k::linear_backward(r.at(dln_, C), r.g(wte_), nullptr, r.at(logits_, V), r.at(lnf_, C), ps_.w(wte_), N, C, V,
                       false, prec_, {}, r.overwrite);
  }
  if (bwd_s1_ < num_stages()) r.done(wte_);  // a range without the embedding: the head's share is final
}

void Gpt::final_norm_backward(const RowsPass& r) {
  const std::int64_t C = cfg_.n_embd, N = r.N;
  float* dres = r.at(dres_, C);
  std::memset(dres, 0, std::size_t(N * C) * sizeof(float));
  {
    GptProf pf(this, kLnBwd, 0);
    k::layernorm_backward(dres, r.g(lnfw_), r.g(lnfb_), r.at(dln_, C), r.at(resid_.back(), C), ps_.w(lnfw_),
                          r.at(lnf_mean_, 1), r.at(lnf_rstd_, 1), N, C);
  }
  r.done(lnfw_);
  r.done(lnfb_);
}

// MLP: x2 = x1 + c_proj(gelu(c_fc(ln_2(x1)))); dres holds dL/dx2, then dL/dx1.
void Gpt::mlp_backward(const RowsPass& r, std::size_t li) {
  const std::int64_t C = cfg_.n_embd, N = r.N;
  const LayerIdx& P = layers_[li];
  const LayerAct& a = acts_[li];
  float* dres = r.at(dres_, C);
  {
    GptProf pf(this, kFcProjBwd, 2 * 2.0 * double(N) * double(4 * C) * double(C));
    k::linear_backward(r.at(dfch_, 4 * C), r.g(P.fcprojw), r.g(P.fcprojb), dres, r.at(a.fch_gelu, 4 * C),
                       ps_.w(P.fcprojw), N, 4 * C, C, false, prec_, r.half(P.fcprojw), r.overwrite);
  }
  r.done(P.fcprojw);
  r.done(P.fcprojb);
  {
    GptProf pf(this, kGeluBwd, 0);
    k::gelu_backward(r.at(dfch_, 4 * C), r.at(a.fch, 4 * C), r.at(dfch_, 4 * C), 4 * N * C);
  }
  {
    GptProf pf(this, kFcBwd, 2 * 2.0 * double(N) * double(4 * C) * double(C));
    k::linear_backward(r.at(dln_, C), r.g(P.fcw), r.g(P.fcb), r.at(dfch_, 4 * C), r.at(a.ln2, C), ps_.w(P.fcw), N,
                       C, 4 * C, false, prec_, r.half(P.fcw), r.overwrite);
  }
  r.done(P.fcw);
  r.done(P.fcb);
  {
    GptProf pf(this, kLnBwd, 0);
    k::layernorm_backward(dres, r.g(P.ln2w), r.g(P.ln2b), r.at(dln_, C), r.at(a.x1, C), ps_.w(P.ln2w),
                          r.at(a.ln2_mean, 1), r.at(a.ln2_rstd, 1), N, C);
  }
  r.done(P.ln2w);
  r.done(P.ln2b);
}

// Attention: x1 = x + c_proj(attn(c_attn(ln_1(x)))); dres holds dL/dx1, then dL/dx.
void Gpt::attention_backward(const RowsPass& r, std::size_t li, float* att_scratch, int att_slots) {
  const std::int64_t T = r.T, C = cfg_.n_embd, NH = cfg_.n_head, N = r.N;
  const LayerIdx& P = layers_[li];
  const LayerAct& a = acts_[li];
  float* dres = r.at(dres_, C);
  {
    GptProf pf(this, kAttProjBwd, 2 * 2.0 * double(N) * double(C) * double(C));
    k::linear_backward(r.at(datty_, C), r.g(P.projw), r.g(P.projb), dres, r.at(a.atty, C), ps_.w(P.projw), N, C,
                       C, false, prec_, r.half(P.projw), r.overwrite);
  }
  r.done(P.projw);
  r.done(P.projb);
  {
    GptProf pf(this, kAttBwd, 8.0 * double(r.B * NH) * double(T) * double(T) * double(C / NH));
    k::attention_backward(r.at(dqkv_, 3 * C), r.at(datty_, C), r.at(a.qkv, 3 * C), a.att + r.b0 * NH * T * T, r.B,
                          T, C, NH, att_scratch, att_slots);
  }
  {
    GptProf pf(this, kQkvBwd, 2 * 2.0 * double(N) * double(3 * C) * double(C));
    k::linear_backward(r.at(dln_, C), r.g(P.qkvw), r.g(P.qkvb), r.at(dqkv_, 3 * C), r.at(a.ln1, C), ps_.w(P.qkvw),
                       N, C, 3 * C, false, prec_, r.half(P.qkvw), r.overwrite);
  }
  r.done(P.qkvw);
  r.done(P.qkvb);
  {
    GptProf pf(this, kLnBwd, 0);
    k::layernorm_backward(dres, r.g(P.ln1w), r.g(P.ln1b), r.at(dln_, C), r.at(resid_[li], C), ps_.w(P.ln1w),
                          r.at(a.ln1_mean, 1), r.at(a.ln1_rstd, 1), N, C);
  }
  r.done(P.ln1w);
  r.done(P.ln1b);
}

void Gpt::embedding_backward(const RowsPass& r) {
  {
    GptProf pf(this, kEmbBwd, 0);
    k::embedding_backward(r.g(wte_), r.g(wpe_), r.at(dres_, cfg_.n_embd), tokens_.data() + r.r0, r.B, r.T,
                          cfg_.n_embd);
  }
  r.done(wpe_);
  r.done(wte_);
}

double Gpt::flops_per_token(std::int64_t seq) const {
  const double C = double(cfg_.n_embd), L = double(cfg_.n_layer), V = double(cfg_.vocab_size);
  const double T = double(seq > 0 ? seq : cfg_.block_size);
  const double n_matmul = L * 12.0 * C * C + V * C;
  return 6.0 * n_matmul + 12.0 * L * C * T;
}

}  // namespace ds::nn
