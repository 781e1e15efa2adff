// The built-in decoders as layer sequences (ds/core/layer_sequence.h): the layer list, the
// tied embedding, and ranges of layers run in sequence -- one model instance per range, all
// bound to the same storage, as pipeline stages would be -- against one whole-model forward
// and backward, over two accumulating micro-batches: the same loss and gradient bits for a cut at every layer boundary and for
// every layer alone, fp32 and bf16, activation checkpointing on and off, the GPT's
// single-thread and per-thread backward. The tied embedding's two shares, summed in another
// order where a cut separates its users, agree to rounding (bit for bit in fp32 on one thread).
// Also under ZeRO-3 group hooks that poison every group outside its brackets (one set of hooks
// for all the instances: they guard the shared storage): a range uses its own groups only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/layer_sequence.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "poison_hooks.h"
#include "small_decoders.h"

namespace {

using namespace dstest;

// Binds `m` to h's storage (what h.rebind() hands h.m), values untouched.
void bind_to(Harness& h, ds::Module& m) {
  std::vector<ds::TensorView> pv, gv;
  for (std::size_t i = 0; i < h.infos.size(); ++i) {
    const std::size_t n = h.infos[i].numel();
    if (h.dt == ds::DType::F32) {
      pv.push_back({h.master[i].data(), n, h.dt});
      gv.push_back({h.g32[i].data(), n, h.dt});
    } else {
      pv.push_back({h.p16[i].data(), n, h.dt});
      gv.push_back({h.g16[i].data(), n, h.dt});
    }
  }
  m.bind(pv, gv);
}

struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  std::vector<std::size_t> ready_count;  // grad_ready calls per parameter
};

template <class M, class Cfg>
std::unique_ptr<M> make(const Cfg& cfg, bool ckpt) {
  auto m = std::make_unique<M>(cfg);
  m->set_activation_checkpointing(ckpt);
  return m;
}

// Two micro-batches (different sizes and backward scales) into the same gradients.
struct MicroBatches {
  std::vector<Data> data;
  std::vector<float> scales{0.75f, 0.5f};
  explicit MicroBatches(std::int64_t V) : data{tokens(3, 7, V, 11), tokens(2, 8, V, 12)} {
    for (Data& d : data) {  // the copies' batches onto their own tokens
      d.batch.inputs = d.in;
      d.batch.targets = d.tg;
    }
  }
};

template <class M, class Cfg>
Outcome whole(const Cfg& cfg, ds::DType dt, bool ckpt, const MicroBatches& mb, bool hooked) {
  auto m = make<M>(cfg, ckpt);
  Harness h(*m, 1, dt);
  randomize(h, 5, 0.3f);
  std::unique_ptr<PoisonHooks> hooks;
  if (hooked) {
    hooks = std::make_unique<PoisonHooks>(h, m->parameter_groups());
    m->set_group_hooks(hooks.get());
  }
  Outcome r;
  r.ready_count.assign(h.infos.size(), 0);
  for (std::size_t b = 0; b < mb.data.size(); ++b) {
    if (hooks) hooks->begin(ds::Pass::Forward);
    r.losses.push_back(m->forward(mb.data[b].batch));
    if (hooks) hooks->check_call("whole forward");
    if (hooks) hooks->begin(ds::Pass::Backward);
    m->backward(mb.scales[b], [&](std::size_t i) {
      if (hooks) hooks->ready(i);
      ++r.ready_count[i];
    });
    if (hooks) hooks->check_call("whole backward");
  }
  if (hooks) hooks->restore_all();
  for (std::size_t i = 0; i < h.infos.size(); ++i) r.grads.push_back(h.grad(i));
  return r;
}

// Group hooks (null: none) around one range's call: the pass it runs in, then its brackets
// closed and its layers' groups (layer i is group i) acquired.
struct RangeCall {
  PoisonHooks* hooks;
  std::size_t first, last;
  RangeCall(PoisonHooks* h, ds::Pass pass, std::size_t f, std::size_t l) : hooks(h), first(f), last(l) {
    if (hooks) hooks->begin(pass);
  }
  ~RangeCall() {
    if (!hooks) return;
    const std::string what = "layers [" + std::to_string(first) + ", " + std::to_string(last) + ")";
    hooks->check_brackets(what);
    for (std::size_t g = first; g < last; ++g) EXPECT_TRUE(hooks->seen(g)) << what << ": group " << g;
  }
};

// Layers [cuts[k], cuts[k + 1]) on model instance k: every forward, then every backward from
// the last range, each range's input gradient the previous range's output gradient.
template <class M, class Cfg>
void run_ranges(std::vector<std::unique_ptr<M>>& stages, const Cfg& cfg, const ds::Batch& batch, float scale,
                const std::vector<std::size_t>& cuts, PoisonHooks* hooks, Outcome& r) {
  std::vector<std::vector<float>> acts(cuts.size());  // acts[k]: the activation into layer cuts[k]
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const bool last = k + 1 == stages.size();
    if (!last) acts[k + 1].resize(std::size_t(batch.batch * batch.seq * cfg.n_embd));
    RangeCall call(hooks, ds::Pass::Forward, cuts[k], cuts[k + 1]);
    const float loss = stages[k]->forward_layers(batch, cuts[k], cuts[k + 1], acts[k], acts[k + 1]);
    if (last) r.losses.push_back(loss);
  }
  std::vector<float> grad_out, grad_in;
  for (std::size_t k = stages.size(); k-- > 0;) {
    grad_in.assign(acts[k].size(), 0.0f);
    RangeCall call(hooks, ds::Pass::Backward, cuts[k], cuts[k + 1]);
    stages[k]->backward_layers(scale, grad_out, grad_in, [&](std::size_t i) {
      if (hooks) hooks->ready(i);
      ++r.ready_count[i];
    });
    grad_out.swap(grad_in);
  }
}

template <class M, class Cfg>
Outcome ranges(const Cfg& cfg, ds::DType dt, bool ckpt, const MicroBatches& mb, const std::vector<std::size_t>& cuts,
               bool hooked) {
  std::vector<std::unique_ptr<M>> stages;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) stages.push_back(make<M>(cfg, ckpt));
  Harness h(*stages[0], 1, dt);
  randomize(h, 5, 0.3f);
  for (std::size_t k = 1; k < stages.size(); ++k) bind_to(h, *stages[k]);
  std::unique_ptr<PoisonHooks> hooks;
  if (hooked) {
    hooks = std::make_unique<PoisonHooks>(h, stages[0]->parameter_groups());
    for (auto& m : stages) m->set_group_hooks(hooks.get());
  }
  Outcome r;
  r.ready_count.assign(h.infos.size(), 0);
  for (std::size_t b = 0; b < mb.data.size(); ++b)
    run_ranges(stages, cfg, mb.data[b].batch, mb.scales[b], cuts, hooks.get(), r);
  if (hooks) hooks->restore_all();
  for (std::size_t i = 0; i < h.infos.size(); ++i) r.grads.push_back(h.grad(i));
  return r;
}

// Whether the cuts separate the layers that use tied parameter i.
bool separates(const std::vector<ds::TiedWeight>& tied, std::size_t i, const std::vector<std::size_t>& cuts) {
  for (const auto& t : tied) {
    if (t.parameter != i) continue;
    for (std::size_t c : cuts)
      if (c > t.layers.front() && c <= t.layers.back()) return true;
  }
  return false;
}

template <class M, class Cfg>
void expect_same(const Cfg& cfg, ds::DType dt, bool ckpt, int threads, bool hooked, const std::string& name) {
  M probe(cfg);
  const std::size_t n = probe.layers().size();
  const std::vector<ds::TiedWeight> tied = probe.tied_weights();
  const std::vector<ds::ParamInfo> infos = probe.parameters();
  const MicroBatches mb(cfg.vocab_size);
  const std::size_t micro = mb.data.size();
  ds::test::on_threads(threads, [&] {
    const Outcome ref = whole<M>(cfg, dt, ckpt, mb, hooked);
    std::vector<std::vector<std::size_t>> splits;
    for (std::size_t c = 1; c < n; ++c) splits.push_back({0, c, n});
    std::vector<std::size_t> every(n + 1);
    for (std::size_t c = 0; c <= n; ++c) every[c] = c;
    splits.push_back(every);
    for (const auto& cuts : splits) {
      std::string what = name + (dt == ds::DType::F32 ? " fp32" : " bf16") + (ckpt ? " checkpointing" : "") + (hooked ? " hooked" : "") +
                         " threads " + std::to_string(threads) + " cuts";
      for (std::size_t c : cuts) what.append(" ").append(std::to_string(c));
      const Outcome got = ranges<M>(cfg, dt, ckpt, mb, cuts, hooked);
      EXPECT_EQ(ds::test::first_bit_difference(ref.losses, got.losses), "") << what << ": losses";
      for (std::size_t i = 0; i < infos.size(); ++i) {
        const bool split_tie = separates(tied, i, cuts);
        EXPECT_EQ(got.ready_count[i], (split_tie ? 2 : 1) * micro) << what << ": grad_ready of " << infos[i].name;
        if (!split_tie || (dt == ds::DType::F32 && threads == 1)) {
          EXPECT_EQ(ds::test::first_bit_difference(ref.grads[i], got.grads[i]), "") << what << ": " << infos[i].name;
          continue;
        }
        // Two shares summed in another order: within rounding of the larger terms.
        float top = 0;
        for (float v : ref.grads[i]) top = std::max(top, std::fabs(v));
        const float tol = dt == ds::DType::F32 ? 1e-5f * top : 1.0f / 64 * top;
        std::size_t j = 0;
        while (j < ref.grads[i].size() && std::fabs(ref.grads[i][j] - got.grads[i][j]) <= tol) ++j;
        EXPECT_EQ(j, ref.grads[i].size()) << what << ": " << infos[i].name << " differs past " << tol;
      }
    }
    return 0;
  });
}

TEST(NnLayerSequence, GptLayersAndTiedEmbedding) {
  ds::nn::Gpt m(gpt_cfg());
  ds::LayerSequence* seq = ds::layer_sequence_of(m);
  ASSERT_NE(seq, nullptr);
  const auto layers = seq->layers();
  std::vector<std::string> names;
  std::size_t next = 0;
  for (const auto& l : layers) {
    names.push_back(l.name);
    EXPECT_EQ(l.first, next) << l.name;  // consecutive runs that tile parameters()
    next += l.count;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "h.0", "h.1", "h.2", "head"}));
  EXPECT_EQ(next, m.parameters().size());
  EXPECT_EQ(layers.back().count, 2u);  // ln_f.weight, ln_f.bias
  const auto tied = seq->tied_weights();
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_EQ(tied[0].name, "wte.weight");
  EXPECT_EQ(tied[0].parameter, 0u);
  EXPECT_EQ(tied[0].layers, (std::vector<std::size_t>{0, 4}));
  ds::Batch b;
  b.batch = 3;
  b.seq = 5;
  EXPECT_EQ(seq->activation_shape(2, b), (std::vector<std::int64_t>{3, 5, 16}));
}

TEST(NnLayerSequence, LlamaTiedOnlyWhenTied) {
  ds::nn::Llama untied(llama_cfg(false)), tied(llama_cfg(true));
  EXPECT_TRUE(untied.tied_weights().empty());
  EXPECT_EQ(untied.layers().back().count, 2u);  // model.norm.weight, lm_head.weight
  ASSERT_EQ(tied.tied_weights().size(), 1u);
  EXPECT_EQ(tied.tied_weights()[0].layers, (std::vector<std::size_t>{0, 4}));
  EXPECT_EQ(tied.layers().back().count, 1u);
}

TEST(NnLayerSequence, GptRangesSameBits) {
  for (int threads : {1, 2})
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16})
      for (bool ckpt : {false, true})
        for (bool hooked : {false, true}) expect_same<ds::nn::Gpt>(gpt_cfg(), dt, ckpt, threads, hooked, "gpt");
}

TEST(NnLayerSequence, LlamaRangesSameBits) {
  for (bool tie : {true, false})
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16})
      for (bool ckpt : {false, true})
        for (bool hooked : {false, true})
          expect_same<ds::nn::Llama>(llama_cfg(tie), dt, ckpt, 2, hooked, tie ? "llama tied" : "llama untied");
}

TEST(NnLayerSequence, RangeErrorsNameTheMismatch) {
  ds::nn::Gpt m(gpt_cfg());
  Harness h(m, 1);
  const Data d = tokens(2, 4, 13, 3);
  std::vector<float> act(2 * 4 * 16), small(3);
  EXPECT_THROW(m.forward_layers(d.batch, 2, 2, act, act), ds::Error);
  EXPECT_THROW(m.forward_layers(d.batch, 0, 6, {}, {}), ds::Error);
  try {
    m.forward_layers(d.batch, 1, 3, small, act);
    FAIL() << "a short input was taken";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("input holds 3 floats; layer 1 takes 128"), std::string::npos) << e.what();
  }
  // A middle range reads no token ids; backward() is not the backward of a range.
  ds::Batch shapes;
  shapes.batch = 2;
  shapes.seq = 4;
  m.forward_layers(shapes, 1, 3, act, act);
  try {
    m.backward(1.0f, {});
    FAIL() << "backward() ran after forward_layers";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward_layers"), std::string::npos) << e.what();
  }
}

}  // namespace
