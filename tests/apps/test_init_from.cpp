// --init_from's careless inputs: weights holding NaN or Inf are refused at load, naming the
// tensor and its first bad element; the 16-bit model save may not replace the file the run
// starts from (the same file by device and inode, whatever the spelling).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "../common/test_mlp.h"
#include "ds/io/safetensors.h"
#include "init_from.h"
#include "save_dir_check.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

// Writes the TestMlp(3, 2) parameters (fc1.weight [2,3], fc1.bias [2], fc2.weight [1,2],
// fc2.bias [1]) to `path`, all 0.25 except `bad` at element `index` of tensor `tensor`.
void write_weights(const fs::path& path, const std::string& tensor, std::size_t index, float bad) {
  test::TestMlp model(3, 2);
  std::vector<io::SafetensorsSpec> specs;
  for (const auto& p : model.parameters()) specs.push_back({p.name, DType::F32, p.shape});
  io::SafetensorsWriter w(path.string(), specs, {{"producer", "dstrain test"}});  // dstrain names
  for (const auto& p : model.parameters()) {
    std::vector<float> v(p.numel(), 0.25f);
    if (p.name == tensor) v[index] = bad;
    w.write(v);
  }
  w.close();
}

// What loading `path` into a TestMlp(3, 2) through --init_from throws ("(no error)" if none).
std::string load_error(const fs::path& path) {
  auto model = train::init_from_file(std::make_unique<test::TestMlp>(3, 2), path.string(), true, nullptr);
  std::vector<std::vector<float>> store;
  std::vector<std::span<float>> spans;
  for (const auto& p : model->parameters()) store.emplace_back(p.numel());
  for (auto& s : store) spans.emplace_back(s);
  return error_of([&] { model->init_parameters(spans, 1); });
}

}  // namespace

TEST(InitFrom, NonFiniteWeightsAreRefusedNamingTheTensorAndElement) {
  TempDir d("ds_init_from");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  write_weights(d.path / "nan.safetensors", "fc1.weight", 4, nan);
  std::string e = load_error(d.path / "nan.safetensors");
  EXPECT_HAS(e, "tensor 'fc1.weight' in " + (d.path / "nan.safetensors").string() + " holds NaN at element 4");
  write_weights(d.path / "inf.safetensors", "fc2.bias", 0, -inf);
  e = load_error(d.path / "inf.safetensors");
  EXPECT_HAS(e, "tensor 'fc2.bias' in " + (d.path / "inf.safetensors").string() + " holds -Inf at element 0");
  write_weights(d.path / "ok.safetensors", "fc1.bias", 1, 0.5f);
  EXPECT_EQ(load_error(d.path / "ok.safetensors"), "(no error)");
}

TEST(InitFrom, ModelSaveMayNotReplaceTheInitFromFile) {
  TempDir d("ds_init_from");
  fs::create_directories(d.path / "run");
  const fs::path weights = d.path / "run" / "model.safetensors";
  write_weights(weights, "fc1.bias", 0, 0.5f);
  const std::string out = (d.path / "run" / "model.safetensors").string();
  // The same file, spelled differently; through a hard link; inside an --init_from directory.
  const std::string other_spelling = (d.path / "run" / ".." / "run" / "model.safetensors").string();
  EXPECT_HAS(error_of([&] { train::check_model_save_target(out, other_spelling); }),
             "would replace " + out + ", which is this run's --init_from " + other_spelling);
  fs::create_hard_link(weights, d.path / "linked.safetensors");
  EXPECT_HAS(error_of([&] { train::check_model_save_target(out, (d.path / "linked.safetensors").string()); }),
             "would replace " + out);
  EXPECT_HAS(error_of([&] { train::check_model_save_target(out, (d.path / "run").string()); }),
             "which is " + weights.string() + " in this run's --init_from " + (d.path / "run").string());
  // Another file, or an output that does not exist yet: fine.
  fs::copy_file(weights, d.path / "copy.safetensors");
  EXPECT_EQ(error_of([&] { train::check_model_save_target(out, (d.path / "copy.safetensors").string()); }),
            "(no error)");
  EXPECT_EQ(error_of([&] { train::check_model_save_target((d.path / "new.safetensors").string(), weights.string()); }),
            "(no error)");
}
