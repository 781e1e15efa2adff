// Decoder: what the CPU token decoders (Gpt, Llama) share around their layer math -- the
// ParamSet and its ZeRO-3 groups, binding and the GEMM precision, the batch and context
// checks, the forward / evaluate / backward protocol, the activation arena's sizing and growth,
// the last row of logits and sampling, and the layer-sequence side (ds/core/layer_sequence.h)
// that runs a range of layers. A model derives from it, registers its parameters and groups in
// its constructor, and supplies its arena layout (arena_floats, ensure_scratch), and its forward
// and backward of a range of layers (run_layers, run_backward).
//
// Activations are sized at the first forward for a batch x seq and reused (grown only when a
// larger batch x seq arrives). Not thread-safe: one forward/backward at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/layer_sequence.h"
#include "ds/core/module.h"
#include "ds/nn/gemm.h"
#include "ds/nn/module_trees.h"
#include "ds/nn/params.h"

namespace ds::nn {

class Decoder : public Module, public LayerSequence {
 public:
  std::vector<ParamInfo> parameters() const override { return ps_.infos(); }
  // Checks the span count, then init_parameter_range(0, ...).
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  // forward() keeps the activations backward() needs; evaluate() does not.
  float forward(const Batch& batch) override;
  float evaluate(const Batch& batch) override;
  // The backward of forward() (not of forward_layers: that is backward_layers').
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;

  // The layer sequence: "embed", "h.0" .. "h.{n_layer-1}", "head" (the final norm, the LM
  // head and the loss), each owning its ZeRO-3 group's parameters; a tied LM head reported as
  // the embedding weight used by layers 0 and n_layer + 1. Activations are the residual stream
  // {batch, seq, n_embd}. Ranges run the kernels of forward()/backward() on the same rows:
  // the same bits. The flops profiler counts the MACs of forward() calls only.
  std::vector<LayerSpec> layers() const override;
  std::vector<TiedWeight> tied_weights() const override;
  std::vector<std::int64_t> activation_shape(std::size_t boundary, const Batch& batch) const override;
  float forward_layers(const Batch& batch, std::size_t first, std::size_t last, std::span<const float> input,
                       std::span<float> output) override;
  void backward_layers(float scale, std::span<const float> output_grad, std::span<float> input_grad,
                       const std::function<void(std::size_t)>& grad_ready) override;
  // ZeRO-3 groups in execution order: "embed", "h.0" .. "h.{n_layer-1}" (a block each),
  // "final"; a tied LM head acquires "embed" again (forward and backward).
  std::vector<ParamGroup> parameter_groups() const override { return groups_; }
  // The model brackets with the ParamSet's hooks: they wrap these and keep the fp32 shadows
  // of half dtypes to the groups in use (ParamSet::set_group_hooks).
  void set_group_hooks(GroupHooks* hooks) override { hooks_ = ps_.set_group_hooks(hooks, groups_); }
  // Host bytes of the fp32 parameter/gradient shadows (half dtypes; ParamSet::shadow_bytes).
  std::size_t shadow_bytes() const { return ps_.shadow_bytes(); }
  std::size_t num_parameters() const { return ps_.total_numel(); }
  // Training FLOPs per token (forward + backward) at `seq` tokens (default block_size), for MFU.
  virtual double flops_per_token(std::int64_t seq = 0) const = 0;
  // The flops profiler: the model's module tree (ds/nn/module_trees.h); while a profile is
  // set, each forward adds its MACs and each module's op times (the loss: the model's own).
  bool set_module_profile(ModuleProfile* profile) override;

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

  // Logits (vocab_size floats) for the token after `context` (its last block_size tokens
  // are used). Overwrites the activations cached by forward(): call outside forward/backward.
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  // Samples n_new tokens after context (temperature <= 0: greedy), deterministic per seed
  // (sample_tokens: the CUDA models use the same sampler).
  std::vector<std::int32_t> generate(std::span<const std::int32_t> context, int n_new,
                                     float temperature, std::uint64_t seed);

 protected:
  // name: the class in error messages ("Gpt"); block_size, vocab: the token checks' bounds;
  // width: n_embd; tied_head: the LM head's weight is the embedding group's first parameter.
  Decoder(const char* name, std::int64_t block_size, std::int64_t vocab, std::int64_t width, bool tied_head);

  // The arena's floats for N rows of sequences of at most T tokens and `slots` attention
  // scratch slots (the model's layout).
  virtual std::int64_t arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const = 0;
  // The arena sized and carved for B sequences of T tokens (grow_arena, then the model's layout).
  virtual void ensure_scratch(std::int64_t B, std::int64_t T) = 0;
  // The forward of layers [first, last) of B sequences of T tokens: the embedding reads
  // `tokens`, block l reads resid_[l] and writes resid_[l + 1], the head ends at logits_.
  virtual void run_layers(const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::size_t first,
                          std::size_t last) = 0;
  // The backward of layers [first, last) of the batch run_layers ran: dres_ holds the
  // gradient of resid_[last - 1] (unless last is the head, which starts from the loss) and
  // ends holding that of resid_[first - 1] (unless first is the embedding).
  virtual void run_backward(float scale, const std::function<void(std::size_t)>& grad_ready, std::size_t first,
                            std::size_t last) = 0;
  // The whole model's forward.
  void run_forward(const std::int32_t* tokens, std::int64_t B, std::int64_t T) {
    run_layers(tokens, B, T, 0, num_layers());
  }
  // Without group hooks: the half-dtype fp32 copies of the parameters layers [first, last)
  // read (the whole model at once for the whole range). With hooks the acquires convert.
  void prepare_layers(std::size_t first, std::size_t last);
  std::size_t num_layers() const { return groups_.size(); }
  // The mean cross-entropy of logits_ against targets_ over N rows (lse_ kept for backward).
  virtual float mean_loss(std::int64_t N);
  // The MACs of a forward of B x T tokens into `out` (module_trees.h).
  virtual void add_forward_macs(ModuleProfile& out, std::int64_t B, std::int64_t T) const = 0;

  // Whether the arena holds B x T rows with the current thread count and checkpointing;
  // if not, grows the capacities and returns a new arena (the old one freed first) for the
  // model to carve (arena_floats(cap_bt_, cap_t_, att_slots_, ckpt_) floats); else null.
  float* grow_arena(std::int64_t B, std::int64_t T);
  // backward()'s start: throws unless forward() kept the activations; drops them.
  void take_cache();

  const char* name_;
  std::int64_t block_size_, vocab_, width_;
  bool tied_head_;
  ParamSet ps_;
  std::vector<ParamGroup> groups_;
  GroupHooks* hooks_ = nullptr;

  // Activations and backward scratch (one arena), carved by the model.
  HostBuffer arena_;
  std::int64_t cap_bt_ = 0, cap_t_ = 0;
  int att_slots_ = 0;
  bool ckpt_ = false, arena_ckpt_ = false;  // activation checkpointing: wanted / how arena_ is laid out
  std::vector<float*> resid_;  // n_layer + 1 residual streams [BT, C], carved by the model
  float *logits_ = nullptr, *lse_ = nullptr, *dres_ = nullptr;  // dres_: a residual stream's gradient
  std::vector<std::int32_t> tokens_, targets_;
  std::int64_t B_ = 0, T_ = 0;
  bool have_cache_ = false;
  std::size_t cached_first_ = 0, cached_last_ = 0;  // the layers whose activations are kept
  Precision prec_ = Precision::F32;
  bool prec_fixed_ = false;
  // The module tree (the model's constructor builds it) and the profile being filled (null: off).
  DecoderModules modules_;
  ModuleProfile* mprof_ = nullptr;

 private:
  float loss_forward(const Batch& batch);
};

}  // namespace ds::nn
