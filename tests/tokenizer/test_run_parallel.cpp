// run_parallel when threads cannot be started (a pids or memory limit): the tasks still all
// run, on the calling thread, and the started threads are joined (no std::terminate).
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "run_parallel.h"

namespace {

using ds::tokenizer::detail::run_parallel;
using ds::tokenizer::detail::ThreadStarter;

// Starts `allowed` threads, then fails as pthread_create does at a pids limit.
ThreadStarter failing_after(std::size_t allowed, std::atomic<std::size_t>& started) {
  return [allowed, &started](std::function<void()> body) {
    if (started >= allowed) throw std::system_error(EAGAIN, std::generic_category(), "thread start (test)");
    ++started;
    return std::thread(std::move(body));
  };
}

TEST(RunParallel, FailedStartsRunTheRestOnTheCaller) {
  for (std::size_t allowed : {0u, 2u, 8u}) {
    std::atomic<std::size_t> started{0};
    std::vector<int> done(8, 0);
    const std::thread::id caller = std::this_thread::get_id();
    std::vector<std::thread::id> ran_on(8);
    const std::size_t n = run_parallel(8, [&](std::size_t k) {
      ++done[k];
      ran_on[k] = std::this_thread::get_id();
    }, failing_after(allowed, started));
    EXPECT_EQ(n, allowed);
    EXPECT_EQ(done, std::vector<int>(8, 1)) << "allowed " << allowed;
    for (std::size_t k = 0; k < 8; ++k) EXPECT_EQ(ran_on[k] == caller, k >= allowed) << "task " << k;
  }
}

TEST(RunParallel, ACallerTaskErrorJoinsTheStartedThreads) {
  std::atomic<std::size_t> started{0};
  std::atomic<int> finished{0};
  EXPECT_THROW(run_parallel(4, [&](std::size_t k) {
    if (k == 3) throw std::runtime_error("task 3");
    std::this_thread::yield();
    ++finished;
  }, failing_after(2, started)), std::runtime_error);
  EXPECT_EQ(finished, 3);  // tasks 0, 1 (threads) and 2 (caller) all ran to the end
}

}  // namespace
