// DeepSpeed's TrainSchedule and InferenceSchedule (ds/pipe/schedule.h), step for step.
#include "ds/pipe/schedule.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::pipe {

const char* op_name(Op op) {
  switch (op) {
    case Op::LoadMicroBatch: return "LoadMicroBatch";
    case Op::ForwardPass: return "ForwardPass";
    case Op::BackwardPass: return "BackwardPass";
    case Op::SendActivation: return "SendActivation";
    case Op::RecvActivation: return "RecvActivation";
    case Op::SendGrad: return "SendGrad";
    case Op::RecvGrad: return "RecvGrad";
    case Op::ReduceTiedGrads: return "ReduceTiedGrads";
    case Op::ReduceGrads: return "ReduceGrads";
    case Op::OptimizerStep: return "OptimizerStep";
  }
  return "?";
}

bool has_buffer(Op op) { return op != Op::ReduceTiedGrads && op != Op::ReduceGrads && op != Op::OptimizerStep; }

std::string Instruction::text() const {
  std::string s = op_name(op);
  s += has_buffer(op) ? "(buffer_id=" + std::to_string(buffer_id) + ")" : "()";
  return s;
}

std::string step_text(const Step& step) {
  std::string s;
  for (const Instruction& in : step) {
    if (!s.empty()) s += ' ';
    s += in.text();
  }
  return s;
}

namespace {

void check_shape(const char* which, int micro_batches, int stages, int stage_id) {
  DS_CHECK(micro_batches >= 1 && stages >= 1,
           which << " schedule: micro_batches " << micro_batches << " and stages " << stages << " must be >= 1");
  DS_CHECK(stage_id >= 0 && stage_id < stages,
           which << " schedule: stage_id " << stage_id << " is outside stages 0.." << stages - 1);
}

// DeepSpeed's TrainSchedule._step_to_micro_batch: a stage runs forward on the steps of its own
// parity. Its four cases (even/odd step x even/odd stage) fold into one formula each:
// forward micro-batch step/2 - stage/2, backward step/2 - (stages - 1) + stage/2.
struct StepWork {
  int micro_batch;
  bool forward;
};
StepWork train_step_work(int step, int stages, int stage_id) {
  if (step % 2 == stage_id % 2) return {step / 2 - stage_id / 2, true};
  return {step / 2 - (stages - 1) + stage_id / 2, false};
}

}  // namespace

Schedule train_schedule(int micro_batches, int stages, int stage_id) {
  check_shape("train", micro_batches, stages, stage_id);
  Schedule out;
  out.num_pipe_buffers = std::max(2, std::min(stages - stage_id, micro_batches));
  const bool first = stage_id == 0, last = stage_id == stages - 1;
  auto valid = [&](int mb) { return mb >= 0 && mb < micro_batches; };
  auto on = [&](Op op, int mb) { return Instruction{op, mb % out.num_pipe_buffers, mb}; };
  const int total_steps = 2 * (micro_batches + stages - 1);
  int prev = -1;  // the micro-batch of the previous step (whose results this step sends)
  for (int step = 0; step < total_steps; ++step) {
    const auto [mb, forward] = train_step_work(step, stages, stage_id);
    Step cmds;
    if (forward) {
      if (valid(prev) && !first) cmds.push_back(on(Op::SendGrad, prev));
      if (valid(mb) && !first) cmds.push_back(on(Op::RecvActivation, mb));
    } else {
      if (valid(mb) && !last) cmds.push_back(on(Op::RecvGrad, mb));
      if (valid(prev) && !last) cmds.push_back(on(Op::SendActivation, prev));
    }
    if ((first || last) && forward && valid(mb)) cmds.push_back(on(Op::LoadMicroBatch, mb));
    if (valid(mb)) cmds.push_back(on(forward ? Op::ForwardPass : Op::BackwardPass, mb));
    if (step == total_steps - 1) {
      for (Op op : {Op::ReduceTiedGrads, Op::ReduceGrads, Op::OptimizerStep}) cmds.push_back({op});
    }
    prev = mb;
    out.steps.push_back(std::move(cmds));
  }
  return out;
}

Schedule inference_schedule(int micro_batches, int stages, int stage_id) {
  check_shape("inference", micro_batches, stages, stage_id);
  Schedule out;
  out.num_pipe_buffers = 2;
  const bool first = stage_id == 0, last = stage_id == stages - 1, even = stage_id % 2 == 0;
  auto valid = [&](int mb) { return mb >= 0 && mb < micro_batches; };
  for (int step = 0; step < micro_batches + stages - 1; ++step) {
    const int mb = step - stage_id;
    // The buffers alternate, and neighbouring stages use them in opposite phase.
    const int recv_buf = even ? step % 2 : (step + 1) % 2;
    const int send_buf = even ? (step + 1) % 2 : step % 2;
    Step cmds;
    if ((first || last) && valid(mb)) cmds.push_back({Op::LoadMicroBatch, recv_buf, mb});
    const bool send = !last && valid(mb - 1), recv = !first && valid(mb);
    // Even stages send before they receive, odd ones receive first: the pairs line up.
    if (even && send) cmds.push_back({Op::SendActivation, send_buf, mb - 1});
    if (recv) cmds.push_back({Op::RecvActivation, recv_buf, mb});
    if (!even && send) cmds.push_back({Op::SendActivation, send_buf, mb - 1});
    if (valid(mb)) cmds.push_back({Op::ForwardPass, recv_buf, mb});
    out.steps.push_back(std::move(cmds));
  }
  return out;
}

}  // namespace ds::pipe
