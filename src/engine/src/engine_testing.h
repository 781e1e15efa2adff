// Counters for the engine's tests, not for training (the switches are per engine:
// EngineTestSwitches in ds/engine/engine.h).
#pragma once

#include <cstdint>

namespace ds::engine {

// Host synchronisations the device stores made so far (cudaStreamSynchronize and the blocking
// statistics read-back), process-wide: the tests count them around Engine::step(). 0 in a
// build without CUDA (device_param_store.cpp).
std::uint64_t device_stream_syncs();

}  // namespace ds::engine
