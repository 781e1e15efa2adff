// "a-b,c" range lists: --bind_core_list ("0-3,8") and the bracket groups of Slurm host lists
// ("node[1-3,5]") are split by this one tokenizer; each caller reads the numbers (core ids,
// zero-padded host indices) and words its own errors.
#pragma once

#include <string_view>
#include <vector>

namespace ds::launch {

struct RangeItem {
  std::string_view text;  // the whole item: "2-4"
  std::string_view lo;    // "2"; the whole item when it has no '-'
  std::string_view hi;    // "4"; the same as lo when it has no '-'
  bool is_range = false;  // the item has a '-'
};

// Splits at every ',' (empty items are kept, so "1,,2" and "" show the caller an empty item
// to refuse) and each item at its first '-' ("1-2-3" gives lo "1", hi "2-3").
std::vector<RangeItem> split_range_list(std::string_view text);

}  // namespace ds::launch
