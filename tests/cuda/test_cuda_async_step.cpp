// The GPU engine's boundary step without a host synchronisation (docs/dev/gpu.md "The
// boundary step without a host synchronisation"), at 1 rank and at 2 ranks sharing GPU 0 over
// StagedComm. GptCuda behind a wrapper that injects faults on the last rank: +inf written into
// its first gradient element before a chosen backward (stages 0 and 1, whose gradients are one
// allocation; at stage 1 the element is in rank 0's slice, so only rank 0 sees the inf after
// the reduction and rank 1 learns it from the statistics' all-reduce), or a NaN loss from a
// chosen forward (any stage: the host's flag goes into the device decision).
//
// Each case trains twice from the same start, the asynchronous step against the synchronous one
// (EngineTestSwitches::synchronous_device_steps), and a third time asynchronously reading nothing
// until the end (every outcome applied lazily by the next backward or boundary):
// - equal bit for bit: losses, grad norms, loss scales, lr, skipped/applied, parameters;
// - the injected steps are skipped on every rank, the fp16 scale halves there (hysteresis 1),
//   the scheduler does not step (last_batch_iteration == applied steps);
// - bf16 with check_grad_overflow false does not skip on inf gradients (norm -1);
// - the device stores synchronise the host 0 times inside step() on the asynchronous path
//   (engine::device_stream_syncs), at least once per boundary on the synchronous one.
// Without a GPU: exit 77.
#include <cuda_runtime.h>
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/cuda_check.h"
#include "ds/engine/engine.h"
#include "ds/mpi/device_comm.h"
#include "ds/nn/gpt_cuda.h"
#include "ds/sched/lr_scheduler.h"
#include "engine_fixture.h"
#include "engine_testing.h"

namespace {

using engine_test::rows_of;
constexpr std::int64_t kMicro = 2;
constexpr int kSteps = 7;

// GptCuda with fault injection (call indices count from 0).
class Faulty final : public ds::Module {
 public:
  explicit Faulty(ds::Module& m) : m_(m) {}
  std::set<int> inf_grad_on_backward, nan_loss_on_forward;

  ds::Device device() const override { return m_.device(); }
  void* device_stream() const override { return m_.device_stream(); }
  std::vector<ds::ParamInfo> parameters() const override { return m_.parameters(); }
  void init_parameters(std::span<const std::span<float>> p, std::uint64_t seed) override { m_.init_parameters(p, seed); }
  bool init_parameter_range(std::size_t first, std::span<const std::span<float>> p, std::uint64_t seed) override {
    return m_.init_parameter_range(first, p, seed);
  }
  void bind(std::span<const ds::TensorView> params, std::span<const ds::TensorView> grads) override {
    first_grad_ = grads.empty() ? ds::TensorView{} : grads[0];
    m_.bind(params, grads);
  }
  float forward(const ds::Batch& b) override {
    const float l = m_.forward(b);
    return nan_loss_on_forward.count(forwards_++) ? std::nanf("") : l;
  }
  void backward(float scale, const std::function<void(std::size_t)>& ready) override {
    if (inf_grad_on_backward.count(backwards_++)) {
      // Before the module's kernels, on its stream: they accumulate into it, inf stays inf.
      static const std::uint32_t f32 = 0x7f800000u;
      static const std::uint16_t f16 = 0x7c00u, b16 = 0x7f80u;
      const void* bits = first_grad_.dtype == ds::DType::F32   ? static_cast<const void*>(&f32)
                         : first_grad_.dtype == ds::DType::F16 ? static_cast<const void*>(&f16)
                                                               : static_cast<const void*>(&b16);
      DS_CUDA_CHECK(cudaMemcpyAsync(first_grad_.data, bits, ds::dtype_size(first_grad_.dtype), cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(m_.device_stream())));
    }
    m_.backward(scale, ready);
  }
  float evaluate(const ds::Batch& b) override { return m_.evaluate(b); }
  std::vector<ds::ParamGroup> parameter_groups() const override { return m_.parameter_groups(); }
  void set_group_hooks(ds::GroupHooks* h) override { m_.set_group_hooks(h); }

 private:
  ds::Module& m_;
  ds::TensorView first_grad_;
  int forwards_ = 0, backwards_ = 0;
};

struct Case {
  const char* name;
  int stage;
  std::string precision;  // top-level keys, each starting with a comma
  double clip;
  std::set<int> inf_grad, nan_loss;  // on the last rank
  std::vector<int> applied;          // expected was_step_applied() per step
  bool fp16_halves = false;          // the scale halves at every skipped step
};

std::string config(const Case& c) {
  return "{\"train_micro_batch_size_per_gpu\": " + std::to_string(kMicro) +
         ", \"gradient_accumulation_steps\": 1, \"seed\": 5, \"gradient_clipping\": " + std::to_string(c.clip) +
         ", \"optimizer\": " + engine_test::kAdamW +
         ", \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10, \"warmup_type\": "
         "\"linear\"}}, \"zero_optimization\": {\"stage\": " +
         std::to_string(c.stage) + "}" + c.precision + "}";
}

struct Run {
  std::vector<double> seen;  // per step: loss, norm, scale, lr, applied, skipped
  std::vector<std::uint32_t> params;
  std::int64_t skipped = 0, sched_steps = 0;
  std::uint64_t syncs_in_step = 0;
  double scale = 0;
};

Run train(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& dcomm, const Case& c, bool sync,
          bool observe) {
  ds::nn::GptCuda gpt(engine_test::small_gpt(), /*allow_tf32=*/false);
  Faulty model(gpt);
  if (ctx.rank == ctx.world_size - 1) {
    model.inf_grad_on_backward = c.inf_grad;
    model.nan_loss_on_forward = c.nan_loss;
  }
  auto r = ds::initialize(ds::config::parse_config_text(config(c), "test config"), model, ctx.comm, dcomm);
  auto& e = *r.engine;
  e.set_test_switches({.synchronous_device_steps = sync});
  const auto it0 = e.lr_scheduler()->last_batch_iteration();
  Run out;
  for (int s = 0; s < kSteps; ++s) {
    const auto g = engine_test::global_tokens(ctx.world_size, kMicro, s, 4000u);
    const auto mine = rows_of(g, ctx.rank * kMicro, kMicro);
    const float loss = e.forward(mine.batch());
    e.backward(loss);
    const std::uint64_t before = ds::engine::device_stream_syncs();
    e.step();
    out.syncs_in_step += ds::engine::device_stream_syncs() - before;
    if (observe)
      out.seen.insert(out.seen.end(), {double(loss), e.get_global_grad_norm(), e.loss_scale(), e.get_lr(),
                                       e.was_step_applied() ? 1.0 : 0.0, double(e.skipped_steps())});
  }
  for (float p : e.gather_params_fp32()) out.params.push_back(std::bit_cast<std::uint32_t>(p));
  out.skipped = e.skipped_steps();
  out.sched_steps = e.lr_scheduler()->last_batch_iteration() - it0;
  out.scale = e.loss_scale();
  return out;
}

void run_case(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& dcomm, const Case& c) {
  const int W = ctx.world_size;
  const Run sync = train(ctx, dcomm, c, true, true);
  const Run async = train(ctx, dcomm, c, false, true);
  const Run quiet = train(ctx, dcomm, c, false, false);
  CHECK_MSG(async.seen == sync.seen, "%s: the asynchronous step's losses / norms / scales / lr / counters differ",
            c.name);
  CHECK_MSG(async.params == sync.params, "%s: parameters differ from the synchronous step", c.name);
  CHECK_MSG(quiet.params == sync.params, "%s: parameters differ when nothing is read between steps", c.name);
  CHECK_MSG(quiet.skipped == sync.skipped && quiet.sched_steps == sync.sched_steps && quiet.scale == sync.scale,
            "%s: lazily applied outcomes differ (skipped %lld/%lld, scheduler %lld/%lld, scale %g/%g)", c.name,
            (long long)quiet.skipped, (long long)sync.skipped, (long long)quiet.sched_steps,
            (long long)sync.sched_steps, quiet.scale, sync.scale);
  // What the faults must do, on every rank.
  std::int64_t want_skipped = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double* row = &sync.seen[std::size_t(s) * 6];
    want_skipped += c.applied[std::size_t(s)] ? 0 : 1;
    CHECK_MSG(int(row[4]) == c.applied[std::size_t(s)], "%s: step %d applied %d, expected %d", c.name, s, int(row[4]),
              c.applied[std::size_t(s)]);
    if (c.fp16_halves && s > 0) {
      const double prev = sync.seen[std::size_t(s - 1) * 6 + 2];
      if (!c.applied[std::size_t(s)]) CHECK_MSG(row[2] == prev / 2, "%s: step %d scale %g after %g", c.name, s, row[2], prev);
    }
  }
  CHECK_MSG(sync.skipped == want_skipped, "%s: %lld skipped, expected %lld", c.name, (long long)sync.skipped,
            (long long)want_skipped);
  CHECK_MSG(sync.sched_steps == kSteps - want_skipped, "%s: the scheduler stepped %lld times for %lld applied steps",
            c.name, (long long)sync.sched_steps, (long long)(kSteps - want_skipped));
  // Host synchronisations by the stores inside step().
  CHECK_MSG(sync.syncs_in_step >= std::uint64_t(kSteps), "%s: the synchronous step synchronised %llu times in %d steps",
            c.name, (unsigned long long)sync.syncs_in_step, kSteps);
  CHECK_MSG(async.syncs_in_step == 0 && quiet.syncs_in_step == 0,
            "%s: the asynchronous step synchronised the host %llu + %llu times", c.name,
            (unsigned long long)async.syncs_in_step, (unsigned long long)quiet.syncs_in_step);
  if (ctx.rank == 0)
    std::printf("%s, %d rank(s): skipped %lld of %d, scale %g; host syncs in step(): synchronous %llu, asynchronous "
                "%llu\n",
                c.name, W, (long long)sync.skipped, kSteps, sync.scale, (unsigned long long)sync.syncs_in_step,
                (unsigned long long)async.syncs_in_step);
}

}  // namespace

int main(int argc, char**) {
  return engine_test::mpi_test_main(
      argc, "test_cuda_async_step", "mpirun -np 1|2 test_cuda_async_step (no arguments)",
      [](ds::DistributedContext& ctx, int devices, cudaError_t rc) {
        if (rc != cudaSuccess || devices == 0) {
          if (ctx.rank == 0) std::printf("test_cuda_async_step: no CUDA device visible: skipped\n");
          return 77;
        }
        ctx.device = 0;  // every rank on GPU 0 (StagedComm between them)
        DS_CUDA_CHECK(cudaSetDevice(0));
        std::shared_ptr<ds::Communicator> dcomm;
        if (ctx.world_size > 1) dcomm = ds::make_device_communicator(ctx, "staged");
        const std::string fp16 = R"(, "fp16": {"enabled": true, "initial_scale_power": 10, "hysteresis": 1})";
        const std::string bf16_nocheck = R"(, "bf16": {"enabled": true, "check_grad_overflow": false})";
        // inf gradients at backward 2, a NaN loss at forward 4, on the last rank.
        for (int stage : {0, 1})
          run_case(ctx, dcomm, Case{"fp16, inf gradients and a NaN loss", stage, fp16, 0.5, {2}, {4},
                                    {1, 1, 0, 1, 0, 1, 1}, true});
        for (int stage : {2, 3})
          run_case(ctx, dcomm, Case{"fp16, a NaN loss", stage, fp16, 0.5, {}, {1, 5}, {1, 0, 1, 1, 1, 0, 1}, true});
        // bf16 without check_grad_overflow: the inf gradients of the last step are applied.
        run_case(ctx, dcomm, Case{"bf16 without check_grad_overflow", 1, bf16_nocheck, 0.5, {6}, {3},
                                  {1, 1, 1, 0, 1, 1, 1}, false});
        // fp32 without clipping.
        run_case(ctx, dcomm, Case{"fp32, no clipping, a NaN loss", 0, "", 0.0, {}, {2}, {1, 1, 0, 1, 1, 1, 1}, false});
        return engine_test::kChecksDone;
      });
}
