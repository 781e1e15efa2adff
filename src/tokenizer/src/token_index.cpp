#include "token_index.h"

#include <functional>

namespace ds::tokenizer::detail {

namespace {

// Slots for `count` tokens at most 3/4 full: a power of two, at least 16.
std::size_t slots_for(std::size_t count) {
  std::size_t n = 16;
  while (n / 4 * 3 < count) n *= 2;
  return n;
}

}  // namespace

std::uint32_t TokenIndex::hash_of(std::string_view token) {
  return std::uint32_t(std::hash<std::string_view>{}(token));
}

std::size_t TokenIndex::probe(std::string_view token, std::uint32_t hash, const std::vector<std::string>& by_id) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id < 0 || (s.hash == hash && by_id[std::size_t(s.id)] == token)) return i;
  }
}

void TokenIndex::rehash(std::size_t slot_count) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(slot_count, Slot{});
  const std::size_t mask = slot_count - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    std::size_t i = s.hash & mask;
    while (slots_[i].id >= 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void TokenIndex::reserve(std::size_t count) {
  if (slots_for(count) > slots_.size()) rehash(slots_for(count));
}

bool TokenIndex::insert(std::int32_t id, const std::vector<std::string>& by_id) {
  if (size_ + 1 > slots_.size() / 4 * 3) rehash(slots_for(size_ + 1));
  const std::string& token = by_id[std::size_t(id)];
  const std::uint32_t hash = hash_of(token);
  Slot& s = slots_[probe(token, hash, by_id)];
  if (s.id >= 0) return false;
  s = Slot{id, hash};
  ++size_;
  return true;
}

std::optional<std::int32_t> TokenIndex::find(std::string_view token, const std::vector<std::string>& by_id) const {
  if (slots_.empty()) return std::nullopt;
  const Slot& s = slots_[probe(token, hash_of(token), by_id)];
  if (s.id < 0) return std::nullopt;
  return s.id;
}

}  // namespace ds::tokenizer::detail
