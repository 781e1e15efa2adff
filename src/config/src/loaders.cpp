// ds_config.json -> DsConfig: the document's top level, and where it comes from (a file,
// JSON text, base64, a parsed object). Sections are read in sections.cpp and
// section_params.cpp; the rules across keys run last (validate.cpp).
#include "ds/config/parse.h"

#include <cctype>
#include <sys/stat.h>

#include "ds/core/base64.h"
#include "ds/core/file_read.h"
#include "reader.h"

namespace ds::config {

namespace detail {

// ---------------------------------------------------------------------------------------
// The document
// ---------------------------------------------------------------------------------------

namespace {

// Batch sizes: "auto" or null mean "not given" (HF-style configs write "auto").
void parse_batch_sizes(Section& top, DsConfig& cfg) {
  auto batch = [&](const char* key, std::int64_t& out) {
    if (const Member* m = top.get(key)) {
      if (m->value.kind != K::Null) out = top.read_int(*m, 1, kIntMax);
    }
  };
  batch("train_batch_size", cfg.train_batch_size);
  batch("train_micro_batch_size_per_gpu", cfg.train_micro_batch_size_per_gpu);
  batch("gradient_accumulation_steps", cfg.gradient_accumulation_steps);
}

// fp16, and "bf16" or its legacy name "bfloat16" when "bf16" is absent.
void parse_precision(Ctx& ctx, Section& top, DsConfig& cfg) {
  if (const Member* m = top.get("fp16")) parse_fp16(ctx, *m, cfg.fp16);
  const Member* bf16 = top.get("bf16");
  const Member* bfloat16 = top.get("bfloat16");
  if (bf16 && bfloat16) {
    ctx.warn(bfloat16->key_pos, "\"bfloat16\" is ignored because \"bf16\" is also given (DeepSpeed uses \"bf16\")");
  }
  if (bf16) {
    parse_bf16(ctx, *bf16, cfg.bf16);
  } else if (bfloat16) {
    parse_bf16(ctx, *bfloat16, cfg.bf16);
  }
}

// zero_optimization, and the legacy top-level allgather_size (used when the section is a bool).
void parse_zero_keys(Ctx& ctx, Section& top, const JsonNode& root, DsConfig& cfg) {
  if (const Member* m = top.get("zero_optimization")) parse_zero(ctx, *m, cfg.zero_optimization);
  if (const Member* m = top.get("allgather_size")) {
    const std::int64_t v = top.read_int(*m, 2, kIntMax);
    if (v % 2 != 0) top.type_error(*m, "an even integer");
    const Member* z = root.find("zero_optimization");
    if (z && z->value.kind == K::Bool) cfg.zero_optimization.allgather_bucket_size = v;
  }
}

// The single values of the top level that shape a step.
void parse_step_keys(Section& top, DsConfig& cfg) {
  top.number("gradient_clipping", cfg.gradient_clipping, at_least(0));
  if (const Member* m = top.get("steps_per_print")) {
    if (m->value.kind == K::Null) cfg.steps_per_print.reset();
    else cfg.steps_per_print = top.read_int(*m, 1, kIntMax);
  }
  top.boolean("wall_clock_breakdown", cfg.wall_clock_breakdown);
  top.boolean("prescale_gradients", cfg.prescale_gradients);
  top.number("gradient_predivide_factor", cfg.gradient_predivide_factor, above(0));
  if (const Member* m = top.get("communication_data_type"); m && m->value.kind != K::Null) {
    if (m->value.kind != K::String) top.type_error(*m, "\"fp32\", \"fp16\" or \"bf16\"");
    const std::string v = lower(m->value.str);
    if (v != "fp32" && v != "fp16" && v != "bf16") top.type_error(*m, "\"fp32\", \"fp16\" or \"bf16\"");
    cfg.communication_data_type = v;
  }
  top.boolean("dataloader_drop_last", cfg.dataloader_drop_last);
}

// communication, refusing a timeout given there and in the deprecated comms_config.
void parse_communication_keys(Ctx& ctx, Section& top, const JsonNode& root, DsConfig& cfg) {
  if (const Member* m = top.get("comms_config"); m && m->value.kind != K::Null)
    parse_comms_config(ctx, *m, cfg.comms_config);
  if (const Member* m = top.get("communication"); m && m->value.kind != K::Null) {
    if (const Member* old = root.find("comms_config"); old && old->value.kind == K::Object && old->value.find("timeout") &&
                                                       m->value.kind == K::Object && m->value.find("timeout")) {
      ctx.fail(m->value.find("timeout")->key_pos, "communication.timeout",
               "both communication.timeout and the deprecated comms_config.timeout are given: write one");
    }
    parse_communication(ctx, *m, cfg.communication, cfg.comms_config);
  }
  if (const Member* m = top.get("comms_logger"); m && m->value.kind != K::Null)
    parse_comms_logger(ctx, *m, cfg.comms_logger);
}

// The sections after the step keys, each read when given and not null.
void parse_other_sections(Ctx& ctx, Section& top, const JsonNode& root, DsConfig& cfg) {
  if (const Member* m = top.get("data_types"); m && m->value.kind != K::Null) parse_data_types(ctx, *m, cfg.data_types);
  if (const Member* m = top.get("checkpoint"); m && m->value.kind != K::Null) parse_checkpoint(ctx, *m, cfg.checkpoint);
  if (const Member* m = top.get("csv_monitor"); m && m->value.kind != K::Null) parse_monitor(ctx, *m, cfg.csv_monitor);
  if (const Member* m = top.get("tensorboard"); m && m->value.kind != K::Null) parse_monitor(ctx, *m, cfg.tensorboard);
  if (const Member* m = top.get("flops_profiler"); m && m->value.kind != K::Null)
    parse_flops_profiler(ctx, *m, cfg.flops_profiler);
  parse_communication_keys(ctx, top, root, cfg);
  if (const Member* m = top.get("kernels"); m && m->value.kind != K::Null) parse_kernels(ctx, *m, cfg.kernels);
  if (const Member* m = top.get("activation_checkpointing"); m && m->value.kind != K::Null)
    parse_activation_checkpointing(ctx, *m, cfg.activation_checkpointing);
  if (const Member* m = top.get("aio"); m && m->value.kind != K::Null) parse_aio(ctx, *m, cfg.aio);
  if (const Member* m = top.get("pipeline"); m && m->value.kind != K::Null) parse_pipeline(ctx, *m, cfg.pipeline);
  if (const Member* m = top.get("seed"); m && m->value.kind != K::Null) {
    if (m->value.kind == K::UInt) cfg.seed = m->value.uint_value;
    else cfg.seed = static_cast<std::uint64_t>(top.read_int(*m, 0, kIntMax));
  }
  top.get("model");  // the train app's model section; kept in raw
}

// DeepSpeed keys whose non-default value changes behaviour we do not implement.
void check_unimplemented(Ctx& ctx, Section& top) {
  if (const Member* m = top.get("amp", false); m && m->value.kind != K::Null) {
    Section a(ctx, m->value, m->key_pos, "amp");
    a.only_default("enabled", false, "Apex AMP is not supported; use fp16 or bf16");
    a.accept({"opt_level", "cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32",
              "master_weights", "loss_scale", "min_loss_scale", "max_loss_scale"});
    a.finish();
  }
  if (const Member* m = top.get("elasticity", false); m && m->value.kind == K::Object) {
    if (const Member* e = m->value.find("enabled"); e && e->value.kind == K::Bool && e->value.boolean) {
      ctx.fail(e->key_pos, "elasticity.enabled", "elastic training is not supported by dstrain");
    }
  }
  if (const Member* m = top.get("sequence_parallel_size", false)) {
    if (top.read_int(*m, 1, kIntMax) != 1) top.type_error(*m, "1 (sequence parallelism is not supported)");
  }
  if (const Member* m = top.get("gradient_allreduce_op", false)) {
    if (m->value.kind != K::String || lower(m->value.str) != "mean") {
      top.type_error(*m, "\"mean\" (dstrain always averages gradients)");
    }
  }
  if (const Member* m = top.get("managed_gradient_accumulation", false)) {
    if (!top.read_bool(*m)) {
      ctx.fail(m->key_pos, "managed_gradient_accumulation", "false is not supported: dstrain owns the accumulation boundary");
    }
  }
}

}  // namespace

DsConfig parse_root(const JsonNode& root, const std::string& source, std::vector<std::string>* warnings,
                    std::vector<std::string>* keys) {
  Ctx ctx;
  ctx.keys = keys;
  ctx.source = source;
  ctx.warnings = warnings;
  if (root.kind != K::Object) ctx.fail(root.pos, "", "a config must be a JSON object, got " + describe(root));

  DsConfig cfg;
  cfg.source = source;
  cfg.raw = to_nlohmann(root);
  ctx.autos = &cfg.auto_values;
  Section top(ctx, root, {}, "");
  parse_batch_sizes(top, cfg);
  if (const Member* m = top.get("optimizer"); m && m->value.kind != K::Null) cfg.optimizer = parse_optimizer(ctx, *m);
  if (const Member* m = top.get("scheduler"); m && m->value.kind != K::Null) cfg.scheduler = parse_scheduler(ctx, *m);
  parse_precision(ctx, top, cfg);
  parse_zero_keys(ctx, top, root, cfg);
  parse_step_keys(top, cfg);
  parse_other_sections(ctx, top, root, cfg);
  check_unimplemented(ctx, top);
  check_features(ctx, top);
  // DeepSpeed top-level keys accepted with no effect (docs/user/config.md).
  top.accept({"memory_breakdown", "dump_state", "sparse_gradients", "disable_allgather",
              "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "timers",
              "log_level", "vocabulary_size", "torch_autocast", "autotuning",
              "sparse_attention", "hybrid_engine", "compile", "nebula",
              "weight_quantization", "graph_harvesting", "use_data_before_expert_parallelism",
              "fp32_allreduce", "monitor_config"});
  top.finish_top_level();

  // The rules across keys (validate.cpp), with the positions read here.
  detail::validate_parsed(cfg, ctx.pos);
  return cfg;
}

}  // namespace detail

namespace {

using detail::jquote;
using detail::parse_root;

// Something exists at `path` (of any kind: a directory or FIFO is then reported as what it is
// by load_config_file, not as "no such file").
bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// URL-safe (or standard) base64, padding optional, trailing white space ignored; nullopt
// when it is not base64 or decodes to nothing.
std::optional<std::string> base64_decode(std::string_view in) {
  while (!in.empty() && std::isspace(static_cast<unsigned char>(in.back()))) in.remove_suffix(1);
  std::optional<std::string> out = try_base64_decode(in);
  if (!out || out->empty()) return std::nullopt;
  return out;
}

}  // namespace

DsConfig parse_config_text(const std::string& text, const std::string& source, std::vector<std::string>* warnings) {
  // Parsing costs many times the text's size, on every rank: refuse what no config needs.
  DS_CHECK(text.size() <= kMaxConfigBytes, "config " << source << " is " << text.size() << " bytes; the limit is "
                                                     << kMaxConfigBytes << " bytes (" << (kMaxConfigBytes >> 20) << " MiB)");
  return parse_root(parse_json(text, source), source, warnings);
}

DsConfig parse_config_json(const nlohmann::json& doc, const std::string& source, std::vector<std::string>* warnings) {
  return parse_root(from_nlohmann(doc), source, warnings);
}

DsConfig load_config_file(const std::string& path, std::vector<std::string>* warnings) {
  return parse_config_text(read_regular_file(path, "config file", kMaxConfigBytes), path, warnings);
}

DsConfig load_config(const std::string& path_or_json, std::vector<std::string>* warnings) {
  if (path_exists(path_or_json)) return load_config_file(path_or_json, warnings);
  const size_t first = path_or_json.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && path_or_json[first] == '{') {
    return parse_config_text(path_or_json, "<json string>", warnings);
  }
  if (auto decoded = base64_decode(path_or_json)) {
    const size_t f = decoded->find_first_not_of(" \t\r\n");
    if (f != std::string::npos && (*decoded)[f] == '{') {
      return parse_config_text(*decoded, "<base64 config>", warnings);
    }
  }
  std::string shown = path_or_json.size() > 80 ? path_or_json.substr(0, 80) + "..." : path_or_json;
  DS_THROW("config " << jquote(shown) << " is neither an existing file, nor JSON text, nor base64-encoded JSON"
                     << (path_or_json.find('/') != std::string::npos || path_or_json.ends_with(".json")
                             ? " (no such file)"
                             : ""));
}

}  // namespace ds::config
