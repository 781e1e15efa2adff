// Shell quoting for display and for strings that pass through a remote shell, and a
// POSIX-shell-like splitter for --launcher_args (Python shlex.split semantics).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::launch {

// Bare if every byte is in [A-Za-z0-9_@%+=:,./-] and non-empty, else single-quoted with
// embedded ' written as '"'"'.
std::string shell_quote(std::string_view s);
std::string shell_join(const std::vector<std::string>& argv);
// Splits like shlex.split (quotes, backslashes, no expansion); throws on an open quote.
std::vector<std::string> shell_split(std::string_view s);

}  // namespace ds::launch
