// DeepSpeed's TrainSchedule (1F1B) and InferenceSchedule: tables for small shapes, worked out
// from the rules of DeepSpeed's runtime/pipe/schedule.py (the same text its schedule objects
// print), and invariants over many shapes: every micro-batch forwarded (and backwarded) once
// per stage, every send matched by the neighbour's receive in the same step, no buffer reused
// while its micro-batch is still in flight.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/pipe/schedule.h"

using ds::pipe::Instruction;
using ds::pipe::Op;
using ds::pipe::Schedule;
using Lines = std::vector<std::string>;

namespace {

Lines lines(const Schedule& s) {
  Lines out;
  for (const auto& step : s.steps) out.push_back(ds::pipe::step_text(step));
  return out;
}

const std::string kStep = "ReduceTiedGrads() ReduceGrads() OptimizerStep()";

}  // namespace

TEST(TrainSchedule, OneStageAlternatesForwardAndBackward) {
  EXPECT_EQ(lines(ds::pipe::train_schedule(1, 1, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)", "BackwardPass(buffer_id=0) " + kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(4, 1, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)", "BackwardPass(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)", "BackwardPass(buffer_id=1)",
                   "LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)", "BackwardPass(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)", "BackwardPass(buffer_id=1) " + kStep}));
}

TEST(TrainSchedule, TwoStages) {
  EXPECT_EQ(lines(ds::pipe::train_schedule(1, 2, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)", "SendActivation(buffer_id=0)", "",
                   "RecvGrad(buffer_id=0) BackwardPass(buffer_id=0) " + kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(1, 2, 1)),
            (Lines{"", "RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)",
                   "BackwardPass(buffer_id=0)", "SendGrad(buffer_id=0) " + kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(2, 2, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)", "SendActivation(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)",
                   "RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0)", "",
                   "RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) " + kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(2, 2, 1)),
            (Lines{"", "RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)",
                   "BackwardPass(buffer_id=0)",
                   "SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) "
                   "ForwardPass(buffer_id=1)",
                   "BackwardPass(buffer_id=1)", "SendGrad(buffer_id=1) " + kStep}));
}

TEST(TrainSchedule, FourStagesTwoMicroBatches) {
  EXPECT_EQ(lines(ds::pipe::train_schedule(2, 4, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)", "SendActivation(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)", "SendActivation(buffer_id=1)", "", "", "",
                   "RecvGrad(buffer_id=0) BackwardPass(buffer_id=0)", "",
                   "RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) " + kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(2, 4, 1)),
            (Lines{"", "RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)", "SendActivation(buffer_id=0)",
                   "RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)", "SendActivation(buffer_id=1)", "",
                   "RecvGrad(buffer_id=0) BackwardPass(buffer_id=0)", "SendGrad(buffer_id=0)",
                   "RecvGrad(buffer_id=1) BackwardPass(buffer_id=1)", "SendGrad(buffer_id=1) " + kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(2, 4, 2)),
            (Lines{"", "", "RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)", "SendActivation(buffer_id=0)",
                   "RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)",
                   "RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0)",
                   "SendGrad(buffer_id=0)", "RecvGrad(buffer_id=1) BackwardPass(buffer_id=1)", "SendGrad(buffer_id=1)",
                   kStep}));
  EXPECT_EQ(lines(ds::pipe::train_schedule(2, 4, 3)),
            (Lines{"", "", "", "RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)",
                   "BackwardPass(buffer_id=0)",
                   "SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) "
                   "ForwardPass(buffer_id=1)",
                   "BackwardPass(buffer_id=1)", "SendGrad(buffer_id=1)", "", kStep}));
}

// max(2, min(stages - stage_id, micro_batches)): the forward passes a stage holds for their backward.
TEST(TrainSchedule, PipeBuffers) {
  const std::map<int, std::vector<int>> by_micro_batches = {
      {1, {2, 2, 2, 2}}, {2, {2, 2, 2, 2}}, {4, {4, 3, 2, 2}}, {8, {4, 3, 2, 2}}};
  for (const auto& [m, want] : by_micro_batches)
    for (int stage = 0; stage < 4; ++stage)
      EXPECT_EQ(ds::pipe::train_schedule(m, 4, stage).num_pipe_buffers, want[stage]) << "m " << m << " stage " << stage;
  EXPECT_EQ(ds::pipe::train_schedule(8, 2, 0).num_pipe_buffers, 2);
  EXPECT_EQ(ds::pipe::train_schedule(8, 1, 0).num_pipe_buffers, 2);
}

TEST(InferenceSchedule, Tables) {
  EXPECT_EQ(lines(ds::pipe::inference_schedule(2, 1, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)"}));
  EXPECT_EQ(lines(ds::pipe::inference_schedule(2, 2, 0)),
            (Lines{"LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1)",
                   "SendActivation(buffer_id=1)"}));
  EXPECT_EQ(lines(ds::pipe::inference_schedule(2, 2, 1)),
            (Lines{"", "LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)",
                   "LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)"}));
  // A middle stage: odd stages receive before they send, even ones send first.
  EXPECT_EQ(lines(ds::pipe::inference_schedule(2, 4, 1)),
            (Lines{"", "RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)",
                   "RecvActivation(buffer_id=1) SendActivation(buffer_id=0) ForwardPass(buffer_id=1)",
                   "SendActivation(buffer_id=1)", ""}));
  EXPECT_EQ(lines(ds::pipe::inference_schedule(2, 4, 2)),
            (Lines{"", "", "RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)",
                   "SendActivation(buffer_id=0) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)",
                   "SendActivation(buffer_id=1)"}));
  EXPECT_EQ(ds::pipe::inference_schedule(8, 4, 0).num_pipe_buffers, 2);
}

TEST(PipeSchedule, RefusesBadShapes) {
  EXPECT_THROW(ds::pipe::train_schedule(0, 2, 0), ds::Error);
  EXPECT_THROW(ds::pipe::train_schedule(2, 2, 2), ds::Error);
  EXPECT_THROW(ds::pipe::inference_schedule(2, 0, 0), ds::Error);
  try {
    ds::pipe::train_schedule(4, 2, -1);
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.message(), "train schedule: stage_id -1 is outside stages 0..1");
  }
}

// ---------------------------------------------------------------------------------------
// Invariants over many shapes
// ---------------------------------------------------------------------------------------

namespace {

// Walks one stage's schedule: a buffer takes a new micro-batch only after the previous one has
// left the stage (its backward and its SendGrad when training; its forward and its
// SendActivation for inference), every buffer id is below num_pipe_buffers, and each
// micro-batch is loaded/received, forwarded and (training) backwarded exactly once.
void check_stage(const Schedule& s, int m, int stages, int stage, bool train) {
  SCOPED_TRACE("stages " + std::to_string(stages) + " micro_batches " + std::to_string(m) + " stage " +
               std::to_string(stage));
  const bool first = stage == 0, last = stage == stages - 1;
  std::map<int, int> owner;                // buffer -> micro-batch
  std::map<int, std::map<Op, int>> count;  // micro-batch -> op -> times
  auto done = [&](int mb) {
    const auto& c = count[mb];
    auto n = [&](Op op) { return c.count(op) ? c.at(op) : 0; };
    if (train) return n(Op::BackwardPass) == 1 && (first || n(Op::SendGrad) == 1);
    return n(Op::ForwardPass) == 1 && (last || n(Op::SendActivation) == 1);
  };
  for (const auto& step : s.steps) {
    for (const Instruction& in : step) {
      if (!ds::pipe::has_buffer(in.op)) continue;
      ASSERT_GE(in.buffer_id, 0);
      ASSERT_LT(in.buffer_id, s.num_pipe_buffers);
      auto it = owner.find(in.buffer_id);
      if (it == owner.end() || it->second != in.micro_batch) {
        if (it != owner.end()) {
          ASSERT_TRUE(done(it->second)) << "buffer " << in.buffer_id << " reused for micro-batch " << in.micro_batch
                                        << " while " << it->second << " is in flight";
        }
        owner[in.buffer_id] = in.micro_batch;
      }
      ++count[in.micro_batch][in.op];
    }
  }
  for (int mb = 0; mb < m; ++mb) {
    auto& c = count[mb];
    EXPECT_EQ(c[Op::ForwardPass], 1) << "micro-batch " << mb;
    EXPECT_EQ(c[Op::BackwardPass], train ? 1 : 0) << "micro-batch " << mb;
    EXPECT_EQ(c[Op::LoadMicroBatch], first || last ? 1 : 0) << "micro-batch " << mb;
    EXPECT_EQ(c[Op::RecvActivation], first ? 0 : 1) << "micro-batch " << mb;
    EXPECT_EQ(c[Op::SendActivation], last ? 0 : 1) << "micro-batch " << mb;
    EXPECT_EQ(c[Op::SendGrad], train && !first ? 1 : 0) << "micro-batch " << mb;
    EXPECT_EQ(c[Op::RecvGrad], train && !last ? 1 : 0) << "micro-batch " << mb;
  }
  EXPECT_EQ(count.size(), static_cast<size_t>(m));  // no instruction names a micro-batch outside 0..m-1
}

// The micro-batches an op moves in one step of one stage, in order.
std::vector<int> moved(const ds::pipe::Step& step, Op op) {
  std::vector<int> mbs;
  for (const Instruction& in : step)
    if (in.op == op) mbs.push_back(in.micro_batch);
  return mbs;
}

void check_pipe(int m, int stages, bool train) {
  std::vector<Schedule> all;
  for (int s = 0; s < stages; ++s) {
    all.push_back(train ? ds::pipe::train_schedule(m, stages, s) : ds::pipe::inference_schedule(m, stages, s));
    check_stage(all.back(), m, stages, s, train);
    ASSERT_EQ(all.back().steps.size(), all.front().steps.size());
  }
  for (size_t t = 0; t < all.front().steps.size(); ++t) {
    for (int s = 0; s + 1 < stages; ++s) {
      EXPECT_EQ(moved(all[s].steps[t], Op::SendActivation), moved(all[s + 1].steps[t], Op::RecvActivation))
          << "stages " << stages << " m " << m << " step " << t << " stage " << s << " -> " << s + 1;
      EXPECT_EQ(moved(all[s + 1].steps[t], Op::SendGrad), moved(all[s].steps[t], Op::RecvGrad))
          << "stages " << stages << " m " << m << " step " << t << " stage " << s + 1 << " -> " << s;
    }
  }
  if (train) {  // the step-level instructions close the last step of every stage, once
    for (const Schedule& s : all) {
      for (size_t t = 0; t < s.steps.size(); ++t)
        EXPECT_EQ(moved(s.steps[t], Op::OptimizerStep).size(), t + 1 == s.steps.size() ? 1u : 0u);
    }
  }
}

}  // namespace

TEST(PipeSchedule, InvariantsOverShapes) {
  for (int stages : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 8, 9})
      for (bool train : {true, false}) check_pipe(m, stages, train);
}
