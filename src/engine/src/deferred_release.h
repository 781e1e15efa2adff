// DeferredReleases: ZeRO-3 on a CUDA device gives a group's flat-space chunks back only once
// the device work that uses them has run (docs/dev/gpu.md "ZeRO-3 on the device").
//
// The module calls GroupHooks::release(g) when it has ENQUEUED its kernels reading group g,
// not when they ran; unmapping the chunks then would fault the kernels still queued. So the
// device store records an event on the compute stream at the release and queues (group,
// byte range, event); the range is released only once its event has completed:
// - poll(): releases, oldest first, every queued range whose event is done (a query, never a
//   wait: events recorded on one stream complete in the order they were recorded, so the
//   first one not done stops the scan);
// - make_room(limit): waits for the oldest events until at most `limit` bytes stay queued
//   (stage3_max_live_parameters bounds what is mapped, queued releases included);
// - flush(): waits for every event and releases everything (zero_grads, destruction);
// - cancel(g): group g is acquired again while its release is queued: it leaves the queue,
//   its chunks stay mapped and are never released by this entry.
// Host-only code: the events are behind ReleaseEvents (CUDA events in the device store, fakes
// in the CPU test tests/engine/deferred_release_test.cpp), the release behind a callback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <utility>

#include "ds/core/error.h"

namespace ds::engine {

// Events on the stream the released memory is used on.
class ReleaseEvents {
 public:
  virtual ~ReleaseEvents() = default;
  virtual std::uint64_t record() = 0;             // an event behind everything enqueued so far
  virtual bool done(std::uint64_t event) = 0;     // has it completed? (does not block)
  virtual void wait(std::uint64_t event) = 0;     // blocks until it has completed
  virtual void drop(std::uint64_t event) noexcept = 0;  // the event is not needed any more
};

class DeferredReleases {
 public:
  using Release = std::function<void(std::size_t begin, std::size_t end)>;  // bytes

  DeferredReleases(ReleaseEvents& events, Release release) : events_(events), release_(std::move(release)) {}
  ~DeferredReleases() {  // drops the events; the store flushes first (the ranges stay mapped)
    for (const Entry& e : queue_) events_.drop(e.event);
  }
  DeferredReleases(const DeferredReleases&) = delete;
  DeferredReleases& operator=(const DeferredReleases&) = delete;

  // Group `key`'s byte range [begin, end) is not used by work enqueued from now on.
  void defer(std::size_t key, std::size_t begin, std::size_t end) {
    DS_CHECK(!queued(key), "deferred release: group " << key << " is queued twice (released without an acquire)");
    const std::uint64_t ev = events_.record();
    queue_.push_back(Entry{key, begin, end, ev});
    bytes_ += end - begin;
  }

  // Group `key` is used again: its queued release (if any) is dropped. True when there was one,
  // i.e. its range is still mapped and holds what it held at the release.
  bool cancel(std::size_t key) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->key != key) continue;
      events_.drop(it->event);
      bytes_ -= it->end - it->begin;
      queue_.erase(it);
      return true;
    }
    return false;
  }

  void poll() {
    while (!queue_.empty() && events_.done(queue_.front().event)) release_front();
  }

  void make_room(std::size_t limit) {
    poll();
    while (!queue_.empty() && bytes_ > limit) {
      events_.wait(queue_.front().event);
      release_front();
    }
  }

  void flush() { make_room(0); }

  bool queued(std::size_t key) const {
    for (const Entry& e : queue_)
      if (e.key == key) return true;
    return false;
  }
  std::size_t size() const { return queue_.size(); }
  std::size_t queued_bytes() const { return bytes_; }

 private:
  struct Entry {
    std::size_t key, begin, end;
    std::uint64_t event;
  };

  void release_front() {
    const Entry e = queue_.front();
    queue_.pop_front();  // first: a release that throws leaves no entry behind to retry
    bytes_ -= e.end - e.begin;
    events_.drop(e.event);
    release_(e.begin, e.end);
  }

  ReleaseEvents& events_;
  Release release_;
  std::deque<Entry> queue_;
  std::size_t bytes_ = 0;
};

}  // namespace ds::engine
