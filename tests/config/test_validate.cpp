// ds::config::validate: the rules across keys, once for the parser and the engine.
#include <gtest/gtest.h>

#include <string>

#include "ds/config/parse.h"
#include "ds/config/validate.h"
#include "ds/core/error.h"

namespace {

using namespace ds::config;

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

std::string validate_error(const DsConfig& c, std::optional<int> ws = std::nullopt) {
  try {
    validate(c, ws);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string parse_error(const std::string& text) {
  try {
    parse_config_text(text, "ds.json");
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

DsConfig code_built() {
  DsConfig c;
  c.source = "<code>";
  return c;
}

TEST(ConfigValidate, DefaultsAndParsedConfigsPass) {
  EXPECT_EQ(validate_error(code_built()), "<no error>");
  DsConfig c = parse_config_text(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})", "ds.json");
  EXPECT_EQ(validate_error(c), "<no error>");
  resolve_batch_sizes(c, 2);
  EXPECT_EQ(validate_error(c, 2), "<no error>");
}

// A config built in code gets the engine's messages, "source: ...".
TEST(ConfigValidate, CodeBuiltConfigsGetOneLineNamingTheKeys) {
  DsConfig c = code_built();
  c.fp16.enabled = c.bf16.enabled = true;
  EXPECT_HAS(validate_error(c), "<code>: fp16.enabled and bf16.enabled are both true; enable at most one");

  c = code_built();
  c.bf16.enabled = true;
  c.data_types.grad_accum_dtype = "fp16";
  EXPECT_HAS(validate_error(c), "<code>: data_types.grad_accum_dtype 'fp16' is not supported with the bf16 working "
                                "dtype; supported: fp32 or bf16");

  c = code_built();
  c.communication_data_type = "int8";
  EXPECT_HAS(validate_error(c), "<code>: communication_data_type 'int8' is not one of fp32, fp16, bf16");

  c = code_built();
  c.zero_optimization.stage = 4;
  EXPECT_HAS(validate_error(c), "<code>: zero_optimization.stage 4 is not supported (dstrain implements stages 0 to 3)");
  c = code_built();
  c.zero_optimization.stage = 3;
  EXPECT_NO_THROW(validate(c));
  c.zero_optimization.max_live_parameters = -1;
  EXPECT_HAS(validate_error(c), "<code>: zero_optimization.stage3_max_live_parameters must be >= 0, got -1");
  c = code_built();
  c.gradient_clipping = -1;
  EXPECT_HAS(validate_error(c), "<code>: gradient_clipping must be >= 0, got -1");
  c = code_built();
  c.gradient_predivide_factor = 0;
  EXPECT_HAS(validate_error(c), "<code>: gradient_predivide_factor must be > 0, got 0");
  c = code_built();
  c.zero_optimization.reduce_bucket_size = 0;
  EXPECT_HAS(validate_error(c), "<code>: zero_optimization.reduce_bucket_size must be > 0");

  c = code_built();
  c.optimizer = OptimizerConfig{};
  c.optimizer->type = "lamb";
  c.fp16.enabled = true;
  c.fp16.loss_scale = 128;
  EXPECT_HAS(validate_error(c), "<code>: the Lamb optimizer needs dynamic loss scaling with fp16");
  c.fp16.loss_scale = 0;
  c.zero_optimization.stage = 1;
  c.train_batch_size = c.train_micro_batch_size_per_gpu = c.gradient_accumulation_steps = 1;
  EXPECT_EQ(validate_error(c), "<no error>");  // a valid DeepSpeed config ...
  EXPECT_HAS(validate_error(c, 1), "<code>: the Lamb optimizer computes per-tensor trust ratios and is not "
                                   "supported with ZeRO (zero_optimization.stage 1)");  // ... dstrain cannot train

  // Rules the parser had: "source: key: message", as a document without positions.
  c = code_built();
  c.zero_optimization.stage = 2;
  c.prescale_gradients = true;
  EXPECT_HAS(validate_error(c), "<code>: prescale_gradients: cannot be true with zero_optimization.stage 2");
  c = code_built();
  c.optimizer = OptimizerConfig{};
  c.optimizer->type = "sgd";
  c.optimizer->nesterov = true;
  EXPECT_HAS(validate_error(c), "<code>: optimizer.params.nesterov: Nesterov momentum requires a momentum > 0");
}

TEST(ConfigValidate, WorldSizeChecksTheResolvedBatch) {
  DsConfig c = code_built();
  EXPECT_HAS(validate_error(c, 2), "<code>: batch sizes did not resolve (gradient_accumulation_steps 0, "
                                   "train_micro_batch_size_per_gpu 0)");
  EXPECT_EQ(validate_error(c), "<no error>");  // without a world size the batch is not checked
  c.train_batch_size = 8;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = 2;
  EXPECT_EQ(validate_error(c, 2), "<no error>");
  EXPECT_HAS(validate_error(c, 3), "batch sizes do not fit the data-parallel world size 3");
}

// The parser runs the same rules at the end of parsing, located at the key; the engine's
// own limits wait for the training call.
TEST(ConfigValidate, ParserReportsRulesAtTheKey) {
  EXPECT_EQ(parse_error(R"({"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 1}})"), "<no error>");
  DsConfig c = parse_config_text("{\"train_batch_size\": 2, \"optimizer\": {\"type\": \"Lamb\"},\n"
                                 " \"zero_optimization\": {\"stage\": 1}}", "ds.json");
  resolve_batch_sizes(c, 2);
  EXPECT_HAS(validate_error(c, 2), "ds.json: the Lamb optimizer computes per-tensor trust ratios and is not "
                                   "supported with ZeRO (zero_optimization.stage 1); use Adam/AdamW with ZeRO or "
                                   "stage 0 with Lamb");
  EXPECT_HAS(parse_error("{\"optimizer\": {\"type\": \"Lamb\"},\n \"fp16\": {\"loss_scale\": 8}}"),
             "ds.json:2:11: fp16.loss_scale: Lamb requires dynamic loss scaling");
  EXPECT_HAS(parse_error("{\"fp16\": {\"enabled\": true},\n \"bf16\": {\"enabled\": true}}"),
             "ds.json:2:11: bf16.enabled: fp16 and bf16 cannot both be enabled");
}

// csv_monitor.job_name names one directory inside output_path: "../../x" used to write the
// CSV outside it. Parsed: located at the key; built in code: the engine's form.
TEST(ConfigValidate, CsvMonitorJobNameIsOneDirectoryName) {
  for (const char* bad : {"../../x", "..", ".", "", "a/b", "/abs"}) {
    const std::string doc = std::string("{\"csv_monitor\": {\"enabled\": true,\n \"job_name\": \"") + bad + "\"}}";
    EXPECT_HAS(parse_error(doc), "ds.json:2:2: csv_monitor.job_name: \"" + std::string(bad) +
                                     "\" is not a single directory name");
    DsConfig c = code_built();
    c.csv_monitor.enabled = true;
    c.csv_monitor.job_name = bad;
    EXPECT_HAS(validate_error(c), "<code>: csv_monitor.job_name: \"" + std::string(bad) + "\" is not a single");
  }
  EXPECT_HAS(parse_error(R"({"csv_monitor": {"enabled": true, "job_name": "../x"}})"),
             "the directory must lie inside csv_monitor.output_path");
  for (const char* good : {"run1", "..x", "a.b", "DeepSpeedJobName"}) {
    EXPECT_EQ(parse_error(std::string(R"({"csv_monitor": {"enabled": true, "job_name": ")") + good + "\"}}"),
              "<no error>") << good;
  }
  // Not written when the monitor is off: DeepSpeed configs that carry one load as before.
  EXPECT_EQ(parse_error(R"({"csv_monitor": {"enabled": false, "job_name": "a/b"}})"), "<no error>");
}

}  // namespace
