// Save / load throughput of the checkpoint store for a model of N parameters with Adam state:
// bf16 working params (2 B) + fp32 master + exp_avg + exp_avg_sq (12 B) = 14 B per parameter.
// One rank (the per-rank path is the same at any world size: each rank writes its own shard).
//
//   bench_checkpoint DIR [N=100000000] [REPEATS=3]
// Prints one line per measurement: "<what> <bytes> <seconds> <GB/s>" (median of repeats).
// Save includes fsync of every file and directory; load reads into existing buffers;
// dstrain_verify_pass is the checksum pass of the verified load on its own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/half.h"
#include "ds/io/checkpoint.h"
#include "ds/mpi/communicator.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

class SelfComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "self"; }
  void all_reduce(TensorView, ReduceOp) override {}
  CommWork iall_reduce(TensorView, ReduceOp) override { return std::make_unique<Done>(); }
  void reduce_scatter(TensorView s, TensorView r, ReduceOp) override { std::memcpy(r.data, s.data, r.bytes()); }
  CommWork ireduce_scatter(TensorView s, TensorView r, ReduceOp o) override { reduce_scatter(s, r, o); return std::make_unique<Done>(); }
  void all_gather(TensorView s, TensorView r) override { std::memcpy(r.data, s.data, r.bytes()); }
  CommWork iall_gather(TensorView s, TensorView r) override { all_gather(s, r); return std::make_unique<Done>(); }
  void broadcast(TensorView, int) override {}
  void barrier() override {}
 private:
  struct Done final : CommHandle { void wait() override {} bool test() override { return true; } };
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_checkpoint DIR [N] [REPEATS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 100000000ull;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  // 12 tensors, like the layers of a small transformer, in one flat space.
  const int tensors = 12;
  HostBuffer params(n, DType::BF16), master(n, DType::F32), m1(n, DType::F32), m2(n, DType::F32);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = float(i % 1000) * 1e-3f - 0.5f;
    master.as<float>()[i] = v;
    m1.as<float>()[i] = v * 0.1f;
    m2.as<float>()[i] = v * v;
  }
  convert_f32_to_bf16(master.as<float>(), params.as<bf16>(), n);
  io::CheckpointContent c;
  std::size_t off = 0;
  for (int t = 0; t < tensors; ++t) {
    const std::size_t cnt = t + 1 < tensors ? n / tensors : n - off;
    c.params.push_back({"layer" + std::to_string(t) + ".weight", {std::int64_t(cnt)}, DType::BF16,
                        params.as<bf16>() + off, off});
    off += cnt;
  }
  c.working_dtype = "bf16";
  c.zero_stage = 1;
  c.flat_numel = n;
  c.shard_offset = 0;
  c.shard_count = n;
  c.shard = {{"fp32_master", master.as<float>()}, {"optim/exp_avg", m1.as<float>()}, {"optim/exp_avg_sq", m2.as<float>()}};
  c.engine_state["global_steps"] = 1;
  const std::size_t bytes = n * 14;

  SelfComm comm;
  io::SaveOptions opt;
  opt.overwrite = true;
  std::vector<double> save_t, load_t, load_verified_t, verify_pass_t;
  // Load targets: allocated and touched once, reused by every repeat.
  HostBuffer lp(n, DType::BF16), lmaster(n, DType::F32), lm1(n, DType::F32), lm2(n, DType::F32);
  for (int r = 0; r < repeats; ++r) {
    fs::remove_all(dir);
    double t0 = now();
    io::save_checkpoint(comm, dir, "bench", c, opt);
    save_t.push_back(now() - t0);
    for (int verify = 0; verify < 2; ++verify) {
      t0 = now();
      io::CheckpointReader rd(dir, "bench");
      if (verify) {
        std::vector<std::string> names;
        for (const auto& p : c.params) names.push_back(p.name);
        rd.verify_params(names);
        rd.verify_flat_range(0, n);
        verify_pass_t.push_back(now() - t0);
      }
      for (const auto& p : c.params)
        rd.read_param(p.name, lp.as<bf16>() + p.flat_offset, DType::BF16, p.numel());
      rd.read_flat("fp32_master", 0, n, lmaster.as<float>());
      rd.read_flat("optim/exp_avg", 0, n, lm1.as<float>());
      rd.read_flat("optim/exp_avg_sq", 0, n, lm2.as<float>());
      (verify ? load_verified_t : load_t).push_back(now() - t0);
    }
  }
  if (std::memcmp(lmaster.data(), master.data(), n * 4) != 0 || std::memcmp(lm2.data(), m2.data(), n * 4) != 0 ||
      std::memcmp(lp.data(), params.data(), n * 2) != 0) {
    std::fprintf(stderr, "bench_checkpoint: loaded data differs from saved data\n");
    return 1;
  }
  auto line = [&](const char* what, double t) { std::printf("%s %zu %.3f %.3f\n", what, bytes, t, double(bytes) / t / 1e9); };
  line("dstrain_save", median(save_t));
  line("dstrain_load", median(load_t));
  line("dstrain_load_verified", median(load_verified_t));
  line("dstrain_verify_pass", median(verify_pass_t));  // the checksum pass of the verified load alone
  fs::remove_all(dir);
  return 0;
}
