// Save / load throughput of the checkpoint store for a model of N parameters with Adam state:
// bf16 working params (2 B) + fp32 master + exp_avg + exp_avg_sq (12 B) = 14 B per parameter.
// One rank (the per-rank path is the same at any world size: each rank writes its own shard).
//
//   bench_checkpoint DIR [N=100000000] [REPEATS=3] [--dd] [--min_ratio X]
// Prints one line per measurement: "<what> <bytes> <seconds> <GB/s>" (median of repeats).
//
// Check: after every load, the loaded params, master and both Adam moments equal the saved
// ones byte for byte (a difference fails the run, exit 1). Headline (with --dd): the median
// over the repeats of dd's write time over our save's (save GB/s / dd GB/s); --min_ratio X
// fails the run (exit 3) below X and needs --dd. The last line is its JSON: record
// (bench/README.md).
//
// --dd: also runs the dd reference from here (dd_write: `dd if=/dev/zero bs=16M
// conv=fdatasync` of the same byte count, dd_read: dd of that file to /dev/null, with dd's
// own timing), after this process's buffers exist and each repeat's dd write right before
// its save. The page cache's cost depends on the guest's memory state: on a VM, pages the
// guest freed a moment ago are far cheaper than pages it has not used recently (~13 us per
// 4 KiB here), so a write right after a big file was deleted runs several times faster.
// Run separately, dd came right after torch freed its tensors and file, and our save right
// after this process first touched 2.8 GB of buffers, so dd had cheap pages and we did not.
// Here both start right after an equally large file was deleted: one unmeasured dd write
// (deleted at once) primes the first repeat; dd's file is deleted before our save.
// Save includes fsync of every file and directory; load reads into existing buffers;
// dstrain_verify_pass is the checksum pass of the verified load on its own.
#include <unistd.h>

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
#include "bench_report.h"
#include "ds/mpi/communicator.h"
#include "../../tests/common/self_comm.h"  // the one-rank communicator the io tests use

namespace fs = std::filesystem;
using namespace ds;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs dd (command line `args`) and returns the seconds it reports ("..., 1.23 s, ...").
double run_dd(const std::string& args) {
  std::string cmd = "dd " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  if (::pclose(p) != 0) {
    std::fprintf(stderr, "bench_checkpoint: '%s' failed: %s\n", cmd.c_str(), out.c_str());
    std::exit(1);
  }
  auto comma = out.find("copied, ");
  return comma == std::string::npos ? -1 : std::strtod(out.c_str() + comma + 8, nullptr);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool with_dd = false;
  double min_ratio = 0;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dd") with_dd = true;
    else if (a == "--min_ratio") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_checkpoint: error: --min_ratio needs a value\n");
        return 2;
      }
      min_ratio = ds::bench::parse_min_ratio("bench_checkpoint", argv[++i]);
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "bench_checkpoint: error: unknown flag %s\n", a.c_str());
      return 2;
    } else pos.push_back(a);
  }
  if (pos.empty()) {
    std::fprintf(stderr, "usage: bench_checkpoint DIR [N] [REPEATS] [--dd] [--min_ratio X]\n");
    return 2;
  }
  if (min_ratio > 0 && !with_dd) {
    std::fprintf(stderr, "bench_checkpoint: error: --min_ratio compares against dd: add --dd\n");
    return 2;
  }
  const std::string dir = pos[0];
  const std::size_t n = pos.size() > 1 ? std::strtoull(pos[1].c_str(), nullptr, 10) : 100000000ull;
  const int repeats = pos.size() > 2 ? std::atoi(pos[2].c_str()) : 3;
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

  ds::test::SelfComm comm;
  io::SaveOptions opt;
  opt.overwrite = true;
  std::vector<double> save_t, load_t, load_verified_t, verify_pass_t, dd_write_t, dd_read_t;
  const std::string dd_file = dir + ".dd.bin";
  const std::size_t dd_block = std::size_t(16) << 20;
  const std::string dd_write = "if=/dev/zero of=" + dd_file + " bs=16M count=" + std::to_string((bytes + dd_block - 1) / dd_block) +
                               " conv=fdatasync";
  if (with_dd) {  // priming: see the header comment
    (void)run_dd(dd_write);
    ::unlink(dd_file.c_str());
  }
  // Load targets: allocated and touched once, reused by every repeat.
  HostBuffer lp(n, DType::BF16), lmaster(n, DType::F32), lm1(n, DType::F32), lm2(n, DType::F32);
  std::size_t differing_loads = 0, loads = 0;
  for (int r = 0; r < repeats; ++r) {
    fs::remove_all(dir);
    if (with_dd) {
      dd_write_t.push_back(run_dd(dd_write));
      dd_read_t.push_back(run_dd("if=" + dd_file + " of=/dev/null bs=16M"));
      ::unlink(dd_file.c_str());
    }
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
      ++loads;
      differing_loads += std::memcmp(lmaster.data(), master.data(), n * 4) != 0 || std::memcmp(lm1.data(), m1.data(), n * 4) != 0 ||
                         std::memcmp(lm2.data(), m2.data(), n * 4) != 0 || std::memcmp(lp.data(), params.data(), n * 2) != 0;
      // The next load must write every byte again: a load that skipped a tensor would show.
      std::memset(lmaster.data(), 0xff, n * 4);
      std::memset(lm1.data(), 0xff, n * 4);
      std::memset(lm2.data(), 0xff, n * 4);
      std::memset(lp.data(), 0xff, n * 2);
    }
  }
  auto line = [&](const char* what, double t) { std::printf("%s %zu %.3f %.3f\n", what, bytes, t, double(bytes) / t / 1e9); };
  if (with_dd) {
    line("dd_write", median(dd_write_t));
    line("dd_read", median(dd_read_t));
  }
  line("dstrain_save", median(save_t));
  line("dstrain_load", median(load_t));
  line("dstrain_load_verified", median(load_verified_t));
  line("dstrain_verify_pass", median(verify_pass_t));  // the checksum pass of the verified load alone
  fs::remove_all(dir);
  ds::bench::Report report("bench_checkpoint");
  report.min_ratio(min_ratio);
  report["params"] = n;
  report["bytes"] = bytes;
  report["repeats"] = repeats;
  auto gbs = [&](const std::vector<double>& t) { return double(bytes) / median(t) / 1e9; };
  report["save_gbs"] = gbs(save_t);
  report["load_gbs"] = gbs(load_t);
  report["load_verified_gbs"] = gbs(load_verified_t);
  report["verify_pass_gbs"] = gbs(verify_pass_t);
  report.check("every load equals the saved params, master and Adam moments", differing_loads == 0,
               std::to_string(differing_loads) + " of " + std::to_string(loads) + " loads differ");
  if (with_dd) {
    std::vector<double> save_vs_dd, load_vs_dd;  // per repeat: dd's time over ours
    for (std::size_t r = 0; r < save_t.size(); ++r) {
      save_vs_dd.push_back(dd_write_t[r] / save_t[r]);
      load_vs_dd.push_back(dd_read_t[r] / load_t[r]);
    }
    report["dd_write_gbs"] = gbs(dd_write_t);
    report["dd_read_gbs"] = gbs(dd_read_t);
    report["load_vs_dd"] = ds::bench::median(load_vs_dd);
    report.headline("save GB/s / dd write GB/s, median over repeats", ds::bench::median(save_vs_dd));
  } else {
    report.headline("none: run with --dd for save / dd", std::nan(""));
  }
  return report.finish();
}
