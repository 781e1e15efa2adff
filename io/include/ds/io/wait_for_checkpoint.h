// Completion of an asynchronous checkpoint save (checkpoint.async_save = true).
//
// With async_save, Engine::save_checkpoint validates the tag with the other ranks, copies
// the state into a host snapshot buffer (allocated once, reused) and returns; a background
// thread writes this rank's files into the save's tmp directory. The collective commit (all
// ranks' results and checksums gathered, manifest, rename, `latest`) runs on the caller's
// thread at the next save_checkpoint / load_checkpoint, or here. Call it (on every rank)
// before the job ends, or the last async save stays uncommitted: its tmp directory is
// ignored and cleaned by the next save, and the previous checkpoint remains the latest.
//
// Defined in src/engine/src/engine_checkpoint.cpp (link ds_engine).
#pragma once

#include <string>

namespace ds {
class Engine;
namespace io {
// Collective. Waits for the background writer and commits; returns the committed
// checkpoint directory, or "" when no async save was pending.
std::string wait_for_checkpoint(Engine& engine);
}  // namespace io
}  // namespace ds
