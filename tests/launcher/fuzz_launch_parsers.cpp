// libFuzzer target for the launcher's text parsers: hostfile, .deepspeed_env, --include /
// --exclude filters, Slurm host lists and task counts, --launcher_args splitting.
// The first input byte picks the parser; the rest is its text. Besides "no crash, no UB,
// only ds::Error", each accepted input is checked against the parser's contract.
// Built only with -DDS_FUZZ=ON and clang (scripts/fuzz_launcher.sh runs it).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "ds/core/error.h"
#include "ds/launch/env_file.h"
#include "ds/launch/filter.h"
#include "ds/launch/hostfile.h"
#include "ds/launch/hostlist.h"
#include "ds/launch/shell.h"
#include "ds/launch/world_info.h"

using namespace ds::launch;

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_hostfile(std::string_view text) {
  Pool pool = parse_hostfile(text, "fuzz");
  check(!pool.empty());
  std::set<std::string> seen;
  for (const auto& hs : pool) {
    check(valid_host_name(hs.host));
    check(hs.slots >= 0);
    check(seen.insert(hs.host).second);
  }
  // Round trip through world_info JSON.
  WorldInfo w = expand_pool(pool);
  check(world_info_json(parse_world_info_json(world_info_json(w))) == world_info_json(w));
  check(base64_urlsafe_decode(base64_urlsafe_encode(world_info_json(w))) == world_info_json(w));
}

void fuzz_env(std::string_view text) {
  EnvList env = parse_env_file(text, "fuzz");
  std::set<std::string> keys;
  for (const auto& [k, v] : env) {
    check(!k.empty() && keys.insert(k).second);
    check(v.find('\0') == std::string::npos && v.find('\n') == std::string::npos);
  }
}

void fuzz_filter(std::string_view text) {
  const Pool pool = {{"worker-0", 4}, {"worker-1", 2}, {"w", 0}, {"localhost", 3}};
  bool include = !text.empty() && (text[0] & 1);
  if (!text.empty()) text.remove_prefix(1);
  if (text.empty()) return;  // no filter: the pool unchanged, 0-slot hosts included
  WorldInfo w = include ? apply_filters(pool, text, "") : apply_filters(pool, "", text);
  check(!w.empty());
  std::size_t last = 0;
  for (const auto& entry : w) {
    const std::string& h = entry.first;
    const std::vector<int>& slots = entry.second;
    auto it = std::find_if(pool.begin(), pool.end(), [&](const HostSlots& p) { return p.host == h; });
    check(it != pool.end());
    std::size_t idx = static_cast<std::size_t>(it - pool.begin());
    check(idx >= last);  // pool order
    last = idx + 1;
    check(!slots.empty());
    check(std::is_sorted(slots.begin(), slots.end()));
    check(std::adjacent_find(slots.begin(), slots.end()) == slots.end());
    for (int s : slots) check(s >= 0 && s < it->slots);
  }
}

void fuzz_hostlist(std::string_view text) {
  if (text.size() > 256) return;  // ranges expand; keep runs fast
  auto hosts = expand_hostlist(text);
  for (const auto& h : hosts) check(!h.empty());
}

void fuzz_tasks(std::string_view text) {
  if (text.size() > 256) return;
  auto counts = parse_tasks_per_node(text);
  check(!counts.empty());
  for (int c : counts) check(c >= 0);
}

void fuzz_shell(std::string_view text) {
  std::string s(text);
  s.erase(std::remove(s.begin(), s.end(), '\0'), s.end());
  auto words = shell_split(shell_quote(s));
  check(words.size() == 1 && words[0] == s);
  try {
    auto split = shell_split(text);
    check(shell_split(shell_join(split)) == split);
  } catch (const ds::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 6) {
      case 0: fuzz_hostfile(text); break;
      case 1: fuzz_env(text); break;
      case 2: fuzz_filter(text); break;
      case 3: fuzz_hostlist(text); break;
      case 4: fuzz_tasks(text); break;
      case 5: fuzz_shell(text); break;
    }
  } catch (const ds::Error&) {
    // Rejected input: fine, as long as it was rejected with our error type.
  }
  return 0;
}
