#include "ds/launch/range_list.h"

namespace ds::launch {

std::vector<RangeItem> split_range_list(std::string_view text) {
  std::vector<RangeItem> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    RangeItem r;
    r.text = text.substr(start, comma - start);
    const std::size_t dash = r.text.find('-');
    r.is_range = dash != std::string_view::npos;
    r.lo = r.text.substr(0, dash);
    r.hi = r.is_range ? r.text.substr(dash + 1) : r.text;
    out.push_back(r);
    start = comma + 1;
  }
  return out;
}

}  // namespace ds::launch
