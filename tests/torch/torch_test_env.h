// What the torch tests share: COMM_WORLD, the models make_models.py writes (rank 0 writes
// them once per run, into a directory of the build tree), and the regression data it wrote.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/module.h"
#include "ds/mpi/communicator.h"
#include "ds/torch/torch_module.h"

namespace ds::test {

extern std::shared_ptr<Communicator> g_world;

// The directory holding the models; the first call (on every rank together) writes them.
const std::string& torch_models();
std::string torch_model(const std::string& name);  // torch_models() + "/" + name + ".pt"

// make_models.py's regression data: STEPS * BATCH samples, inputs of 6 floats, targets of 3.
struct RegressionData {
  static constexpr int kIn = 6, kOut = 3, kSteps = 20, kBatch = 8;
  std::vector<float> x, y;
  std::vector<std::int64_t> in_shape{kIn}, out_shape{kOut};
  RegressionData();
  // `count` samples from sample `first` as a feature batch (float targets).
  Batch batch(int first, int count) const;
  // The first eight samples' inputs with class ids 0-3 as targets (for 4-way classifiers).
  Batch class_batch() const;
};

// Engine-like flat storage for a module: fp32 parameters (its own initial values) and
// zeroed gradients, bound.
struct Bound {
  std::vector<std::vector<float>> params, grads;
  explicit Bound(torch::TorchModule& m);
};

// PyTorch's losses for the regression trained with `optimizer` ("adamw" or "sgd").
std::vector<double> pytorch_losses(const std::string& optimizer);

}  // namespace ds::test
