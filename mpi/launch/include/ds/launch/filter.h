// --include / --exclude node filters and their resolution against the pool
// (DeepSpeed's launcher/runner.py with its PR #8239 semantics).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds/launch/hostfile.h"

namespace ds::launch {

// Ordered host -> slot list. The resolved form of a job ("world_info").
using WorldInfo = std::vector<std::pair<std::string, std::vector<int>>>;

// "worker-2:0@worker-3:0,1" -> {worker-2:[0], worker-3:[0,1]}; same host pieces merged,
// slot lists de-duplicated and sorted; a bare host has an empty list (= whole host).
// `flag` ("--include") names the option in errors.
WorldInfo parse_node_filter(std::string_view filter, std::string_view flag);

// Expands the pool to host -> [0..slots-1] in pool order.
WorldInfo expand_pool(const Pool& pool);

// Applies include or exclude (mutually exclusive; both empty = the pool unchanged, keeping
// 0-slot hosts). Unknown host and unknown slot are errors; the result keeps pool order,
// drops hosts left empty, and is never empty (error "no resources left").
WorldInfo apply_filters(const Pool& pool, std::string_view include, std::string_view exclude);

}  // namespace ds::launch
