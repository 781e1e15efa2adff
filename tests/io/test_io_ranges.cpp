// Multi-range shards and parameters kept only in the fp32 master (the ZeRO stage 3 layout) at
// one rank: read_param rebuilds every working dtype from the master, verify_params checks the
// master's checksums, a manifest whose ranges do not tile the flat space is refused, a rank's
// bad range list fails the save, and a contiguous checkpoint's manifest keeps its old fields.
// The multi-rank cases are io_ranges_mpi_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <tuple>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/io/checkpoint.h"
#include "ds/io/h5file.h"
#include "../common/self_comm.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace ds;
using namespace ds::io;

namespace {

fs::path fresh(const std::string& name) {
  // test_io_unit's cleanup removes the ds_io_unit_<pid>_ directories when the tests end
  fs::path p = fs::temp_directory_path() / ("ds_io_unit_" + std::to_string(::getpid()) + "_ranges_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Three parameters (a [3,4] at 0, b [5] at 12, c [7] at 17: 24 elements) whose master values
// are not representable in fp16 or bf16 (the rounding is exercised), saved by one rank as the
// ranges [0, 9), [9, 20), [20, 24) with the parameters only in the master.
struct Stage3Fake {
  std::vector<float> master = std::vector<float>(24), m1 = std::vector<float>(24);
  DType wd;
  explicit Stage3Fake(DType wd_) : wd(wd_) {
    for (std::size_t i = 0; i < 24; ++i) {
      master[i] = (i % 2 ? -1.0f : 1.0f) * (0.1f + float(i) * 1.0013f);
      m1[i] = float(i) * 0.5f + 0.125f;
    }
  }
  CheckpointContent content() const {
    CheckpointContent c;
    c.params = {{"a", {3, 4}, wd, nullptr, 0}, {"b", {5}, wd, nullptr, 12}, {"c", {7}, wd, nullptr, 17}};
    c.working_dtype = std::string(dtype_name(wd));
    c.zero_stage = 3;
    c.flat_numel = 24;
    c.shard_ranges = {{0, 9}, {9, 11}, {20, 4}};
    c.shard_count = 24;
    c.params_in_master = true;
    c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}};
    c.engine_state["global_steps"] = std::int64_t(2);
    return c;
  }
};

}  // namespace

TEST(CheckpointRanges, ParamsFromMasterInEveryWorkingDtype) {
  for (DType wd : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(wd)));
    fs::path d = fresh(std::string("master_") + std::string(dtype_name(wd)));
    ds::test::SelfComm comm;
    Stage3Fake f(wd);
    save_checkpoint(comm, d.string(), "t", f.content());
    {
      H5File model((d / "t" / "model_states.h5").string(), H5File::Mode::Read);
      EXPECT_FALSE(model.exists("params")) << "params_in_master: no params/<name> datasets";
      EXPECT_EQ(model.attr_int("/", "params_in_master"), 1);
      H5File shard((d / "t" / "zero_rank_0.h5").string(), H5File::Mode::Read);
      EXPECT_EQ(shard.attr_string("/", "ranges"), "[[0, 9], [9, 11], [20, 4]]");
    }
    CheckpointReader r(d.string(), "t");
    const Manifest& m = r.manifest();
    EXPECT_TRUE(m.params_in_master);
    EXPECT_TRUE(m.shard_ranges);
    ASSERT_EQ(m.partitions.size(), 3u);
    EXPECT_EQ(m.partitions[1].offset, 9u);
    EXPECT_EQ(m.partitions[1].position, 9u);
    EXPECT_EQ(m.partitions[2].offset, 20u);
    EXPECT_EQ(m.partitions[2].position, 20u);
    ASSERT_EQ(m.params.size(), 3u);
    EXPECT_EQ(m.params[1].dtype, std::string(dtype_name(wd)));
    EXPECT_EQ(m.params[2].flat_offset, 17u);
    r.check_model({{"a", {3, 4}, 0}, {"b", {5}, 12}, {"c", {7}, 17}}, true);
    r.verify_params({"a", "b", "c"});
    r.verify_flat_range(0, 24);
    using P = std::tuple<const char*, int, int>;  // name, flat offset, numel
    for (const auto& [name, off, n] : std::initializer_list<P>{{"a", 0, 12}, {"b", 12, 5}, {"c", 17, 7}}) {
      std::vector<float> f32(n);
      r.read_param(name, f32.data(), DType::F32, std::size_t(n));
      for (int i = 0; i < n; ++i) EXPECT_EQ(f32[i], f.master[std::size_t(off + i)]) << name << i;
      if (wd == DType::F32) continue;
      // the working dtype: the master rounded to nearest even, as the engine keeps it
      std::vector<std::uint16_t> got(n), want(n);
      r.read_param(name, got.data(), wd, std::size_t(n));
      for (int i = 0; i < n; ++i) {
        const float x = f.master[std::size_t(off + i)];
        want[i] = wd == DType::BF16 ? float_to_bf16(x).bits : float_to_f16(x).bits;
      }
      EXPECT_EQ(got, want) << name;
      // ... which is also what ds::convert gives, and not just the truncation
      std::vector<std::uint16_t> conv(n);
      convert(f.master.data() + off, DType::F32, conv.data(), wd, std::size_t(n));
      EXPECT_EQ(got, conv) << name;
    }
    std::string e = error_of([&] { std::vector<float> x(3); r.read_param("a", x.data(), DType::F32, 3); });
    EXPECT_NE(e.find("parameter 'a' has 12 elements, the model 3"), std::string::npos) << e;
    e = error_of([&] { std::vector<float> x(3); r.read_param("zz", x.data(), DType::F32, 3); });
    EXPECT_NE(e.find("has no parameter 'zz'"), std::string::npos) << e;
  }
}

TEST(CheckpointRanges, CorruptMasterIsFoundByVerifyParams) {
  fs::path d = fresh("corrupt");
  ds::test::SelfComm comm;
  Stage3Fake f(DType::BF16);
  save_checkpoint(comm, d.string(), "t", f.content());
  const fs::path shard = d / "t" / "zero_rank_0.h5";
  std::uint64_t at = 0;
  {
    H5File s(shard.string(), H5File::Mode::Read);
    at = s.raw_extent("fp32_master")->offset + 21 * sizeof(float);  // inside the third range
  }
  std::fstream io(shard, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(at));
  char c = 0;
  io.read(&c, 1);
  c = char(c ^ 0x40);
  io.seekp(std::streamoff(at));
  io.write(&c, 1);
  io.close();
  CheckpointReader r(d.string(), "t");
  std::string e = error_of([&] { r.verify_params({"c"}); });
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("zero_rank_0.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("'fp32_master'"), std::string::npos) << e;
}

TEST(CheckpointRanges, ManifestWhoseRangesDoNotTileIsRefused) {
  fs::path d = fresh("tiling");
  ds::test::SelfComm comm;
  Stage3Fake f(DType::F32);
  save_checkpoint(comm, d.string(), "t", f.content());
  const std::string text = slurp(d / "t" / "manifest.json");
  auto edit = [&](const std::string& tag, const std::string& from, const std::string& to) {
    fs::copy(d / "t", d / tag, fs::copy_options::recursive);
    std::string s = text;
    auto p = s.find(from);
    EXPECT_NE(p, std::string::npos) << from;
    if (p != std::string::npos) s.replace(p, from.size(), to);
    std::ofstream(d / tag / "manifest.json") << s;
    return error_of([&] { CheckpointReader r(d.string(), tag); });
  };
  // the third range moved down by one: it overlaps the second
  std::string e = edit("overlap", "\"offset\": 20", "\"offset\": 19");
  EXPECT_NE(e.find((d / "overlap" / "manifest.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("do not cover the flat space [0, 24) exactly once: rank 0's range [19, 23) overlaps rank 0's range [9, 20)"),
            std::string::npos) << e;
  // moved up by one: element 20 is nobody's, and it ends past the flat space
  e = edit("gap", "\"offset\": 20", "\"offset\": 21");
  EXPECT_NE(e.find("flat elements [20, 21) are in no rank's range"), std::string::npos) << e;
  // positions that do not lie end to end inside the file
  e = edit("pos", "\"position\": 20", "\"position\": 19");
  EXPECT_NE(e.find("partitions of zero_rank_0.h5 do not lie end to end"), std::string::npos) << e;
  // params_in_master without a master
  e = edit("nomaster", "\"fp32_master\",", "");
  EXPECT_NE(e.find("params_in_master is set but shard_datasets has no fp32_master"), std::string::npos) << e;
}

TEST(CheckpointRanges, BadRangeListFailsTheSave) {
  fs::path d = fresh("badlist");
  ds::test::SelfComm comm;
  Stage3Fake f(DType::F32);
  CheckpointContent c = f.content();
  c.shard_ranges = {{0, 9}, {20, 4}, {9, 11}};  // not in increasing order
  std::string e = error_of([&] { save_checkpoint(comm, d.string(), "t", c); });
  EXPECT_NE(e.find("shard_ranges[2] = [9, 20) starts before the end 24"), std::string::npos) << e;
  c = f.content();
  c.shard_count = 23;
  e = error_of([&] { save_checkpoint(comm, d.string(), "t", c); });
  EXPECT_NE(e.find("shard_ranges hold 24 elements, shard_count says 23"), std::string::npos) << e;
  c = f.content();
  c.shard_ranges = {{0, 9}, {9, 11}, {21, 3}};  // one rank alone leaves element 20 out
  c.shard_count = 23;
  e = error_of([&] { save_checkpoint(comm, d.string(), "t", c); });
  EXPECT_NE(e.find("save_checkpoint to " + (d / "t").string() + ": the ranks' shard ranges do not cover the flat "
                   "space [0, 24) exactly once: flat elements [20, 21) are in no rank's range"),
            std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "t"));
  EXPECT_FALSE(fs::exists(d / "latest"));
  c = f.content();
  c.shard = {{"optim/exp_avg", f.m1.data()}};
  e = error_of([&] { save_checkpoint(comm, d.string(), "t", c); });
  EXPECT_NE(e.find("params_in_master needs an fp32_master shard dataset"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "t"));
}

// A contiguous (stages 0-2) checkpoint keeps the manifest it always had: no "position", and
// a manifest without the newer keys at all (as older dstrain wrote) still loads.
TEST(CheckpointRanges, ContiguousCheckpointKeepsItsFormat) {
  fs::path d = fresh("old");
  ds::test::SelfComm comm;
  std::vector<float> w(10), master(12), m1(12);
  for (std::size_t i = 0; i < 12; ++i) {
    master[i] = i < 10 ? float(i) + 0.5f : 0.0f;
    m1[i] = float(i);
    if (i < 10) w[i] = master[i];
  }
  CheckpointContent c;
  c.params = {{"w", {10}, DType::F32, w.data(), 0}};
  c.zero_stage = 1;
  c.flat_numel = 12;
  c.shard_count = 12;
  c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}};
  save_checkpoint(comm, d.string(), "t", c);
  std::string text = slurp(d / "t" / "manifest.json");
  EXPECT_EQ(text.find("\"position\""), std::string::npos) << text;
  auto p = text.find("\"params_in_master\": false,");
  ASSERT_NE(p, std::string::npos) << text;
  text.erase(p, std::string("\"params_in_master\": false,").size());
  std::ofstream(d / "t" / "manifest.json") << text;
  CheckpointReader r(d.string(), "t");
  EXPECT_FALSE(r.manifest().params_in_master);
  EXPECT_FALSE(r.manifest().shard_ranges);
  r.verify_params({"w"});
  r.verify_flat_range(0, 12);
  std::vector<float> got(10);
  r.read_param("w", got.data(), DType::F32, 10);
  EXPECT_EQ(got, w);
  // a contiguous checkpoint read in ranges (as a stage 3 rank cuts it)
  std::vector<float> a(3), b(2);
  r.read_flat("optim/exp_avg", 2, 3, a.data());
  r.read_flat("optim/exp_avg", 9, 2, b.data());
  EXPECT_EQ(a, (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(b, (std::vector<float>{9, 10}));
}

// read_param_range (a stage-3 rank reads its piece of each tensor): every range of every
// parameter equals the same elements of read_param, from the master (params_in_master) and
// from a model file's contiguous bf16 datasets converted to fp32 and back; a range past the
// tensor's end is an error naming it.
TEST(CheckpointRanges, ReadParamRangeEqualsTheSliceOfReadParam) {
  auto check_all = [](CheckpointReader& r, const std::vector<std::pair<std::string, std::size_t>>& params, DType dt) {
    const std::size_t es = dtype_size(dt);
    for (const auto& [name, n] : params) {
      std::vector<unsigned char> whole(n * es);
      r.read_param(name, whole.data(), dt, n);
      for (std::size_t first = 0; first < n; ++first)
        for (std::size_t count = 1; first + count <= n; count += 2) {
          std::vector<unsigned char> got(count * es);
          r.read_param_range(name, first, count, got.data(), dt);
          EXPECT_EQ(0, std::memcmp(got.data(), whole.data() + first * es, count * es)) << name << " " << first << "+" << count;
        }
    }
  };
  ds::test::SelfComm comm;
  for (DType wd : {DType::F32, DType::BF16}) {
    fs::path d = fresh(std::string("range_master_") + std::string(dtype_name(wd)));
    Stage3Fake f(wd);
    save_checkpoint(comm, d.string(), "t", f.content());
    CheckpointReader r(d.string(), "t");
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) check_all(r, {{"a", 12}, {"b", 5}, {"c", 7}}, dt);
    const std::string e = error_of([&] { float x[4]; r.read_param_range("b", 3, 4, x, DType::F32); });
    EXPECT_NE(e.find("elements [3, 7) of parameter 'b', which has 5"), std::string::npos) << e;
  }
  fs::path d = fresh("range_model");
  std::vector<std::uint16_t> w(10);
  std::vector<float> master(12), m1(12);
  for (std::size_t i = 0; i < 12; ++i) master[i] = i < 10 ? float(i) * 0.37f - 1.0f : 0.0f;
  convert(master.data(), DType::F32, w.data(), DType::BF16, 10);
  CheckpointContent c;
  c.params = {{"w", {10}, DType::BF16, w.data(), 0}};
  c.working_dtype = "bf16";
  c.zero_stage = 1;
  c.flat_numel = 12;
  c.shard_count = 12;
  c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}};
  save_checkpoint(comm, d.string(), "t", c);
  CheckpointReader r(d.string(), "t");
  for (DType dt : {DType::F32, DType::BF16}) check_all(r, {{"w", 10}}, dt);
}
