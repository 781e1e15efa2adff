// The ordinary tokens' ids by their bytes, for merges and lookups while loading and for
// ignore_merges while encoding. An open-addressing table of ids whose keys are read from the
// tokenizer's id -> bytes table, so a token's bytes are stored once: 8 bytes a slot, at most
// 3/4 full (a 3-million-token vocabulary: 32 MiB, where an unordered_map<string, id> took
// ~220 MiB beside the id table).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds::tokenizer::detail {

class TokenIndex {
 public:
  // Makes room for `count` tokens without growing.
  void reserve(std::size_t count);
  // Adds `id`, whose bytes are by_id[id]; false (nothing added) when those bytes have an id.
  bool insert(std::int32_t id, const std::vector<std::string>& by_id);
  std::optional<std::int32_t> find(std::string_view token, const std::vector<std::string>& by_id) const;
  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::int32_t id = -1;  // -1: empty
    std::uint32_t hash = 0;
  };
  static std::uint32_t hash_of(std::string_view token);
  // The slot holding `token`, or the empty slot where it would go.
  std::size_t probe(std::string_view token, std::uint32_t hash, const std::vector<std::string>& by_id) const;
  void rehash(std::size_t slot_count);

  std::vector<Slot> slots_;  // a power of two of them
  std::size_t size_ = 0;
};

}  // namespace ds::tokenizer::detail
