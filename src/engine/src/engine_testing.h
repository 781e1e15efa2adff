// Switches and counters for the engine's tests, not for training (docs/dev/engine.md "The
// boundary step"). Process-wide; set the switches between engines.
#pragma once

#include <cstdint>

namespace ds::engine::testing {

// On: the host store's boundary outcome is applied the way a device store's is -- later, at
// the first point that depends on it (Engine::resolve_step) -- so the CPU tests run the lazy
// resolution the GPU path uses. Off (the default): applied inside step(), as it always was.
void defer_host_step_outcomes(bool on);
bool host_step_outcomes_deferred();

// On: a device store takes the synchronous boundary step even where it has the asynchronous
// one (the CUDA tests compare the two). Off by default.
void synchronous_device_steps(bool on);
bool device_steps_synchronous();

}  // namespace ds::engine::testing

namespace ds::engine {

// Host synchronisations the device stores made so far (cudaStreamSynchronize and the blocking
// statistics read-back), process-wide: the tests count them around Engine::step(). 0 in a
// build without CUDA (device_param_store.cpp).
std::uint64_t device_stream_syncs();

}  // namespace ds::engine
