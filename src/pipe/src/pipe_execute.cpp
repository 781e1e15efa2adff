// The pipeline engine's execution of a schedule (ds/pipe/schedule.h): each instruction of each
// step in order, on this stage's buffers.

#include "ds/core/error.h"
#include "pipe_impl.h"

namespace ds::pipe {

namespace {

constexpr int kTagActivation = 1;
constexpr int kTagGradient = 2;

std::size_t elements(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= std::size_t(d);
  return n;
}

}  // namespace

void PipeEngine::Impl::ensure_loaded(PipeSlot& slot, int micro) {
  if (slot.micro_batch == micro) return;
  // Micro-batches enter every stage in order, so the source is read in order on every stage.
  DS_CHECK(micro == loaded, "pipeline: micro-batch " << micro << " scheduled before micro-batch " << loaded);
  slot.load((*source)(), micro);
  ++loaded;
  size_activations(slot);
}

void PipeEngine::Impl::size_activations(PipeSlot& slot) {
  const LayerSequence& seq = stage->sequence();
  const std::vector<int>& b = bounds;
  if (!first()) {
    const std::size_t n = elements(seq.activation_shape(std::size_t(b[std::size_t(stage_id)]), slot.batch));
    slot.act_in.resize(n);
    slot.grad_out.resize(n);
  }
  if (!last()) {
    const std::size_t n = elements(seq.activation_shape(std::size_t(b[std::size_t(stage_id) + 1]), slot.batch));
    slot.act_send.wait();  // the previous micro-batch's send still reads act_out
    slot.act_out.resize(n);
    slot.grad_in.resize(n);
  }
}

void PipeEngine::Impl::forward_pass(PipeSlot& slot, int buffer) {
  // act_out is free: its previous send was waited for when the micro-batch was loaded.
  stage->select(buffer, {slot.act_in, slot.act_out, {}, {}});
  slot.loss = training ? engine->forward(slot.batch) : engine->evaluate(slot.batch);
  if (last()) loss_sum += double(slot.loss);
}

void PipeEngine::Impl::backward_pass(PipeSlot& slot, int buffer, int micro) {
  slot.grad_send.wait();  // the previous micro-batch's gradient send still reads grad_out
  stage->select(buffer, {slot.act_in, slot.act_out, slot.grad_in, slot.grad_out});
  engine->backward(slot.loss);
  tied->send_gradients();
  // The engine counts micro-steps: every backward but the step's last ends with step(); the
  // last one's step() is the schedule's OptimizerStep.
  if (micro + 1 < micro_batches) engine->step();
  slot.micro_batch = -1;
}

// Every send in flight, finished. Before a collective: a large send progresses only while its
// sender is inside MPI, and a shared-memory collective waits without calling MPI, so a sender
// that entered one with a send pending would hang a receiver that waits for it (Open MPI
// without single-copy transfers).
void PipeEngine::Impl::finish_sends() {
  for (PipeSlot& s : slots) {
    s.act_send.wait();
    s.grad_send.wait();
  }
  tied->finish_sends();
}

void PipeEngine::Impl::execute(const Instruction& ins) {
  PipeSlot* slot = ins.buffer_id >= 0 ? &slots.at(std::size_t(ins.buffer_id)) : nullptr;
  switch (ins.op) {
    case Op::LoadMicroBatch: ensure_loaded(*slot, ins.micro_batch); break;
    case Op::RecvActivation:
      ensure_loaded(*slot, ins.micro_batch);
      link->recv(slot->act_in.data(), slot->act_in.size() * sizeof(float), stage_id - 1, kTagActivation);
      break;
    case Op::ForwardPass:
      ensure_loaded(*slot, ins.micro_batch);
      forward_pass(*slot, ins.buffer_id);
      break;
    case Op::SendActivation:
      slot->act_send = link->isend(slot->act_out.data(), slot->act_out.size() * sizeof(float), stage_id + 1,
                                   kTagActivation);
      break;
    case Op::RecvGrad:
      link->recv(slot->grad_in.data(), slot->grad_in.size() * sizeof(float), stage_id + 1, kTagGradient);
      break;
    case Op::BackwardPass: backward_pass(*slot, ins.buffer_id, ins.micro_batch); break;
    case Op::SendGrad:
      slot->grad_send = link->isend(slot->grad_out.data(), slot->grad_out.size() * sizeof(float), stage_id - 1,
                                    kTagGradient);
      break;
    // Tied gradients were summed at each backward (TiedSync) and the data-parallel reduction
    // runs inside the engine (overlapped with the last backward, finished by its step).
    case Op::ReduceTiedGrads:
    case Op::ReduceGrads: break;
    case Op::OptimizerStep:
      finish_sends();
      engine->step();
      tied->sync_values();
      break;
  }
}

void PipeEngine::Impl::run(const Schedule& schedule) {
  loaded = 0;
  loss_sum = 0.0;
  for (PipeSlot& s : slots) s.micro_batch = -1;
  for (const Step& step : schedule.steps)
    for (const Instruction& ins : step) execute(ins);
  finish_sends();  // before the loss's collective
}

float PipeEngine::Impl::mean_loss(Communicator& world, int count) {
  double buf[2] = {last() ? loss_sum : 0.0, last() ? double(count) : 0.0};
  world.all_reduce(TensorView{buf, 2, DType::F64}, ReduceOp::Sum);
  return float(buf[0] / buf[1]);
}

float PipeEngine::train_batch(const MicroBatchSource& next) {
  impl_->source = &next;
  impl_->training = true;
  impl_->run(train_schedule(impl_->micro_batches, grid_.stages(), coord_.stage));
  return impl_->mean_loss(*world_comm_, impl_->micro_batches);
}

float PipeEngine::eval_batch(const MicroBatchSource& next, int micro_batches) {
  impl_->source = &next;
  impl_->training = false;
  impl_->run(inference_schedule(micro_batches, grid_.stages(), coord_.stage));
  return impl_->mean_loss(*world_comm_, micro_batches);
}

}  // namespace ds::pipe
