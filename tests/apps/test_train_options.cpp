// The train app's flag parsing and model-shape resolution (no MPI needed).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/error.h"
#include "model_spec.h"
#include "options.h"
#include "report.h"

namespace {

using ds::train::parse_options;
using ds::train::ParseResult;

ParseResult parse(std::vector<const char*> args) {
  args.insert(args.begin(), "train");
  return parse_options(int(args.size()), args.data());
}

TEST(TrainOptions, ConfigAndRunFlags) {
  auto r = parse({"--config", "c.json", "--steps", "7", "--seed", "9", "--n_layer", "2", "--data", "x.txt",
                  "--save_dir", "ck", "--save_interval", "3", "--eval_interval", "5"});
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->config, "c.json");
  EXPECT_EQ(r.options->steps, 7);
  EXPECT_FALSE(r.options->epochs);
  EXPECT_EQ(r.options->seed, 9u);
  EXPECT_EQ(r.options->n_layer, 2);
  EXPECT_FALSE(r.options->n_head);
  EXPECT_EQ(r.options->data, "x.txt");
  EXPECT_EQ(r.options->save_interval, 3);
  EXPECT_EQ(r.options->eval_interval, 5);
}

TEST(TrainOptions, Device) {
  auto def = parse({"--config", "c.json"});
  ASSERT_TRUE(def.options) << def.message;
  EXPECT_EQ(def.options->device, "auto");
  for (const char* d : {"cpu", "cuda", "auto"}) {
    auto r = parse({"--config", "c.json", "--device", d});
    ASSERT_TRUE(r.options) << r.message;
    EXPECT_EQ(r.options->device, d);
  }
}

// --data_dtype: the token width of headerless token files; only uint16 and uint32.
TEST(TrainOptions, DataDtype) {
  auto def = parse({"--config", "c.json", "--data", "d/train_*.bin"});
  ASSERT_TRUE(def.options) << def.message;
  EXPECT_EQ(def.options->data, "d/train_*.bin");
  EXPECT_EQ(def.options->data_dtype, "");
  auto r = parse({"--config", "c.json", "--data", "t.bin", "--data_dtype", "uint32"});
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->data_dtype, "uint32");
  auto bad = parse({"--config", "c.json", "--data_dtype", "int8"});
  EXPECT_FALSE(bad.options);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.message.find("--data_dtype"), std::string::npos) << bad.message;
}

TEST(TrainOptions, DeepSpeedForms) {
  auto r = parse({"--local_rank=0", "--deepspeed", "--deepspeed_config", "ds.json"});
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(r.options->config, "ds.json");
  EXPECT_TRUE(r.options->deepspeed);
  EXPECT_EQ(r.options->local_rank, 0);

  auto same = parse({"--config", "ds.json", "--deepspeed_config", "ds.json"});
  EXPECT_TRUE(same.options) << same.message;
  auto differ = parse({"--config", "a.json", "--deepspeed_config", "b.json"});
  EXPECT_FALSE(differ.options);
  EXPECT_NE(differ.message.find("different"), std::string::npos) << differ.message;
}

TEST(TrainOptions, Errors) {
  auto bogus = parse({"--config", "c.json", "--bogus"});
  EXPECT_FALSE(bogus.options);
  EXPECT_TRUE(bogus.message_is_error);
  EXPECT_NE(bogus.exit_code, 0);
  EXPECT_NE(bogus.message.find("--bogus"), std::string::npos) << bogus.message;

  auto none = parse({"--steps", "3"});
  EXPECT_FALSE(none.options);
  EXPECT_NE(none.message.find("config"), std::string::npos) << none.message;

  EXPECT_FALSE(parse({"--config", "c", "--steps", "3", "--epochs", "1"}).options);
  EXPECT_FALSE(parse({"--config", "c", "--steps", "0"}).options);
  EXPECT_FALSE(parse({"--config", "c", "--steps", "x"}).options);
  EXPECT_FALSE(parse({"--config", "c", "--model", "rnn"}).options);

  EXPECT_FALSE(parse({"--config", "c", "--device", "gpu"}).options);  // cpu | cuda | auto

  auto help = parse({"--help"});
  EXPECT_FALSE(help.options);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_FALSE(help.message_is_error);
  EXPECT_NE(help.message.find("--save_interval"), std::string::npos);
}

// An empty directory flag (an unset shell variable) is an error, not "no directory".
TEST(TrainOptions, EmptyDirectoryFlags) {
  for (const char* flag : {"--load_dir", "--save_dir"}) {
    auto r = parse({"--config", "c", flag, ""});
    EXPECT_FALSE(r.options) << flag;
    EXPECT_TRUE(r.message_is_error);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.message.find(std::string(flag) + " is empty"), std::string::npos) << r.message;
    const std::string joined = std::string(flag) + "=";  // CLI11: a missing value
    auto j = parse({"--config", "c", joined.c_str()});
    EXPECT_FALSE(j.options) << joined;
    EXPECT_NE(j.message.find(flag), std::string::npos) << j.message;
  }
  auto ok = parse({"--config", "c", "--load_dir", "ck"});
  ASSERT_TRUE(ok.options) << ok.message;
  EXPECT_EQ(ok.options->load_dir, "ck");
}

TEST(ModelSpec, DefaultsConfigThenFlags) {
  ds::train::TrainOptions o;
  auto def = ds::train::resolve_model_spec(nullptr, o, "c.json");
  EXPECT_EQ(def.type, "gpt");
  EXPECT_EQ(def.vocab_size, 0);  // from the data

  nlohmann::json section = {{"type", "gpt"}, {"n_layer", 3}, {"n_head", 2}, {"n_embd", 64}, {"block_size", 32}};
  auto cfg = ds::train::resolve_model_spec(section, o, "c.json");
  EXPECT_EQ(cfg.n_layer, 3);
  EXPECT_EQ(cfg.n_embd, 64);
  EXPECT_EQ(cfg.block_size, 32);

  o.n_layer = 1;
  o.block_size = 8;
  auto flags = ds::train::resolve_model_spec(section, o, "c.json");
  EXPECT_EQ(flags.n_layer, 1);
  EXPECT_EQ(flags.block_size, 8);
  EXPECT_EQ(flags.n_head, 2);
}

TEST(ModelSpec, Errors) {
  ds::train::TrainOptions o;
  auto msg = [&](const nlohmann::json& s) {
    try {
      ds::train::resolve_model_spec(s, o, "c.json");
    } catch (const ds::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({{"n_layers", 2}}).find("model.n_layers"), std::string::npos);
  EXPECT_NE(msg({{"n_layer", 0}}).find("model.n_layer"), std::string::npos);
  EXPECT_NE(msg({{"n_layer", "2"}}).find("model.n_layer"), std::string::npos);
  EXPECT_NE(msg({{"type", "rnn"}}).find("model.type"), std::string::npos);
  EXPECT_NE(msg({{"n_embd", 30}, {"n_head", 4}}).find("divisible"), std::string::npos);
  EXPECT_NE(msg(nlohmann::json::array()).find("object"), std::string::npos);
}

// --model torchscript:PATH (or model.type): the whole string is the type, checked here; the
// file itself is read when the model is built.
TEST(ModelSpec, TorchScript) {
  auto flag = parse({"--config", "c", "--model", "torchscript:dir/m.pt"});
  ASSERT_TRUE(flag.options) << flag.message;
  EXPECT_EQ(ds::train::resolve_model_spec(nullptr, *flag.options, "c.json").type, "torchscript:dir/m.pt");
  EXPECT_FALSE(parse({"--config", "c", "--model", "torchscript:"}).options);
  ds::train::TrainOptions o;
  EXPECT_EQ(ds::train::resolve_model_spec({{"type", "torchscript:m.pt"}}, o, "c.json").describe(),
            "torchscript:m.pt block_size=64 vocab_size=0");
  EXPECT_THROW(ds::train::resolve_model_spec({{"type", "torchscript"}}, o, "c.json"), ds::Error);
}

TEST(ModelSpec, Llama) {
  ds::train::TrainOptions o;
  nlohmann::json section = {{"type", "llama"}, {"n_head", 4}, {"n_kv_head", 2}, {"n_embd", 64}, {"intermediate_size", 96}};
  auto m = ds::train::resolve_model_spec(section, o, "c.json");
  EXPECT_EQ(m.type, "llama");
  EXPECT_EQ(m.n_kv_head, 2);
  EXPECT_EQ(m.intermediate_size, 96);
  EXPECT_EQ(m.describe(), "llama n_layer=4 n_head=4 n_kv_head=2 n_embd=64 intermediate_size=96 block_size=64 vocab_size=0");
  // n_kv_head defaults to n_head; the flags win over the section.
  o.model = "llama";
  EXPECT_EQ(ds::train::resolve_model_spec(nullptr, o, "c.json").n_kv_head, 4);
  o.n_kv_head = 1;
  EXPECT_EQ(ds::train::resolve_model_spec(section, o, "c.json").n_kv_head, 1);
  auto msg = [&](const nlohmann::json& s, const ds::train::TrainOptions& opts) {
    try {
      ds::train::resolve_model_spec(s, opts, "c.json");
    } catch (const ds::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ds::train::TrainOptions none;
  EXPECT_NE(msg({{"type", "llama"}, {"n_head", 4}, {"n_kv_head", 3}}, none)
                .find("n_head (4) must be divisible by n_kv_head (3); set --n_kv_head or model.n_kv_head in c.json"),
            std::string::npos);
  EXPECT_NE(msg({{"type", "llama"}, {"n_head", 4}, {"n_embd", 12}}, none).find("head dim n_embd / n_head (3) must be even"),
            std::string::npos);
  EXPECT_NE(msg({{"n_kv_head", 2}}, none).find("n_kv_head and intermediate_size are llama settings; --model gpt"),
            std::string::npos);
  EXPECT_NE(msg({{"n_kv_heads", 2}}, none).find("(known: type, n_layer, n_head, n_kv_head, n_embd, intermediate_size"),
            std::string::npos);
  EXPECT_NE(msg({{"type", "llama2"}}, none).find("model.type must be \"gpt\", \"mlp\", \"llama\" or \"torchscript:PATH\""), std::string::npos);
  // The command line takes --model llama and the llama flags.
  const char* argv[] = {"train", "--config", "c.json", "--model", "llama", "--n_kv_head", "2", "--intermediate_size", "40"};
  auto r = ds::train::parse_options(9, argv);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(*r.options->model, "llama");
  EXPECT_EQ(*r.options->n_kv_head, 2);
  EXPECT_EQ(*r.options->intermediate_size, 40);
}

TEST(ModelSpec, LlamaSettings) {
  ds::train::TrainOptions none;
  nlohmann::json section = {{"type", "llama"}, {"n_embd", 64}, {"rope_theta", 500000}, {"rms_norm_eps", 1e-6},
                            {"tie_embeddings", true}};
  auto m = ds::train::resolve_model_spec(section, none, "c.json");
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rms_norm_eps, 1e-6);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.describe(), "llama n_layer=4 n_head=4 n_kv_head=4 n_embd=64 intermediate_size=0 block_size=64 "
                          "vocab_size=0 rope_theta=500000 rms_norm_eps=1e-06 tie_embeddings=true");
  // The defaults leave the line as it was (a resume compares it).
  ds::train::TrainOptions llama;
  llama.model = "llama";
  auto d = ds::train::resolve_model_spec(nullptr, llama, "c.json");
  EXPECT_EQ(d.rope_theta, 10000.0);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_FALSE(d.tie_embeddings);
  EXPECT_EQ(d.describe().find("rope_theta"), std::string::npos);
  // Flags win over the section.
  ds::train::TrainOptions o;
  o.rope_theta = 20000;
  o.rms_norm_eps = 1e-5;
  o.tie_embeddings = false;
  auto f = ds::train::resolve_model_spec(section, o, "c.json");
  EXPECT_EQ(f.rope_theta, 20000.0);
  EXPECT_EQ(f.rms_norm_eps, 1e-5);
  EXPECT_FALSE(f.tie_embeddings);

  auto msg = [&](const nlohmann::json& s, const ds::train::TrainOptions& opts) {
    try {
      ds::train::resolve_model_spec(s, opts, "c.json");
    } catch (const ds::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({{"type", "llama"}, {"rope_theta", 0}}, none).find("c.json: model.rope_theta must be a positive number, got 0"),
            std::string::npos);
  EXPECT_NE(msg({{"type", "llama"}, {"rms_norm_eps", "1e-6"}}, none)
                .find("c.json: model.rms_norm_eps must be a positive number, got \"1e-6\""),
            std::string::npos);
  EXPECT_NE(msg({{"type", "llama"}, {"tie_embeddings", 1}}, none).find("c.json: model.tie_embeddings must be true or false, got 1"),
            std::string::npos);
  ds::train::TrainOptions bad;
  bad.rms_norm_eps = -1;
  EXPECT_NE(msg({{"type", "llama"}}, bad).find("--rms_norm_eps must be a positive number, got -1"), std::string::npos);
  EXPECT_NE(msg({{"rope_theta", 5}}, none)
                .find("rope_theta is a llama setting; --model gpt does not take it (model.rope_theta in c.json or --rope_theta)"),
            std::string::npos);
  ds::train::TrainOptions tie;
  tie.tie_embeddings = true;
  EXPECT_NE(msg(nullptr, tie).find("tie_embeddings is a llama setting; --model gpt does not take it"), std::string::npos);

  // The command line: --tie_embeddings takes true or false.
  const char* argv[] = {"train", "--config", "c.json", "--rope_theta", "1e6", "--rms_norm_eps", "1e-6", "--tie_embeddings", "true"};
  auto r = ds::train::parse_options(9, argv);
  ASSERT_TRUE(r.options) << r.message;
  EXPECT_EQ(*r.options->rope_theta, 1e6);
  EXPECT_EQ(*r.options->rms_norm_eps, 1e-6);
  EXPECT_TRUE(*r.options->tie_embeddings);
  const char* argv2[] = {"train", "--config", "c.json", "--tie_embeddings", "yes"};
  auto r2 = ds::train::parse_options(5, argv2);
  EXPECT_FALSE(r2.options);
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.message.find("--tie_embeddings"), std::string::npos) << r2.message;
}

TEST(Report, Formatting) {
  EXPECT_EQ(ds::train::format_duration(65), "1:05");
  EXPECT_EQ(ds::train::format_duration(3723), "1:02:03");
  EXPECT_EQ(ds::train::printable(std::string("a\nb\x01\xff")), "a\nb??");
}

}  // namespace
