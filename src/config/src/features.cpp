// DeepSpeed features dstrain does not implement, by one rule: a feature that changes what is
// trained (curriculum, progressive layer drop, MoQ, random-LTD, compression, quantized ZeRO,
// tensor parallelism) is an error naming the key when enabled; one that only observes
// (monitors, profilers) is warned about once -- never accepted and dropped in silence.
// (tensorboard, csv_monitor and comms_logger are implemented: sections.cpp; flops_profiler: flops_profiler.cpp.)
#include <string>
#include <vector>

#include "reader.h"

namespace ds::config::detail {

namespace {

enum class Kind { ChangesTraining, Observes };

struct Feature {
  const char* key;
  Kind kind;
  const char* what;  // Observes: what to use instead; ChangesTraining: what it is
};

const Feature kFeatures[] = {
    {"curriculum_learning", Kind::ChangesTraining, "curriculum learning"},
    {"progressive_layer_drop", Kind::ChangesTraining, "progressive layer drop"},
    {"quantize_training", Kind::ChangesTraining, "MoQ quantization-aware training"},
    {"data_efficiency", Kind::ChangesTraining, "data efficiency (curriculum sampling, random-LTD)"},
    {"compression_training", Kind::ChangesTraining, "compression training"},
    {"wandb", Kind::Observes,
     "it needs the wandb Python client and the network, which a C++ job has neither of; tensorboard and "
     "csv_monitor write the same scalars"},
    {"comet", Kind::Observes,
     "it needs the comet_ml Python client and the network, which a C++ job has neither of; tensorboard and "
     "csv_monitor write the same scalars"},
    {"eigenvalue", Kind::Observes, "nothing computes Hessian eigenvalues in dstrain"},
};

// Whether a section is on: its "enabled" when it has one, else any "enabled": true inside it
// (compression_training's techniques each carry their own).
bool enabled(const JsonNode& n) {
  if (n.kind != K::Object) return false;
  if (const Member* e = n.find("enabled")) return e->value.kind == K::Bool && e->value.boolean;
  for (const Member& m : n.members)
    if (enabled(m.value)) return true;
  return false;
}

SourcePos enabled_pos(const Member& section) {
  if (const Member* e = section.value.find("enabled")) return e->key_pos;
  return section.key_pos;
}

}  // namespace

void check_features(Ctx& ctx, Section& top) {
  for (const Feature& f : kFeatures) {
    const Member* m = top.get_raw(f.key, false);
    if (!m || !enabled(m->value)) continue;
    if (f.kind == Kind::ChangesTraining) {
      ctx.fail(enabled_pos(*m), std::string(f.key) + ".enabled",
               std::string(f.what) + " is not supported by dstrain: it would change what is trained; remove the "
                                     "section or set \"enabled\": false");
    }
    ctx.warn(enabled_pos(*m), std::string(f.key) + " is enabled but dstrain does not implement it; " + f.what);
  }
  // Tensor (model) parallelism: the batch arithmetic would count its ranks as data parallel.
  if (const Member* m = top.get_raw("tensor_parallel", false); m && m->value.kind == K::Object) {
    for (const char* key : {"autotp_size", "tp_size"}) {
      const Member* v = m->value.find(key);
      if (v && v->value.is_number() && v->value.as_double() > 1) {
        ctx.fail(v->key_pos, std::string("tensor_parallel.") + key,
                 "tensor parallelism is not supported by dstrain (every rank is data parallel); write 1 or remove "
                 "tensor_parallel");
      }
    }
  }
}

void check_zero_features(Section& z) {
  for (const char* key : {"zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"}) {
    const Member* m = z.get_raw(key, false);
    if (m && m->value.kind == K::Bool && m->value.boolean) {
      z.ctx().fail(m->key_pos, z.sub(key),
                   "ZeRO++ quantized communication is not supported by dstrain: it would change the values "
                   "trained; write false");
    }
  }
  if (const Member* m = z.get_raw("zero_hpz_partition_size", false)) {
    if (z.read_int(*m, 0, kIntMax) > 1) {
      z.ctx().fail(m->key_pos, z.sub("zero_hpz_partition_size"),
                   "ZeRO++ hierarchical partitioning is not supported by dstrain; write 1");
    }
  }
}

}  // namespace ds::config::detail
