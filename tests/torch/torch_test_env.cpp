#include "torch_test_env.h"

#include <cstdlib>
#include <fstream>

#include "ds/core/error.h"
#include "../common/mpi_gtest_main.h"

namespace ds::test {

std::shared_ptr<Communicator> g_world;

const std::string& torch_models() {
  static const std::string dir = [] {
    const std::string d = std::string(DS_TORCH_MODELS_DIR) + "_np" + std::to_string(g_world->size());
    int rc = 0;
    if (g_world->rank() == 0) {
      const std::string cmd = std::string(DS_TORCH_PYTHON) + " " + DS_TORCH_MAKE_MODELS + " " + d;
      rc = std::system(cmd.c_str());
    }
    g_world->broadcast(TensorView{&rc, 1, DType::I32}, 0);
    DS_CHECK(rc == 0, "make_models.py failed (" << rc << ")");
    return d;
  }();
  return dir;
}

std::string torch_model(const std::string& name) { return torch_models() + "/" + name + ".pt"; }

namespace {

std::vector<float> read_floats(const std::string& path, std::size_t count) {
  std::vector<float> v(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(count * sizeof(float)));
  DS_CHECK(in.gcount() == std::streamsize(count * sizeof(float)), path << ": short read");
  return v;
}

}  // namespace

RegressionData::RegressionData()
    : x(read_floats(torch_models() + "/regression_x.f32", std::size_t(kSteps * kBatch * kIn))),
      y(read_floats(torch_models() + "/regression_y.f32", std::size_t(kSteps * kBatch * kOut))) {}

Batch RegressionData::batch(int first, int count) const {
  Batch b;
  b.batch = count;
  b.features = std::span<const float>(x).subspan(std::size_t(first * kIn), std::size_t(count * kIn));
  b.target_values = std::span<const float>(y).subspan(std::size_t(first * kOut), std::size_t(count * kOut));
  b.sample_shape = in_shape;
  b.target_shape = out_shape;
  b.feature_dim = kIn;
  return b;
}

Batch RegressionData::class_batch() const {
  static constexpr std::int32_t kClassIds[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  Batch b = batch(0, 8);
  b.target_values = {};
  b.target_shape = {};
  b.targets = kClassIds;
  return b;
}

Bound::Bound(torch::TorchModule& m) {
  std::vector<std::span<float>> spans;
  for (const auto& p : m.parameters()) {
    params.emplace_back(p.numel());
    grads.emplace_back(p.numel(), 0.0f);
  }
  for (auto& p : params) spans.emplace_back(p);
  m.init_parameters(spans, 0);
  std::vector<TensorView> pv, gv;
  for (std::size_t i = 0; i < params.size(); ++i) {
    pv.push_back({params[i].data(), params[i].size(), DType::F32});
    gv.push_back({grads[i].data(), grads[i].size(), DType::F32});
  }
  m.bind(pv, gv);
}

std::vector<double> pytorch_losses(const std::string& optimizer) {
  std::ifstream in(torch_models() + "/regression_" + optimizer + ".txt");
  std::vector<double> losses;
  for (double v; in >> v;) losses.push_back(v);
  DS_CHECK(losses.size() == std::size_t(RegressionData::kSteps), "regression_" << optimizer << ".txt: "
                                                                                 << losses.size() << " losses");
  return losses;
}

}  // namespace ds::test

int main(int argc, char** argv) { return ds::test::mpi_gtest_main(argc, argv, ds::test::g_world); }
