// A user's model trained through the installed library: y = w.x + b fitted by the engine.
#include <cmath>
#include <cstdio>
#include <vector>

#include "ds/core/module.h"
#include "ds/engine/engine.h"
#include "ds/mpi/init.h"

namespace {
class Linear final : public ds::Module {
 public:
  std::vector<ds::ParamInfo> parameters() const override { return {{"w", {4}}, {"b", {1}}}; }
  void init_parameters(std::span<const std::span<float>> p, std::uint64_t) override {
    for (auto s : p) for (float& v : s) v = 0.0f;
  }
  void bind(std::span<const ds::TensorView> p, std::span<const ds::TensorView> g) override {
    w_ = p[0].as<float>(); b_ = p[1].as<float>(); gw_ = g[0].as<float>(); gb_ = g[1].as<float>();
  }
  float forward(const ds::Batch& batch) override {
    x_ = batch.features; n_ = batch.batch;
    err_.assign(n_, 0.0f);
    float loss = 0;
    for (int i = 0; i < n_; ++i) {
      float y = b_[0];
      for (int j = 0; j < 4; ++j) y += w_[j] * x_[i * 4 + j];
      const float target = 1.0f + 2.0f * x_[i * 4] - x_[i * 4 + 3];
      err_[i] = y - target;
      loss += err_[i] * err_[i] / n_;
    }
    return loss;
  }
  void backward(float scale, const std::function<void(std::size_t)>& ready) override {
    for (int i = 0; i < n_; ++i) {
      const float d = 2.0f * err_[i] / n_ * scale;
      for (int j = 0; j < 4; ++j) gw_[j] += d * x_[i * 4 + j];
      gb_[0] += d;
    }
    ready(1);
    ready(0);
  }

 private:
  float *w_ = nullptr, *b_ = nullptr, *gw_ = nullptr, *gb_ = nullptr;
  std::span<const float> x_;
  int n_ = 0;
  std::vector<float> err_;
};
}  // namespace

int main() {
  auto dist = ds::init_distributed();
  Linear model;
  auto init = ds::initialize(std::string(R"({"train_micro_batch_size_per_gpu": 8,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "gradient_clipping": 0})"),
      model, dist.comm);
  std::vector<float> x(8 * 4);
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.37f * float(i + 1) * float(step + 1 + 1000 * dist.rank));
    ds::Batch batch;
    batch.features = x;
    batch.batch = 8;
    batch.feature_dim = 4;
    const float loss = init.engine->forward(batch);
    init.engine->backward(loss);
    init.engine->step();
    if (step == 0) first = loss;
    last = loss;
  }
  if (dist.rank == 0) std::printf("consumer: world %d, loss %.6f -> %.6f\n", dist.world_size, first, last);
  return last < first * 0.01f ? 0 : 1;
}
