// `ds_config pipe-schedule`: the text of DeepSpeed's pipeline schedules, stage by stage.
#pragma once

#include <string>

namespace ds::tools {

struct PipeScheduleArgs {
  int stages = 1;
  int micro_batches = 1;
  int stage_id = -1;  // -1: every stage
  bool eval = false;  // InferenceSchedule instead of TrainSchedule
};

// One header line per stage, "stage K (N pipe buffers):", then one line per step,
// "  step T: <instructions>" ("(idle)" for a step without any), instructions as DeepSpeed
// prints them ("RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)"). Throws ds::Error for
// values the schedules refuse.
std::string pipe_schedule_text(const PipeScheduleArgs& a);

}  // namespace ds::tools
