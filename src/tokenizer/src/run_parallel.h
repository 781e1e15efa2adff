// Running independent tasks on threads when threads may not be available: a pids limit
// (ulimit -u, a container's pids.max) or an address-space limit makes std::thread throw
// std::system_error, and a thread that never started must not take the process down
// (std::terminate from an unjoined std::thread).
#pragma once

#include <cstddef>
#include <functional>
#include <thread>

namespace ds::tokenizer::detail {

// Starts a thread running `body` (std::thread by default; tests pass one that fails).
using ThreadStarter = std::function<std::thread(std::function<void()> body)>;

// Runs task(0) .. task(n - 1), each on a thread of its own as long as threads start. Once a
// start fails, the calling thread runs the remaining tasks itself (with a warning naming how
// many threads did start); every started thread is joined before returning, also when a task
// throws. Returns the number of threads started. Tasks must not share mutable state.
std::size_t run_parallel(std::size_t n, const std::function<void(std::size_t)>& task,
                         const ThreadStarter& start = {});

}  // namespace ds::tokenizer::detail
