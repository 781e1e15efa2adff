// --include / --exclude (DeepSpeed's runner.py with its PR #8239 semantics, see docs/user/launching.md).
#include "ds/launch/filter.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "ds/core/error.h"

namespace ds::launch {
namespace {

// Python int(): optional surrounding blanks and sign, decimal digits.
bool parse_int(std::string_view s, int& out) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  std::string t(s);
  if (t.empty()) return false;
  std::size_t i = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (i == t.size() || t.size() > 10) return false;
  for (std::size_t k = i; k < t.size(); ++k)
    if (t[k] < '0' || t[k] > '9') return false;
  out = static_cast<int>(std::strtol(t.c_str(), nullptr, 10));
  return true;
}

// Host names match without regard to case, as in the hostfile (which has no two hosts that
// differ only in case).
std::vector<int>* find(WorldInfo& w, const std::string& host) {
  for (auto& [h, s] : w)
    if (same_host(h, host)) return &s;
  return nullptr;
}
const std::vector<int>* find(const WorldInfo& w, const std::string& host) {
  for (const auto& [h, s] : w)
    if (same_host(h, host)) return &s;
  return nullptr;
}

}  // namespace

WorldInfo parse_node_filter(std::string_view filter, std::string_view flag) {
  WorldInfo out;
  std::size_t start = 0;
  while (start <= filter.size()) {
    std::size_t at = filter.find('@', start);
    if (at == std::string_view::npos) at = filter.size();
    std::string_view piece = filter.substr(start, at - start);
    start = at + 1;
    std::string host;
    std::vector<int> slots;
    std::size_t colon = piece.find(':');
    if (colon == std::string_view::npos) {
      host = std::string(piece);
    } else {
      DS_CHECK(piece.find(':', colon + 1) == std::string_view::npos,
               flag << " '" << filter << "': more than one ':' in '" << piece << "'");
      host = std::string(piece.substr(0, colon));
      std::string_view list = piece.substr(colon + 1);
      std::size_t s = 0;
      while (s <= list.size()) {
        std::size_t comma = list.find(',', s);
        if (comma == std::string_view::npos) comma = list.size();
        std::string_view item = list.substr(s, comma - s);
        int v = 0;
        DS_CHECK(parse_int(item, v), flag << " '" << filter << "': bad slot '" << item
                                          << "' for host '" << host << "' (integers only)");
        slots.push_back(v);
        s = comma + 1;
      }
    }
    if (auto* existing = find(out, host)) {
      existing->insert(existing->end(), slots.begin(), slots.end());
    } else {
      out.emplace_back(host, std::move(slots));
    }
  }
  for (auto& [h, s] : out) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  return out;
}

WorldInfo expand_pool(const Pool& pool) {
  WorldInfo w;
  for (const auto& hs : pool) {
    std::vector<int> s(static_cast<std::size_t>(hs.slots));
    for (int i = 0; i < hs.slots; ++i) s[static_cast<std::size_t>(i)] = i;
    w.emplace_back(hs.host, std::move(s));
  }
  return w;
}

WorldInfo apply_filters(const Pool& pool, std::string_view include, std::string_view exclude) {
  DS_CHECK(include.empty() || exclude.empty(),
           "--include and --exclude are mutually exclusive");
  const WorldInfo full = expand_pool(pool);
  if (include.empty() && exclude.empty()) return full;

  const bool inc = !include.empty();
  const std::string_view flag = inc ? "--include" : "--exclude";
  const WorldInfo filter = parse_node_filter(inc ? include : exclude, flag);

  WorldInfo picked = inc ? WorldInfo{} : full;
  for (const auto& entry : filter) {
    const std::string& host = entry.first;
    const std::vector<int>& slots = entry.second;
    const std::vector<int>* have = find(full, host);
    DS_CHECK(have != nullptr, flag << ": host '" << host << "' not found in the hostfile");
    for (int s : slots) {
      DS_CHECK(std::find(have->begin(), have->end(), s) != have->end(),
               flag << ": no slot " << s << " on host '" << host << "' (it has slots 0.."
                    << static_cast<int>(have->size()) - 1 << ")");
    }
    if (inc) {
      picked.emplace_back(host, slots.empty() ? *have : slots);  // post-pass: hostfile's spelling
    } else {
      std::vector<int>& mine = *find(picked, host);
      if (slots.empty()) {
        mine.clear();
      } else {
        std::erase_if(mine, [&](int v) {
          return std::find(slots.begin(), slots.end(), v) != slots.end();
        });
      }
    }
  }
  // Post-pass: pool order, no empty hosts.
  WorldInfo out;
  for (const auto& [host, all] : full) {
    const std::vector<int>* s = find(picked, host);
    if (s != nullptr && !s->empty()) out.emplace_back(host, *s);
  }
  DS_CHECK(!out.empty(), flag << " '" << (inc ? include : exclude)
                              << "' leaves no resources to run on");
  return out;
}

}  // namespace ds::launch
