// Slurm-style host lists and task counts (Slurm's hostlist syntax).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::launch {

// "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5 (order kept, duplicates kept,
// zero padding from the width of LO, earlier bracket groups expanded as a cartesian product).
// Throws ds::Error quoting the list and the offending token.
std::vector<std::string> expand_hostlist(std::string_view list);

// SLURM_TASKS_PER_NODE-style counts: "2(x3),1" -> {2, 2, 2, 1}. Throws ds::Error.
std::vector<int> parse_tasks_per_node(std::string_view counts);

}  // namespace ds::launch
