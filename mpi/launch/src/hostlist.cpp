// Slurm hostlist expansion and task-count parsing (Slurm's hostlist syntax).
#include "ds/launch/hostlist.h"

#include <cstddef>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/launch/range_list.h"

namespace ds::launch {
namespace {

// Upper bound on hosts in one list (and on one range): far above any real cluster, low
// enough that a hostile list cannot exhaust memory.
constexpr std::size_t kMaxHosts = 100000;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Parses an unsigned decimal that fits comfortably in long long; false otherwise.
bool parse_uint(std::string_view s, long long& out) {
  if (s.empty() || s.size() > 18) return false;
  long long v = 0;
  for (char c : s) {
    if (!is_digit(c)) return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

std::string pad(long long v, std::size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// "01-03,07" -> {"01","02","03","07"}. The padding width is the digit count of LO.
std::vector<std::string> expand_range_list(std::string_view body, std::string_view list,
                                           std::string_view token) {
  DS_CHECK(!body.empty(), "hostlist '" << list << "': empty range list '[]' in '" << token << "'");
  std::vector<std::string> out;
  for (const RangeItem& r : split_range_list(body)) {
    const std::string_view item = r.text;
    long long lo = 0, hi = 0;
    DS_CHECK(parse_uint(r.lo, lo) && parse_uint(r.hi, hi),
             "hostlist '" << list << "': bad range '" << item << "' in '" << token
                          << "' (expected N or LO-HI with decimal digits)");
    DS_CHECK(lo <= hi, "hostlist '" << list << "': descending range '" << item << "' in '"
                                    << token << "'");
    DS_CHECK(hi - lo < static_cast<long long>(kMaxHosts) &&
                 out.size() + static_cast<std::size_t>(hi - lo) < kMaxHosts,
             "hostlist '" << list << "': range '" << item << "' in '" << token
                          << "' is too large (more than " << kMaxHosts << " hosts)");
    for (long long v = lo; v <= hi; ++v) out.push_back(pad(v, r.lo.size()));
  }
  return out;
}

// Expands one top-level token (may hold several bracket groups, the last one ending it).
std::vector<std::string> expand_token(std::string_view token, std::string_view list) {
  std::vector<std::string> acc{std::string()};
  std::size_t pos = 0;
  while (pos < token.size()) {
    std::size_t open = token.find('[', pos);
    std::size_t close_stray = token.find(']', pos);
    if (open == std::string_view::npos) {
      DS_CHECK(close_stray == std::string_view::npos,
               "hostlist '" << list << "': unmatched ']' in '" << token << "'");
      for (auto& a : acc) a.append(token.substr(pos));
      break;
    }
    DS_CHECK(close_stray == std::string_view::npos || close_stray > open,
             "hostlist '" << list << "': unmatched ']' in '" << token << "'");
    std::size_t close = token.find(']', open);
    DS_CHECK(close != std::string_view::npos,
             "hostlist '" << list << "': unterminated '[' in '" << token << "'");
    std::string_view body = token.substr(open + 1, close - open - 1);
    DS_CHECK(body.find('[') == std::string_view::npos,
             "hostlist '" << list << "': nested '[' in '" << token << "'");
    std::string_view prefix = token.substr(pos, open - pos);
    std::vector<std::string> values = expand_range_list(body, list, token);
    bool last = token.find('[', close) == std::string_view::npos;
    if (last) {
      DS_CHECK(close + 1 == token.size(), "hostlist '" << list << "': text after the final ']' in '"
                                                       << token << "'");
    }
    DS_CHECK(acc.size() * values.size() <= kMaxHosts,
             "hostlist '" << list << "': '" << token << "' expands to more than " << kMaxHosts
                          << " hosts");
    std::vector<std::string> next;
    next.reserve(acc.size() * values.size());
    for (const auto& a : acc) {
      for (const auto& v : values) {
        std::string s = a;
        s.append(prefix);
        s.append(v);
        next.push_back(std::move(s));
      }
    }
    acc = std::move(next);
    pos = close + 1;
  }
  return acc;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> hosts;
  std::size_t i = 0;
  while (i < list.size()) {
    // Split at ',', ' ' or '\t' outside brackets.
    std::size_t j = i;
    int depth = 0;
    while (j < list.size()) {
      char c = list[j];
      if (c == '[') ++depth;
      if (c == ']' && depth > 0) --depth;
      if (depth == 0 && (c == ',' || c == ' ' || c == '\t')) break;
      ++j;
    }
    std::string_view token = list.substr(i, j - i);
    if (!token.empty()) {
      for (auto& h : expand_token(token, list)) hosts.push_back(std::move(h));
      DS_CHECK(hosts.size() <= kMaxHosts,
               "hostlist '" << list << "' expands to more than " << kMaxHosts << " hosts");
    }
    i = j + 1;
  }
  return hosts;
}

std::vector<int> parse_tasks_per_node(std::string_view counts) {
  std::vector<int> out;
  DS_CHECK(!counts.empty(), "task count list is empty");
  std::size_t start = 0;
  while (start <= counts.size()) {
    std::size_t comma = counts.find(',', start);
    if (comma == std::string_view::npos) comma = counts.size();
    std::string_view item = counts.substr(start, comma - start);
    long long count = 0, repeat = 1;
    std::size_t paren = item.find('(');
    bool ok;
    if (paren == std::string_view::npos) {
      ok = parse_uint(item, count);
    } else {
      ok = parse_uint(item.substr(0, paren), count) && item.size() > paren + 3 &&
           item[paren + 1] == 'x' && item.back() == ')' &&
           parse_uint(item.substr(paren + 2, item.size() - paren - 3), repeat) && repeat > 0;
    }
    DS_CHECK(ok && count <= 1000000, "task count list '" << counts << "': bad item '" << item
                                                          << "' (expected C or C(xR), e.g. 2(x3),1)");
    DS_CHECK(out.size() + static_cast<std::size_t>(repeat) <= kMaxHosts,
             "task count list '" << counts << "' names more than " << kMaxHosts << " nodes");
    for (long long r = 0; r < repeat; ++r) out.push_back(static_cast<int>(count));
    start = comma + 1;
  }
  return out;
}

}  // namespace ds::launch
