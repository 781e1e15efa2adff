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
