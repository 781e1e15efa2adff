// Waiting on the same node for another thread or process to publish something: pause-spin
// a while (the wait is usually short), then yield the CPU, because with more threads or
// ranks than cores the one being waited for may need this very CPU.
#pragma once

#include <thread>

namespace ds {

// Returns once done() is true: up to `spins` pause-spins, then a yield between looks.
template <class Done>
void spin_then_yield(Done&& done, int spins) {
  for (int spin = 0; !done();) {
    if (spin < spins) {
      ++spin;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace ds
