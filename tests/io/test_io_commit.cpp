// The commit against another writer of the same save directory (another job saving the same
// tag, injected here between begin_save's check and commit_save): a tag is never replaced
// unless this save saw it and meant to, the losing save fails naming the other writer and
// leaves its checkpoint alone, and `latest` only moves forward. The two-process race is
// tests/io/concurrent_save_test.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/self_comm.h"
#include "../common/temp_dir.h"
#include "ds/core/error.h"
#include "ds/io/checkpoint.h"

namespace fs = std::filesystem;
using namespace ds;
using namespace ds::io;

namespace {

// One parameter of four elements, all `value`, saved at global step `step`.
struct TinySave {
  std::vector<float> w;
  CheckpointContent content;
  TinySave(float value, std::int64_t step) : w(4, value) {
    content.params = {{"w", {4}, DType::F32, w.data(), 0}};
    content.zero_stage = 1;
    content.flat_numel = 4;
    content.shard_count = 4;
    content.shard = {{"fp32_master", w.data()}};
    content.engine_state["global_steps"] = step;
    content.config_json = "{}";
  }
};

// The value a checkpoint's parameter holds (checksums verified).
float saved_value(const fs::path& dir, const std::string& tag) {
  CheckpointReader r(dir.string(), tag);
  r.verify_params({"w"});
  std::vector<float> w(4);
  r.read_param("w", w.data(), DType::F32, 4);
  return w[0];
}

void expect_no_tmp_dirs(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

std::string this_writer() { return "pid " + std::to_string(::getpid()) + " on host "; }

}  // namespace

TEST(CheckpointCommit, ATagCommittedByAnotherWriterAfterTheCheckIsNotReplaced) {
  TempDir d("ds_io_commit");
  test::SelfComm comm;
  TinySave mine(1.0f, 5), theirs(2.0f, 5);
  PendingSave p = begin_save(comm, d.path.string(), "global_step5", SaveOptions(), mine.content);
  LocalWriteResult w = write_local(p, 0, mine.content);
  ASSERT_TRUE(w.ok) << w.error;
  // The other job checks, writes and commits the same tag while this save is writing.
  save_checkpoint(comm, d.path.string(), "global_step5", theirs.content);
  const std::string e = error_of([&] { commit_save(comm, p, w); });
  EXPECT_HAS(e, "checkpoint tag 'global_step5' in " + d.path.string() + " was committed by another writer (" +
                    this_writer());
  EXPECT_HAS(e, "this save is not committed");
  EXPECT_EQ(saved_value(d.path, "global_step5"), 2.0f);  // the other job's checkpoint is intact
  EXPECT_EQ(*read_latest(d.path.string()), "global_step5");
  expect_no_tmp_dirs(d.path);
}

TEST(CheckpointCommit, AnOverwriteReplacesOnlyTheCopyItSaw) {
  TempDir d("ds_io_commit");
  test::SelfComm comm;
  TinySave first(1.0f, 1), mine(2.0f, 1), theirs(3.0f, 1), later(4.0f, 1);
  SaveOptions overwrite;
  overwrite.overwrite = true;
  save_checkpoint(comm, d.path.string(), "t", first.content);
  PendingSave p = begin_save(comm, d.path.string(), "t", overwrite, mine.content);
  LocalWriteResult w = write_local(p, 0, mine.content);
  ASSERT_TRUE(w.ok) << w.error;
  // Another writer replaces `t` after this save looked at it.
  save_checkpoint(comm, d.path.string(), "t", theirs.content, overwrite);
  const std::string e = error_of([&] { commit_save(comm, p, w); });
  EXPECT_HAS(e, "checkpoint tag 't' in " + d.path.string() + " was replaced by another writer (" + this_writer());
  EXPECT_EQ(saved_value(d.path, "t"), 3.0f);
  expect_no_tmp_dirs(d.path);
  // With nothing in between, the overwrite goes through.
  save_checkpoint(comm, d.path.string(), "t", later.content, overwrite);
  EXPECT_EQ(saved_value(d.path, "t"), 4.0f);
  expect_no_tmp_dirs(d.path);
}

TEST(CheckpointCommit, LatestOnlyMovesForward) {
  TempDir d("ds_io_commit");
  test::SelfComm comm;
  TinySave step10(1.0f, 10), step5(2.0f, 5), again10(3.0f, 10);
  save_checkpoint(comm, d.path.string(), "b", step10.content);
  save_checkpoint(comm, d.path.string(), "a", step5.content);  // committed, `latest` stays
  EXPECT_EQ(*read_latest(d.path.string()), "b");
  EXPECT_EQ(saved_value(d.path, "a"), 2.0f);
  save_checkpoint(comm, d.path.string(), "c", again10.content);  // the same step moves it
  EXPECT_EQ(*read_latest(d.path.string()), "c");
  CheckpointReader r(d.path.string(), "c");
  EXPECT_EQ(r.manifest().global_steps, 10);
  EXPECT_HAS(r.manifest().writer, this_writer());
  // A `latest` that names no readable checkpoint is replaced.
  std::ofstream(d.path / "latest") << "gone";
  save_checkpoint(comm, d.path.string(), "d", step5.content);
  EXPECT_EQ(*read_latest(d.path.string()), "d");
}

// `latest` of random bytes: what the error echoes is escaped and bounded.
TEST(CheckpointCommit, LatestOfRandomBytesIsEchoedEscapedAndBounded) {
  TempDir d("ds_io_commit");
  std::string noise = "x\x1b[2J\x07";
  for (int i = 0; i < 5000; ++i) noise.push_back(char((i * 131 + 7) % 256));
  noise += "y";
  for (const std::string& content : {std::string("\x1b[31mred\x1b[0m"), noise}) {
    std::ofstream(d.path / "latest", std::ios::binary) << content;
    const std::string e = error_of([&] { (void)read_latest(d.path.string()); });
    EXPECT_HAS(e, (d.path / "latest").string());
    EXPECT_HAS(e, "\\x1b[");  // escaped, not raw
    EXPECT_LT(e.size(), 700u) << e;
    for (char c : e) EXPECT_TRUE((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f) << e;
  }
}
