#include "ds/launch/core_list.h"

#include <charconv>

#include "ds/core/error.h"
#include "ds/launch/range_list.h"

namespace ds::launch {
namespace {

int parse_core(const std::string& text, std::string_view item, std::string_view s) {
  int v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  DS_CHECK(!s.empty() && ec == std::errc() && p == s.data() + s.size() && v >= 0 && v < 65536,
           "--bind_core_list '" << text << "': '" << item
                                << "' is not a core number or range (expected e.g. 0,2-4,6)");
  return v;
}

}  // namespace

std::vector<int> parse_core_list(const std::string& text) {
  DS_CHECK(!text.empty(), "--bind_core_list is empty (expected e.g. 0,2-4,6)");
  std::vector<int> out;
  for (const RangeItem& r : split_range_list(text)) {
    const std::string_view item = r.text;
    int lo = parse_core(text, item, r.lo);
    int hi = r.is_range ? parse_core(text, item, r.hi) : lo;
    DS_CHECK(lo <= hi, "--bind_core_list '" << text << "': range '" << item << "' runs backwards");
    DS_CHECK(out.empty() || lo > out.back(),
             "--bind_core_list '" << text << "': '" << item
                                  << "' overlaps or comes before the previous item (items must be "
                                     "ascending and disjoint)");
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  return out;
}

std::string format_core_list(const std::vector<int>& cores) {
  std::string out;
  for (std::size_t i = 0; i < cores.size();) {
    std::size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cores[i]);
    if (j > i) out += '-' + std::to_string(cores[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> cores_for_rank(const std::vector<int>& cores, int local_rank, int local_size) {
  DS_CHECK(local_size > 0 && local_rank >= 0 && local_rank < local_size,
           "internal: local rank " << local_rank << " of " << local_size);
  const std::size_t per = cores.size() / static_cast<std::size_t>(local_size);
  DS_CHECK(per >= 1, "core binding: " << cores.size() << " core(s) (" << format_core_list(cores)
                                      << ") for " << local_size
                                      << " local ranks; every rank needs at least one core");
  auto first = cores.begin() + static_cast<std::ptrdiff_t>(per * static_cast<std::size_t>(local_rank));
  return {first, first + static_cast<std::ptrdiff_t>(per)};
}

}  // namespace ds::launch
