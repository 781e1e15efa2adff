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
// Binding, the groups, the arena's growth, checkpointing, the loss, logits_last and generate
// are Decoder's (ds/nn/decoder.h). Not thread-safe: one forward/backward at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/nn/decoder.h"
#include "ds/nn/op_profile.h"

namespace ds::nn {

struct GptConfig {
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 256;
  std::int64_t block_size = 128;
  std::int64_t vocab_size = 256;
};

class Gpt : public Decoder {
 public:
  explicit Gpt(const GptConfig& cfg);  // validates cfg (n_embd % n_head == 0, all > 0)

  bool init_parameter_range(std::size_t first, std::span<const std::span<float>> params, std::uint64_t seed) override;

  const GptConfig& config() const { return cfg_; }

  // Training FLOPs per token (forward + backward): 6 * N_matmul + 6 * n_layer * T * C with
  // T = seq (attention's QK^T and PV, causal half not counted as saved), where N_matmul
  // counts the weights that enter GEMMs (all Linear weights + the tied LM head; not the
  // position table, biases or LayerNorms). `seq` defaults to block_size.
  double flops_per_token(std::int64_t seq = 0) const override;

  // Per-op profile of forward/backward (benchmarks, op_profile.h): when enabled, every kernel
  // call adds the process CPU time it took (all threads; run 1 thread for a clean split) and
  // its elapsed time to its op.
  using OpTime = ds::nn::OpTime;
  void set_profiling(bool on);
  const std::vector<OpTime>& profile() const { return prof_.rows(); }

 private:
  struct LayerIdx { std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb; };
  void ensure_scratch(std::int64_t B, std::int64_t T) override;
  std::int64_t arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const override;
  // Layer i is forward stage i (the head: stages n_layer + 1 and n_layer + 2).
  void run_layers(const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::size_t first,
                  std::size_t last) override;
  void run_backward(float scale, const std::function<void(std::size_t)>& grad_ready, std::size_t first,
                    std::size_t last) override;
  float mean_loss(std::int64_t N) override;  // Decoder's, profiled
  void add_forward_macs(ModuleProfile& out, std::int64_t B, std::int64_t T) const override {
    add_gpt_forward_macs(cfg_, modules_, B, T, out);
  }
  // The forward and the backward run in stages, one group's use each (gpt.cpp: forward
  // embed, blocks, ln_f, head; backward head, ln_f, blocks in reverse, embed): all stages
  // in one parallel region without group hooks, one region per stage, bracketed, with them.
  int num_stages() const { return int(layers_.size()) + 3; }
  std::size_t forward_group(int stage) const;
  std::size_t backward_group(int stage) const;
  // The forward of sequences [b0, b0 + B) of the batch set up by run_layers (one thread's
  // share), stages [s0, s1).
  void forward_rows(const std::int32_t* tokens, std::int64_t b0, std::int64_t B, std::int64_t T, int s0, int s1);
  // The backward of sequences [b0, b0 + B) of the batch forward() ran: into the ParamSet's
  // gradients (part null) or into `part`, a thread's fp32 partial of all parameters laid out
  // as ParamSet::offset says (see backward()); done(i) as parameter i's share is complete.
  // att_slot: the attention's dP scratch slot of a thread running its own rows, or -1 when
  // the kernels run their own threads (a slot each).
  // Backward stages [s0, s1) (see num_stages) of the call's stages [bwd_s0_, bwd_s1_).
  void backward_rows(std::int64_t b0, std::int64_t B, float* part, int att_slot, float scale,
                     const std::function<void(std::size_t)>& done, int s0, int s1);
  // run_backward's two ways: one pass into the gradients (the kernels run their own threads),
  // or a pass per thread with fp32 partials (PartialsPass, gpt.cpp).
  struct PartialsPass;
  void run_backward_shared(float scale, const std::function<void(std::size_t)>& grad_ready);
  void run_backward_partials(float scale, const std::function<void(std::size_t)>& grad_ready, int threads,
                             std::size_t total);
  // backward_rows' steps, over one call's rows (RowsPass, gpt.cpp): the cross-entropy and the
  // tied head, ln_f, block li's MLP then attention half, the embeddings.
  struct RowsPass;
  void head_backward(const RowsPass& r, float scale);
  void final_norm_backward(const RowsPass& r);
  void mlp_backward(const RowsPass& r, std::size_t li);
  void attention_backward(const RowsPass& r, std::size_t li, float* att_scratch, int att_slots);
  void embedding_backward(const RowsPass& r);

  friend struct GptProf;
  GptConfig cfg_;
  bool profiling_ = false;
  OpProfile prof_;
  std::size_t wte_, wpe_, lnfw_, lnfb_;
  std::vector<LayerIdx> layers_;

  // Activations and backward scratch, carved from Decoder's arena.
  struct LayerAct { float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *x1, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu; };
  std::vector<LayerAct> acts_;
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  float *dln_ = nullptr, *dqkv_ = nullptr, *datty_ = nullptr, *dfch_ = nullptr,
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
  int bwd_s0_ = 0, bwd_s1_ = 0;  // the backward stages of the running run_backward
};

}  // namespace ds::nn
