// Hostfile grammar (DeepSpeed's runner.py fetch_hostfile; docs/user/launching.md "Hostfile dialects").
#include "ds/launch/hostfile.h"

#include <cstring>

#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/text_lines.h"

namespace ds::launch {
namespace {

constexpr long kMaxSlots = 1 << 20;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Digits only, no sign; false on anything else or on overflow beyond kMaxSlots.
bool parse_count(std::string_view s, long& out) {
  if (s.empty() || s.size() > 9) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > kMaxSlots) return false;
  out = v;
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

bool same_host(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool valid_host_name(std::string_view host) {
  if (host.empty() || host.size() > 253 || host.front() == '-') return false;
  for (char c : host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

namespace {

// The count of the Horovod / Hydra form host:N (`n` is what follows the ':').
long colon_slots(const TextLines& lines, std::string_view line, std::string_view host, std::string_view n) {
  long slots = -1;
  DS_CHECK(!n.empty() && n.find_first_of(" \t") == std::string_view::npos,
           lines.where() << "malformed line '" << printable(line) << "' (expected 'host:N')");
  DS_CHECK(parse_count(n, slots), lines.where() << "bad slot count '" << printable(n) << "' for host '" << host
                                                << "' (a non-negative integer <= " << kMaxSlots << ")");
  return slots;
}

// The count of the key=value form "host slots=N [max_slots=M]"; blanks around '=' allowed as in
// Open MPI's lexer. `rest` is what follows the host.
long key_value_slots(const TextLines& lines, std::string_view line, std::string_view host, std::string_view rest) {
  DS_CHECK(!rest.empty(), lines.where() << "host '" << host << "' has no slot count (write '" << host
                                        << " slots=N' or '" << host << ":N')");
  long slots = -1, max_slots = -1;
  std::string_view r = rest;
  while (!r.empty()) {
    std::size_t k = 0;
    while (k < r.size() && !is_space(r[k]) && r[k] != '=') ++k;
    std::string_view key = r.substr(0, k);
    r = trim(r.substr(k));
    DS_CHECK(!key.empty() && !r.empty() && r.front() == '=',
             lines.where() << "malformed line '" << printable(line) << "' (expected 'host slots=N [max_slots=M]')");
    r = trim(r.substr(1));
    std::size_t v = 0;
    while (v < r.size() && !is_space(r[v])) ++v;
    std::string_view value = r.substr(0, v);
    r = trim(r.substr(v));
    long n = 0;
    bool is_slots = key == "slots" || key == "cpu" || key == "count";
    bool is_max = key == "max_slots" || key == "max-slots" || key == "slots_max" || key == "slots-max";
    DS_CHECK(is_slots || is_max, lines.where() << "unknown key '" << printable(key) << "' for host '" << host
                                               << "' (known: slots, max_slots)");
    DS_CHECK(parse_count(value, n), lines.where() << "bad slot count '" << printable(value) << "' for host '" << host
                                                  << "' (" << key << " must be a non-negative integer <= "
                                                  << kMaxSlots << ")");
    long& dst = is_slots ? slots : max_slots;
    DS_CHECK(dst < 0, lines.where() << "'" << key << "' given twice for host '" << host << "'");
    dst = n;
  }
  DS_CHECK(slots >= 0, lines.where() << "host '" << host << "' has max_slots but no slots=N");
  DS_CHECK(max_slots < 0 || max_slots >= slots,
           lines.where() << "host '" << host << "': max_slots=" << max_slots << " is less than slots=" << slots);
  return slots;
}

// One non-empty line (comment removed): the host and its slot count.
HostSlots parse_host_line(const TextLines& lines, std::string_view line) {
  DS_CHECK(line.find('\0') == std::string_view::npos, lines.where() << "NUL byte in hostfile line");
  // Host token: up to the first blank or ':'.
  std::size_t end = 0;
  while (end < line.size() && !is_space(line[end]) && line[end] != ':' && line[end] != '=') ++end;
  std::string_view host = line.substr(0, end);
  std::string_view rest = trim(line.substr(end));
  DS_CHECK(!host.empty(), lines.where() << "malformed line '" << printable(line)
                                        << "' (expected 'host slots=N' or 'host:N')");
  DS_CHECK(valid_host_name(host),
           lines.where() << "invalid host name '" << printable(host)
                         << "' (letters, digits, '.', '-', '_' only; user@host is not supported)");
  const long slots = !rest.empty() && rest.front() == ':' ? colon_slots(lines, line, host, rest.substr(1))
                                                          : key_value_slots(lines, line, host, rest);
  return {std::string(host), static_cast<int>(slots)};
}

// Host names are case-insensitive: a host may appear once. first_line: each pool entry's line.
void check_new_host(const TextLines& lines, const Pool& pool, const std::vector<int>& first_line,
                    const std::string& host) {
  for (std::size_t i = 0; i < pool.size(); ++i) {
    DS_CHECK(!same_host(pool[i].host, host),
             lines.where() << "duplicate host '" << host << "' (first on line " << first_line[i]
                           << (pool[i].host == host
                                   ? std::string()
                                   : " as '" + pool[i].host + "'; host names are case-insensitive")
                           << ")");
  }
}

}  // namespace

Pool parse_hostfile(std::string_view text, const std::string& source) {
  Pool pool;
  std::vector<int> first_line;  // line of each pool entry, for duplicate messages
  TextLines lines(text, source);
  while (lines.next()) {
    std::string_view line = trim(lines.line());
    // A '#' starts a comment anywhere (Open MPI and DeepSpeed both ignore trailing comments).
    std::size_t hash = line.find('#');
    if (hash != std::string_view::npos) line = trim(line.substr(0, hash));
    if (line.empty()) continue;
    HostSlots entry = parse_host_line(lines, line);
    check_new_host(lines, pool, first_line, entry.host);
    pool.push_back(std::move(entry));
    first_line.push_back(lines.number());
  }
  DS_CHECK(!pool.empty(), source << ": hostfile is empty (no 'host slots=N' lines)");
  return pool;
}

bool read_hostfile(const std::string& path, Pool& pool) {
  pool.clear();
  // A FIFO, device or directory is an error (never a hang or an unbounded read); capped like
  // every control file.
  if (!check_regular_file(path, "hostfile", /*missing_ok=*/true)) return false;
  pool = parse_hostfile(read_regular_file(path, "hostfile"), path);
  return true;
}

}  // namespace ds::launch
