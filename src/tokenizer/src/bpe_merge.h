// The BPE merge loop: a piece's tokens (one per byte at first) are merged pair by pair, the
// pair with the lowest merge rank first and the leftmost among equal ranks, until no adjacent
// pair has a merge. This is Hugging Face's BPE order; for merge lists where a merge's result
// only takes part in later merges (all trained ones) it equals GPT-2's bpe().
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ds::tokenizer::detail {

class MergeTable {
 public:
  // Adds merge (left, right) -> merged at `rank`; false when the pair already has a merge
  // (the earlier, lower rank one stays).
  bool add(std::int32_t left, std::int32_t right, std::int32_t merged, std::int32_t rank);
  std::size_t size() const { return map_.size(); }

  // Merges `ids` in place.
  void apply(std::vector<std::int32_t>& ids) const;

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };
  static std::uint64_t key(std::int32_t l, std::int32_t r) {
    return (std::uint64_t(std::uint32_t(l)) << 32) | std::uint32_t(r);
  }
  const Merge* find(std::int32_t l, std::int32_t r) const {
    const auto it = map_.find(key(l, r));
    return it == map_.end() ? nullptr : &it->second;
  }
  std::unordered_map<std::uint64_t, Merge> map_;
};

}  // namespace ds::tokenizer::detail
