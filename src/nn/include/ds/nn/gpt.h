// GPT-2 style decoder (pre-LayerNorm blocks, tied token embedding / LM head, final LayerNorm),
// implementing ds::Module exactly as a user's model would.
//
// Parameters (PyTorch Linear layout: weight[out, in]), in this order:
//   wte.weight [V, C], wpe.weight [block_size, C], then per layer l:
//   h.l.ln_1.weight/bias [C], h.l.attn.c_attn.weight [3C, C] / bias [3C],
//   h.l.attn.c_proj.weight [C, C] / bias [C], h.l.ln_2.weight/bias [C],
//   h.l.mlp.c_fc.weight [4C, C] / bias [4C], h.l.mlp.c_proj.weight [C, 4C] / bias [C],
//   and ln_f.weight/bias [C]. The LM head reuses wte.weight (tied, as GPT-2).
// Init as GPT-2: weights N(0, 0.02), the two residual projections (c_proj) N(0, 0.02 /
// sqrt(2 n_layer)), biases 0, LayerNorm weight 1.
//
// Activations are sized at the first forward for a batch x seq and reused (grown only when a
// larger batch x seq arrives). Not thread-safe: one forward/backward at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/module.h"
#include "ds/nn/gemm.h"
#include "ds/nn/op_profile.h"
#include "ds/nn/params.h"

namespace ds::nn {

struct GptConfig {
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 256;
  std::int64_t block_size = 128;
  std::int64_t vocab_size = 256;
};

class Gpt : public Module {
 public:
  explicit Gpt(const GptConfig& cfg);  // validates cfg (n_embd % n_head == 0, all > 0)

  std::vector<ParamInfo> parameters() const override { return ps_.infos(); }
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  bool init_parameter_range(std::size_t first, std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  // ZeRO-3 groups in execution order: "embed" (wte, wpe), "h.0" .. "h.{n_layer-1}" (a block
  // each), "final" (ln_f). The tied LM head acquires "embed" again (forward and backward).
  std::vector<ParamGroup> parameter_groups() const override { return groups_; }
  // The model brackets with the ParamSet's hooks: they wrap these and keep the fp32 shadows
  // of half dtypes to the groups in use (ParamSet::set_group_hooks).
  void set_group_hooks(GroupHooks* hooks) override { hooks_ = ps_.set_group_hooks(hooks, groups_); }
  // Host bytes of the fp32 parameter/gradient shadows (half dtypes; ParamSet::shadow_bytes).
  std::size_t shadow_bytes() const { return ps_.shadow_bytes(); }

  const GptConfig& config() const { return cfg_; }

  // Activation checkpointing (DeepSpeed's deepspeed.checkpointing.checkpoint around each
  // block): forward keeps each block's input (the residual stream) and what the loss needs,
  // and one block's activations, which every block overwrites; backward recomputes a block's
  // activations from its input just before that block's backward (inside its group bracket).
  // The same kernels on the same rows: the same loss and gradient bits either way.
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return ckpt_; }
  // Bytes of the activation arena (activations and backward scratch) a micro-batch of B
  // sequences x T tokens allocates with the current setting and thread count; arena_bytes():
  // what is allocated now (the largest micro-batch so far).
  std::size_t activation_bytes(std::int64_t B, std::int64_t T) const { return activation_bytes(B, T, ckpt_); }
  std::size_t activation_bytes(std::int64_t B, std::int64_t T, bool checkpointing) const;
  std::size_t arena_bytes() const { return arena_.count() * sizeof(float); }
  // GEMM precision of the Linear layers (attention GEMMs stay fp32). By default chosen at
  // bind() from the working dtype: layer_precision() (BF16 for bf16 parameters where this CPU
  // runs vdpbf16ps faster than fp32 FMA, else F32). BF16 rounds GEMM inputs to bf16
  // (vdpbf16ps, fp32 accumulation): see ds/nn/gemm.h. set_gemm_precision() fixes it.
  void set_gemm_precision(Precision p) { prec_ = p; prec_fixed_ = true; }
  Precision gemm_precision() const { return prec_; }
  std::size_t num_parameters() const { return ps_.total_numel(); }

  // Training FLOPs per token (forward + backward): 6 * N_matmul + 6 * n_layer * T * C with
  // T = seq (attention's QK^T and PV, causal half not counted as saved), where N_matmul
  // counts the weights that enter GEMMs (all Linear weights + the tied LM head; not the
  // position table, biases or LayerNorms). `seq` defaults to block_size.
  double flops_per_token(std::int64_t seq = 0) const;

  // Logits (vocab_size floats) for the token after `context` (its last block_size tokens
  // are used). Overwrites the activations cached by forward(): call outside forward/backward.
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  // Samples n_new tokens after context (temperature <= 0: greedy), deterministic per seed.
  std::vector<std::int32_t> generate(std::span<const std::int32_t> context, int n_new,
                                     float temperature, std::uint64_t seed);

  // Per-op profile of forward/backward (benchmarks, op_profile.h): when enabled, every kernel
  // call adds the process CPU time it took (all threads; run 1 thread for a clean split) and
  // its elapsed time to its op.
  using OpTime = ds::nn::OpTime;
  void set_profiling(bool on);
  const std::vector<OpTime>& profile() const { return prof_.rows(); }

 private:
  struct LayerIdx { std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb; };
  void ensure_scratch(std::int64_t B, std::int64_t T);
  // The arena's floats for N rows of sequences of at most T tokens and `slots` attention
  // scratch slots (ensure_scratch's layout).
  std::int64_t arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const;
  void run_forward(const std::int32_t* tokens, std::int64_t B, std::int64_t T);
  // The forward and the backward run in stages, one group's use each (gpt.cpp: forward
  // embed, blocks, ln_f, head; backward head, ln_f, blocks in reverse, embed): all stages
  // in one parallel region without group hooks, one region per stage, bracketed, with them.
  int num_stages() const { return int(layers_.size()) + 3; }
  std::size_t forward_group(int stage) const;
  std::size_t backward_group(int stage) const;
  // The forward of sequences [b0, b0 + B) of the batch set up by run_forward (one thread's
  // share), stages [s0, s1).
  void forward_rows(const std::int32_t* tokens, std::int64_t b0, std::int64_t B, std::int64_t T, int s0, int s1);
  float loss_forward(const Batch& batch);
  // The backward of sequences [b0, b0 + B) of the batch forward() ran: into the ParamSet's
  // gradients (part null) or into `part`, a thread's fp32 partial of all parameters laid out
  // as ParamSet::offset says (see backward()); done(i) as parameter i's share is complete.
  // att_slot: the attention's dP scratch slot of a thread running its own rows, or -1 when
  // the kernels run their own threads (a slot each).
  // Backward stages [s0, s1) (see num_stages).
  void backward_rows(std::int64_t b0, std::int64_t B, float* part, int att_slot, float scale,
                     const std::function<void(std::size_t)>& done, int s0, int s1);

  friend struct GptProf;
  GptConfig cfg_;
  ParamSet ps_;
  bool profiling_ = false;
  OpProfile prof_;
  std::size_t wte_, wpe_, lnfw_, lnfb_;
  std::vector<LayerIdx> layers_;
  std::vector<ParamGroup> groups_;
  GroupHooks* hooks_ = nullptr;

  // Activations and backward scratch (one arena).
  HostBuffer arena_;
  std::int64_t cap_bt_ = 0, cap_t_ = 0;
  int att_slots_ = 0;
  bool ckpt_ = false, arena_ckpt_ = false;  // activation checkpointing: wanted / how arena_ is laid out
  struct LayerAct { float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *x1, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu; };
  std::vector<LayerAct> acts_;
  std::vector<float*> resid_;  // n_layer + 1 residual streams [BT, C]
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *logits_ = nullptr, *lse_ = nullptr;
  float *dres_ = nullptr, *dln_ = nullptr, *dqkv_ = nullptr, *datty_ = nullptr, *dfch_ = nullptr,
        *datt_scratch_ = nullptr;
  // Per-thread backward (backward()): whether a GEMM writes a parameter's partial first (the
  // Linear weights, wte: no zeroing), the partials (threads - 1 of them, at most
  // kMaxPartialBytes in all), per parameter how many threads have passed it, whether a
  // thread has taken the adding of its partials and whether they are added in, and the order
  // thread 0's pass completed the gradients in (grad_ready follows it).
  static constexpr std::size_t kMaxPartialBytes = std::size_t(1) << 30;
  std::vector<char> gemm_grad_;
  HostBuffer partial_;
  std::vector<std::atomic<int>> finished_;
  std::vector<std::atomic<bool>> claimed_, folded_;
  std::vector<std::size_t> done_order_;
  std::vector<std::int32_t> tokens_, targets_;
  std::int64_t B_ = 0, T_ = 0;
  bool have_cache_ = false;
  Precision prec_ = Precision::F32;
  bool prec_fixed_ = false;
};

}  // namespace ds::nn
