// A switch for the engine's tests, not for training: with it on, the host store's boundary
// outcome is applied the way a device store's is -- later, at the first point that depends on
// it (Engine::resolve_step, docs/dev/engine.md "The boundary step") -- so the CPU tests run
// the lazy resolution the GPU path uses. Off (the default), the host store's outcome is
// applied inside step(), as it always was. Process-wide; set it between engines.
#pragma once

namespace ds::engine::testing {

void defer_host_step_outcomes(bool on);
bool host_step_outcomes_deferred();

}  // namespace ds::engine::testing
