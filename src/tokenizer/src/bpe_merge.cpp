#include "bpe_merge.h"

#include <queue>

namespace ds::tokenizer::detail {

bool MergeTable::add(std::int32_t left, std::int32_t right, std::int32_t merged, std::int32_t rank) {
  return map_.emplace(key(left, right), Merge{rank, merged}).second;
}

void MergeTable::apply(std::vector<std::int32_t>& ids) const {
  const std::size_t n = ids.size();
  if (n < 2) return;
  // Symbols in a linked list over the original positions; a candidate names its left
  // position and the ids it expects there, and is dropped when either side changed since.
  struct Cand {
    std::int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<std::int32_t> next(n), prev(n);
  std::vector<char> alive(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = std::int32_t(i) - 1;
    next[i] = i + 1 < n ? std::int32_t(i + 1) : -1;
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](std::int32_t p) {
    if (p < 0 || next[std::size_t(p)] < 0) return;
    const std::int32_t l = ids[std::size_t(p)], r = ids[std::size_t(next[std::size_t(p)])];
    if (const Merge* m = find(l, r)) heap.push(Cand{m->rank, p, l, r});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(std::int32_t(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const auto p = std::size_t(c.pos);
    if (!alive[p] || next[p] < 0 || ids[p] != c.left || ids[std::size_t(next[p])] != c.right) continue;
    const auto q = std::size_t(next[p]);
    ids[p] = find(c.left, c.right)->merged;
    alive[q] = 0;
    next[p] = next[q];
    if (next[q] >= 0) prev[std::size_t(next[q])] = std::int32_t(p);
    push(prev[p]);
    push(std::int32_t(p));
  }
  std::size_t w = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (alive[i]) ids[w++] = ids[i];
  ids.resize(w);
}

}  // namespace ds::tokenizer::detail
