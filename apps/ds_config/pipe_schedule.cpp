#include "pipe_schedule.h"

#include "ds/core/error.h"
#include "ds/pipe/schedule.h"

namespace ds::tools {

std::string pipe_schedule_text(const PipeScheduleArgs& a) {
  DS_CHECK(a.stage_id < a.stages,
           "--stage_id " << a.stage_id << " is outside the " << a.stages << " stages (0.." << a.stages - 1 << ")");
  const int first = a.stage_id >= 0 ? a.stage_id : 0;
  const int last = a.stage_id >= 0 ? a.stage_id : a.stages - 1;
  std::string out;
  for (int stage = first; stage <= last; ++stage) {
    const pipe::Schedule s = a.eval ? pipe::inference_schedule(a.micro_batches, a.stages, stage)
                                    : pipe::train_schedule(a.micro_batches, a.stages, stage);
    out += "stage " + std::to_string(stage) + " (" + std::to_string(s.num_pipe_buffers) + " pipe buffers):\n";
    for (size_t t = 0; t < s.steps.size(); ++t) {
      const std::string text = pipe::step_text(s.steps[t]);
      out += "  step " + std::to_string(t) + ": " + (text.empty() ? "(idle)" : text) + "\n";
    }
  }
  return out;
}

}  // namespace ds::tools
