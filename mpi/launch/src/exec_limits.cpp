// Exec size limits (see exec_limits.h).
#include "ds/launch/exec_limits.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "ds/core/error.h"

namespace ds::launch {
namespace {

constexpr std::size_t kKernelArgCap = 6u << 20;  // _STK_LIM / 4 * 3 (Linux >= 4.13)

// The start of a long argument, printable, for the error message.
std::string head(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < 40; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  }
  if (s.size() > 40) out += "...";
  return out;
}

}  // namespace

ExecLimits system_exec_limits() {
  long page = ::sysconf(_SC_PAGESIZE);
  ExecLimits l;
  l.max_arg_strlen = 32 * static_cast<std::size_t>(page > 0 ? page : 4096);
  long arg_max = ::sysconf(_SC_ARG_MAX);
  l.arg_max = arg_max > 0 ? std::min(static_cast<std::size_t>(arg_max), kKernelArgCap) : kKernelArgCap;
  l.arg_max = std::max(l.arg_max, l.max_arg_strlen);
  return l;
}

void check_exec_size(const Command& cmd, const EnvList& environ, const ExecLimits& limits) {
  DS_CHECK(!cmd.argv.empty(), "internal: empty command");
  const std::string& engine = cmd.argv.front();
  const std::size_t one = limits.max_arg_strlen;  // with the NUL: strings of one-1 bytes fit
  for (const auto& [k, v] : cmd.exports) {
    const std::size_t n = k.size() + 1 + v.size();
    DS_CHECK(n < one, "environment variable " << k << " is " << n << " bytes (" << k
                          << "=VALUE), over the " << one - 1
                          << "-byte limit of one exec argument (Linux MAX_ARG_STRLEN, "
                          << one << " bytes with the terminating NUL); dsrun exports it to "
                             "every rank through "
                          << engine << ": shorten it, or remove it from the env file "
                                       "(.deepspeed_env / $DS_ENV_FILE) or environment that "
                                       "sets it");
  }
  std::size_t total = 0;
  for (std::size_t i = 0; i < cmd.argv.size(); ++i) {
    const std::string& a = cmd.argv[i];
    DS_CHECK(a.size() < one, "argument " << i << " of the " << engine << " command ('" << head(a)
                                        << "') is " << a.size() << " bytes, over the " << one - 1
                                        << "-byte limit of one exec argument (Linux "
                                           "MAX_ARG_STRLEN)");
    total += a.size() + 1 + sizeof(char*);
  }
  std::string largest;
  std::size_t largest_n = 0;
  auto consider = [&](const std::string& k, std::size_t n) {
    if (n > largest_n) {
      largest = k;
      largest_n = n;
    }
  };
  for (const auto& [k, v] : environ) {
    total += k.size() + 1 + v.size() + 1 + sizeof(char*);
    consider(k, k.size() + 1 + v.size());
  }
  for (const auto& [k, v] : cmd.exports) consider(k, k.size() + 1 + v.size());
  total += engine.size() + 1 + sizeof(char*);  // the kernel copies the file name too; NULL ends
  DS_CHECK(total <= limits.arg_max,
           "the " << engine << " command line and environment take " << total
                  << " bytes, over this system's " << limits.arg_max
                  << "-byte limit for one exec (ARG_MAX, a quarter of `ulimit -s`); the largest "
                     "variable is "
                  << (largest.empty() ? std::string("(none)") : largest) << " (" << largest_n
                  << " bytes): shorten or remove exported variables (env file .deepspeed_env / "
                     "$DS_ENV_FILE, or the environment), or raise `ulimit -s`");
}

}  // namespace ds::launch
