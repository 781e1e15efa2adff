// Checkpoint resume driver (run under mpirun by tests/io/*.sh; docs/dev/checkpoints.md "Tests").
//
//   ckpt_driver --dir D --steps N --save-at k[,k2] [--combos fp32:0,bf16:2] [--kill PHASE]
//       trains N optimizer steps for every combo (working dtype : ZeRO stage), saving at the
//       listed steps into D/<combo>/ckpt, and writes D/<combo>/full.txt (loss per step and the
//       final parameters as hex floats). With --kill, DS_CKPT_TEST_KILL_AT=PHASE is set just
//       before the LAST save (a test hook: the process raises SIGKILL there).
//   ckpt_driver --dir D --load-must-fail TEXT [--hidden H] [--combos ...]
//       trains one step, then load_checkpoint(D/<combo>/ckpt) must throw ds::Error containing
//       TEXT, and the engine's parameters, counters and lr must be unchanged.
//   ckpt_driver --dir D --steps N --resume [--combos ...] [--tol T] [--async]
//       a NEW process: loads D/<combo>/ckpt (tag from `latest`), takes the data position from
//       the client state, trains to N, and compares every loss and the final parameters with
//       full.txt: bit for bit (T = 0) or within relative tolerance T (elastic runs).
//   ckpt_driver ... --async --meet FILE
//       two such jobs meet before committing their last save (the first to arrive creates
//       FILE and waits until the second removes it): both saves are begun, their tag checked,
//       and their commits race (tests/io/concurrent_save_test.sh).
// The global batch is 8 samples for every world size (micro batch 2, gas = 8 / (2 W)).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt_model.h"
#include "ds/core/error.h"
#include "ds/engine/engine.h"
#include "ds/mpi/init.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

constexpr int kDim = 6, kExtra = 3, kSamples = 64, kGlobalBatch = 8, kMicro = 2;

struct Data {
  std::vector<float> x;
  std::vector<std::int32_t> t;
  Data() {
    std::uint64_t s = 99;
    auto next = [&] { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    for (int i = 0; i < kSamples * kDim; ++i) x.push_back(float(std::int64_t(next() % 17) - 8) / 8.0f);
    for (int i = 0; i < kSamples; ++i) t.push_back(std::int32_t(next() % 5) - 2);
  }
  Batch batch(int first) const {
    first %= kSamples;
    Batch b;
    b.features = std::span<const float>(x.data() + std::size_t(first) * kDim, std::size_t(kMicro * kDim));
    b.targets = std::span<const std::int32_t>(t.data() + first, std::size_t(kMicro));
    b.batch = kMicro;
    b.feature_dim = kDim;
    return b;
  }
};

std::string config_for(const std::string& dtype, int stage, bool async) {
  std::ostringstream c;
  c << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,)"
    << R"( "optimizer": {"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.01}},)"
    << R"( "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4}},)"
    << R"( "gradient_clipping": 1.0, "seed": 5,)"
    << R"( "zero_optimization": {"stage": )" << stage << R"(, "reduce_bucket_size": 16, "allgather_bucket_size": 16},)"
    << R"( "checkpoint": {"tag_validation": "Fail", "async_save": )" << (async ? "true" : "false") << "},"
    << R"( "fp16": {"enabled": )" << (dtype == "fp16" ? "true" : "false") << R"(, "initial_scale_power": 8, "loss_scale_window": 2},)"
    << R"( "bf16": {"enabled": )" << (dtype == "bf16" ? "true" : "false") << "}}";
  return c.str();
}

std::string hexf(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", v);
  return b;
}

// One optimizer step: gas micro-batches; returns the global mean loss (all ranks).
double train_step(Engine& e, const Data& data, std::int64_t step) {
  const int W = e.comm().size(), r = e.comm().rank();
  const int gas = int(e.gradient_accumulation_steps());
  float sum = 0;
  for (int m = 0; m < gas; ++m) {
    const int first = int(step) * kGlobalBatch + (m * W + r) * kMicro;
    float loss = e.forward(data.batch(first));
    e.backward(loss);
    e.step();
    sum += loss;
  }
  e.comm().all_reduce(TensorView{&sum, 1, DType::F32}, ReduceOp::Sum);
  return double(sum) / double(W * gas);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::map<std::string, std::string> read_kv(const fs::path& p) {
  std::map<std::string, std::string> m;
  std::ifstream in(p);
  DS_CHECK(in, "cannot read " << p);
  std::string k, v;
  while (in >> k >> v) m[k] = v;
  return m;
}

// --meet: this job and one other pass here together (rank 0 meets, then every rank).
void meet_other_job(const std::string& file, Communicator& comm) {
  if (comm.rank() == 0) {
    const int fd = ::open(file.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      for (int i = 0; i < 6000 && fs::exists(file); ++i) ::usleep(10000);  // a bound, not a timing
      DS_CHECK(!fs::exists(file), "--meet " << file << ": no other job arrived within 60 s");
    } else {
      DS_CHECK(errno == EEXIST, "--meet " << file << ": " << std::strerror(errno));
      fs::remove(file);
    }
  }
  float token = 0;
  comm.all_reduce(TensorView{&token, 1, DType::F32}, ReduceOp::Sum);
}

}  // namespace

int main(int argc, char** argv) {
  DistributedContext ctx;
  try {
    ctx = init_distributed();
    std::string dir, combos = "fp32:0,fp32:1,fp32:2,fp32:3,fp16:0,fp16:1,fp16:2,fp16:3,bf16:0,bf16:1,bf16:2,bf16:3", kill, must_fail,
                     meet;
    int hidden = 5;
    std::vector<std::int64_t> save_at;
    std::int64_t steps = 6;
    bool resume = false, async = false;
    double tol = 0;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto val = [&]() -> std::string {
        DS_CHECK(i + 1 < argc, a << " needs a value");
        return argv[++i];
      };
      if (a == "--dir") dir = val();
      else if (a == "--steps") steps = std::stoll(val());
      else if (a == "--save-at") for (auto& s : split(val(), ',')) save_at.push_back(std::stoll(s));
      else if (a == "--combos") combos = val();
      else if (a == "--kill") kill = val();
      else if (a == "--resume") resume = true;
      else if (a == "--async") async = true;
      else if (a == "--tol") tol = std::stod(val());
      else if (a == "--load-must-fail") must_fail = val();
      else if (a == "--hidden") hidden = std::stoi(val());
      else if (a == "--meet") meet = val();
      else DS_THROW("unknown argument " << a);
    }
    DS_CHECK(!dir.empty(), "--dir is required");
    Data data;
    const int rank = ctx.comm->rank();
    int failures = 0;
    for (const auto& combo : split(combos, ',')) {
      auto parts = split(combo, ':');
      DS_CHECK(parts.size() == 2, "combo '" << combo << "' is not dtype:stage");
      const std::string name = parts[0] + "_z" + parts[1];
      const fs::path cdir = fs::path(dir) / name;
      io::test::CkptMlp model(kDim, hidden, kExtra);
      auto init = initialize(config_for(parts[0], std::stoi(parts[1]), async), model, ctx.comm);
      Engine& e = *init.engine;
      if (!must_fail.empty()) {
        train_step(e, data, 0);
        const std::vector<float> before = e.gather_params_fp32();
        const std::int64_t steps_before = e.global_steps();
        const double lr_before = e.get_lr(), scale_before = e.loss_scale();
        std::string err;
        try {
          e.load_checkpoint((cdir / "ckpt").string());
        } catch (const Error& ex) {
          err = ex.what();
        }
        // The rank that read the bad data names it; the others report that another rank failed.
        float found = err.find(must_fail) != std::string::npos ? 1.0f : 0.0f;
        ctx.comm->all_reduce(TensorView{&found, 1, DType::F32}, ReduceOp::Max);
        const bool ok = found > 0 && !err.empty() && e.gather_params_fp32() == before &&
                        e.global_steps() == steps_before && e.get_lr() == lr_before && e.loss_scale() == scale_before;
        // the engine still trains after the failed load
        train_step(e, data, 1);
        if (err.find(must_fail) != std::string::npos)
          std::cout << name << ": failed load " << (ok ? "OK" : "WRONG") << " (state unchanged), rank " << rank << ": " << err << std::endl;
        else if (!ok)
          std::cout << name << ": failed load WRONG, rank " << rank << ": '" << err << "'" << std::endl;
        failures += ok ? 0 : 1;
        continue;
      }
      std::int64_t start = 0;
      if (resume) {
        auto loaded = e.load_checkpoint((cdir / "ckpt").string());
        DS_CHECK(loaded, "no checkpoint in " << (cdir / "ckpt"));
        const io::StateValue& cs = loaded->second;
        start = cs.at("sampler").at("next_step").as_int();
        DS_CHECK(start == e.global_steps(), "client state step " << start << " != engine global_steps " << e.global_steps());
        DS_CHECK(cs.at("note").as_string() == "resume-test" && cs.at("rng").as_tensor().data.size() == 4,
                 "client state did not round-trip: " << cs.to_string());
      }
      std::vector<std::pair<std::string, std::string>> lines;
      for (std::int64_t s = start; s < steps; ++s) {
        double loss = train_step(e, data, s);
        lines.emplace_back("loss" + std::to_string(s), hexf(loss));
        if (!resume && std::find(save_at.begin(), save_at.end(), s + 1) != save_at.end()) {
          if (!kill.empty() && s + 1 == save_at.back()) ::setenv("DS_CKPT_TEST_KILL_AT", kill.c_str(), 1);
          io::StateValue client;
          client["sampler"]["next_step"] = s + 1;
          client["note"] = "resume-test";
          client["rng"] = io::FloatTensor{{2, 2}, {1.f, 2.f, 3.f, float(s)}};
          e.save_checkpoint((cdir / "ckpt").string(), std::nullopt, client);
        }
      }
      if (!meet.empty()) meet_other_job(meet, *ctx.comm);
      if (async) e.wait_for_checkpoint();
      std::vector<float> params = e.gather_params_fp32();
      for (std::size_t i = 0; i < params.size(); ++i) lines.emplace_back("param" + std::to_string(i), hexf(params[i]));
      if (rank == 0) {
        fs::create_directories(cdir);
        std::ofstream out(cdir / (resume ? "resume.txt" : "full.txt"));
        for (const auto& [k, v] : lines) out << k << " " << v << "\n";
      }
      if (resume && rank == 0) {
        auto full = read_kv(cdir / "full.txt");
        int bad = 0;
        double worst = 0;
        for (const auto& [k, v] : lines) {
          auto it = full.find(k);
          if (it == full.end()) { ++bad; std::cerr << name << ": " << k << " missing from full.txt\n"; continue; }
          const double a = std::strtod(v.c_str(), nullptr), b = std::strtod(it->second.c_str(), nullptr);
          const double rel = std::fabs(a - b) / std::max(1e-3, std::fabs(b));
          worst = std::max(worst, rel);
          const bool ok = tol == 0 ? v == it->second : rel <= tol;
          if (!ok) {
            if (bad < 5) std::cerr << name << ": " << k << " resumed " << v << " (" << a << ") unbroken " << it->second << " (" << b << ")\n";
            ++bad;
          }
        }
        std::cout << name << ": resumed at step " << start << ", " << lines.size() << " values compared, "
                  << (tol == 0 ? "bit-exact" : "tol " + std::to_string(tol)) << ", max rel diff " << worst
                  << (bad ? ", MISMATCHES " + std::to_string(bad) : ", OK") << std::endl;
        failures += bad ? 1 : 0;
      }
    }
    float f = float(failures);
    ctx.comm->all_reduce(TensorView{&f, 1, DType::F32}, ReduceOp::Max);
    int rc = f > 0 ? 1 : 0;
    finalize_distributed(ctx);
    return rc;
  } catch (const std::exception& e) {
    abort_job(1, std::string("ckpt_driver: error: ") + e.what());
  }
}
