// ckpt_restage SRC_SAVE_DIR DST_SAVE_DIR (under mpirun, W ranks): rewrites the newest
// checkpoint of SRC as ZeRO stage 3 saves it -- parameters in groups of three, each group cut
// into W pieces (the last ones short), rank r saving piece r of every group (shard_ranges),
// no params/<name> datasets (params_in_master) -- with the same master, optimizer state,
// counters, client state and config, under the same tag. Exporting both must give the same
// tensors (export_stage3_test.sh).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/io/checkpoint.h"
#include "ds/mpi/init.h"

using namespace ds;

int main(int argc, char** argv) {
  DistributedContext ctx = init_distributed();
  Communicator& comm = *ctx.comm;
  const int rank = comm.rank(), W = comm.size();
  try {
    if (argc != 3) throw Error("usage: ckpt_restage SRC_SAVE_DIR DST_SAVE_DIR");
    const std::string src = argv[1], dst = argv[2];
    const std::string tag = io::read_latest(src).value();
    io::CheckpointReader r(src, tag);
    const io::Manifest& m = r.manifest();
    io::CheckpointContent c;
    const DType wd = parse_dtype(m.working_dtype);
    std::size_t dense = 0;
    for (const auto& p : m.params) {
      c.params.push_back({p.name, p.shape, wd, nullptr, p.flat_offset});
      dense = std::max(dense, p.flat_offset + p.numel);
    }
    for (std::size_t g = 0; g < m.params.size(); g += 3) {
      const std::size_t off = m.params[g].flat_offset;
      const std::size_t end = g + 3 < m.params.size() ? m.params[g + 3].flat_offset : dense;
      const std::size_t n = end - off, piece = (n + std::size_t(W) - 1) / std::size_t(W), b = std::size_t(rank) * piece;
      if (b < n) c.shard_ranges.push_back({off + b, std::min(piece, n - b)});
    }
    for (const auto& g : c.shard_ranges) c.shard_count += g.count;
    std::vector<std::vector<float>> data;
    for (const auto& name : m.shard_datasets) {
      std::vector<float>& d = data.emplace_back(c.shard_count);
      std::size_t at = 0;
      for (const auto& g : c.shard_ranges) {
        r.verify_flat_range(g.offset, g.count);
        r.read_flat(name, g.offset, g.count, d.data() + at);
        at += g.count;
      }
    }
    for (std::size_t i = 0; i < data.size(); ++i) c.shard.push_back({m.shard_datasets[i], data[i].data()});
    c.working_dtype = m.working_dtype;
    c.zero_stage = 3;
    c.flat_numel = dense;
    c.params_in_master = true;
    c.engine_state = r.engine_state();
    c.engine_state["zero_stage"] = std::int64_t(3);
    c.engine_state["world_size"] = std::int64_t(W);
    c.client_state = r.client_state();
    c.config_json = r.config_json();
    io::save_checkpoint(comm, dst, tag, c);
    if (rank == 0)
      std::cout << "ckpt_restage: " << src << "/" << tag << " -> " << dst << "/" << tag << " (" << W << " ranks, "
                << c.shard_ranges.size() << " ranges on rank 0)" << std::endl;
  } catch (const std::exception& e) {
    abort_job(1, std::string("ckpt_restage: error: ") + e.what());
  }
  finalize_distributed(ctx);
  return 0;
}
