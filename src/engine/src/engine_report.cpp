// The Engine's progress lines, CSV rows and memory accessors.
#include <algorithm>
#include <sstream>

#include "ds/core/log.h"
#include "ds/engine/engine.h"
#include "ds/engine/monitor.h"
#include "ds/mpi/comms_logger.h"
#include "ds/optim/optimizer.h"
#include "ds/sched/lr_scheduler.h"
#include "grad_reducer.h"
#include "param_store.h"

namespace ds {

void Engine::report_progress(bool overflow, double loss, double step_ms) {
  if (monitors_->any()) {
    engine::CsvRow row;
    row.step = global_steps_;
    row.samples = global_samples_;
    row.loss = loss;
    row.lr = last_lr_;
    row.loss_scale = backward_scale_;
    row.grad_norm = global_grad_norm_;
    row.overflow = overflow;
    row.skipped_steps = skipped_steps_;
    row.step_time_ms = step_ms;
    monitors_->write(row);
  }
  // steps_per_print unset: no progress lines (DeepSpeed >= 0.15.2), except that
  // wall_clock_breakdown alone reports every step as DeepSpeed's timers do.
  const std::int64_t every = cfg_.steps_per_print.value_or(cfg_.wall_clock_breakdown ? 1 : 0);
  if (every > 0 && global_steps_ % every == 0) {
    std::ostringstream os;
    os.precision(6);
    os << "step=" << global_steps_ << " loss=" << loss << " lr=" << last_lr_ << " loss_scale=" << backward_scale_
       << " grad_norm=" << global_grad_norm_ << " skipped=" << skipped_steps_
       << " samples/s=" << (step_ms > 0 ? double(cfg_.train_batch_size) * 1000.0 / step_ms : 0.0)
       << " step_time_ms=" << step_ms;
    if (cfg_.wall_clock_breakdown) {
      const auto per_step = [&](const char* n) { return timers_.total_ms(n) / double(every); };
      os << " | forward_ms=" << per_step("forward") << " backward_ms=" << per_step("backward")
         << " reduce_ms=" << per_step("reduce") << " step_ms=" << per_step("step");
      timers_.reset();
    }
    DS_INFO(os.str());
  }
}

void Engine::log_eval_loss(double loss) {
  if (monitors_->any()) monitors_->write_eval_loss(global_samples_, loss);
}

double Engine::get_lr() const {
  resolve_step();  // the scheduler steps only when the last boundary's step was applied
  return scheduler_->lr();
}

engine::ModelStateBytes Engine::memory_report() const {
  resolve_step();  // a device step's queued releases go once the stream passed it
  engine::ModelStateBytes b;
  store_->add_memory(b);
  if (store_->grad_space() && map_.stage == 2 && world_ > 1) {  // ZeRO-2: measured (host or device)
    const GradientMemory g = gradient_memory();
    b.grad_buckets = g.peak_resident > g.partition ? g.peak_resident - g.partition : 0;
  }
  std::size_t opt = 0;
  for (const auto& t : optimizer_->state_tensors()) opt += t.second.size() * sizeof(float);
  b.optimizer_state = opt;
  b.comm_scratch += sync_->scratch_bytes();
  store_->add_swap_memory(b);
  return b;
}

Engine::GradientMemory Engine::gradient_memory() const {
  resolve_step();
  GradientMemory g;
  // Host pages, or a device store's chunks at ZeRO-2 (resident: mapped).
  const engine::GradPages* pages = store_->grad_space();
  if (!pages) return g;  // gradients in one device allocation
  const auto [keep_lo, keep_hi] = store_->kept_bytes();
  g.reserved = pages->mapped_bytes();
  g.resident = pages->resident_bytes();
  g.partition = pages->resident_bytes(keep_lo, keep_hi);
  g.peak_resident = std::max(sync_->peak_resident(), g.resident);
  return g;
}

std::vector<float> Engine::gather_params_fp32() const { return store_->params_fp32(); }

std::string Engine::comms_summary() const { return comms_log_ ? comms_log_->summary() : std::string(); }

}  // namespace ds
