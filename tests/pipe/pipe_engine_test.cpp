// The pipeline engine against pure data parallelism: every rank trains the same model with
// the same global batches twice -- through ds::pipe::PipeEngine on the pipe x data grid of
// the test's world, and through a one-rank ds::Engine over MPI_COMM_SELF that accumulates all
// of the step's micro-batches -- and compares losses and final parameters. Run under mpirun at
// 2 ranks (grids 2x1, 1x2 is not a pipeline) and 4 ranks (4x1, 2x2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/engine/engine.h"
#include "ds/mpi/mpi_comm.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/pipe/pipe_engine.h"
#include "mpi_gtest_main.h"

namespace {

std::shared_ptr<ds::Communicator> g_world;

constexpr std::int64_t kMicro = 2, kSeq = 8, kVocab = 64;

struct Case {
  std::string model = "gpt";  // gpt (tied head) | llama (untied)
  int stages = 2;
  int zero = 0;
  int gas = 4;
  double clip = 1.0;
  std::string dtype = "fp32";
  int scale_power = 8;  // fp16's initial_scale_power
  std::string offload;  // the pipeline's offload_optimizer device ("", "cpu", "nvme")
};

std::unique_ptr<ds::Module> make_model(const Case& c) {
  if (c.model == "gpt") return std::make_unique<ds::nn::Gpt>(ds::nn::GptConfig{3, 2, 16, kSeq, kVocab});
  ds::nn::LlamaConfig l;
  l.n_layer = 2;
  l.n_head = 2;
  l.n_kv_head = 1;
  l.n_embd = 16;
  l.intermediate_size = 24;
  l.block_size = kSeq;
  l.vocab_size = kVocab;
  return std::make_unique<ds::nn::Llama>(l);
}

std::string config_text(const Case& c, int data_parallel, int stages) {
  std::string t = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(kMicro) +
                  R"(, "gradient_accumulation_steps": )" + std::to_string(c.gas * (stages == 1 ? data_parallel : 1)) +
                  R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                  R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}})" +
                  R"(, "zero_optimization": {"stage": )" + std::to_string(stages == 1 ? 0 : c.zero) +
                  (stages > 1 && !c.offload.empty()
                       ? R"(, "offload_optimizer": {"device": ")" + c.offload + R"(", "nvme_path": ")" +
                             std::filesystem::temp_directory_path().string() + R"("})"
                       : std::string()) +
                  "}" +
                  R"(, "pipeline": {"stages": )" + std::to_string(stages) + "}";
  if (c.dtype == "bf16") t += R"(, "bf16": {"enabled": true})";
  if (c.dtype == "fp16") t += R"(, "fp16": {"enabled": true, "initial_scale_power": )" + std::to_string(c.scale_power) + "}";
  return t + "}";
}

// Micro-batch `index` of the run (global order: step, data index, micro-batch).
struct Tokens {
  std::vector<std::int32_t> inputs, targets;
  ds::Batch batch() const {
    ds::Batch b;
    b.inputs = inputs;
    b.targets = targets;
    b.batch = kMicro;
    b.seq = kSeq;
    return b;
  }
};

Tokens micro_batch(std::int64_t index) {
  std::mt19937 rng(std::uint32_t(1000 + index));
  Tokens t;
  for (std::int64_t i = 0; i < kMicro * kSeq; ++i) {
    // A learnable pattern (next = current + 1) with noise, so losses fall.
    const std::int32_t x = std::int32_t(rng() % kVocab);
    t.inputs.push_back(x);
    t.targets.push_back(rng() % 4 == 0 ? std::int32_t(rng() % kVocab) : (x + 1) % std::int32_t(kVocab));
  }
  return t;
}

struct RunResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;  // by name
  std::int64_t skipped = 0;
};

// The global parameters by name from an engine's consolidated fp32 copy.
void collect(const ds::Engine& e, std::map<std::string, std::vector<float>>& out) {
  const std::vector<float> flat = e.gather_params_fp32();
  std::size_t off = 0;
  for (const ds::ParamInfo& p : e.module().parameters()) {
    out[p.name].assign(flat.begin() + std::ptrdiff_t(off), flat.begin() + std::ptrdiff_t(off + p.numel()));
    off += p.numel();
  }
}

RunResult run_pipeline(const Case& c, int steps) {
  const int world = g_world->size();
  const int dp = world / c.stages;
  ds::pipe::PipeEngine pipe(ds::config::parse_config_text(config_text(c, dp, c.stages)),
                            [&] { return make_model(c); }, MPI_COMM_WORLD);
  const int data = pipe.coord().data;
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    int micro = 0;
    Tokens held;
    const ds::pipe::MicroBatchSource next = [&] {
      held = micro_batch((std::int64_t(s) * dp + data) * c.gas + micro++);
      return held.batch();
    };
    r.losses.push_back(pipe.train_batch(next));
  }
  r.skipped = pipe.engine().skipped_steps();
  collect(pipe.engine(), r.params);  // this rank's stage: the ranks together check every stage
  return r;
}

RunResult run_reference(const Case& c, int steps) {
  const int world = g_world->size();
  const int dp = world / c.stages;
  auto self = std::make_shared<ds::MpiComm>(MPI_COMM_SELF);
  std::unique_ptr<ds::Module> model = make_model(c);
  ds::Engine e(ds::config::parse_config_text(config_text(c, dp, 1)), *model, self);
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    double sum = 0;
    const int n = dp * c.gas;
    for (int k = 0; k < n; ++k) {
      const Tokens t = micro_batch(std::int64_t(s) * n + k);
      const float loss = e.forward(t.batch());
      sum += loss;
      e.backward(loss);
      e.step();
    }
    r.losses.push_back(float(sum / n));
  }
  r.skipped = e.skipped_steps();
  collect(e, r.params);
  return r;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::abs(b)); }

// Losses within `tol` (relative; 0: bit for bit) and this rank's stage parameters within `ptol`.
void expect_same(const Case& c, int steps, double tol, double ptol) {
  const RunResult ref = run_reference(c, steps);
  const RunResult pipe = run_pipeline(c, steps);
  ASSERT_EQ(pipe.losses.size(), ref.losses.size());
  EXPECT_EQ(pipe.skipped, ref.skipped);  // an overflow skips on every stage, as on the one rank
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    if (tol == 0) EXPECT_EQ(pipe.losses[i], ref.losses[i]) << "step " << i + 1;
    else EXPECT_LE(rel(pipe.losses[i], ref.losses[i]), tol) << "step " << i + 1 << ": " << pipe.losses[i] << " vs " << ref.losses[i];
  }
  EXPECT_LT(pipe.losses.back(), pipe.losses.front());  // it trains
  ASSERT_FALSE(pipe.params.empty());
  for (const auto& [name, v] : pipe.params) {
    const std::vector<float>& w = ref.params.at(name);
    ASSERT_EQ(v.size(), w.size()) << name;
    double worst = 0;
    for (std::size_t i = 0; i < v.size(); ++i) worst = std::max(worst, double(std::abs(v[i] - w[i])));
    if (ptol == 0) EXPECT_EQ(worst, 0.0) << name;
    else EXPECT_LE(worst, ptol) << name;
  }
}

int stages_for_world() { return g_world->size(); }  // a pipe across all ranks
// Two stages: 2x1 at 2 ranks, 2x2 (two data-parallel pipes) at 4.
constexpr int kTwoStages = 2;

}  // namespace

// Llama (untied head) on one pipe: the same summation order as the one-rank run, bit for bit.
TEST(PipeEngine, LlamaOnePipeBitForBit) {
  Case c;
  c.model = "llama";
  c.stages = stages_for_world();
  expect_same(c, 4, 0, 0);
}

// The GPT's tied embedding/head: its two gradient shares are summed in another order.
TEST(PipeEngine, GptTiedHeadOnePipe) {
  Case c;
  c.stages = stages_for_world();
  expect_same(c, 4, 1e-6, 1e-6);
}

// Two stages; at 4 ranks two pipes whose stages average their gradients over 2 ranks.
TEST(PipeEngine, GptTwoStagesEachZeroStage) {
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("zero stage " + std::to_string(zero));
    Case c;
    c.stages = kTwoStages;
    c.zero = zero;
    expect_same(c, 3, 1e-6, 1e-5);
  }
}

// Offloaded optimizer states (host memory, NVMe swap files) inside the stages.
TEST(PipeEngine, OffloadInsideStages) {
  for (const char* device : {"cpu", "nvme"}) {
    SCOPED_TRACE(device);
    Case c;
    c.stages = kTwoStages;
    c.zero = 2;
    c.offload = device;
    expect_same(c, 3, 1e-6, 1e-5);
  }
}

// Clipping by the norm over all stages: a clip far below the norm scales every step.
TEST(PipeEngine, LlamaClipsByTheGlobalNorm) {
  Case c;
  c.model = "llama";
  c.stages = kTwoStages;
  c.clip = 0.05;
  c.zero = 1;
  expect_same(c, 3, 1e-6, 1e-5);
}

// bf16 and fp16 (dynamic loss scale, fp32 master weights): within a few bf16/fp16 ulps.
TEST(PipeEngine, HalfPrecisions) {
  for (const char* dtype : {"bf16", "fp16"}) {
    SCOPED_TRACE(dtype);
    Case c;
    c.stages = kTwoStages;
    c.dtype = dtype;
    c.gas = 2;
    expect_same(c, 3, 2e-2, 3e-2);
  }
}

// fp16 from a loss scale of 2^24: the first steps overflow (on one stage's gradients) and
// every stage skips them, as the one-rank run does.
// One pipe (no data-parallel sum, whose fp16 additions can overflow where the one rank's do not).
TEST(PipeEngine, OverflowSkipsOnEveryStage) {
  Case c;
  c.stages = stages_for_world();
  c.dtype = "fp16";
  c.gas = 2;
  c.scale_power = 24;
  const RunResult pipe = run_pipeline(c, 8);
  EXPECT_GT(pipe.skipped, 0);
  std::int64_t skipped = pipe.skipped, most = pipe.skipped;
  g_world->all_reduce(ds::TensorView{&most, 1, ds::DType::I64}, ds::ReduceOp::Max);
  EXPECT_EQ(skipped, most);  // the same count on every rank
  expect_same(c, 8, 2e-2, 3e-2);
}

// Evaluation (InferenceSchedule): the mean loss of the micro-batches, as the whole model's.
TEST(PipeEngine, EvalBatchEqualsTheModelsLoss) {
  Case c;
  c.stages = stages_for_world();
  const int dp = g_world->size() / c.stages;
  ds::pipe::PipeEngine pipe(ds::config::parse_config_text(config_text(c, dp, c.stages)),
                            [&] { return make_model(c); }, MPI_COMM_WORLD);
  auto self = std::make_shared<ds::MpiComm>(MPI_COMM_SELF);
  std::unique_ptr<ds::Module> model = make_model(c);
  ds::Engine ref(ds::config::parse_config_text(config_text(c, dp, 1)), *model, self);
  int micro = 0;
  Tokens held;
  const ds::pipe::MicroBatchSource next = [&] {
    held = micro_batch(500 + micro++);
    return held.batch();
  };
  const float loss = pipe.eval_batch(next, 3);
  double sum = 0;
  for (int k = 0; k < 3; ++k) sum += ref.evaluate(micro_batch(500 + k).batch());
  EXPECT_EQ(micro, 3);
  EXPECT_FLOAT_EQ(loss, float(sum / 3));
  EXPECT_EQ(pipe.engine().global_steps(), 0);
}

// A grid that does not divide is an error on every rank.
TEST(PipeEngine, RefusesAGridThatDoesNotDivide) {
  Case c;
  c.stages = 3;  // divides neither 2 nor 4 ranks
  EXPECT_THROW(ds::pipe::PipeEngine(ds::config::parse_config_text(config_text(c, 1, 3)),
                                    [&] { return make_model(c); }, MPI_COMM_WORLD),
               ds::Error);
}

// ZeRO-3 inside each stage: one parameter group per layer, gathered around its use.
TEST(PipeEngine, ZeroStage3PerLayerGroups) {
  for (const char* model : {"gpt", "llama"}) {
    SCOPED_TRACE(model);
    Case c;
    c.model = model;
    c.stages = kTwoStages;
    c.zero = 3;
    expect_same(c, 3, 1e-6, 1e-5);
  }
}

// ---------------------------------------------------------------------------------------
// Checkpoints across grids: a run on one grid saves after 2 steps and trains 2 more; a run on
// another grid (or data parallel over all ranks) loads that checkpoint and trains the same 2
// steps: the same losses.
// ---------------------------------------------------------------------------------------

namespace {

constexpr int kBatchMicro = 4;  // micro-batches per global step (every grid)

// A job on `stages` stages (1: ds::Engine over all ranks, data parallel), ZeRO-1.
class GridJob {
 public:
  GridJob(Case c, int stages, int zero = 1) : c_(std::move(c)), stages_(stages) {
    const int world = g_world->size();
    dp_ = world / stages;
    c_.zero = zero;
    c_.gas = kBatchMicro / dp_;
    if (stages > 1) {
      pipe_ = std::make_unique<ds::pipe::PipeEngine>(ds::config::parse_config_text(config_text(c_, dp_, stages)),
                                                     [&] { return make_model(c_); }, MPI_COMM_WORLD);
      data_ = pipe_->coord().data;
    } else {
      model_ = make_model(c_);
      engine_ = std::make_unique<ds::Engine>(ds::config::parse_config_text(config_text(c_, 1, 1)), *model_, g_world);
      data_ = g_world->rank();
    }
  }
  // Steps [first, first + count) (0-based), their mean losses.
  std::vector<float> train(int first, int count) {
    std::vector<float> out;
    for (int s = first; s < first + count; ++s) {
      int micro = 0;
      Tokens held;
      const auto index = [&] { return (std::int64_t(s) * dp_ + data_) * c_.gas + micro++; };
      if (pipe_) {
        out.push_back(pipe_->train_batch([&] {
          held = micro_batch(index());
          return held.batch();
        }));
        continue;
      }
      double sum = 0;
      for (int k = 0; k < c_.gas; ++k) {
        held = micro_batch(index());
        const float loss = engine_->forward(held.batch());
        sum += loss;
        engine_->backward(loss);
        engine_->step();
      }
      double buf[2] = {sum, double(c_.gas)};
      g_world->all_reduce(ds::TensorView{buf, 2, ds::DType::F64}, ds::ReduceOp::Sum);
      out.push_back(float(buf[0] / buf[1]));
    }
    return out;
  }
  void save(const std::string& dir) {
    if (pipe_) pipe_->save_checkpoint(dir);
    else engine_->save_checkpoint(dir);
  }
  void load(const std::string& dir) {
    const auto loaded = pipe_ ? pipe_->load_checkpoint(dir) : engine_->load_checkpoint(dir);
    ASSERT_TRUE(loaded.has_value());
  }
  ds::Engine& engine() { return pipe_ ? pipe_->engine() : *engine_; }

 private:
  Case c_;
  int stages_ = 1, dp_ = 1, data_ = 0;
  std::unique_ptr<ds::pipe::PipeEngine> pipe_;
  std::unique_ptr<ds::Module> model_;
  std::unique_ptr<ds::Engine> engine_;
};

std::string fresh_dir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("ds_pipe_ckpt_" + std::to_string(g_world->size()) + "_" + name))
                              .string();
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
  g_world->barrier();
  return dir;
}

void expect_resumes(const std::string& model, int save_stages, int load_stages, int save_zero = 1, int load_zero = 1) {
  SCOPED_TRACE(model + ": saved on " + std::to_string(save_stages) + " stages, ZeRO " + std::to_string(save_zero) +
               ", loaded on " + std::to_string(load_stages) + ", ZeRO " + std::to_string(load_zero));
  Case c;
  c.model = model;
  const std::string dir = fresh_dir(model + std::to_string(save_stages) + "z" + std::to_string(save_zero) + "to" +
                                    std::to_string(load_stages) + "z" + std::to_string(load_zero));
  std::vector<float> first_run;
  {
    GridJob a(c, save_stages, save_zero);
    a.train(0, 2);
    a.save(dir);
    first_run = a.train(2, 2);
  }
  GridJob b(c, load_stages, load_zero);
  b.load(dir);
  EXPECT_EQ(b.engine().global_steps(), 2);
  const std::vector<float> resumed = b.train(2, 2);
  ASSERT_EQ(resumed.size(), first_run.size());
  for (std::size_t i = 0; i < resumed.size(); ++i)
    EXPECT_LE(rel(resumed[i], first_run[i]), 1e-5) << "step " << i + 3 << ": " << resumed[i] << " vs " << first_run[i];
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(PipeCheckpoint, ResumesOnOtherGrids) {
  const int w = g_world->size();
  // (save stages, load stages); 1 is data parallel over every rank.
  const std::vector<std::pair<int, int>> pairs =
      w == 2 ? std::vector<std::pair<int, int>>{{2, 1}, {1, 2}} : std::vector<std::pair<int, int>>{{4, 2}, {2, 1}, {1, 4}};
  for (const auto& [from, to] : pairs) expect_resumes("gpt", from, to);
  expect_resumes("llama", w, w);
  // ZeRO-3 stages: saved pipelined, loaded data parallel at ZeRO-1, and back.
  expect_resumes("gpt", 2, 1, 3, 1);
  expect_resumes("gpt", 1, 2, 1, 3);
}

int main(int argc, char** argv) { return ds::test::mpi_gtest_main(argc, argv, g_world); }
