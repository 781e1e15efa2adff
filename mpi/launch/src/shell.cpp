// Shell quoting and shlex-style splitting.
#include "ds/launch/shell.h"

#include "ds/core/error.h"

namespace ds::launch {

std::string shell_quote(std::string_view s) {
  bool safe = !s.empty();
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '@' || c == '%' || c == '+' || c == '=' || c == ':' || c == ',' ||
              c == '.' || c == '/' || c == '-';
    if (!ok) {
      safe = false;
      break;
    }
  }
  if (safe) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\"'\"'";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (i) out += ' ';
    out += shell_quote(argv[i]);
  }
  return out;
}

std::vector<std::string> shell_split(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  std::size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) {
        out.push_back(cur);
        cur.clear();
        in_word = false;
      }
      ++i;
    } else if (c == '\'') {
      std::size_t end = s.find('\'', i + 1);
      DS_CHECK(end != std::string_view::npos, "unterminated ' in '" << s << "'");
      cur.append(s.substr(i + 1, end - i - 1));
      in_word = true;
      i = end + 1;
    } else if (c == '"') {
      ++i;
      bool closed = false;
      while (i < s.size()) {
        char d = s[i];
        if (d == '"') {
          closed = true;
          ++i;
          break;
        }
        if (d == '\\' && i + 1 < s.size() &&
            (s[i + 1] == '"' || s[i + 1] == '\\' || s[i + 1] == '$' || s[i + 1] == '`')) {
          cur += s[i + 1];
          i += 2;
          continue;
        }
        cur += d;
        ++i;
      }
      DS_CHECK(closed, "unterminated \" in '" << s << "'");
      in_word = true;
    } else if (c == '\\') {
      DS_CHECK(i + 1 < s.size(), "trailing backslash in '" << s << "'");
      cur += s[i + 1];
      in_word = true;
      i += 2;
    } else {
      cur += c;
      in_word = true;
      ++i;
    }
  }
  if (in_word) out.push_back(cur);
  return out;
}

}  // namespace ds::launch
