// Multi-rank checks of the checkpoint store (run by ctest under mpirun at 2 and 4 ranks):
//  1. every rank writes its shard in parallel; the manifest's partition map is complete;
//  2. elastic: the flat tensors re-cut for M = 1, 3, 5 readers equal the saved values;
//  3. tag validation: Fail -> every rank throws; Warn -> saved under rank 0's tag;
//  4. a save entered by rank 0 only fails at the first collective's deadline, not a hang.
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/io/checkpoint.h"
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

float value(const std::string& ds, std::size_t g) { return float(g) * 0.5f + (ds == "fp32_master" ? 0.25f : -1000.0f); }

// Uneven partition of [0, L) into W slices (the last ones are larger).
std::pair<std::size_t, std::size_t> slice(std::size_t L, int W, int r) {
  std::size_t base = L / std::size_t(W), extra = L % std::size_t(W);
  std::size_t off = std::size_t(r) * base + std::min<std::size_t>(std::size_t(r), extra);
  return {off, base + (std::size_t(r) < extra ? 1 : 0)};
}

}  // namespace

int main() {
  DistributedContext ctx = init_distributed();
  Communicator& comm = *ctx.comm;
  const int rank = comm.rank(), W = comm.size();
  try {
    fs::path dir = fs::temp_directory_path() / "ds_io_mpi_test";
    std::string tagdir;
    if (rank == 0) {
      // a per-run directory name shared through a broadcast
      fs::path d = fs::temp_directory_path() / ("ds_io_mpi_test_" + std::to_string(::getpid()));
      fs::remove_all(d);
      tagdir = d.string();
    }
    std::vector<float> name(256, 0.0f);
    for (std::size_t i = 0; i < tagdir.size(); ++i) name[i] = float(static_cast<unsigned char>(tagdir[i]));
    comm.broadcast(TensorView{name.data(), name.size(), DType::F32}, 0);
    std::string dirs;
    for (float f : name) { if (f == 0) break; dirs += char(int(f)); }
    dir = dirs;

    // ---- 1 + 2: parallel shards and elastic reads ----
    const std::size_t L = 1003;
    auto [off, cnt] = slice(L, W, rank);
    std::vector<float> master(cnt), m1(cnt);
    for (std::size_t i = 0; i < cnt; ++i) { master[i] = value("fp32_master", off + i); m1[i] = value("optim/exp_avg", off + i); }
    std::vector<float> p0(L);
    for (std::size_t i = 0; i < L; ++i) p0[i] = value("fp32_master", i);
    io::CheckpointContent c;
    c.params = {{"flat", {std::int64_t(L)}, DType::F32, p0.data(), 0}};
    c.zero_stage = 2;
    c.flat_numel = L;
    c.shard_offset = off;
    c.shard_count = cnt;
    c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}};
    c.client_state["world"] = W;
    std::string path = io::save_checkpoint(comm, dir.string(), "step1", c);
    comm.barrier();
    {
      io::CheckpointReader r(dir.string(), "step1");
      EXPECT(r.manifest().world_size == W, "world_size");
      EXPECT(int(r.manifest().partitions.size()) == W, "one partition per rank");
      for (int M : {1, 3, 5}) {
        for (int j = 0; j < M; ++j) {
          auto [o, n] = slice(L, M, j);
          r.verify_flat_range(o, n);
          std::vector<float> got(n + 3);
          r.read_flat("optim/exp_avg", o, n + 3, got.data());  // 3 past the end: zero padding
          for (std::size_t i = 0; i < n + 3; ++i) {
            float want = o + i < L ? value("optim/exp_avg", o + i) : 0.0f;
            if (got[i] != want) { EXPECT(false, "M=" << M << " j=" << j << " i=" << i << " got " << got[i] << " want " << want); break; }
          }
        }
      }
      EXPECT(r.client_state().at("world").as_int() == W, "client state");
    }

    // ---- 3: tag validation ----
    io::SaveOptions fail;
    fail.tag_validation = io::TagValidation::Fail;
    std::string err;
    try {
      io::save_checkpoint(comm, dir.string(), "tag_r" + std::to_string(rank), c, fail);
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT(err.find("not consistent across all ranks") != std::string::npos, "Fail did not throw on this rank: '" << err << "'");
    comm.barrier();
    io::SaveOptions warn;
    warn.tag_validation = io::TagValidation::Warn;
    io::save_checkpoint(comm, dir.string(), "warn_r" + std::to_string(rank), c, warn);
    comm.barrier();
    EXPECT(fs::exists(dir / "warn_r0" / "manifest.json"), "Warn: not saved under rank 0's tag");
    EXPECT(*io::read_latest(dir.string()) == "warn_r0", "latest after Warn");

    // ---- 4: save entered by rank 0 only ----
    if (rank == 0) {
      io::SaveOptions lonely;
      lonely.collective_timeout_s = 2;  // instead of the communicator's deadline
      std::string e1;
      try {
        io::save_checkpoint(comm, dir.string(), "lonely", c, lonely);
      } catch (const Error& e) {
        e1 = e.what();
      }
      EXPECT(e1.find("every rank must call it") != std::string::npos, "no timeout error: '" << e1 << "'");
      std::cout << "one-rank save -> " << e1 << std::endl;
      int go = 1;
      for (int r = 1; r < W; ++r) MPI_Send(&go, 1, MPI_INT, r, 77, MPI_COMM_WORLD);
    } else {
      int go = 0;
      MPI_Recv(&go, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      // Complete rank 0's abandoned first collective (five int64, max) so MPI can shut down cleanly.
      std::vector<std::int64_t> b(5, 0);
      comm.iall_reduce(TensorView{b.data(), b.size(), DType::I64}, ReduceOp::Max)->wait();
    }
    EXPECT(!fs::exists(dir / "lonely"), "a one-rank save committed");
    comm.barrier();
    if (rank == 0) fs::remove_all(dir);
  } catch (const std::exception& e) {
    abort_job(1, std::string("io_mpi_test: error: ") + e.what());
  }
  float f = float(g_failures);
  comm.all_reduce(TensorView{&f, 1, DType::F32}, ReduceOp::Max);
  if (rank == 0) std::cout << (f > 0 ? "io_mpi_test FAILED" : "io_mpi_test passed") << " at " << W << " ranks" << std::endl;
  finalize_distributed(ctx);
  return f > 0 ? 1 : 0;
}
