// The asynchronous checkpoint save of one Engine (checkpoint.async_save): the host snapshot
// it writes from, the save it belongs to and its writer thread. Engine::save_checkpoint
// starts it; the next save / load, or Engine::wait_for_checkpoint, joins and commits it.
#pragma once

#include <thread>

#include "ds/core/buffer.h"
#include "ds/io/checkpoint.h"

namespace ds::engine {

struct AsyncSave {
  HostBuffer snapshot;  // grown once to the size a save needs, then reused
  io::CheckpointContent content;
  io::PendingSave pending;
  io::LocalWriteResult result;
  std::thread worker;
  bool in_flight = false;
  AsyncSave() = default;
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  ~AsyncSave() {
    if (worker.joinable()) worker.join();  // never commit from a destructor (collective)
  }
};

}  // namespace ds::engine
