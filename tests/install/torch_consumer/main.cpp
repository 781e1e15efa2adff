// A user's torch::nn model trained through the installed library: a small MLP fits
// y = 1 + 2 x0 - x3 on data-parallel ranks, the engine doing the optimizer steps.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "ds/engine/engine.h"
#include "ds/mpi/init.h"
#include "ds/torch/torch_frontend.h"

namespace {

struct Net : torch::nn::Module {
  Net() : torch::nn::Module("Net") {
    fc1 = register_module("fc1", torch::nn::Linear(4, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))).squeeze(1); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace

int main() {
  auto dist = ds::init_distributed();
  torch::manual_seed(0);  // the same initial weights everywhere (the engine broadcasts rank 0's anyway)
  auto model = ds::torch::from_module(std::make_shared<Net>(), [](Net& net, const torch::Tensor& x,
                                                                   const torch::Tensor& y) {
    return torch::mse_loss(net.forward(x), y);
  });
  auto init = ds::initialize(std::string(R"({"train_micro_batch_size_per_gpu": 16,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.02}}, "gradient_clipping": 0})"),
      *model, dist.comm);
  constexpr int kBatch = 16, kIn = 4;
  std::vector<float> x(kBatch * kIn), y(kBatch);
  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    for (int i = 0; i < kBatch; ++i) {
      for (int j = 0; j < kIn; ++j)
        x[i * kIn + j] = std::sin(0.37f * float(i * kIn + j + 1) * float(step + 1 + 1000 * dist.rank));
      y[i] = 1.0f + 2.0f * x[i * kIn] - x[i * kIn + 3];
    }
    ds::Batch batch;
    batch.features = x;
    batch.target_values = y;
    batch.batch = kBatch;
    batch.feature_dim = kIn;
    const float loss = init.engine->forward(batch);
    init.engine->backward(loss);
    init.engine->step();
    if (step == 0) first = loss;
    last = loss;
  }
  if (dist.rank == 0)
    std::printf("torch_consumer: world %d, %zu parameter tensors, loss %.6f -> %.6f\n", dist.world_size,
                model->parameters().size(), first, last);
  return last < first * 0.1f ? 0 : 1;
}
