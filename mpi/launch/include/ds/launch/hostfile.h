// Hostfile parsing: DeepSpeed's grammar plus the Open MPI / Horovod / MPICH forms a user's
// existing file may hold (docs/user/launching.md "Hostfile dialects").
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds::launch {

// One host of the pool in file order: name and slot count (0 allowed, as in DeepSpeed).
struct HostSlots {
  std::string host;
  int slots = 0;
};
using Pool = std::vector<HostSlots>;

// Parses hostfile text; `source` names the file in error messages ("<source>:<line>: ...").
// Accepted line forms (after stripping whitespace; blank and '#' lines skipped; a trailing
// "# comment" is ignored):
//   host slots=N [max_slots=M]       DeepSpeed / Open MPI ("slots = N" also accepted;
//                                    synonyms cpu= count= for slots, max-slots= slots_max=
//                                    slots-max= for max_slots; M >= N)
//   host:N                           Horovod / MPICH Hydra
// Errors: malformed line, invalid host name, bad slot count, duplicate host (names compared
// without regard to case, as DNS does: "Worker-1" and "worker-1" are one host), empty file.
Pool parse_hostfile(std::string_view text, const std::string& source);

// Reads and parses a file. Returns false (and leaves `pool` empty) when the file does not
// exist, as DeepSpeed treats a missing hostfile as "use local resources"; throws on a read
// error or a parse error.
bool read_hostfile(const std::string& path, Pool& pool);

// True when `host` is a name dsrun accepts: letters, digits, '.', '-', '_' (1..253 chars),
// not starting with '-'. Rules out shell metacharacters, '@' (filter separator) and ':'.
bool valid_host_name(std::string_view host);

// Host names compare without regard to ASCII case, as DNS names do (hostfile duplicates,
// --include / --exclude lookups).
bool same_host(std::string_view a, std::string_view b);

}  // namespace ds::launch
