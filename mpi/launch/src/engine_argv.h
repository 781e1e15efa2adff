// The argv builders of the back-end table (backend.h), one per engine family.
#pragma once

#include "ds/launch/backend.h"

namespace ds::launch::engine_argv {

void openmpi(const EngineJob& job, Command& cmd);
void mpich(const EngineJob& job, Command& cmd);
void impi(const EngineJob& job, Command& cmd);
void mvapich(const EngineJob& job, Command& cmd);
void slurm(const EngineJob& job, Command& cmd);

}  // namespace ds::launch::engine_argv
