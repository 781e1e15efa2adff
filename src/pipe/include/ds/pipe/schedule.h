// DeepSpeed's pipeline schedules (runtime/pipe/schedule.py): for one stage, the instructions
// it executes step by step over one batch of micro-batches. Each step is atomic: a barrier
// between two steps cannot deadlock, because every send is matched by the receive on the
// neighbouring stage in the same step (stage s's SendActivation by stage s+1's
// RecvActivation, stage s's SendGrad by stage s-1's RecvGrad).
//
// TrainSchedule is 1F1B: 2 x (micro_batches + stages - 1) steps, each stage alternating
// forward and backward steps (the parity of stage and step decides which), ending with
// ReduceTiedGrads, ReduceGrads and OptimizerStep on the last step. InferenceSchedule runs
// forward passes only, micro_batches + stages - 1 steps over two alternating buffers.
// Instructions, their order within a step, and buffer ids are DeepSpeed's.
#pragma once

#include <string>
#include <vector>

namespace ds::pipe {

enum class Op {
  LoadMicroBatch,   // read the next micro-batch (inputs on the first stage, labels on the last) into a buffer
  ForwardPass,      // run this stage's layers forward on a buffer
  BackwardPass,     // backward through this stage's layers, accumulating gradients
  SendActivation,   // send a buffer's outputs to the next stage
  RecvActivation,   // receive the previous stage's outputs into a buffer
  SendGrad,         // send the gradient of a buffer's inputs to the previous stage
  RecvGrad,         // receive the gradient of a buffer's outputs from the next stage
  ReduceTiedGrads,  // sum the gradients of weights tied across stages (GPT embedding and head)
  ReduceGrads,      // reduce gradients over the stage's data-parallel group
  OptimizerStep,    // step the optimizer and zero the gradients
};

// DeepSpeed's class name of the instruction ("ForwardPass").
const char* op_name(Op op);
// Whether the instruction works on a pipe buffer (all but the last three).
bool has_buffer(Op op);

struct Instruction {
  Op op;
  int buffer_id = -1;    // the pipe buffer, < num_pipe_buffers; -1 for step-level ops
  int micro_batch = -1;  // which micro-batch of the batch it concerns; -1 for step-level ops
  // As DeepSpeed prints it: "ForwardPass(buffer_id=0)", "ReduceGrads()".
  std::string text() const;
  bool operator==(const Instruction&) const = default;
};

using Step = std::vector<Instruction>;  // executed in order; may be empty (an idle step)

struct Schedule {
  std::vector<Step> steps;
  // The buffers the stage allocates. Train: max(2, min(stages - stage_id, micro_batches)),
  // the most forward passes in flight awaiting their backward; inference: 2.
  int num_pipe_buffers = 0;
};

// Throws ds::Error unless micro_batches >= 1, stages >= 1 and 0 <= stage_id < stages.
Schedule train_schedule(int micro_batches, int stages, int stage_id);
Schedule inference_schedule(int micro_batches, int stages, int stage_id);

// A step's instructions, space separated ("RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)").
std::string step_text(const Step& step);

}  // namespace ds::pipe
