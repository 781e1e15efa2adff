// Multi-range shards at several ranks (run by ctest under mpirun at 2 and 4 ranks), laid out
// as ZeRO stage 3 lays them: the dense flat space cut into parameter groups, each group's
// elements split into W equal pieces (the last ones short: padding is not saved) and rank r
// saving piece r of every group, so the ranks' ranges interleave; some ranks hold nothing of
// a small group, and in the `tiny` checkpoint one rank holds nothing at all.
//  1. read_flat at the cuts of 1, 2 and 3 contiguous readers and of 3 interleaved ones, past
//     the end (zeros); verify_flat_range for each;
//  2. read_param from the master (bf16 working dtype; fp32 reads the master itself);
//  3. a contiguous checkpoint read with interleaved cuts (the other direction of the mix);
//  4. one flipped byte in rank 1's optim/exp_avg and fp32_master: the errors name file and
//     dataset (verify_params checks only the master);
//  5. ranks whose ranges overlap or leave a gap: every rank fails with the same message and
//     nothing is committed.
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/io/checkpoint.h"
#include "ds/io/h5file.h"
#include "ds/mpi/init.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

int g_failures = 0;
#define EXPECT(cond, what)                                                                        \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::cerr << "[rank " << rank << "] FAILED " << __LINE__ << ": " << what << std::endl;      \
      ++g_failures;                                                                               \
    }                                                                                             \
  } while (0)

float value(const std::string& ds, std::size_t g) {
  return (ds == "fp32_master" ? 0.1f : -1000.0f) + float(g) * 1.0009765625f * (g % 3 ? 1.0f : -1.0f);
}

struct Param {
  std::string name;
  std::size_t numel, offset;
};

// Parameters grouped as stage 3 groups them (sizes per group).
struct Layout {
  std::vector<Param> params;
  std::vector<std::pair<std::size_t, std::size_t>> groups;  // dense offset, numel
  std::size_t total = 0;
  explicit Layout(const std::vector<std::vector<std::size_t>>& sizes) {
    for (const auto& g : sizes) {
      const std::size_t start = total;
      for (std::size_t n : g) {
        std::string name = "p";  // (not "p" + to_string: GCC 12 warns falsely on that)
        name += std::to_string(params.size());
        params.push_back({name, n, total});
        total += n;
      }
      groups.push_back({start, total - start});
    }
  }
  // Rank r's ranges among W: piece r of every group (pieces of ceil(numel / W)).
  std::vector<io::ShardRange> ranges(int W, int r) const {
    std::vector<io::ShardRange> out;
    for (auto [off, n] : groups) {
      const std::size_t piece = (n + std::size_t(W) - 1) / std::size_t(W), b = std::size_t(r) * piece;
      if (b < n) out.push_back({off + b, std::min(piece, n - b)});
    }
    return out;
  }
};

// What rank r of W saves: its ranges' values end to end.
struct RankContent {
  std::vector<float> master, m1;
  io::CheckpointContent c;
  RankContent(const Layout& L, int W, int r, DType wd) {
    c.shard_ranges = L.ranges(W, r);
    for (const auto& g : c.shard_ranges)
      for (std::size_t i = 0; i < g.count; ++i) {
        master.push_back(value("fp32_master", g.offset + i));
        m1.push_back(value("optim/exp_avg", g.offset + i));
      }
    for (const auto& p : L.params) c.params.push_back({p.name, {std::int64_t(p.numel)}, wd, nullptr, p.offset});
    c.working_dtype = std::string(dtype_name(wd));
    c.zero_stage = 3;
    c.flat_numel = L.total;
    c.shard_count = master.size();
    c.params_in_master = true;
    c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}};
    c.engine_state["global_steps"] = std::int64_t(7);
  }
};

std::pair<std::size_t, std::size_t> slice(std::size_t L, int W, int r) {
  std::size_t base = L / std::size_t(W), extra = L % std::size_t(W);
  std::size_t off = std::size_t(r) * base + std::min<std::size_t>(std::size_t(r), extra);
  return {off, base + (std::size_t(r) < extra ? 1 : 0)};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void flip_byte(const fs::path& file, const std::string& dataset, std::size_t element) {
  std::uint64_t at = 0;
  {
    io::H5File f(file.string(), io::H5File::Mode::Read);
    at = f.raw_extent(dataset)->offset + element * sizeof(float) + 1;
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(at));
  char c = 0;
  io.read(&c, 1);
  c = char(c ^ 0x10);
  io.seekp(std::streamoff(at));
  io.write(&c, 1);
}

}  // namespace

int main() {
  DistributedContext ctx = init_distributed();
  Communicator& comm = *ctx.comm;
  const int rank = comm.rank(), W = comm.size();
  try {
    // a per-run directory shared through a broadcast of rank 0's pid
    std::int64_t pid = rank == 0 ? std::int64_t(::getpid()) : 0;
    comm.broadcast(TensorView{&pid, 1, DType::I64}, 0);
    const fs::path dir = fs::temp_directory_path() / ("ds_io_ranges_mpi_" + std::to_string(pid));
    if (rank == 0) fs::remove_all(dir);
    comm.barrier();

    // groups: 42 (two params), 3 (fewer elements than ranks at 4), 201, 75 (two params)
    const Layout L({{37, 5}, {3}, {200, 1}, {64, 11}});
    RankContent mine(L, W, rank, DType::BF16);
    io::save_checkpoint(comm, dir.string(), "s3", mine.c);
    comm.barrier();
    {
      io::CheckpointReader r(dir.string(), "s3");
      const io::Manifest& m = r.manifest();
      std::size_t parts = 0;
      for (int q = 0; q < W; ++q) parts += L.ranges(W, q).size();
      EXPECT(m.partitions.size() == parts, "one partition per range: " << m.partitions.size() << " vs " << parts);
      EXPECT(m.shard_ranges && m.params_in_master && m.flat_numel == L.total, "manifest flags");
      auto check = [&](std::size_t o, std::size_t n, const std::string& what) {
        r.verify_flat_range(o, n);
        std::vector<float> got(n + 3);
        const bool past_end = o + n == L.total;
        r.read_flat("optim/exp_avg", o, past_end ? n + 3 : n, got.data());
        for (std::size_t i = 0; i < (past_end ? n + 3 : n); ++i) {
          float want = o + i < L.total ? value("optim/exp_avg", o + i) : 0.0f;
          if (got[i] != want) { EXPECT(false, what << " element " << o + i << " got " << got[i] << " want " << want); break; }
        }
      };
      for (int M : {1, 2, 3})
        for (int j = 0; j < M; ++j) {
          auto [o, n] = slice(L.total, M, j);
          check(o, n, "contiguous M=" + std::to_string(M));
        }
      for (int j = 0; j < 3; ++j)
        for (const auto& g : L.ranges(3, j)) check(g.offset, g.count, "interleaved M=3");
      // the parameters from the master: fp32 exactly, bf16 rounded to nearest even
      std::vector<std::string> names;
      for (const auto& p : L.params) names.push_back(p.name);
      r.verify_params(names);
      for (const auto& p : L.params) {
        std::vector<float> f(p.numel);
        std::vector<bf16> b(p.numel);
        r.read_param(p.name, f.data(), DType::F32, p.numel);
        r.read_param(p.name, b.data(), DType::BF16, p.numel);
        for (std::size_t i = 0; i < p.numel; ++i) {
          const float x = value("fp32_master", p.offset + i);
          if (f[i] != x || b[i].bits != float_to_bf16(x).bits) {
            EXPECT(false, p.name << "[" << i << "]: fp32 " << f[i] << " bf16 bits " << b[i].bits << " want " << x);
            break;
          }
        }
      }
    }

    // a rank with no range at all (the group has fewer elements than ranks): it still writes
    // its (empty) shard file, and the others' ranges tile the space
    {
      const Layout tiny(std::vector<std::vector<std::size_t>>{{std::size_t(W - 1)}});
      RankContent t(tiny, W, rank, DType::F32);
      EXPECT(rank != W - 1 || t.c.shard_ranges.empty(), "the last rank holds nothing of the tiny layout");
      io::save_checkpoint(comm, dir.string(), "tiny", t.c);
      comm.barrier();
      io::CheckpointReader r(dir.string(), "tiny");
      r.verify_flat_range(0, tiny.total);
      std::vector<float> got(tiny.total);
      r.read_param("p0", got.data(), DType::F32, tiny.total);
      for (std::size_t i = 0; i < tiny.total; ++i) EXPECT(got[i] == value("fp32_master", i), "tiny " << i);
    }

    // a contiguous (stage 1/2) checkpoint read with the interleaved cuts
    {
      auto [off, cnt] = slice(L.total, W, rank);
      std::vector<float> master(cnt), m1(cnt);
      for (std::size_t i = 0; i < cnt; ++i) { master[i] = value("fp32_master", off + i); m1[i] = value("optim/exp_avg", off + i); }
      io::CheckpointContent c;
      c.zero_stage = 2;
      c.flat_numel = L.total;
      c.shard_offset = off;
      c.shard_count = cnt;
      c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}};
      io::save_checkpoint(comm, dir.string(), "contig", c);
      comm.barrier();
      io::CheckpointReader r(dir.string(), "contig");
      EXPECT(!r.manifest().shard_ranges && !r.manifest().params_in_master, "contiguous manifest flags");
      for (int j = 0; j < 3; ++j)
        for (const auto& g : L.ranges(3, j)) {
          std::vector<float> got(g.count);
          r.read_flat("optim/exp_avg", g.offset, g.count, got.data());
          for (std::size_t i = 0; i < g.count; ++i)
            if (got[i] != value("optim/exp_avg", g.offset + i)) { EXPECT(false, "contig element " << g.offset + i); break; }
        }
    }

    // corruption inside a multi-range shard
    if (rank == 0) {
      fs::copy(dir / "s3", dir / "bad_optim", fs::copy_options::recursive);
      fs::copy(dir / "s3", dir / "bad_master", fs::copy_options::recursive);
      const std::size_t n1 = RankContent(L, W, 1, DType::BF16).master.size();
      flip_byte(dir / "bad_optim" / "zero_rank_1.h5", "optim/exp_avg", n1 - 2);  // in its last range
      flip_byte(dir / "bad_master" / "zero_rank_1.h5", "fp32_master", n1 - 2);
      std::vector<std::string> names;
      for (const auto& p : L.params) names.push_back(p.name);
      {
        io::CheckpointReader r(dir.string(), "bad_optim");
        r.verify_params(names);  // the master is intact
        std::string e = error_of([&] { r.verify_flat_range(0, L.total); });
        EXPECT(e.find("checksum mismatch in " + (dir / "bad_optim" / "zero_rank_1.h5").string() +
                      " dataset 'optim/exp_avg'") != std::string::npos, e);
      }
      {
        io::CheckpointReader r(dir.string(), "bad_master");
        std::string e = error_of([&] { r.verify_params(names); });
        EXPECT(e.find("checksum mismatch in " + (dir / "bad_master" / "zero_rank_1.h5").string() +
                      " dataset 'fp32_master'") != std::string::npos, e);
      }
    }
    comm.barrier();

    // ranges that do not tile the space: every rank fails, nothing is committed
    {
      RankContent bad(L, W, rank, DType::BF16);
      if (rank == 1) bad.c.shard_ranges.back().offset -= 1;  // overlaps rank 0's piece of the group
      std::string e = error_of([&] { io::save_checkpoint(comm, dir.string(), "overlap", bad.c); });
      EXPECT(e.find("save_checkpoint to " + (dir / "overlap").string() + ": the ranks' shard ranges do not cover the "
                    "flat space [0, " + std::to_string(L.total) + ") exactly once: rank 1's range") != std::string::npos &&
                 e.find("overlaps rank 0's range") != std::string::npos, e);
      if (rank == 0) std::cout << "overlap -> " << e << std::endl;
      RankContent gap(L, W, rank, DType::BF16);
      if (rank == W - 1) {  // drops its piece of the last group
        gap.c.shard_count -= gap.c.shard_ranges.back().count;
        gap.c.shard_ranges.pop_back();
      }
      e = error_of([&] { io::save_checkpoint(comm, dir.string(), "gap", gap.c); });
      EXPECT(e.find("are in no rank's range") != std::string::npos, e);
      comm.barrier();
      EXPECT(!fs::exists(dir / "overlap") && !fs::exists(dir / "gap"), "a bad tiling committed");
      EXPECT(*io::read_latest(dir.string()) == "contig", "latest moved");
    }
    comm.barrier();
    if (rank == 0) fs::remove_all(dir);
  } catch (const std::exception& e) {
    abort_job(1, std::string("io_ranges_mpi_test: error: ") + e.what());
  }
  float f = float(g_failures);
  comm.all_reduce(TensorView{&f, 1, DType::F32}, ReduceOp::Max);
  if (rank == 0) std::cout << (f > 0 ? "io_ranges_mpi_test FAILED" : "io_ranges_mpi_test passed") << " at " << W << " ranks" << std::endl;
  finalize_distributed(ctx);
  return f > 0 ? 1 : 0;
}
