// HDF5 arrays as training data (Hdf5Dataset, FeatureLoader): shapes, element types and
// their conversion, the split, the sampler's shards and resume, and each error.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "ds/data/hdf5_dataset.h"
#include "temp_dir.h"

namespace {

using ds::data::DistributedSampler;
using ds::data::FeatureLoader;
using ds::data::Hdf5Dataset;

// Writes HDF5 files the way other tools do (any element type), with the plain C API.
class H5Writer {
 public:
  explicit H5Writer(const std::string& path) : id_(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)) {
    EXPECT_GE(id_, 0) << path;
  }
  ~H5Writer() { H5Fclose(id_); }
  // Dataset `name` of `shape` (empty: scalar), elements of file type `type` from memory type `mem`.
  void write(const std::string& name, std::vector<hsize_t> shape, hid_t type, hid_t mem, const void* data) {
    hid_t space = shape.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(shape.size()), shape.data(), nullptr);
    hid_t d = H5Dcreate2(id_, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(d, 0) << name;
    ASSERT_GE(H5Dwrite(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0) << name;
    H5Dclose(d);
    H5Sclose(space);
  }
  hid_t id() const { return id_; }

 private:
  hid_t id_;
};

// 10 samples of 2x3 float64 inputs (sample i: 100 i + j) and int64 class ids i % 4.
std::string write_classes(const TempDir& dir) {
  const std::string path = (dir.path / "classes.h5").string();
  H5Writer w(path);
  std::vector<double> x(60);
  for (std::size_t i = 0; i < 10; ++i)
    for (std::size_t j = 0; j < 6; ++j) x[i * 6 + j] = double(100 * i + j);
  std::vector<std::int64_t> y(10);
  for (std::size_t i = 0; i < 10; ++i) y[i] = std::int64_t(i % 4);
  w.write("inputs", {10, 2, 3}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, x.data());
  w.write("targets", {10}, H5T_STD_I64LE, H5T_NATIVE_INT64, y.data());
  return path;
}

TEST(Hdf5Dataset, ShapesAndConvertedElements) {
  TempDir dir("ds_h5data");
  const auto d = Hdf5Dataset::open(write_classes(dir), "inputs", "targets");
  EXPECT_EQ(d.num_samples(), 10u);
  EXPECT_EQ(std::vector<std::int64_t>(d.sample_shape().begin(), d.sample_shape().end()),
            (std::vector<std::int64_t>{2, 3}));
  EXPECT_TRUE(d.target_shape().empty());
  EXPECT_TRUE(d.integer_targets());
  EXPECT_EQ(d.describe(), "inputs 'inputs' float64 [2, 3], targets 'targets' int64 (one per sample)");
  const std::size_t idx[] = {7, 2, 7};
  std::vector<float> f(18);
  std::vector<std::int32_t> t(3);
  d.read(idx, f.data(), nullptr, t.data());
  EXPECT_EQ(f[0], 700.f);
  EXPECT_EQ(f[5], 705.f);
  EXPECT_EQ(f[6], 200.f);
  EXPECT_EQ(f[17], 705.f);
  EXPECT_EQ(t, (std::vector<std::int32_t>{3, 2, 3}));
  // Runs of consecutive rows, out of order: one read, each row back in its place.
  const std::size_t runs[] = {5, 6, 1, 4, 9, 5};
  std::vector<float> g(36);
  std::vector<std::int32_t> u(6);
  d.read(runs, g.data(), nullptr, u.data());
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(g[i * 6], float(100 * runs[i])) << i;
    EXPECT_EQ(g[i * 6 + 5], float(100 * runs[i] + 5)) << i;
    EXPECT_EQ(u[i], std::int32_t(runs[i] % 4)) << i;
  }
  EXPECT_EQ(d.target_range(), (std::pair<std::int32_t, std::int32_t>{0, 3}));
}

TEST(Hdf5Dataset, IntegerInputsFloatTargetsInGroups) {
  TempDir dir("ds_h5data");
  const std::string path = (dir.path / "reg.h5").string();
  {
    H5Writer w(path);
    H5Gclose(H5Gcreate2(w.id(), "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    const std::uint8_t x[4] = {0, 255, 7, 9};
    const std::int16_t y16[4] = {-3, 4, 5, 6};
    const float y[4][2] = {{0.5f, 1}, {1.5f, 2}, {2.5f, 3}, {3.5f, 4}};
    w.write("train/x", {4}, H5T_STD_U8LE, H5T_NATIVE_UINT8, x);
    w.write("train/y", {4, 2}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, y);
    w.write("train/y16", {4}, H5T_STD_I16LE, H5T_NATIVE_INT16, y16);
  }
  const auto d = Hdf5Dataset::open(path, "train/x", "train/y");
  EXPECT_TRUE(d.sample_shape().empty());
  EXPECT_EQ(d.sample_numel(), 1u);
  EXPECT_FALSE(d.integer_targets());
  EXPECT_EQ(d.target_numel(), 2u);
  const std::size_t idx[] = {1, 3};
  float f[2], v[4];
  d.read(idx, f, v, nullptr);
  EXPECT_EQ(f[0], 255.f);
  EXPECT_EQ(f[1], 9.f);
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[3], 4.f);
  EXPECT_HAS(error_of([&] { (void)d.target_range(); }), "float32 targets, not integer class ids");
  const auto d16 = Hdf5Dataset::open(path, "train/x", "train/y16");
  EXPECT_EQ(d16.target_range(), (std::pair<std::int32_t, std::int32_t>{-3, 6}));
}

TEST(Hdf5Dataset, SplitTakesTheTail) {
  TempDir dir("ds_h5data");
  const auto d = Hdf5Dataset::open(write_classes(dir), "inputs", "targets");
  auto [train, val] = d.split(0.25, 0);
  EXPECT_EQ(train.num_samples(), 7u);  // ceil(2.5) = 3 held out
  EXPECT_EQ(val.num_samples(), 3u);
  const std::size_t first[] = {0};
  float f[6];
  std::int32_t t;
  val.read(first, f, nullptr, &t);
  EXPECT_EQ(f[0], 700.f);
  EXPECT_EQ(d.split(0.01, 4).second.num_samples(), 4u);  // at least min_val
  EXPECT_EQ(d.split(0.0, 4).second.num_samples(), 0u);
  EXPECT_EQ(d.split(0.999, 0).first.num_samples(), 1u);  // never all
  EXPECT_HAS(error_of([&] { val.read(std::vector<std::size_t>{3}, f, nullptr, &t); }),
             "sample 3 beyond the 3 of this split");
}

// Two ranks' loaders read disjoint samples that cover the epoch; a loader set to a saved
// sampler state continues with the same batches as the one that kept going.
TEST(Hdf5Dataset, LoaderShardsAndResumes) {
  TempDir dir("ds_h5data");
  const auto d = Hdf5Dataset::open(write_classes(dir), "inputs", "targets");
  std::multiset<float> seen;
  for (int rank = 0; rank < 2; ++rank) {
    FeatureLoader loader(d, DistributedSampler(10, 2, rank, 2, true, 7, false));
    for (std::size_t s = 0; s < loader.sampler().steps_per_epoch(); ++s) {
      const ds::Batch b = loader.next();
      EXPECT_EQ(b.feature_dim, 6);
      EXPECT_EQ(std::vector<std::int64_t>(b.sample_shape.begin(), b.sample_shape.end()),
                (std::vector<std::int64_t>{2, 3}));
      ASSERT_EQ(b.targets.size(), std::size_t(b.batch));
      EXPECT_TRUE(b.target_values.empty());
      for (std::int64_t i = 0; i < b.batch; ++i) {
        const float x0 = b.features[std::size_t(i) * 6];
        EXPECT_EQ(b.targets[std::size_t(i)], std::int32_t(x0 / 100) % 4);
        seen.insert(x0);
      }
    }
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(std::set<float>(seen.begin(), seen.end()).size(), 10u);

  FeatureLoader a(d, DistributedSampler(10, 1, 0, 3, true, 7, false));
  for (int i = 0; i < 5; ++i) a.next();
  FeatureLoader b(d, DistributedSampler(10, 1, 0, 3, true, 7, false));
  b.sampler().set_state(a.sampler().state());
  for (int i = 0; i < 6; ++i) {
    const ds::Batch x = a.next(), y = b.next();
    ASSERT_EQ(std::vector<float>(x.features.begin(), x.features.end()),
              std::vector<float>(y.features.begin(), y.features.end()));
  }
}

TEST(Hdf5Dataset, ErrorsNameTheFileAndDataset) {
  TempDir dir("ds_h5data");
  const std::string path = (dir.path / "bad.h5").string();
  {
    H5Writer w(path);
    const float x[3] = {1, 2, 3};
    const std::int32_t y[2] = {0, 1};
    const double s = 1.0;
    w.write("x", {3}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, x);
    w.write("y2", {2}, H5T_STD_I32LE, H5T_NATIVE_INT32, y);
    w.write("scalar", {}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &s);
    w.write("empty", {0, 4}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, x);
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, 4);
    w.write("names", {3}, str, str, "ab\0\0cd\0\0ef\0\0");
    H5Tclose(str);
    hid_t rec = H5Tcreate(H5T_COMPOUND, 8);
    H5Tinsert(rec, "a", 0, H5T_NATIVE_INT32);
    H5Tinsert(rec, "b", 4, H5T_NATIVE_FLOAT);
    const char bytes[24] = {};
    w.write("records", {3}, rec, rec, bytes);
    H5Tclose(rec);
    H5Gclose(H5Gcreate2(w.id(), "group", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  }
  auto err = [&](const std::string& file, const std::string& in, const std::string& tg) {
    return error_of([&] { (void)Hdf5Dataset::open(file, in, tg); });
  };
  EXPECT_HAS(err(path + ".nope", "x", "y"), "HDF5 file " + path + ".nope does not exist");
  const std::string text = (dir.path / "text.h5").string();
  std::ofstream(text) << "not hdf5\n";
  EXPECT_HAS(err(text, "x", "y"), "H5Fopen failed on file " + text);
  EXPECT_HAS(err(path, "inputs", "y2"), "HDF5 file " + path + " has no dataset 'inputs' (the inputs array)");
  EXPECT_HAS(err(path, "x", "missing/deeper"), "has no dataset 'missing/deeper' (the targets array)");
  EXPECT_HAS(err(path, "group", "y2"), "has no dataset 'group'");
  EXPECT_HAS(err(path, "scalar", "y2"), "dataset 'scalar' (the inputs array) is a scalar (0-D)");
  EXPECT_HAS(err(path, "empty", "y2"), "dataset 'empty' (the inputs array) holds no samples: its shape is [0, 4]");
  EXPECT_HAS(err(path, "names", "y2"), "dataset 'names' (the inputs array) holds string elements");
  EXPECT_HAS(err(path, "x", "records"), "dataset 'records' (the targets array) holds compound elements");
  EXPECT_HAS(err(path, "x", "y2"), "the inputs 'x' have 3 samples (first axis of [3]) but the targets 'y2' have 2");
}

}  // namespace
