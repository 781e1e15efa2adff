// ZeRO-3 on a device: the deferred-release queue's rules (src/engine/src/deferred_release.h)
// with fake events, so they run anywhere. A fake event completes when the test says the
// "stream" got that far; every release checks that its event had completed -- as unmapping
// chunks a queued kernel still reads would fault on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "deferred_release.h"
#include "ds/core/error.h"

namespace {

using ds::engine::DeferredReleases;
using ds::engine::ReleaseEvents;

// A stream whose work completes in order: events 1, 2, ... are recorded in order and
// `completed` says up to which one the stream has run.
struct FakeStream final : ReleaseEvents {
  std::uint64_t recorded = 0, completed = 0;
  std::set<std::uint64_t> live;  // recorded, not dropped
  int waits = 0;
  std::uint64_t record() override {
    live.insert(++recorded);
    return recorded;
  }
  bool done(std::uint64_t e) override { return e <= completed; }
  void wait(std::uint64_t e) override {
    ++waits;
    completed = std::max(completed, e);
  }
  void drop(std::uint64_t e) noexcept override { live.erase(e); }
};

struct Released {
  std::size_t begin, end;
  std::uint64_t stream_at;  // how far the stream had run when it was released
};

struct Fixture {
  FakeStream s;
  std::vector<Released> released;
  // The event of each range, to check the rule at the release.
  std::vector<std::pair<std::size_t, std::uint64_t>> event_of;  // begin -> event
  DeferredReleases q{s, [this](std::size_t b, std::size_t e) {
                       for (const auto& [begin, ev] : event_of)
                         if (begin == b) {
                           EXPECT_LE(ev, s.completed) << "range " << b << " released before its event";
                         }
                       released.push_back({b, e, s.completed});
                     }};
  void defer(std::size_t key, std::size_t b, std::size_t e) {
    q.defer(key, b, e);
    event_of.emplace_back(b, s.recorded);
  }
};

TEST(DeferredRelease, NothingBeforeItsEvent) {
  Fixture f;
  f.defer(0, 0, 100);
  f.defer(1, 100, 300);
  f.defer(2, 300, 400);
  EXPECT_EQ(f.q.queued_bytes(), 400u);
  f.q.poll();
  EXPECT_TRUE(f.released.empty());
  f.s.completed = 1;  // the stream ran the kernels before the first release
  f.q.poll();
  ASSERT_EQ(f.released.size(), 1u);
  EXPECT_EQ(f.released[0].begin, 0u);
  EXPECT_EQ(f.released[0].end, 100u);
  EXPECT_EQ(f.q.queued_bytes(), 300u);
  f.s.completed = 3;
  f.q.poll();
  ASSERT_EQ(f.released.size(), 3u);
  EXPECT_EQ(f.released[1].begin, 100u);
  EXPECT_EQ(f.released[2].begin, 300u);
  EXPECT_EQ(f.q.size(), 0u);
  EXPECT_EQ(f.q.queued_bytes(), 0u);
  EXPECT_EQ(f.s.waits, 0) << "poll must never block the host";
  EXPECT_TRUE(f.s.live.empty()) << "every event is dropped once its range is released";
}

TEST(DeferredRelease, ReacquireCancels) {
  Fixture f;
  f.defer(7, 0, 64);
  f.defer(8, 64, 128);
  EXPECT_TRUE(f.q.queued(7));
  EXPECT_TRUE(f.q.cancel(7));  // acquired again before the stream got there: stays mapped
  EXPECT_FALSE(f.q.queued(7));
  EXPECT_FALSE(f.q.cancel(7));  // nothing queued any more
  EXPECT_FALSE(f.q.cancel(9));  // never queued
  EXPECT_EQ(f.q.queued_bytes(), 64u);
  f.s.completed = 2;
  f.q.poll();
  ASSERT_EQ(f.released.size(), 1u) << "a cancelled release must not unmap the group used again";
  EXPECT_EQ(f.released[0].begin, 64u);
  // Released again after that use: queued again, with a new event.
  f.defer(7, 0, 64);
  f.q.poll();
  EXPECT_EQ(f.released.size(), 1u);
  f.s.completed = 3;
  f.q.poll();
  ASSERT_EQ(f.released.size(), 2u);
  EXPECT_EQ(f.released[1].begin, 0u);
  EXPECT_TRUE(f.s.live.empty());
}

TEST(DeferredRelease, DoubleDeferIsRefused) {
  Fixture f;
  f.defer(3, 0, 10);
  EXPECT_THROW(f.q.defer(3, 0, 10), ds::Error);
}

TEST(DeferredRelease, MakeRoomWaitsForTheOldestOnly) {
  Fixture f;
  f.defer(0, 0, 100);
  f.defer(1, 100, 200);
  f.defer(2, 200, 300);
  f.q.make_room(150);  // 300 queued: the two oldest must go, the newest may stay
  ASSERT_EQ(f.released.size(), 2u);
  EXPECT_EQ(f.released[0].begin, 0u);
  EXPECT_EQ(f.released[1].begin, 100u);
  EXPECT_EQ(f.s.waits, 2);
  EXPECT_EQ(f.q.queued_bytes(), 100u);
  EXPECT_TRUE(f.q.queued(2));
  f.q.make_room(100);  // within the limit: no wait
  EXPECT_EQ(f.s.waits, 2);
  f.q.flush();
  ASSERT_EQ(f.released.size(), 3u);
  EXPECT_EQ(f.q.size(), 0u);
  EXPECT_TRUE(f.s.live.empty());
}

TEST(DeferredRelease, MakeRoomTakesWhatIsDoneWithoutWaiting) {
  Fixture f;
  f.defer(0, 0, 100);
  f.defer(1, 100, 200);
  f.s.completed = 2;
  f.q.make_room(0);
  EXPECT_EQ(f.released.size(), 2u);
  EXPECT_EQ(f.s.waits, 0);
}

TEST(DeferredRelease, DestructionDropsEventsWithoutReleasing) {
  FakeStream s;
  int releases = 0;
  {
    DeferredReleases q(s, [&](std::size_t, std::size_t) { ++releases; });
    q.defer(0, 0, 10);
    q.defer(1, 10, 20);
  }
  EXPECT_EQ(releases, 0);
  EXPECT_TRUE(s.live.empty());
}

// A random sequence of uses as the fetcher makes them (acquire = cancel, release = defer, the
// stream advancing at random, polls and limits): no range is released before its event, a
// range used again is never released by its old entry, and the queue's byte count is exact.
TEST(DeferredRelease, RandomUsesKeepTheRule) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    Fixture f;
    constexpr std::size_t kGroups = 6, kBytes = 1000;
    std::vector<bool> in_use(kGroups, false), mapped(kGroups, false);
    std::vector<std::uint64_t> last_use_event(kGroups, 0);
    DeferredReleases q(f.s, [&](std::size_t b, std::size_t) {
      const std::size_t g = b / kBytes;
      EXPECT_FALSE(in_use[g]) << "seed " << seed << ": group " << g << " released while in use";
      EXPECT_LE(last_use_event[g], f.s.completed) << "seed " << seed << ": group " << g << " released early";
      mapped[g] = false;
    });
    for (int step = 0; step < 400; ++step) {
      const std::size_t g = rng() % kGroups;
      switch (rng() % 5) {
        case 0:
        case 1:  // acquire / release
          if (!in_use[g]) {
            q.cancel(g);
            in_use[g] = mapped[g] = true;
          } else {
            in_use[g] = false;
            q.defer(g, g * kBytes, (g + 1) * kBytes);
            last_use_event[g] = f.s.recorded;
          }
          break;
        case 2:
          f.s.completed = std::min(f.s.recorded, f.s.completed + rng() % 3);
          break;
        case 3:
          q.poll();
          break;
        default:
          q.make_room((rng() % 4) * kBytes);
      }
      std::size_t expect = 0;
      for (std::size_t k = 0; k < kGroups; ++k)
        if (q.queued(k)) expect += kBytes;
      ASSERT_EQ(q.queued_bytes(), expect);
      for (std::size_t k = 0; k < kGroups; ++k)
        if (in_use[k]) {
          ASSERT_TRUE(mapped[k]) << "seed " << seed << ": group " << k << " unmapped while in use";
        }
    }
    q.flush();
    for (std::size_t k = 0; k < kGroups; ++k) EXPECT_EQ(mapped[k], in_use[k]);
  }
}

}  // namespace
