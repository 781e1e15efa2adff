// --bind_core_list / --bind_cores_to_rank: DeepSpeed's core-list grammar and the share of cores
// each local rank gets.
#pragma once

#include <string>
#include <vector>

namespace ds::launch {

// "0,2-4,6" -> {0,2,3,4,6}. Items are N or A-B (inclusive, A <= B), strictly ascending and
// non-overlapping, no spaces (DeepSpeed's parse_range_list). Throws naming the bad item.
std::vector<int> parse_core_list(const std::string& text);

// The inverse, compressed: {0,2,3,4,6} -> "0,2-4,6".
std::string format_core_list(const std::vector<int>& cores);

// Local rank `local_rank` of `local_size` gets the contiguous block
// cores[k*n .. (k+1)*n) with n = cores.size() / local_size (as DeepSpeed; leftovers unused).
// Throws when there are fewer cores than local ranks.
std::vector<int> cores_for_rank(const std::vector<int>& cores, int local_rank, int local_size);

}  // namespace ds::launch
