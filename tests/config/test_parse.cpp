// ds_config.json parsing: defaults, types, sections, DeepSpeed's rules, and the messages.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "parse_test_util.h"

namespace {

using namespace ds::config;

using config_test::error_of;
using config_test::parse;

TEST(ConfigParse, EmptyConfigHasDeepSpeedDefaults) {
  std::vector<std::string> warnings;
  const DsConfig c = parse("{}", &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(c.train_batch_size, 0);
  EXPECT_FALSE(c.optimizer);
  EXPECT_FALSE(c.scheduler);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_TRUE(c.bf16.check_grad_overflow);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_FALSE(c.zero_optimization.overlap_comm_effective());
  EXPECT_EQ(c.gradient_clipping, 1.0);  // DeepSpeed >= 0.19.3
  EXPECT_FALSE(c.steps_per_print);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_FALSE(c.communication_data_type);
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_FALSE(c.seed);
  EXPECT_EQ(c.source, "ds.json");
}

TEST(ConfigParse, FullConfigWithComments) {
  const DsConfig c = parse(R"({
    // DeepSpeed reads config files with hjson: comments are fine
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
    "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.8, 0.99], "eps": 1e-6,
                  "weight_decay": 0.01, "bias_correction": false, "adam_w_mode": false}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5, "warmup_num_steps": 50, "warmup_type": "linear"}},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 100,
             "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5, "auto_cast": true},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "allgather_bucket_size": 2e8,
                          "overlap_comm": true, "contiguous_gradients": false, "reduce_scatter": true},
    "gradient_clipping": 0.5, "steps_per_print": 10, "wall_clock_breakdown": true,
    "communication_data_type": "FP32", "dataloader_drop_last": true, "seed": 42,
    "checkpoint": {"tag_validation": "fail", "async_save": true},
    "csv_monitor": {"enabled": true, "output_path": "logs/", "job_name": "run1"}
  })");
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  ASSERT_TRUE(c.optimizer);
  EXPECT_EQ(c.optimizer->type, "adam");
  EXPECT_EQ(c.optimizer->lr, 3e-4);
  EXPECT_EQ(c.optimizer->betas[0], 0.8);
  EXPECT_EQ(c.optimizer->eps, 1e-6);
  EXPECT_FALSE(c.optimizer->bias_correction);
  EXPECT_FALSE(c.optimizer->adam_w_mode);
  ASSERT_TRUE(c.scheduler);
  EXPECT_EQ(c.scheduler->type, "WarmupLR");
  EXPECT_EQ(c.scheduler->warmup_num_steps, 50);
  EXPECT_EQ(c.scheduler->warmup_type, "linear");
  EXPECT_FALSE(c.scheduler->warmup_max_lr);  // None: the optimizer's lr
  EXPECT_TRUE(c.fp16.enabled && c.fp16.auto_cast && c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.5);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 50000000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
  EXPECT_TRUE(c.zero_optimization.overlap_comm_effective());
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_EQ(c.steps_per_print.value(), 10);
  EXPECT_EQ(c.communication_data_type.value(), "fp32");
  EXPECT_EQ(c.seed.value(), 42u);
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail");
  EXPECT_TRUE(c.checkpoint.async_save);
  EXPECT_EQ(c.csv_monitor.output_path, "logs/");
  EXPECT_EQ(c.raw["fp16"]["hysteresis"], 3);
}

TEST(ConfigParse, TypeErrorsNamePositionKeyPathAndExpectedType) {
  EXPECT_HAS(error_of("{\n  \"fp16\": {\n    \"loss_scale\": \"abc\"\n  }\n}"),
             "ds.json:3:5: fp16.loss_scale: expected a number >= 0, got \"abc\"");
  EXPECT_HAS(error_of("{\"fp16\": {\"enabled\": 1}}"), "ds.json:1:11: fp16.enabled: expected true or false, got 1");
  EXPECT_HAS(error_of("{\"fp16\": true}"), "ds.json:1:2: fp16: expected an object, got true");
  EXPECT_HAS(error_of("{\"train_batch_size\": 2.5}"), "train_batch_size: expected an integer >= 1, got 2.5");
  EXPECT_HAS(error_of("{\"train_batch_size\": 0}"), "train_batch_size: expected an integer >= 1, got 0");
  EXPECT_HAS(error_of("{\"gradient_clipping\": -1}"), "gradient_clipping: expected a number >= 0, got -1");
  EXPECT_HAS(error_of("{\"steps_per_print\": \"10\"}"), "steps_per_print: expected an integer >= 1, got \"10\"");
  EXPECT_HAS(error_of("{\"zero_optimization\": {\"stage\": \"2\"}}"), "zero_optimization.stage: expected an integer in [0, 3]");
  EXPECT_HAS(error_of("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9]}}}"),
             "optimizer.params.betas: expected an array of two numbers in [0, 1), got an array");
  EXPECT_HAS(error_of("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.5]}}}"),
             "ds.json:1:58: optimizer.params.betas[1]: expected a number in [0, 1), got 1.5");
  EXPECT_HAS(error_of("[1]"), "ds.json:1:1: a config must be a JSON object, got an array");
}

// communication.timeout: seconds a collective may wait (default torch's 30 minutes; 0 = none).
// The old comms_config.timeout still works with a deprecation warning; comms_config's other
// keys (DeepSpeed-style, which DeepSpeed ignores) are ignored with a warning.
TEST(ConfigParse, CommsConfigTimeout) {
  std::vector<std::string> warnings;
  EXPECT_EQ(parse("{}").comms_config.timeout, 1800.0);
  EXPECT_EQ(parse(R"({"communication": {"timeout": 2.5}})", &warnings).comms_config.timeout, 2.5);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(parse(R"({"communication": {"timeout": 0}})").comms_config.timeout, 0.0);
  EXPECT_HAS(error_of(R"({"communication": {"timeout": -1}})"), "communication.timeout: expected a number");
  EXPECT_HAS(error_of(R"({"communication": {"timeout": "30"}})"), "communication.timeout: expected a number");
  EXPECT_EQ(parse(R"({"comms_config": {"timeout": 7}})", &warnings).comms_config.timeout, 7.0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_HAS(warnings[0], "comms_config.timeout is deprecated (comms_config is a DeepSpeed section name): write "
                          "communication.timeout");
  warnings.clear();
  EXPECT_EQ(parse(R"({"comms_config": {"verbose": true, "prof_all": false}})", &warnings).comms_config.timeout, 1800.0);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_HAS(warnings[0], "comms_config.verbose is ignored (DeepSpeed ignores comms_config");
  EXPECT_HAS(error_of(R"({"comms_config": {"timeout": 3}, "communication": {"timeout": 4}})"),
             "both communication.timeout and the deprecated comms_config.timeout are given");
}

TEST(ConfigParse, UnknownSectionKeysAreErrorsWithSuggestion) {
  const std::string e = error_of("{\n  \"fp16\": {\"enabled\": true, \"loss_scal\": 0}\n}");
  EXPECT_HAS(e, "ds.json:2:29: fp16.loss_scal: unknown key in fp16 (did you mean \"loss_scale\"?)");
  EXPECT_HAS(e, "supported keys: auto_cast, consecutive_hysteresis, enabled");
  // The list names every key the section takes: bf16's DeepSpeed keys accepted only at their
  // default too.
  EXPECT_HAS(error_of(R"({"bf16": {"enabled": true, "foo": 1}})"),
             "supported keys: check_grad_overflow, enabled; also accepted (no effect, or only at their default): "
             "bf16_master_weights_and_grads, bf16_optimizer_states, immediate_grad_update");
  // A key in the wrong section says where it belongs (DeepSpeed issue #1809).
  EXPECT_HAS(error_of("{\"bf16\": {\"enabled\": true, \"initial_scale_power\": 8}}"),
             "bf16.initial_scale_power: unknown key in bf16 (\"initial_scale_power\" belongs in fp16)");
  EXPECT_HAS(error_of("{\"zero_optimization\": {\"stgae\": 1}}"), "(did you mean \"stage\"?)");
  EXPECT_HAS(error_of("{\"checkpoint\": {\"tag_validaton\": \"Warn\"}}"), "did you mean \"tag_validation\"?");
  EXPECT_HAS(error_of("{\"csv_monitor\": {\"enable\": true}}"), "csv_monitor.enable: unknown key in csv_monitor (did you mean \"enabled\"?)");
  EXPECT_HAS(error_of("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lrr\": 1}}}"),
             "optimizer.params.lrr: unknown key in optimizer.params (did you mean \"lr\"?)");
  EXPECT_HAS(error_of("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"betas\": [0.9, 0.9]}}}"),
             "optimizer.params.betas: unknown key in optimizer.params");
  EXPECT_HAS(error_of("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max\": 1}}}"),
             "did you mean \"warmup_max_lr\"?");
  EXPECT_HAS(error_of("{\"optimizer\": {\"type\": \"Adam\", \"param\": {}}}"), "optimizer.param: unknown key in optimizer (did you mean \"params\"?)");
}

TEST(ConfigParse, UnknownTopLevelKeysAreWarnings) {
  std::vector<std::string> w;
  const DsConfig c = parse("{\n  \"gradient_cliping\": 0.5,\n  \"stage\": 2,\n  \"zzz_unrelated\": 1\n}", &w);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // ignored, as DeepSpeed ignores it
  ASSERT_EQ(w.size(), 3u);
  EXPECT_HAS(w[0], "ds.json:2:3: unknown top-level key \"gradient_cliping\" (did you mean \"gradient_clipping\"?)");
  EXPECT_HAS(w[1], "unknown top-level key \"stage\" (did you mean \"zero_optimization.stage\"?)");
  EXPECT_HAS(w[2], "unknown top-level key \"zzz_unrelated\" is ignored");
}

TEST(ConfigParse, AcceptedDeepSpeedKeysAndModelDoNotWarn) {
  std::vector<std::string> w;
  parse(R"({"memory_breakdown": false, "dump_state": false, "sparse_gradients": false,
            "zero_allow_untested_optimizer": true, "amp": {"enabled": false},
            "activation_checkpointing": {"partition_activations": false}, "flops_profiler": {"enabled": false},
            "tensorboard": {"enabled": false, "output_path": "tb"}, "wandb": {"enabled": false},
            "comms_logger": {"enabled": false}, "data_types": {"grad_accum_dtype": "fp32"},
            "timers": {"throughput": {"enabled": true}}, "model": {"kind": "gpt2", "layers": 2},
            "sequence_parallel_size": 1, "gradient_allreduce_op": "mean"})",
        &w);
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_HAS(error_of("{\"amp\": {\"enabled\": true}}"), "amp.enabled: Apex AMP is not supported");
  EXPECT_HAS(error_of("{\"sequence_parallel_size\": 2}"), "sequence parallelism is not supported");
  EXPECT_HAS(error_of("{\"gradient_allreduce_op\": \"sum\"}"), "gradient_allreduce_op: expected \"mean\"");
  EXPECT_HAS(error_of("{\"elasticity\": {\"enabled\": true}}"), "elastic training is not supported");
}

// One rule for DeepSpeed features dstrain lacks: enabled, one that changes what is trained is
// an error naming the key; one that only observes is a warning; disabled, nothing is said.
TEST(ConfigParse, UnimplementedFeaturesFollowOneRule) {
  for (const char* key : {"curriculum_learning", "progressive_layer_drop", "quantize_training", "data_efficiency"}) {
    const std::string e = error_of(std::string("{\"") + key + "\": {\"enabled\": true}}");
    EXPECT_HAS(e, std::string("ds.json:1:") );
    EXPECT_HAS(e, std::string(key) + ".enabled: ");
    EXPECT_HAS(e, "is not supported by dstrain: it would change what is trained");
  }
  // compression_training has no top-level "enabled": any technique enabled inside counts.
  EXPECT_HAS(error_of(R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true}}}})"),
             "compression training is not supported by dstrain");
  EXPECT_EQ(error_of(R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": false}}}})"),
            "<no error>");
  for (const char* key : {"zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights"}) {
    EXPECT_HAS(error_of(std::string(R"({"zero_optimization": {"stage": 3, ")") + key + "\": true}}"),
               std::string("zero_optimization.") + key + ": ZeRO++ quantized communication is not supported");
  }
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})"),
             "zero_optimization.zero_hpz_partition_size: ZeRO++ hierarchical partitioning is not supported");
  EXPECT_HAS(error_of(R"({"tensor_parallel": {"autotp_size": 2}})"),
             "tensor_parallel.autotp_size: tensor parallelism is not supported by dstrain");
  std::vector<std::string> w;
  parse(R"({"tensor_parallel": {"autotp_size": 1}, "zero_optimization": {"zero_hpz_partition_size": 1},
            "tensorboard": {"enabled": true, "output_path": "tb"}, "wandb": {"enabled": true},
            "flops_profiler": {"enabled": true}, "comms_logger": {"enabled": true, "verbose": true}})", &w);
  ASSERT_EQ(w.size(), 1u);  // tensorboard, flops_profiler and comms_logger are implemented
  EXPECT_HAS(w[0], "wandb is enabled but dstrain does not implement it; it needs the wandb Python client");
}

// flops_profiler: DeepSpeed's keys and defaults; a bad value names its key.
TEST(ConfigParse, FlopsProfilerKeys) {
  const auto d = parse(R"({"flops_profiler": {"enabled": true}})");
  EXPECT_TRUE(d.flops_profiler.enabled);
  EXPECT_EQ(d.flops_profiler.profile_step, 1);
  EXPECT_EQ(d.flops_profiler.module_depth, -1);
  EXPECT_EQ(d.flops_profiler.top_modules, 1);
  EXPECT_TRUE(d.flops_profiler.detailed);
  EXPECT_FALSE(d.flops_profiler.output_file.has_value());
  const auto c = parse(R"({"flops_profiler": {"enabled": true, "profile_step": 3, "module_depth": 2,
                           "top_modules": 4, "detailed": false, "output_file": "prof/out.txt"}})");
  EXPECT_EQ(c.flops_profiler.profile_step, 3);
  EXPECT_EQ(c.flops_profiler.module_depth, 2);
  EXPECT_EQ(c.flops_profiler.top_modules, 4);
  EXPECT_FALSE(c.flops_profiler.detailed);
  EXPECT_EQ(c.flops_profiler.output_file.value_or(""), "prof/out.txt");
  EXPECT_FALSE(parse(R"({"flops_profiler": {"output_file": null}})").flops_profiler.output_file.has_value());
  EXPECT_HAS(error_of(R"({"flops_profiler": {"profile_step": -1}})"),
             "ds.json:1:21: flops_profiler.profile_step: expected an integer >= 0, got -1");
  EXPECT_HAS(error_of(R"({"flops_profiler": {"module_depth": -2}})"), "flops_profiler.module_depth: expected an integer >= -1");
  EXPECT_HAS(error_of(R"({"flops_profiler": {"top_modules": 1.5}})"), "flops_profiler.top_modules: expected an integer");
  EXPECT_HAS(error_of(R"({"flops_profiler": {"detailed": 1}})"), "flops_profiler.detailed: expected true or false");
  EXPECT_HAS(error_of(R"({"flops_profiler": {"output_file": 3}})"), "flops_profiler.output_file: expected a string");
  EXPECT_HAS(error_of(R"({"flops_profiler": {"module_dept": 1}})"), "(did you mean \"module_depth\"?)");
}

// DeepSpeed accepts 0 for both bucket sizes; 0 says what it does.
TEST(ConfigParse, ZeroBucketSizesAreAcceptedWithAWarning) {
  std::vector<std::string> w;
  const auto c = parse(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0, "allgather_bucket_size": 0}})", &w);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1);
  EXPECT_GT(c.zero_optimization.allgather_bucket_size, std::int64_t(1) << 62);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_HAS(w[0], "zero_optimization.reduce_bucket_size 0: every gradient is reduced on its own");
  EXPECT_HAS(w[1], "zero_optimization.allgather_bucket_size 0: each rank's updated partition is gathered whole");
}

TEST(ConfigParse, AutoValuesMeanTheDefault) {
  const DsConfig c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "fp16": {"enabled": "auto", "loss_scale": "auto", "initial_scale_power": "auto"},
      "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": "auto"}}})");
  EXPECT_EQ(c.train_batch_size, 0);
  EXPECT_EQ(c.gradient_accumulation_steps, 0);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.optimizer->lr, 1e-3);
  EXPECT_FALSE(c.scheduler->warmup_max_lr);
  EXPECT_EQ(c.scheduler->warmup_num_steps, 1000);
}

TEST(ConfigParse, OptimizerNamesFollowDeepSpeedCaseRules) {
  EXPECT_EQ(parse(R"({"optimizer": {"type": "ADAM"}})").optimizer->type, "adam");
  EXPECT_EQ(parse(R"({"optimizer": {"type": "adamw"}})").optimizer->type, "adamw");
  EXPECT_TRUE(parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": true}}})").optimizer->adam_w_mode);
  EXPECT_EQ(parse(R"({"optimizer": {"type": "SGD"}})").optimizer->type, "sgd");
  EXPECT_EQ(parse(R"({"optimizer": {"type": "LAMB"}})").optimizer->type, "lamb");
  EXPECT_EQ(parse(R"({"optimizer": {"type": "Adagrad"}})").optimizer->type, "adagrad");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "sgd"}})"), "optimizer.type: \"sgd\" is not a supported optimizer name");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "sgd"}})"), "write \"SGD\"");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "OneBitAdam"}})"),
             "optimizer \"OneBitAdam\" is not supported by dstrain; supported: Adam, AdamW, SGD, Lamb, Adagrad");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "Adamm"}})"),
             "unknown optimizer \"Adamm\" (did you mean \"Adam\"?); supported: Adam, AdamW, SGD, Lamb, Adagrad");
  EXPECT_HAS(error_of(R"({"optimizer": {"params": {}}})"), "optimizer: missing \"type\"");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": 3}})"), "optimizer.type: expected an optimizer name");
}

TEST(ConfigParse, OptimizerPerTypeDefaultsAndParams) {
  const auto ada = parse(R"({"optimizer": {"type": "Adagrad", "params": {"lr_decay": 0.1, "initial_accumulator_value": 0.5}}})").optimizer;
  EXPECT_EQ(ada->lr, 1e-2);
  EXPECT_EQ(ada->eps, 1e-10);
  EXPECT_EQ(ada->lr_decay, 0.1);
  EXPECT_EQ(ada->initial_accumulator_value, 0.5);
  const auto adam = parse(R"({"optimizer": {"type": "Adam"}})").optimizer;
  EXPECT_EQ(adam->lr, 1e-3);
  EXPECT_EQ(adam->eps, 1e-8);
  EXPECT_TRUE(adam->adam_w_mode);  // DeepSpeed's default: decoupled weight decay
  const auto sgd = parse(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})").optimizer;
  EXPECT_EQ(sgd->momentum, 0.9);
  EXPECT_TRUE(sgd->nesterov);
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "SGD", "params": {"nesterov": true}}})"), "Nesterov momentum requires");
  const auto lamb = parse(R"({"optimizer": {"type": "Lamb", "params": {"max_coeff": 5, "min_coeff": 0.1, "eps_inside_sqrt": true}}})").optimizer;
  EXPECT_EQ(lamb->max_coeff, 5.0);
  EXPECT_EQ(lamb->min_coeff, 0.1);
  EXPECT_TRUE(lamb->eps_inside_sqrt);
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "Lamb", "params": {"max_coeff": 0.1, "min_coeff": 1}}})"), "must be <= max_coeff");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "Adam", "params": {"lr": -1}}})"), "optimizer.params.lr: expected a number >= 0, got -1");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})"), "amsgrad is not supported");
}

TEST(ConfigParse, MaxGradNormAndTorchAdam) {
  EXPECT_HAS(error_of("{\"optimizer\": {\"type\": \"Adam\",\n \"params\": {\"max_grad_norm\": 1.0}}}"),
             "ds.json:2:13: optimizer.params.max_grad_norm: is not accepted here (DeepSpeed raises ValueError): use the top-level \"gradient_clipping\" instead");
  std::vector<std::string> w;
  const auto c = parse(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": true}}})", &w);
  EXPECT_EQ(c.optimizer->type, "adam");
  EXPECT_TRUE(w.empty());
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": "yes"}}})"), "torch_adam: expected true or false");
  std::vector<std::string> w2;
  parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})", &w2);
  ASSERT_EQ(w2.size(), 1u);
  EXPECT_HAS(w2[0], "adam_w_mode false has no effect with type AdamW");
}

TEST(ConfigParse, Schedulers) {
  const auto wd = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}}})").scheduler;
  EXPECT_EQ(wd->total_num_steps.value(), 100);
  EXPECT_EQ(wd->warmup_max_lr.value(), 1e-3);  // WarmupDecayLR's own default
  const auto cos = parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
      "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01, "warmup_num_steps": 5}}})").scheduler;
  EXPECT_EQ(cos->warmup_min_ratio, 0.1);
  EXPECT_EQ(cos->cos_min_ratio, 0.01);
  const auto oc = parse(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
      "cycle_first_step_size": 10, "cycle_momentum": false, "decay_step_size": 5, "decay_lr_rate": 0.1}}})").scheduler;
  EXPECT_EQ(oc->cycle_max_lr, 1e-3);
  EXPECT_EQ(oc->cycle_first_step_size, 10);
  EXPECT_FALSE(oc->cycle_second_step_size);
  EXPECT_FALSE(oc->cycle_momentum);
  const auto rt = parse(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-5,
      "lr_range_test_step_size": 10, "lr_range_test_step_rate": 2, "lr_range_test_staircase": true}}})").scheduler;
  EXPECT_EQ(rt->lr_range_test_step_size, 10);
  EXPECT_TRUE(rt->lr_range_test_staircase);

  EXPECT_HAS(error_of(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})"),
             "scheduler.params.total_num_steps: is required for WarmupDecayLR");
  EXPECT_HAS(error_of(R"({"scheduler": {"type": "WarmupCosineLR"}})"), "scheduler.params.total_num_steps: is required for WarmupCosineLR");
  EXPECT_HAS(error_of(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}})"), "cycle_min_lr and cycle_max_lr are required");
  EXPECT_HAS(error_of(R"({"scheduler": {"type": "warmuplr"}})"),
             "unknown scheduler \"warmuplr\" (did you mean \"WarmupLR\"?); supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest");
  EXPECT_HAS(error_of(R"({"scheduler": {"type": "StepLR"}})"), "unknown scheduler \"StepLR\"");
  EXPECT_HAS(error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})"),
             "warmup_num_steps: expected an integer >= 1, got 0");
  EXPECT_HAS(error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 5}}})"), "only -1");
  std::vector<std::string> short_total;
  parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5, "warmup_num_steps": 10}}})", &short_total);
  ASSERT_EQ(short_total.size(), 1u);
  EXPECT_HAS(short_total[0], "scheduler.params.total_num_steps 5 is less than warmup_num_steps 10");
  EXPECT_FALSE(parse(R"({"scheduler": null})").scheduler);
  EXPECT_FALSE(parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": null}}})").scheduler->warmup_max_lr);
  std::vector<std::string> w;
  const auto odd = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}}})", &w).scheduler;
  EXPECT_EQ(odd->warmup_type, "log");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "unknown warmup_type \"cubic\"");
}

TEST(ConfigParse, PrecisionRules) {
  EXPECT_HAS(error_of("{\"fp16\": {\"enabled\": true},\n \"bf16\": {\"enabled\": true}}"),
             "ds.json:2:11: bf16.enabled: fp16 and bf16 cannot both be enabled");
  EXPECT_TRUE(parse(R"({"bfloat16": {"enabled": true}})").bf16.enabled);  // legacy name
  EXPECT_HAS(error_of(R"({"fp16": {"enabled": true}, "bfloat16": {"enabled": true}})"), "bfloat16.enabled: fp16 and bf16 cannot both be enabled");
  std::vector<std::string> w;
  EXPECT_FALSE(parse(R"({"bf16": {"enabled": false}, "bfloat16": {"enabled": true}})", &w).bf16.enabled);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "\"bfloat16\" is ignored because \"bf16\" is also given");
  EXPECT_HAS(error_of(R"({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": true, "loss_scale": 128}})"),
             "fp16.loss_scale: Lamb requires dynamic loss scaling");
  EXPECT_EQ(parse(R"({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": true}})").fp16.loss_scale, 0.0);
  EXPECT_HAS(error_of(R"({"fp16": {"loss_scale_window": 0}})"), "fp16.loss_scale_window: must be > 0 with dynamic loss scaling");
  EXPECT_EQ(parse(R"({"fp16": {"loss_scale": 1024, "loss_scale_window": 0}})").fp16.loss_scale, 1024.0);
  EXPECT_HAS(error_of(R"({"fp16": {"min_loss_scale": 0}})"), "fp16.min_loss_scale: must be > 0");
  EXPECT_HAS(error_of(R"({"fp16": {"loss_scale": true}})"), "fp16.loss_scale: expected a number >= 0, got true");
  EXPECT_HAS(error_of(R"({"bf16": {"bf16_master_weights_and_grads": true}})"), "bf16 master weights are not supported");
  EXPECT_EQ(parse(R"({"communication_data_type": "BF16"})").communication_data_type.value(), "bf16");
  EXPECT_HAS(error_of(R"({"communication_data_type": "int8"})"), "communication_data_type: expected \"fp32\", \"fp16\" or \"bf16\", got \"int8\"");
}

TEST(ConfigParse, ZeroForms) {
  std::vector<std::string> w;
  const DsConfig t = parse(R"({"zero_optimization": true, "allgather_size": 1000})", &w);
  EXPECT_EQ(t.zero_optimization.stage, 1);
  EXPECT_EQ(t.zero_optimization.allgather_bucket_size, 1000);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "is deprecated; write {\"stage\": 1}");
  EXPECT_EQ(parse(R"({"zero_optimization": false})").zero_optimization.stage, 0);
  EXPECT_EQ(parse("{\"zero_optimization\": {\n  \"stage\": 3}}").zero_optimization.stage, 3);
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage": 4}})"), "expected an integer in [0, 3], got 4");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"allgather_bucket_size": 3}})"), "expected an even integer");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})"),
             "zero_optimization.offload_optimizer.device \"cpu\" needs zero_optimization.stage >= 1 (stage is 0)");
  EXPECT_EQ(parse(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "none"}, "sub_group_size": 1e9,
                      "stage3_max_live_parameters": 1e9, "round_robin_gradients": false}})").zero_optimization.stage, 1);
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage": 2}, "gradient_predivide_factor": 2})"),
             "gradient_predivide_factor: must be 1 with zero_optimization.stage 2 and reduce_scatter");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage": 2}, "prescale_gradients": true})"), "prescale_gradients: cannot be true");
  EXPECT_TRUE(parse(R"({"zero_optimization": {"stage": 2, "reduce_scatter": false}, "prescale_gradients": true})").prescale_gradients);
  EXPECT_FALSE(parse(R"({"zero_optimization": {"stage": 1, "overlap_comm": null}})").zero_optimization.overlap_comm);
}

// overlap_comm, contiguous_gradients, allgather_partitions: dstrain always does what the
// default means; the other value, written explicitly, warns once, one line per key.
TEST(ConfigParse, ZeroKeysWithoutEffectWarnOncePerKey) {
  std::vector<std::string> w;
  parse(R"({"zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
            "allgather_partitions": true, "reduce_scatter": true}})", &w);
  parse(R"({"zero_optimization": {"stage": 1, "reduce_scatter": false, "overlap_comm": null}})", &w);
  parse(R"({"zero_optimization": {"stage": 1, "overlap_comm": "auto", "contiguous_gradients": "auto"}})", &w);
  EXPECT_TRUE(w.empty()) << w.front();  // values dstrain honours, or not given

  const DsConfig c = parse("{\"zero_optimization\": {\"stage\": 2,\n \"overlap_comm\": false,\n"
                           " \"contiguous_gradients\": false,\n \"allgather_partitions\": false}}", &w);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], "ds.json:3:2: zero_optimization.contiguous_gradients false has no effect: dstrain always keeps "
                  "gradients in one contiguous flat buffer");
  EXPECT_EQ(w[1], "ds.json:4:2: zero_optimization.allgather_partitions false has no effect: dstrain always "
                  "all-gathers the updated partitions (no per-rank broadcasts)");
  EXPECT_EQ(w[2], "ds.json:2:2: zero_optimization.overlap_comm false has no effect: dstrain always overlaps the "
                  "gradient reduction with the backward pass");
  // The values stay readable as written.
  EXPECT_FALSE(c.zero_optimization.contiguous_gradients);
  EXPECT_FALSE(c.zero_optimization.allgather_partitions);
  EXPECT_FALSE(c.zero_optimization.overlap_comm_effective());
}

// ZeRO stage 3: DeepSpeed's defaults, each key under its stage3_ name or its bare name.
TEST(ConfigParse, Stage3KeysDefaultsAndBothNames) {
  std::vector<std::string> w;
  const ZeroConfig d = parse(R"({"zero_optimization": {"stage": 3}})", &w).zero_optimization;
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_EQ(d.stage, 3);
  EXPECT_EQ(d.prefetch_bucket_size, 50000000);
  EXPECT_EQ(d.param_persistence_threshold, 100000);
  EXPECT_EQ(d.model_persistence_threshold, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(d.max_live_parameters, 1000000000);
  EXPECT_EQ(d.max_reuse_distance, 1000000000);
  EXPECT_FALSE(d.gather_16bit_weights_on_model_save);
  EXPECT_EQ(d.sub_group_size, 1000000000);
  EXPECT_TRUE(d.overlap_comm_effective());  // DeepSpeed: None -> stage == 3

  const ZeroConfig p = parse(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e6,
      "stage3_param_persistence_threshold": 1e4, "stage3_model_persistence_threshold": 9223372036854775807,
      "stage3_max_live_parameters": 3e8, "stage3_max_reuse_distance": 0,
      "stage3_gather_16bit_weights_on_model_save": true}})", &w).zero_optimization;
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_EQ(p.prefetch_bucket_size, 5000000);
  EXPECT_EQ(p.param_persistence_threshold, 10000);
  EXPECT_EQ(p.model_persistence_threshold, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(p.max_live_parameters, 300000000);
  EXPECT_EQ(p.max_reuse_distance, 0);
  EXPECT_TRUE(p.gather_16bit_weights_on_model_save);

  const ZeroConfig b = parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 7,
      "param_persistence_threshold": 8, "model_persistence_threshold": 9, "max_live_parameters": 10,
      "max_reuse_distance": 11, "gather_16bit_weights_on_model_save": true, "sub_group_size": 1e9}})", &w).zero_optimization;
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_EQ(b.prefetch_bucket_size, 7);
  EXPECT_EQ(b.param_persistence_threshold, 8);
  EXPECT_EQ(b.model_persistence_threshold, 9);
  EXPECT_EQ(b.max_live_parameters, 10);
  EXPECT_EQ(b.max_reuse_distance, 11);
  EXPECT_TRUE(b.gather_16bit_weights_on_model_save);

  // "auto" (HF Trainer's zero3 config) means not given: the default applies, and "auto" beside
  // the other name is not a second value.
  const ZeroConfig a = parse(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": "auto",
      "max_reuse_distance": 5, "stage3_max_reuse_distance": "auto", "sub_group_size": "auto",
      "stage3_gather_16bit_weights_on_model_save": "auto"}})", &w).zero_optimization;
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_EQ(a.prefetch_bucket_size, 50000000);
  EXPECT_EQ(a.param_persistence_threshold, 100000);
  EXPECT_EQ(a.max_live_parameters, 1000000000);
  EXPECT_EQ(a.max_reuse_distance, 5);
  EXPECT_FALSE(a.gather_16bit_weights_on_model_save);

  EXPECT_HAS(error_of("{\"zero_optimization\": {\"stage\": 3,\n \"stage3_max_live_parameters\": 1e9,\n"
                      " \"max_live_parameters\": 1e9}}"),
             "ds.json:3:2: zero_optimization.max_live_parameters: both zero_optimization.stage3_max_live_parameters "
             "and zero_optimization.max_live_parameters are given; they are two names of one setting (DeepSpeed "
             "asserts this): write one of them");
  EXPECT_HAS(error_of("{\"zero_optimization\": {\"allgather_sequential\": false,\n \"stage3_allgather_sequential\": false}}"),
             "ds.json:2:2: zero_optimization.stage3_allgather_sequential: both zero_optimization.stage3_allgather_sequential "
             "and zero_optimization.allgather_sequential are given");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage3_prefetch_bucket_size": -1}})"),
             "zero_optimization.stage3_prefetch_bucket_size: expected an integer >= 0, got -1");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"param_persistence_threshold": 1.5}})"),
             "zero_optimization.param_persistence_threshold: expected an integer >= 0, got 1.5");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": 1}})"),
             "zero_optimization.stage3_gather_16bit_weights_on_model_save: expected true or false, got 1");
  EXPECT_HAS(error_of(R"({"zero_optimization": {"stage3_prefetch_bucket_sise": 1}})"),
             "(did you mean \"stage3_prefetch_bucket_size\"?)");
  parse(R"({"stage3_max_live_parameters": 1})", &w);  // top level: a warning naming the section
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "(did you mean \"zero_optimization.stage3_max_live_parameters\"?)");
}

// stage3_gather_fp16_weights_on_model_save: DeepSpeed's deprecated spelling, remapped with a warning.
TEST(ConfigParse, Stage3DeprecatedGatherFp16Spelling) {
  std::vector<std::string> w;
  const ZeroConfig z = parse("{\"zero_optimization\": {\"stage\": 3,\n"
                             "  \"stage3_gather_fp16_weights_on_model_save\": true}}", &w).zero_optimization;
  EXPECT_TRUE(z.gather_16bit_weights_on_model_save);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], "ds.json:2:3: zero_optimization.stage3_gather_fp16_weights_on_model_save is deprecated; write "
                  "stage3_gather_16bit_weights_on_model_save (the value is used)");
  for (const char* other : {"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"}) {
    EXPECT_HAS(error_of(std::string(R"({"zero_optimization": {"stage3_gather_fp16_weights_on_model_save": false, ")") +
                        other + "\": true}}"),
               std::string("zero_optimization.stage3_gather_fp16_weights_on_model_save: the deprecated name of "
                           "zero_optimization.") + other + ", which is also given (DeepSpeed asserts this): remove "
                           "stage3_gather_fp16_weights_on_model_save");
  }
}

// The stage-3 keys dstrain does not act on warn at stage 3 for a value that changes what
// DeepSpeed does; below stage 3 DeepSpeed ignores all stage-3 keys, and so does dstrain.
TEST(ConfigParse, Stage3KeysWithoutEffectWarnAtStage3) {
  const std::string keys = R"("sub_group_size": 1e8, "stage3_module_granularity_threshold": 100,
      "use_all_reduce_for_fetch_params": true, "stage3_allgather_sequential": true)";
  std::vector<std::string> w;
  parse(R"({"zero_optimization": {"stage": 3, "sub_group_size": 1e9, "module_granularity_threshold": 0,
            "stage3_use_all_reduce_for_fetch_params": false, "allgather_sequential": false, "overlap_comm": true}})", &w);
  EXPECT_TRUE(w.empty()) << w.front();  // the defaults
  for (const char* stage : {"0", "1", "2"}) {
    parse(std::string(R"({"zero_optimization": {"stage": )") + stage + ", " + keys + "}}", &w);
  }
  EXPECT_TRUE(w.empty()) << w.front();  // below stage 3

  const DsConfig c = parse("{\"zero_optimization\": {\"stage\": 3, " + keys + ", \"overlap_comm\": false}}", &w);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000);  // kept as written
  EXPECT_FALSE(c.zero_optimization.overlap_comm_effective());  // acts at stage 3: no warning
  ASSERT_EQ(w.size(), 4u) << w.back();
  EXPECT_HAS(w[0], "zero_optimization.sub_group_size 100000000 has no effect: it acts only with offload_optimizer "
                   "device \"nvme\"");
  EXPECT_HAS(w[1], "zero_optimization.stage3_module_granularity_threshold 100 has no effect: dstrain gathers the "
                   "parameter groups the model declares (one group per block), whatever their size");
  EXPECT_HAS(w[2], "zero_optimization.use_all_reduce_for_fetch_params true has no effect: dstrain fetches "
                   "parameters with all-gather");
  EXPECT_HAS(w[3], "zero_optimization.stage3_allgather_sequential true has no effect: dstrain gathers each "
                   "parameter group with one all-gather");
}

TEST(ConfigParse, GradAccumDtype) {
  std::vector<std::string> w;
  EXPECT_FALSE(parse("{}").data_types.grad_accum_dtype);
  EXPECT_EQ(parse(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "FP32"}})", &w)
                .data_types.grad_accum_dtype.value(), "fp32");
  EXPECT_EQ(parse(R"({"fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})", &w)
                .data_types.grad_accum_dtype.value(), "fp32");
  EXPECT_EQ(parse(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})", &w)
                .data_types.grad_accum_dtype.value(), "bf16");
  EXPECT_EQ(parse(R"({"data_types": {"grad_accum_dtype": "fp32"}})", &w).data_types.grad_accum_dtype.value(), "fp32");
  EXPECT_FALSE(parse(R"({"data_types": {"grad_accum_dtype": null, "param_dtype": "fp32"}})", &w).data_types.grad_accum_dtype);
  EXPECT_TRUE(w.empty()) << w.front();
  EXPECT_HAS(error_of(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp16"}})"),
             "data_types.grad_accum_dtype: \"fp16\" is not supported with the bf16 working dtype; supported: \"fp32\" "
             "or \"bf16\" (the working dtype)");
  EXPECT_HAS(error_of(R"({"data_types": {"grad_accum_dtype": "bf16"}})"),
             "data_types.grad_accum_dtype: \"bf16\" is not supported with the fp32 working dtype; supported: \"fp32\"");
  EXPECT_HAS(error_of(R"({"data_types": {"grad_accum_dtype": "int8"}})"),
             "data_types.grad_accum_dtype: expected \"fp32\", \"fp16\" or \"bf16\", got \"int8\"");
  EXPECT_HAS(error_of(R"({"data_types": {"grad_acum_dtype": "fp32"}})"), "(did you mean \"grad_accum_dtype\"?)");
}

TEST(ConfigParse, CheckpointAndMonitor) {
  EXPECT_EQ(parse(R"({"checkpoint": {"tag_validation": "IGNORE"}})").checkpoint.tag_validation, "Ignore");
  EXPECT_EQ(parse(R"({"checkpoint": {"tag_validation": "Warn"}})").checkpoint.tag_validation, "Warn");
  EXPECT_HAS(error_of(R"({"checkpoint": {"tag_validation": "Strict"}})"),
             "checkpoint.tag_validation: expected \"Ignore\", \"Warn\" or \"Fail\", got \"Strict\"");
  EXPECT_HAS(error_of(R"({"csv_monitor": {"job_name": 5}})"), "csv_monitor.job_name: expected a string, got 5");
  EXPECT_EQ(parse(R"({"seed": 18446744073709551615})").seed.value(), 18446744073709551615ull);
  EXPECT_HAS(error_of(R"({"seed": -1})"), "seed: expected an integer >= 0, got -1");
}

TEST(ConfigParse, JsonObjectFormHasNoPositions) {
  nlohmann::json doc = {{"fp16", {{"loss_scale", "abc"}}}};
  try {
    parse_config_json(doc, "<dict>");
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_HAS(e.what(), "<dict>: fp16.loss_scale: expected a number >= 0, got \"abc\"");
  }
  const DsConfig c = parse_config_json({{"train_batch_size", 8}, {"optimizer", {{"type", "SGD"}}}});
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.optimizer->type, "sgd");
}

TEST(ConfigParse, ResolvedJsonRoundTrips) {
  for (const char* text : {
           R"({"train_batch_size": 8, "optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR"}, "fp16": {"enabled": true}})",
           R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"momentum": 0.9}},
               "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1}}, "bf16": {"enabled": true}, "seed": 7})",
           R"({"train_batch_size": 16, "gradient_accumulation_steps": 2, "optimizer": {"type": "Lamb"},
               "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 10}}, "zero_optimization": {"stage": 2}, "model": {"kind": "mlp"}})",
           R"({"train_batch_size": 4, "optimizer": {"type": "Adagrad"}, "scheduler": {"type": "LRRangeTest"}, "steps_per_print": 5,
               "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"overlap_comm": true}})",
           R"({"train_batch_size": 4, "optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 9, "warmup_num_steps": 3}}})",
           R"({"train_batch_size": 4, "zero_optimization": {"stage": 3, "overlap_comm": false, "prefetch_bucket_size": 1e6,
               "stage3_gather_fp16_weights_on_model_save": true, "sub_group_size": 1e9}})"}) {
    DsConfig c = parse(text);
    resolve_batch_sizes(c, 2);
    const nlohmann::json j = to_json(c);
    for (const char* key : {"train_batch_size", "optimizer", "scheduler", "fp16", "bf16", "zero_optimization", "gradient_clipping",
                            "steps_per_print", "communication_data_type", "data_types", "checkpoint", "csv_monitor", "seed"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    std::vector<std::string> w;
    DsConfig again = parse_config_text(j.dump(2), "resolved.json", &w);
    resolve_batch_sizes(again, 2);
    EXPECT_TRUE(w.empty()) << w.front();
    EXPECT_EQ(to_json(again), j) << text;
  }
}

TEST(ConfigLoad, PathJsonTextAndBase64) {
  const std::string path = testing::TempDir() + "ds_config_load_test.json";
  {
    std::ofstream f(path);
    f << "{\n  // file\n  \"train_batch_size\": 4\n}\n";
  }
  EXPECT_EQ(load_config(path).train_batch_size, 4);
  EXPECT_EQ(load_config(path).source, path);
  EXPECT_EQ(load_config_file(path).train_batch_size, 4);
  EXPECT_EQ(load_config("  {\"train_batch_size\": 6}").train_batch_size, 6);
  // base64.urlsafe_b64encode(b'{"train_batch_size": 12, "x": "??>"}')
  EXPECT_EQ(load_config("eyJ0cmFpbl9iYXRjaF9zaXplIjogMTIsICJ4IjogIj8_PiJ9").train_batch_size, 12);
  try {
    load_config("configs/missing.json");
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_HAS(e.what(), "config \"configs/missing.json\" is neither an existing file, nor JSON text, nor base64-encoded JSON (no such file)");
  }
  std::remove(path.c_str());
}

}  // namespace

namespace {

// activation_checkpointing: DeepSpeed's keys and defaults; giving the section turns
// recomputation on; values the CPU models cannot act on warn once each, naming the key.
TEST(ConfigParse, ActivationCheckpointingSection) {
  std::vector<std::string> warnings;
  EXPECT_FALSE(parse("{}").activation_checkpointing.enabled);
  EXPECT_FALSE(parse(R"({"activation_checkpointing": null})").activation_checkpointing.enabled);
  const DsConfig d = parse(R"({"activation_checkpointing": {}})", &warnings);
  EXPECT_TRUE(warnings.empty());
  const auto& a = d.activation_checkpointing;
  EXPECT_TRUE(a.enabled);
  EXPECT_FALSE(a.partition_activations || a.cpu_checkpointing || a.contiguous_memory_optimization ||
               a.synchronize_checkpoint_boundary || a.profile);
  EXPECT_FALSE(a.number_checkpoints);
  // DeepSpeed's defaults written out: no warnings.
  parse(R"({"activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
            "contiguous_memory_optimization": false, "number_checkpoints": null,
            "synchronize_checkpoint_boundary": false, "profile": false}})", &warnings);
  EXPECT_TRUE(warnings.empty());
  const DsConfig e = parse(R"({"activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
            "contiguous_memory_optimization": true, "number_checkpoints": 4,
            "synchronize_checkpoint_boundary": true, "profile": true}})", &warnings);
  ASSERT_EQ(warnings.size(), 6u);
  EXPECT_HAS(warnings[0], "activation_checkpointing.partition_activations true has no effect: ");
  EXPECT_HAS(warnings[1], "activation_checkpointing.cpu_checkpointing true has no effect: ");
  EXPECT_HAS(warnings[3], "activation_checkpointing.number_checkpoints 4 has no effect: ");
  EXPECT_EQ(e.activation_checkpointing.number_checkpoints, 4);
  EXPECT_TRUE(e.activation_checkpointing.profile);
  EXPECT_HAS(error_of(R"({"activation_checkpointing": {"profile": 1}})"),
             "activation_checkpointing.profile: expected true or false");
  EXPECT_HAS(error_of(R"({"activation_checkpointing": {"number_checkpoints": 0}})"),
             "activation_checkpointing.number_checkpoints: expected an integer >= 1");
  EXPECT_HAS(error_of(R"({"activation_checkpointing": {"partition_activation": true}})"),
             "activation_checkpointing.partition_activation: unknown key");
  EXPECT_HAS(error_of(R"({"activation_checkpointing": true})"), "activation_checkpointing: expected an object");
  // Round trip: the section stays given (and off stays off).
  EXPECT_TRUE(parse_config_json(to_json(d), "<json>").activation_checkpointing.enabled);
  EXPECT_FALSE(parse_config_json(to_json(parse("{}")), "<json>").activation_checkpointing.enabled);
}

}  // namespace
