// The checkpoint store's names, tag rules and layout signature, shared by save and load
// (checkpoint_internal.h lists the other files).
#include "ds/io/checkpoint.h"

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "checkpoint_internal.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "save_claim.h"

namespace ds::io {

namespace detail {

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

bool is_plain_name(std::string_view s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         s.find('\0') == std::string_view::npos;
}

void test_kill_point(std::string_view phase, int rank) {
  const std::string spec = env::get_string("DS_CKPT_TEST_KILL_AT");
  if (spec.empty()) return;
  std::string want_phase = spec;
  int want_rank = -1;
  if (auto at = spec.find('@'); at != std::string::npos) {
    want_phase = spec.substr(0, at);
    want_rank = std::atoi(spec.c_str() + at + 1);
  }
  if (want_phase == phase && (want_rank < 0 || want_rank == rank)) std::raise(SIGKILL);
}

}  // namespace detail

std::string shard_file_name(int rank) { return "zero_rank_" + std::to_string(rank) + ".h5"; }

TagValidation parse_tag_validation(std::string_view s) {
  std::string l(s);
  for (auto& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (l == "ignore") return TagValidation::Ignore;
  if (l == "warn") return TagValidation::Warn;
  if (l == "fail") return TagValidation::Fail;
  DS_THROW("checkpoint.tag_validation = '" << s << "': expected Ignore, Warn or Fail");
}

std::size_t ParamRecord::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}

std::string layout_signature(const CheckpointContent& c) {
  std::ostringstream os;
  os << "stage=" << c.zero_stage << ";flat=" << c.flat_numel << ";dtype=" << c.working_dtype << ";shard=";
  for (const auto& s : c.shard) os << s.name << ",";
  return os.str();
}

int clean_stale_tmp_dirs(const std::string& save_dir) { return detail::remove_abandoned_tmp_dirs(save_dir); }

}  // namespace ds::io
