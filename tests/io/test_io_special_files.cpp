// Checkpoint files that are not regular files: `latest`, manifest.json or a shard that is a
// FIFO (a reader would block forever), a directory or a device, or far too large. Each is a
// clear error naming the path and what it is, at once.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "../common/no_hang.h"
#include "../common/self_comm.h"
#include "ds/core/error.h"
#include "ds/io/checkpoint.h"

namespace fs = std::filesystem;
using namespace ds;
using namespace ds::io;

namespace {

fs::path fresh(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("ds_io_special_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A one-rank checkpoint of one parameter with a ZeRO shard, saved as tag "t" in dir.
void save_small(const fs::path& dir) {
  static std::vector<float> w = {1, 2, 3, 4}, master = {1, 2, 3, 4}, m = {0, 0, 0, 0};
  CheckpointContent c;
  c.params = {{"w", {4}, DType::F32, w.data(), 0}};
  c.zero_stage = 1;
  c.flat_numel = 4;
  c.shard_count = 4;
  c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m.data()}};
  c.config_json = "{}";
  test::SelfComm comm;
  save_checkpoint(comm, dir.string(), "t", c);
}

// Replaces `p` by a FIFO.
void make_fifo(const fs::path& p) {
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
}

TEST(CheckpointSpecialFiles, LatestThatIsNotARegularFile) {
  fs::path d = fresh("latest");
  const std::string latest = (d / "latest").string();
  make_fifo(latest);
  EXPECT_HAS(error_without_hang(latest, [&] { (void)read_latest(d.string()); }),
             "checkpoint file " + latest + " is a FIFO, not a regular file");
  fs::remove(latest);
  fs::create_directory(latest);
  EXPECT_HAS(error_of([&] { (void)read_latest(d.string()); }), "checkpoint file " + latest + " is a directory, not a regular file");
  fs::remove(latest);
  fs::create_symlink("/dev/null", latest);
  EXPECT_HAS(error_of([&] { (void)read_latest(d.string()); }),
             "checkpoint file " + latest + " is a character device, not a regular file");
  fs::remove(latest);
  ::close(::creat(latest.c_str(), 0644));
  fs::resize_file(latest, (std::uint64_t(4) << 20) + 1);  // sparse: no disk used
  EXPECT_HAS(error_of([&] { (void)read_latest(d.string()); }),
             "checkpoint file " + latest + " is 4194305 bytes; the limit is 4194304 bytes (4 MiB)");
}

TEST(CheckpointSpecialFiles, ManifestThatIsNotARegularFile) {
  fs::path d = fresh("manifest");
  save_small(d);
  const std::string manifest = (d / "t" / "manifest.json").string();
  const std::string saved = manifest + ".saved";
  fs::rename(manifest, saved);
  make_fifo(manifest);
  EXPECT_HAS(error_without_hang(manifest, [&] { CheckpointReader r(d.string(), "t"); }),
             "checkpoint manifest " + manifest + " is a FIFO, not a regular file");
  fs::remove(manifest);
  fs::create_directory(manifest);
  EXPECT_HAS(error_of([&] { CheckpointReader r(d.string(), "t"); }),
             "checkpoint manifest " + manifest + " is a directory, not a regular file");
  fs::remove(manifest);
  ::close(::creat(manifest.c_str(), 0644));
  fs::resize_file(manifest, (std::uint64_t(64) << 20) + 1);  // sparse
  EXPECT_HAS(error_of([&] { CheckpointReader r(d.string(), "t"); }),
             "checkpoint manifest " + manifest + " is 67108865 bytes; the limit is 67108864 bytes (64 MiB)");
  fs::remove(manifest);
  fs::rename(saved, manifest);
  EXPECT_EQ(error_of([&] { CheckpointReader r(d.string(), "t"); }), "(no error)");
}

TEST(CheckpointSpecialFiles, ShardOrModelFileThatIsNotARegularFile) {
  fs::path d = fresh("shard");
  save_small(d);
  const std::string shard = (d / "t" / "zero_rank_0.h5").string();
  make_fifo(shard);
  EXPECT_HAS(error_without_hang(shard, [&] {
               CheckpointReader r(d.string(), "t");
               r.verify_flat_range(0, 4);
             }),
             "HDF5 file " + shard + " is a FIFO, not a regular file");
  const std::string model = (d / "t" / "model_states.h5").string();
  fs::remove(model);
  fs::create_directory(model);
  EXPECT_HAS(error_of([&] {
               CheckpointReader r(d.string(), "t");
               r.verify_params({"w"});
             }),
             "HDF5 file " + model + " is a directory, not a regular file");
}

}  // namespace
