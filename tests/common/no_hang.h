// error_without_hang(fifo, f): runs f, which is expected to refuse the FIFO at `fifo` at once,
// on its own thread and returns the text of the exception it throws ("(no error)" when it
// returns). When f has not returned after `seconds` (a reader blocked in open() or read() on
// the FIFO), a writer opens and closes the FIFO so the reader sees end of file, and the result
// starts with "(hung)": the test fails instead of hanging until the ctest timeout.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <thread>

inline std::string error_without_hang(const std::string& fifo, const std::function<void()>& f, int seconds = 10) {
  auto result = std::async(std::launch::async, [&f]() -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(no error)";
  });
  if (result.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready) return result.get();
  // Release the reader: each open-for-write lets a blocked open() return; the close gives EOF.
  while (result.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
  }
  return "(hung) " + result.get();
}
