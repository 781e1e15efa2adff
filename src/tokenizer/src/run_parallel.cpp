#include "run_parallel.h"

#include <exception>
#include <vector>

#include "ds/core/log.h"

namespace ds::tokenizer::detail {

namespace {

std::thread start_std_thread(std::function<void()> body) { return std::thread(std::move(body)); }

}  // namespace

std::size_t run_parallel(std::size_t n, const std::function<void(std::size_t)>& task, const ThreadStarter& start) {
  const ThreadStarter& starter = start ? start : ThreadStarter(start_std_thread);
  std::vector<std::thread> pool;
  pool.reserve(n);  // no reallocation (which could throw) while a started thread is in hand
  std::size_t next = 0;  // the first task no thread has taken
  for (; next < n; ++next) {
    try {
      pool.push_back(starter([&task, next] { task(next); }));
    } catch (const std::exception& e) {  // std::system_error (EAGAIN), or bad_alloc under a memory limit
      DS_WARN("could not start thread " << next + 1 << " of " << n << " (" << e.what() << "): running the other "
                                        << n - next << " part(s) on " << pool.size() + 1 << " thread(s)");
      break;
    }
  }
  std::exception_ptr error;
  try {
    for (; next < n; ++next) task(next);
  } catch (...) {
    error = std::current_exception();
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  return pool.size();
}

}  // namespace ds::tokenizer::detail
