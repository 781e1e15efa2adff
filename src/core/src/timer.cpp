#include "ds/core/timer.h"

namespace ds {

void Timers::start(const std::string& name) {
  Entry& e = entries_[name];
  e.sw.reset();
  e.running = true;
}

void Timers::stop(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.running) return;
  it->second.total_ms += it->second.sw.elapsed_ms();
  it->second.count += 1;
  it->second.running = false;
}

double Timers::total_ms(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? 0.0 : it->second.total_ms;
}

double Timers::mean_ms(const std::string& name) const {
  auto it = entries_.find(name);
  return (it == entries_.end() || it->second.count == 0) ? 0.0 : it->second.total_ms / it->second.count;
}

int Timers::count(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? 0 : it->second.count;
}

void Timers::reset() { entries_.clear(); }

}  // namespace ds
