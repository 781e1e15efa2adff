// Unit tests of ds_io: state trees, HDF5 datasets and errors, CRC-32C, and the checkpoint
// store at one rank (atomic protocol, injected kills, full disk, corrupt/truncated files).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/io/checkpoint.h"
#include "ds/io/checksum.h"
#include "ds/io/h5file.h"
#include "ds/io/state_value.h"
#include "../common/self_comm.h"
#include "../common/temp_dir.h"

#include <hdf5.h>

namespace fs = std::filesystem;
using namespace ds;
using namespace ds::io;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("ds_io_unit_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

StateValue sample_tree() {
  StateValue v;
  v["step"] = std::int64_t(10);
  v["lr"] = 0.5;
  v["ten_as_double"] = 10.0;
  v["flag"] = true;
  v["off"] = false;
  v["nothing"] = nullptr;
  v["name"] = "hello / world %";
  v["empty_str"] = "";
  v["empty_list"] = StateValue::list();
  v["empty_map"] = StateValue::map();
  v["nested"]["deeper"]["x"] = -7;
  v["list"] = StateValue::list({1, 2.5, "s", nullptr, true, StateValue::list({StateValue::map()})});
  v["a/b"] = 1;
  v["%2F"] = 2;
  v[""] = 3;
  v["."] = 4;
  v["t"] = FloatTensor{{2, 3}, {1, 2, 3, 4, 5, -6.5f}};
  v["t0"] = FloatTensor{{0}, {}};
  v["ts"] = FloatTensor{{}, {42}};
  for (int i = 0; i < 12; ++i) v["many"].as_map();  // noop access
  StateValue l = StateValue::list();
  for (int i = 0; i < 12; ++i) l.push_back(i);  // > 10 items: order must not be lexicographic
  v["long_list"] = l;
  return v;
}

// A fake model of three parameters (mixed working dtypes are not an engine case, but the
// store must not care), flat space padded to 40.
struct FakeModel {
  std::vector<float> a = std::vector<float>(12), c = std::vector<float>(7);
  std::vector<bf16> b = std::vector<bf16>(5);
  std::vector<float> master = std::vector<float>(40), m1 = std::vector<float>(40), m2 = std::vector<float>(40);
  float seed = 0;
  explicit FakeModel(float seed_) : seed(seed_) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = seed + float(i) * 0.25f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = float_to_bf16(seed - float(i));
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = seed * 3 + float(i);
    for (std::size_t i = 0; i < 40; ++i) {
      master[i] = i < 24 ? seed + 1000.0f + float(i) * 1.125f : 0.0f;
      m1[i] = seed * 0.01f + float(i);
      m2[i] = seed * 0.001f + float(i) * 0.5f;
    }
  }
  CheckpointContent content() const {
    CheckpointContent c_;
    c_.params = {{"a", {3, 4}, DType::F32, a.data(), 0}, {"b.weight", {5}, DType::BF16, b.data(), 12},
                 {"c", {7}, DType::F32, c.data(), 17}};
    c_.working_dtype = "fp32";
    c_.zero_stage = 1;
    c_.flat_numel = 40;
    c_.shard_offset = 0;
    c_.shard_count = 40;
    c_.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}, {"optim/exp_avg_sq", m2.data()}};
    c_.engine_state["global_steps"] = std::int64_t(seed);
    c_.client_state = sample_tree();
    c_.config_json = R"({"train_batch_size": 8})";
    return c_;
  }
};

std::vector<ExpectedParam> fake_expected() {
  return {{"a", {3, 4}, 0}, {"b.weight", {5}, 12}, {"c", {7}, 17}};
}

void expect_loads(const fs::path& dir, const std::string& tag, float seed) {
  CheckpointReader r(dir.string(), tag);
  r.check_model(fake_expected(), true);
  r.verify_params({"a", "b.weight", "c"});
  r.verify_flat_range(0, 40);
  FakeModel want(seed);
  std::vector<float> a(12), master(40);
  r.read_param("a", a.data(), DType::F32, 12);
  EXPECT_EQ(a, want.a);
  r.read_flat("fp32_master", 0, 40, master.data());
  EXPECT_EQ(master, want.master);
  EXPECT_EQ(r.engine_state().at("global_steps").as_int(), std::int64_t(seed));
  EXPECT_EQ(r.client_state(), sample_tree());
}

// Flips one byte of the data of `needle` (a float that occurs once in the file).
void corrupt_float(const fs::path& file, float needle) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  std::string pat(reinterpret_cast<const char*>(&needle), 4);
  auto pos = bytes.find(pat);
  ASSERT_NE(pos, std::string::npos);
  f.seekp(std::streamoff(pos));
  char c = char(bytes[pos] ^ 0x55);
  f.write(&c, 1);
}

// Removes this process's scratch directories when the tests end.
struct CleanupEnv : ::testing::Environment {
  void TearDown() override {
    std::string prefix = "ds_io_unit_" + std::to_string(::getpid()) + "_";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new CleanupEnv);

}  // namespace

TEST(StateValue, ConstructionAccessEquality) {
  StateValue v = StateValue::map();
  v["step"] = std::int64_t(10);
  EXPECT_EQ(v.at("step").as_int(), 10);
  EXPECT_TRUE(StateValue().is_map());
  EXPECT_EQ(StateValue().size(), 0u);
  EXPECT_NE(StateValue(10), StateValue(10.0));
  EXPECT_NE(StateValue(1), StateValue(true));
  EXPECT_NE(StateValue::null(), StateValue::map());
  EXPECT_EQ(sample_tree(), sample_tree());
  EXPECT_NE(error_of([&] { (void)v.at("step").as_double(); }).find("expected double, found int64"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)v.at("nope"); }).find("'nope'"), std::string::npos);
  StateValue l = StateValue::list({1, 2});
  EXPECT_EQ(l.at(std::size_t(1)).as_int(), 2);
  EXPECT_NE(error_of([&] { (void)l.at(std::size_t(2)); }), "(no error)");
}

TEST(StateTree, RoundTripsEveryKindExactly) {
  fs::path d = fresh_dir("tree");
  StateValue v = sample_tree();
  {
    H5File f((d / "t.h5").string(), H5File::Mode::Create);
    f.write_state("client_state", v);
    f.write_state("scalar_root", StateValue(3.25));
    f.close();
  }
  H5File f((d / "t.h5").string(), H5File::Mode::Read);
  StateValue back = f.read_state("client_state");
  EXPECT_EQ(back, v) << back.to_string() << "\n" << v.to_string();
  EXPECT_TRUE(back.at("step").is_int());
  EXPECT_TRUE(back.at("ten_as_double").is_double());
  EXPECT_TRUE(back.at("flag").is_bool());
  EXPECT_TRUE(back.at("nothing").is_null());
  EXPECT_EQ(f.read_state("scalar_root"), StateValue(3.25));
}

TEST(H5Datasets, EveryDtypeRoundTripsAndRanges) {
  fs::path d = fresh_dir("dsets");
  std::vector<float> f32 = {1.5f, -2, 3, 4, 5, 6};
  std::vector<double> f64 = {1e300, -0.0};
  std::vector<std::int64_t> i64 = {-(std::int64_t(1) << 62), 7};
  std::vector<std::uint8_t> u8 = {0, 255, 7};
  std::vector<f16> h(6);
  std::vector<bf16> bh(6);
  convert_f32_to_f16(f32.data(), h.data(), 6);
  convert_f32_to_bf16(f32.data(), bh.data(), 6);
  std::vector<std::int64_t> s23 = {2, 3};
  {
    H5File f((d / "d.h5").string(), H5File::Mode::Create);
    f.write("g/f32", f32.data(), DType::F32, s23);
    f.write_1d("f64", f64.data(), DType::F64, 2);
    f.write_1d("i64", i64.data(), DType::I64, 2);
    f.write_1d("u8", u8.data(), DType::U8, 3);
    f.write("f16", h.data(), DType::F16, s23);
    f.write_1d("bf16", bh.data(), DType::BF16, 6);
    f.set_attr("g/f32", "note", "x");
    f.set_attr("/", "n", std::int64_t(-3));
    f.close();
  }
  H5File f((d / "d.h5").string(), H5File::Mode::Read);
  EXPECT_EQ(f.info("g/f32").shape, s23);
  EXPECT_EQ(f.info("f16").dtype, DType::F16);
  EXPECT_EQ(f.info("bf16").dtype, DType::BF16);
  EXPECT_EQ(f.attr_string("bf16", "dtype"), "bf16");
  EXPECT_EQ(f.attr_string("g/f32", "note"), "x");
  EXPECT_EQ(f.attr_int("/", "n"), -3);
  std::vector<float> rf(6);
  f.read("g/f32", rf.data(), DType::F32, 6);
  EXPECT_EQ(rf, f32);
  std::vector<double> rd(2);
  f.read("f64", rd.data(), DType::F64, 2);
  EXPECT_EQ(rd, f64);
  EXPECT_TRUE(std::signbit(rd[1]));
  std::vector<std::int64_t> ri(2);
  f.read("i64", ri.data(), DType::I64, 2);
  EXPECT_EQ(ri, i64);
  std::vector<std::uint8_t> ru(3);
  f.read("u8", ru.data(), DType::U8, 3);
  EXPECT_EQ(ru, u8);
  std::vector<f16> rh(6);
  f.read("f16", rh.data(), DType::F16, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rh[i].bits, h[i].bits);
  std::vector<bf16> rb(3);
  f.read_range("bf16", rb.data(), DType::BF16, 2, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rb[i].bits, bh[2 + i].bits);
  // wrong dtype and count are errors naming the file and dataset
  std::string e = error_of([&] { f.read("g/f32", rd.data(), DType::F64, 6); });
  EXPECT_NE(e.find("d.h5"), std::string::npos);
  EXPECT_NE(e.find("g/f32"), std::string::npos);
  EXPECT_NE(error_of([&] { f.read_range("bf16", rb.data(), DType::BF16, 5, 3); }), "(no error)");
}

TEST(H5Errors, NameTheCallTheFileAndTheReason) {
  std::string e = error_of([] { H5File f("/nonexistent/dir/x.h5", H5File::Mode::Read); });
  EXPECT_NE(e.find("HDF5 call H5Fopen"), std::string::npos) << e;
  EXPECT_NE(e.find("/nonexistent/dir/x.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("h5file.cpp"), std::string::npos) << e;
  fs::path d = fresh_dir("errs");
  H5File f((d / "e.h5").string(), H5File::Mode::Create);
  std::vector<float> x(2);
  f.write_1d("x", x.data(), DType::F32, 2);
  e = error_of([&] { f.write_1d("x", x.data(), DType::F32, 2); });  // exists already
  EXPECT_NE(e.find("H5Dcreate2"), std::string::npos) << e;
  EXPECT_NE(e.find("dataset x"), std::string::npos) << e;
  e = error_of([&] { f.read("missing", x.data(), DType::F32, 2); });
  EXPECT_NE(e.find("no dataset 'missing'"), std::string::npos) << e;
}

TEST(Crc32c, StandardValueAndFastMatchesReference) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c_ref(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::mt19937 rng(1);
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(278011)}) {
    std::vector<unsigned char> b(n);
    for (auto& c : b) c = static_cast<unsigned char>(rng());
    std::uint32_t ref = crc32c_ref(b.data(), n);
    EXPECT_EQ(crc32c(b.data(), n), ref) << n;
    std::size_t half = n / 2;
    EXPECT_EQ(crc32c(b.data() + half, n - half, crc32c(b.data(), half)), ref) << n;  // incremental
    b[n / 3] ^= 1;
    EXPECT_NE(crc32c(b.data(), n), ref);
  }
}

// The three-stream loop joins blocks of 3 * 8192 bytes: sizes around those blocks, unaligned
// starts (the loop aligns to 8 bytes first) and incremental seeds all match the table version.
TEST(Crc32c, InterleavedStreamsMatchReferenceAtAwkwardSizesAndAlignments) {
  std::mt19937 rng(7);
  std::vector<unsigned char> b(3 * 24576 + 64);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  for (std::size_t start : {0, 1, 3, 7, 8, 13}) {
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(8), std::size_t(24575),
                          std::size_t(24576), std::size_t(24577), std::size_t(24576 + 7), std::size_t(2 * 24576 + 13),
                          std::size_t(3 * 24576 + 1)}) {
      if (start + n > b.size()) continue;
      const unsigned char* p = b.data() + start;
      const std::uint32_t ref = crc32c_ref(p, n), ref_seeded = crc32c_ref(p, n, 0x12345678u);
      EXPECT_EQ(crc32c(p, n), ref) << "start " << start << " n " << n;
      EXPECT_EQ(crc32c(p, n, 0x12345678u), ref_seeded) << "start " << start << " n " << n;
      EXPECT_EQ(crc32c_streams(p, n), ref) << "start " << start << " n " << n;
      EXPECT_EQ(crc32c_streams(p, n, 0x12345678u), ref_seeded) << "start " << start << " n " << n;
      EXPECT_EQ(crc32c_fold(p, n), ref) << "start " << start << " n " << n;
      EXPECT_EQ(crc32c_fold(p, n, 0x12345678u), ref_seeded) << "start " << start << " n " << n;
    }
  }
  std::vector<unsigned char> big(278011 * 5 + 3);
  for (auto& c : big) c = static_cast<unsigned char>(rng());
  const std::uint32_t ref = crc32c_ref(big.data() + 3, big.size() - 3);
  EXPECT_EQ(crc32c(big.data() + 3, big.size() - 3), ref);
  EXPECT_EQ(crc32c_streams(big.data() + 3, big.size() - 3), ref);
  EXPECT_EQ(crc32c_fold(big.data() + 3, big.size() - 3), ref);
}

// crc32c_streams runs on the CRC-32C instruction wherever the CPU has one (SSE4.2 on x86-64,
// the CRC32 hwcap on aarch64), so the cases above compare that path, not the table, with
// crc32c_ref.
TEST(Crc32c, StreamsUseTheCrcInstructionWhereTheCpuHasIt) {
#if defined(__x86_64__)
  EXPECT_EQ(crc32c_streams_available(), __builtin_cpu_supports("sse4.2") != 0);
#elif defined(__aarch64__)
  EXPECT_EQ(crc32c_streams_available(), (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0);
#else
  EXPECT_FALSE(crc32c_streams_available());
#endif
}

// The AVX-512 folding path: every length from 256 to 1100 (1, 2, 3 and 4 accumulators, the
// 64-byte and 8-byte tails) at every start offset within a cache line, and seeds.
TEST(Crc32c, FoldingMatchesReferenceAtEveryTailAndOffset) {
  if (!crc32c_fold_available()) GTEST_SKIP() << "no AVX-512 VPCLMULQDQ on this CPU (crc32c_fold falls back; covered above)";
  std::mt19937 rng(11);
  std::vector<unsigned char> b(1200);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  for (std::size_t start = 0; start < 64; start += 5)
    for (std::size_t n = 256; n + start <= 1100 + 64; n += (n < 600 ? 1 : 13)) {
      const unsigned char* p = b.data() + start;
      ASSERT_EQ(crc32c_fold(p, n), crc32c_ref(p, n)) << "start " << start << " n " << n;
      ASSERT_EQ(crc32c_fold(p, n, ~std::uint32_t(n)), crc32c_ref(p, n, ~std::uint32_t(n))) << "start " << start << " n " << n;
    }
  EXPECT_EQ(crc32c_fold("123456789", 9), 0xE3069283u);  // short: falls back
}

TEST(Crc32c, CombineJoinsPieces) {
  std::mt19937 rng(3);
  std::vector<unsigned char> b(278011);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  const std::uint32_t whole = crc32c_ref(b.data(), b.size());
  for (std::size_t cut : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(4096), std::size_t(139005),
                          std::size_t(278010), std::size_t(278011)}) {
    std::uint32_t a = crc32c(b.data(), cut), c = crc32c(b.data() + cut, b.size() - cut);
    EXPECT_EQ(crc32c_combine(a, c, b.size() - cut), whole) << cut;
  }
  // three pieces, joined left to right
  std::uint32_t x = crc32c(b.data(), 1), y = crc32c(b.data() + 1, 7), z = crc32c(b.data() + 8, b.size() - 8);
  EXPECT_EQ(crc32c_combine(crc32c_combine(x, y, 7), z, b.size() - 8), whole);
}

TEST(Checkpoint, SaveLoadRoundTripAndLayout) {
  fs::path d = fresh_dir("roundtrip");
  ds::test::SelfComm comm;
  FakeModel m(1.0f);
  std::string path = save_checkpoint(comm, d.string(), "global_step1", m.content());
  EXPECT_EQ(path, (d / "global_step1").string());
  EXPECT_TRUE(fs::exists(d / "global_step1" / "model_states.h5"));
  EXPECT_TRUE(fs::exists(d / "global_step1" / "zero_rank_0.h5"));
  EXPECT_TRUE(fs::exists(d / "global_step1" / "manifest.json"));
  std::ifstream lf(d / "latest");
  std::string latest((std::istreambuf_iterator<char>(lf)), {});
  EXPECT_EQ(latest, "global_step1");  // no newline, as DeepSpeed
  EXPECT_EQ(read_latest(d.string()), std::optional<std::string>("global_step1"));
  expect_loads(d, "global_step1", 1.0f);
  CheckpointReader r(d.string(), "global_step1");
  EXPECT_EQ(r.manifest().format_version, kFormatVersion);
  EXPECT_EQ(r.manifest().world_size, 1);
  EXPECT_EQ(r.manifest().partitions.size(), 1u);
  EXPECT_EQ(r.manifest().params[1].dtype, "bf16");
  EXPECT_EQ(r.config_json(), R"({"train_batch_size": 8})");
  // dtype conversion on read (bf16 saved -> fp32 requested)
  std::vector<float> b(5);
  r.read_param("b.weight", b.data(), DType::F32, 5);
  EXPECT_EQ(b[1], bf16_to_float(m.b[1]));
  // elastic slice reads: a sub-range and a range beyond the saved flat space (zero padding)
  std::vector<float> part(10);
  r.read_flat("optim/exp_avg", 35, 10, part.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(part[i], m.m1[35 + i]);
  for (int i = 5; i < 10; ++i) EXPECT_EQ(part[i], 0.0f);
  EXPECT_TRUE(r.same_flat_layout(fake_expected()));
}

// Tensors above the bulk-I/O threshold (8 MiB) at odd sizes: several write chunks, CRC pieces
// joined across threads, the verify pass on the mapped file, parallel copies and a parallel
// bf16 -> fp32 conversion. Corruption deep inside a large dataset is still found.
TEST(Checkpoint, LargeTensorsRoundTripOnSeveralIoThreads) {
  SaveOptions save_opts;
  save_opts.io_threads = 3;  // config checkpoint.io_threads
  const LoadOptions load_opts{3};
  fs::path d = fresh_dir("large");
  const std::size_t n = 5000003;  // fp32 shard: 20 MB; bf16 param: 10 MB
  std::vector<float> master(n), m1(n), m2(n);
  std::vector<bf16> w(n);
  for (std::size_t i = 0; i < n; ++i) {
    master[i] = float(i % 9973) * 0.25f - 7.0f;
    m1[i] = float(i) * 1e-6f;
    m2[i] = float(i) * 0.5f + 1.0f;  // exact, unique
    w[i] = float_to_bf16(master[i]);
  }
  CheckpointContent c;
  c.params.push_back({"w", {std::int64_t(n)}, DType::BF16, w.data(), 0});
  c.working_dtype = "bf16";
  c.zero_stage = 1;
  c.flat_numel = n;
  c.shard_count = n;
  c.shard = {{"fp32_master", master.data()}, {"optim/exp_avg", m1.data()}, {"optim/exp_avg_sq", m2.data()}};
  c.engine_state["global_steps"] = std::int64_t(1);
  ds::test::SelfComm comm;
  save_checkpoint(comm, d.string(), "t", c, save_opts);
  {
    CheckpointReader r(d.string(), "t", load_opts);
    EXPECT_EQ(r.manifest().checksums.at("zero_rank_0.h5").at("fp32_master"), crc32c_ref(master.data(), n * 4));
    EXPECT_EQ(r.manifest().checksums.at("model_states.h5").at("params/w"), crc32c_ref(w.data(), n * 2));
    r.verify_params({"w"});
    r.verify_flat_range(0, n);
    std::vector<bf16> lw(n);
    std::vector<float> lf(n), lm(n), part(n / 2 + 5);
    r.read_param("w", lw.data(), DType::BF16, n);
    EXPECT_EQ(std::memcmp(lw.data(), w.data(), n * 2), 0);
    r.read_param("w", lf.data(), DType::F32, n);
    for (std::size_t i : {std::size_t(0), n / 3, n / 2 + 1, n - 1}) EXPECT_EQ(lf[i], bf16_to_float(w[i])) << i;
    r.read_flat("optim/exp_avg", 0, n, lm.data());
    EXPECT_EQ(lm, m1);
    r.read_flat("fp32_master", n - part.size() + 5, part.size(), part.data());  // tail + 5 padding zeros
    for (std::size_t i = 0; i + 5 < part.size(); ++i) ASSERT_EQ(part[i], master[n - part.size() + 5 + i]) << i;
    for (std::size_t i = part.size() - 5; i < part.size(); ++i) EXPECT_EQ(part[i], 0.0f);
  }
  {  // one flipped byte deep inside exp_avg_sq
    const fs::path shard = d / "t" / "zero_rank_0.h5";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), {});
    auto pos = bytes.find(std::string(reinterpret_cast<const char*>(m2.data() + 4000000), 4 * 64));
    ASSERT_NE(pos, std::string::npos);
    f.seekp(std::streamoff(pos + 17));
    char ch = char(bytes[pos + 17] ^ 0x20);
    f.write(&ch, 1);
  }
  CheckpointReader r(d.string(), "t", load_opts);
  std::string e = error_of([&] { r.verify_flat_range(0, n); });
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("optim/exp_avg_sq"), std::string::npos) << e;
}

// Replaces dataset `name` of `file` by a chunked, gzip-compressed copy of the same elements
// (as h5repack or another tool might leave it): no longer one contiguous run in the file.
void rewrite_chunked(const fs::path& file, const std::string& name, hid_t type, std::size_t n, const void* data) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t old = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  ASSERT_GE(old, 0);
  const bool bf16_attr = H5Aexists(old, "dtype") > 0;
  H5Dclose(old);
  ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0);
  hsize_t dims = n, chunk = std::max<hsize_t>(1, n / 3);
  hid_t space = H5Screate_simple(1, &dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  H5Pset_deflate(dcpl, 1);
  hid_t d = H5Dcreate2(f, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  ASSERT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  if (bf16_attr) {
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    H5Tset_cset(st, H5T_CSET_UTF8);  // as dstrain (and h5py) write strings
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "dtype", st, as, H5P_DEFAULT, H5P_DEFAULT);
    const char* v = "bf16";
    H5Awrite(a, st, &v);
    H5Aclose(a);
    H5Sclose(as);
    H5Tclose(st);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

// Datasets that are not contiguous (chunked + compressed) are verified and read through HDF5
// (the mapped-file path does not apply), with the same results and the same corruption check.
TEST(Checkpoint, ChunkedDatasetsAreReadThroughHdf5) {
  fs::path d = fresh_dir("chunked");
  ds::test::SelfComm comm;
  FakeModel m(4.0f);
  save_checkpoint(comm, d.string(), "t", m.content());
  {
    H5File f((d / "t" / "zero_rank_0.h5").string(), H5File::Mode::Read);
    ASSERT_TRUE(f.raw_extent("fp32_master").has_value());  // dstrain writes contiguous datasets
  }
  rewrite_chunked(d / "t" / "zero_rank_0.h5", "fp32_master", H5T_IEEE_F32LE, m.master.size(), m.master.data());
  rewrite_chunked(d / "t" / "model_states.h5", "params/b.weight", H5T_STD_U16LE, m.b.size(), m.b.data());
  {
    H5File f((d / "t" / "zero_rank_0.h5").string(), H5File::Mode::Read);
    EXPECT_FALSE(f.raw_extent("fp32_master").has_value());
  }
  expect_loads(d, "t", 4.0f);  // verifies params and flat range, reads a and fp32_master
  {
    CheckpointReader r(d.string(), "t");
    std::vector<bf16> b(5);
    std::vector<float> bf(5), part(10);
    r.read_param("b.weight", b.data(), DType::BF16, 5);
    r.read_param("b.weight", bf.data(), DType::F32, 5);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(b[i].bits, m.b[i].bits);
      EXPECT_EQ(bf[i], bf16_to_float(m.b[i]));
    }
    r.read_flat("fp32_master", 35, 10, part.data());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(part[i], m.master[35 + i]);
    for (int i = 5; i < 10; ++i) EXPECT_EQ(part[i], 0.0f);
  }  // the reader closes its files (HDF5 opens a file once per process)
  // wrong data in a chunked dataset: still a checksum mismatch naming it
  std::vector<float> wrong = m.master;
  wrong[7] += 1.0f;
  rewrite_chunked(d / "t" / "zero_rank_0.h5", "fp32_master", H5T_IEEE_F32LE, wrong.size(), wrong.data());
  CheckpointReader r2(d.string(), "t");
  std::string e = error_of([&] { r2.verify_flat_range(0, 40); });
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("fp32_master"), std::string::npos) << e;
}

TEST(Checkpoint, LatestMissingDirMissingTag) {
  fs::path d = fresh_dir("missing");
  EXPECT_EQ(read_latest(d.string()), std::nullopt);
  EXPECT_NE(error_of([&] { (void)read_latest((d / "nope").string()); }).find("does not exist"), std::string::npos);
  ds::test::SelfComm comm;
  FakeModel m(2.0f);
  save_checkpoint(comm, d.string(), "t1", m.content());
  std::string e = error_of([&] { CheckpointReader r(d.string(), "t2"); });
  EXPECT_NE(e.find("tag 't2' not found"), std::string::npos) << e;
  EXPECT_NE(e.find("t1"), std::string::npos) << e;  // lists the tags that exist
  EXPECT_NE(error_of([&] { CheckpointReader r((d / "nope").string(), "t1"); }), "(no error)");
}

TEST(Checkpoint, ExistingTagIsNotOverwrittenUnlessAsked) {
  fs::path d = fresh_dir("overwrite");
  ds::test::SelfComm comm;
  FakeModel m1(1.0f), m2(2.0f);
  save_checkpoint(comm, d.string(), "t", m1.content());
  std::string e = error_of([&] { save_checkpoint(comm, d.string(), "t", m2.content()); });
  EXPECT_NE(e.find("already exists"), std::string::npos) << e;
  expect_loads(d, "t", 1.0f);
  SaveOptions o;
  o.overwrite = true;
  save_checkpoint(comm, d.string(), "t", m2.content(), o);
  expect_loads(d, "t", 2.0f);
  for (const auto& ent : fs::directory_iterator(d))
    EXPECT_EQ(ent.path().filename().string().find(".tmp-"), std::string::npos) << ent.path();
}

TEST(Checkpoint, CorruptTruncatedAndWrongVersionAreNamed) {
  fs::path d = fresh_dir("corrupt");
  ds::test::SelfComm comm;
  FakeModel m(3.0f);
  save_checkpoint(comm, d.string(), "t", m.content());
  fs::copy(d / "t", d / "t_trunc", fs::copy_options::recursive);
  fs::copy(d / "t", d / "t_ver", fs::copy_options::recursive);
  fs::copy(d / "t", d / "t_param", fs::copy_options::recursive);
  // corrupt one master value
  corrupt_float(d / "t" / "zero_rank_0.h5", m.master[5]);
  {
    CheckpointReader r(d.string(), "t");
    std::string e = error_of([&] { r.verify_flat_range(0, 40); });
    EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
    EXPECT_NE(e.find("zero_rank_0.h5"), std::string::npos) << e;
    EXPECT_NE(e.find("fp32_master"), std::string::npos) << e;
  }
  corrupt_float(d / "t_param" / "model_states.h5", m.c[3]);
  {
    CheckpointReader r(d.string(), "t_param");
    std::string e = error_of([&] { r.verify_params({"a", "b.weight", "c"}); });
    EXPECT_NE(e.find("params/c"), std::string::npos) << e;
  }
  // truncated shard
  fs::resize_file(d / "t_trunc" / "zero_rank_0.h5", fs::file_size(d / "t_trunc" / "zero_rank_0.h5") / 2);
  {
    std::string e = error_of([&] {
      CheckpointReader r(d.string(), "t_trunc");
      r.verify_flat_range(0, 40);
    });
    EXPECT_NE(e.find("zero_rank_0.h5"), std::string::npos) << e;
  }
  // different format version
  {
    std::ifstream in(d / "t_ver" / "manifest.json");
    std::string s((std::istreambuf_iterator<char>(in)), {});
    auto p = s.find("\"format_version\": 1");
    ASSERT_NE(p, std::string::npos);
    s.replace(p, 19, "\"format_version\": 99");
    std::ofstream(d / "t_ver" / "manifest.json") << s;
    std::string e = error_of([&] { CheckpointReader r(d.string(), "t_ver"); });
    EXPECT_NE(e.find("format_version 99"), std::string::npos) << e;
    EXPECT_NE(e.find("manifest.json"), std::string::npos) << e;
  }
}

TEST(Checkpoint, DifferentModelListsNamesAndShapes) {
  fs::path d = fresh_dir("model");
  ds::test::SelfComm comm;
  FakeModel m(1.0f);
  save_checkpoint(comm, d.string(), "t", m.content());
  CheckpointReader r(d.string(), "t");
  std::vector<ExpectedParam> other = {{"a", {4, 3}, 0}, {"b.weight", {5}, 12}, {"d", {7}, 17}};
  std::string e = error_of([&] { r.check_model(other, true); });
  EXPECT_NE(e.find("shape differs: a checkpoint [3,4] model [4,3]"), std::string::npos) << e;
  EXPECT_NE(e.find("missing in checkpoint: d"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected in checkpoint: c"), std::string::npos) << e;
  std::vector<ExpectedParam> subset = {{"a", {3, 4}, 0}};
  EXPECT_EQ(error_of([&] { r.check_model(subset, false); }), "(no error)");  // non-strict: warns only
  EXPECT_NE(error_of([&] { r.check_model(subset, true); }), "(no error)");
  EXPECT_FALSE(r.same_flat_layout(subset));
}

TEST(Checkpoint, TagValidationParsingAndBadTags) {
  EXPECT_EQ(parse_tag_validation("WARN"), TagValidation::Warn);
  EXPECT_EQ(parse_tag_validation("fail"), TagValidation::Fail);
  EXPECT_EQ(parse_tag_validation("Ignore"), TagValidation::Ignore);
  EXPECT_NE(error_of([] { (void)parse_tag_validation("loud"); }), "(no error)");
  fs::path d = fresh_dir("badtag");
  ds::test::SelfComm comm;
  FakeModel m(1.0f);
  EXPECT_NE(error_of([&] { save_checkpoint(comm, d.string(), "a/b", m.content()); }), "(no error)");
  EXPECT_NE(error_of([&] { save_checkpoint(comm, d.string(), "latest", m.content()); }), "(no error)");
  EXPECT_NE(error_of([&] { save_checkpoint(comm, "", "t", m.content()); }), "(no error)");
}

// Tags and shard file names are plain names inside the checkpoint directory: a `latest`, a
// tag or a manifest pointing elsewhere (here at a valid checkpoint outside) is refused,
// naming the file and the value.
TEST(Checkpoint, TagsAndShardFilesMustBePlainNames) {
  fs::path root = fresh_dir("plain");
  fs::path d = root / "ck";
  ds::test::SelfComm comm;
  FakeModel m(1.0f);
  save_checkpoint(comm, d.string(), "t", m.content());
  fs::copy(d / "t", root / "outside", fs::copy_options::recursive);
  const std::string latest = (d / "latest").string();
  for (const std::string& bad : {std::string("../outside"), (root / "outside").string(), std::string(".."),
                                 std::string(".")}) {
    std::ofstream(latest, std::ios::trunc) << bad;
    std::string e = error_of([&] { (void)read_latest(d.string()); });
    EXPECT_NE(e.find(latest + " names tag '" + bad + "', which is not a plain directory name"), std::string::npos) << e;
    e = error_of([&] { CheckpointReader r(d.string(), bad); });
    EXPECT_NE(e.find("checkpoint tag '" + bad + "' is not a plain directory name inside " + d.string()), std::string::npos)
        << e;
  }
  std::ofstream(latest, std::ios::trunc) << "t\n";
  EXPECT_EQ(*read_latest(d.string()), "t");

  const fs::path manifest = d / "t" / "manifest.json";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string good = "\"file\": \"zero_rank_0.h5\"";
  ASSERT_NE(text.find(good), std::string::npos) << text;
  for (const std::string& bad : {std::string("../../outside/zero_rank_0.h5"), (root / "outside" / "zero_rank_0.h5").string()}) {
    std::string t = text;
    t.replace(t.find(good), good.size(), "\"file\": \"" + bad + "\"");
    std::ofstream(manifest, std::ios::trunc) << t;
    std::string e = error_of([&] { CheckpointReader r(d.string(), "t"); });
    EXPECT_NE(e.find(manifest.string() + ": partitions[0].file '" + bad + "' is not a plain file name"), std::string::npos)
        << e;
  }
  std::ofstream(manifest, std::ios::trunc) << text;
  expect_loads(d, "t", 1.0f);
}

// A save removes only the tmp dirs of its own kind whose writer is gone: never users' entries
// that merely contain ".tmp-", never another save in progress in the same directory, never a
// writer's on another host (unknowable), never a look-alike without dstrain's marker.
TEST(Checkpoint, SaveRemovesOnlyAbandonedTmpDirsOfItsOwn) {
  fs::path d = fresh_dir("tmpclean");
  ds::test::SelfComm comm;
  FakeModel m1(1.0f), m2(2.0f);
  fs::create_directories(d / "notes.tmp-mine");
  std::ofstream(d / "notes.tmp-mine" / "keep.txt") << "user data";
  std::ofstream(d / "results.tmp-1") << "user file";
  fs::create_directories(d / "x.tmp-0123456789ab");  // dstrain's name pattern, no marker
  std::ofstream(d / "x.tmp-0123456789ab" / "keep.txt") << "user data";
  fs::create_directories(d / "elsewhere");
  std::ofstream(d / "elsewhere" / ".dstrain-save") << "dstrain-save 1\npid 1\nhost h\nboot b\nstart 1\n";
  fs::create_directory_symlink(d / "elsewhere", d / "y.tmp-0123456789ab");  // a symlink: not followed
  fs::create_directories(d / "z.tmp-00000000000a");  // a save by a process on another host
  std::ofstream(d / "z.tmp-00000000000a" / ".dstrain-save")
      << "dstrain-save 1\npid 1\nhost another-host.invalid\nboot b\nstart 1\n";

  // Another save in progress in the same directory (begun, files not yet written).
  PendingSave other = begin_save(comm, d.string(), "other", SaveOptions(), m2.content());
  ASSERT_TRUE(fs::is_directory(other.tmp_dir));
  EXPECT_TRUE(fs::exists(fs::path(other.tmp_dir) / ".dstrain-save"));

  save_checkpoint(comm, d.string(), "t1", m1.content());
  save_checkpoint(comm, d.string(), "t2", m1.content());
  EXPECT_TRUE(fs::exists(d / "notes.tmp-mine" / "keep.txt"));
  EXPECT_TRUE(fs::exists(d / "results.tmp-1"));
  EXPECT_TRUE(fs::exists(d / "x.tmp-0123456789ab" / "keep.txt"));
  EXPECT_TRUE(fs::is_symlink(d / "y.tmp-0123456789ab"));
  EXPECT_TRUE(fs::exists(d / "elsewhere" / ".dstrain-save"));
  EXPECT_TRUE(fs::exists(d / "z.tmp-00000000000a" / ".dstrain-save"));
  ASSERT_TRUE(fs::is_directory(other.tmp_dir)) << "another save in progress was removed";

  // ... which still commits.
  LocalWriteResult w = write_local(other, 0, m2.content());
  ASSERT_TRUE(w.ok) << w.error;
  commit_save(comm, other, w);
  expect_loads(d, "other", 2.0f);
  expect_loads(d, "t2", 1.0f);
  EXPECT_FALSE(fs::exists(d / "other" / ".dstrain-save"));  // the committed tag carries no marker
  EXPECT_EQ(*read_latest(d.string()), "other");
}

// The same with the save in progress in another process (another job): it survives a save
// here and commits afterwards.
TEST(Checkpoint, SaveKeepsAnotherProcessSaveInProgress) {
  fs::path d = fresh_dir("tmpclean_proc");
  int begun[2], go[2];
  ASSERT_EQ(::pipe(begun), 0);
  ASSERT_EQ(::pipe(go), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ds::test::SelfComm comm;
    FakeModel m(2.0f);
    char c = 0;
    try {
      PendingSave p = begin_save(comm, d.string(), "theirs", SaveOptions(), m.content());
      if (::write(begun[1], "b", 1) != 1 || ::read(go[0], &c, 1) != 1) ::_exit(4);
      LocalWriteResult w = write_local(p, 0, m.content());
      if (!w.ok) ::_exit(5);
      commit_save(comm, p, w);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(begun[0], &c, 1), 1);
  ds::test::SelfComm comm;
  FakeModel m(1.0f);
  save_checkpoint(comm, d.string(), "mine", m.content());
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the other process's save failed (its tmp dir was removed?)";
  expect_loads(d, "theirs", 2.0f);
  expect_loads(d, "mine", 1.0f);
  for (int fd : {begun[0], begun[1], go[0], go[1]}) ::close(fd);
}

// A child process saves `tag` with DS_CKPT_TEST_KILL_AT=phase and is SIGKILLed there.
class KillAt : public ::testing::TestWithParam<const char*> {};

TEST_P(KillAt, PreviousCheckpointStaysLoadable) {
  std::string phase = GetParam();
  fs::path d = fresh_dir(std::string("kill_") + phase);
  ds::test::SelfComm comm;
  FakeModel m1(1.0f), m2(2.0f);
  save_checkpoint(comm, d.string(), "t1", m1.content());
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("DS_CKPT_TEST_KILL_AT", phase.c_str(), 1);
    try {
      save_checkpoint(comm, d.string(), "t2", m2.content());
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child was not killed at " << phase;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  std::string latest = *read_latest(d.string());
  if (phase == "after_latest") {
    EXPECT_EQ(latest, "t2");
    expect_loads(d, "t2", 2.0f);
  } else {
    EXPECT_EQ(latest, "t1");
  }
  expect_loads(d, "t1", 1.0f);
  // a later save cleans the stale tmp dir and commits
  save_checkpoint(comm, d.string(), "t3", m2.content());
  expect_loads(d, *read_latest(d.string()), 2.0f);
  for (const auto& ent : fs::directory_iterator(d))
    EXPECT_EQ(ent.path().filename().string().find(".tmp-"), std::string::npos) << ent.path();
}

INSTANTIATE_TEST_SUITE_P(Phases, KillAt,
                         ::testing::Values("begin", "shard_write", "before_manifest", "before_rename",
                                           "before_latest", "after_latest"));

// Full disk: a 1 MiB tmpfs when mount is permitted (root), and RLIMIT_FSIZE in a child.
TEST(Checkpoint, FullDiskFailsCleanlyAndKeepsPrevious) {
  fs::path d = fresh_dir("fulldisk");
  bool mounted = ::mount("tmpfs", d.c_str(), "tmpfs", 0, "size=1m") == 0;
  ds::test::SelfComm comm;
  FakeModel m1(1.0f), m2(2.0f);
  save_checkpoint(comm, d.string(), "t1", m1.content());
  CheckpointContent big = m2.content();
  big.client_state["blob"] = FloatTensor{{300000}, std::vector<float>(300000, 1.0f)};  // 1.2 MB
  if (mounted) {
    std::string e = error_of([&] { save_checkpoint(comm, d.string(), "t2", big); });
    EXPECT_NE(e.find("nothing committed"), std::string::npos) << e;
    EXPECT_NE(e.find("No space left on device"), std::string::npos) << e;
  }
  {  // RLIMIT_FSIZE in a child (always: it also runs where mount is not permitted)
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      rlimit rl{200000, 200000};
      ::setrlimit(RLIMIT_FSIZE, &rl);
      try {
        save_checkpoint(comm, d.string(), "t2", big);
      } catch (const ds::Error& e) {
        ::_exit(std::string(e.what()).find("nothing committed") != std::string::npos ? 7 : 8);
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 7);
  }
  EXPECT_EQ(*read_latest(d.string()), "t1");
  EXPECT_FALSE(fs::exists(d / "t2"));
  for (const auto& ent : fs::directory_iterator(d))
    EXPECT_EQ(ent.path().filename().string().find(".tmp-"), std::string::npos) << ent.path();
  expect_loads(d, "t1", 1.0f);
  if (mounted) ::umount(d.c_str());
  std::cout << "full disk simulated with " << (mounted ? "a 1 MiB tmpfs and RLIMIT_FSIZE" : "RLIMIT_FSIZE only (mount not permitted)") << "\n";
}
