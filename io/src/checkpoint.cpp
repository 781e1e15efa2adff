// The checkpoint store's names, tag rules and layout signature, shared by save and load
// (checkpoint_internal.h lists the other files).
#include "ds/io/checkpoint.h"

#include <algorithm>
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

std::string tiling_problem(std::vector<RankRange> ranges, std::size_t flat_numel) {
  std::erase_if(ranges, [](const RankRange& r) { return r.count == 0; });
  std::sort(ranges.begin(), ranges.end(), [](const RankRange& a, const RankRange& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.rank < b.rank;
  });
  auto str = [](const RankRange& r) {
    std::ostringstream os;
    os << "rank " << r.rank << "'s range [" << r.offset << ", " << r.offset + r.count << ")";
    return os.str();
  };
  std::ostringstream os;
  std::size_t pos = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const RankRange& r = ranges[i];
    if (r.offset > pos) {
      os << "flat elements [" << pos << ", " << r.offset << ") are in no rank's range";
      return os.str();
    }
    if (r.offset < pos) {
      os << str(r) << " overlaps " << str(ranges[i - 1]);
      return os.str();
    }
    if (r.offset + r.count > flat_numel) {
      os << str(r) << " ends past flat_numel " << flat_numel;
      return os.str();
    }
    pos = r.offset + r.count;
  }
  if (pos < flat_numel) {
    os << "flat elements [" << pos << ", " << flat_numel << ") are in no rank's range";
    return os.str();
  }
  return "";
}

std::string local_ranges_problem(const std::vector<ShardRange>& ranges, std::size_t shard_count, std::size_t flat_numel) {
  std::ostringstream os;
  std::size_t sum = 0, end = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const ShardRange& r = ranges[i];
    if (i > 0 && r.offset < end) {
      os << "shard_ranges[" << i << "] = [" << r.offset << ", " << r.offset + r.count << ") starts before the end "
         << end << " of the range before it (ranges must be in increasing order, without overlap)";
      return os.str();
    }
    if (r.offset + r.count > flat_numel) {
      os << "shard_ranges[" << i << "] = [" << r.offset << ", " << r.offset + r.count << ") ends past flat_numel "
         << flat_numel;
      return os.str();
    }
    end = r.offset + r.count;
    sum += r.count;
  }
  if (sum != shard_count) {
    os << "shard_ranges hold " << sum << " elements, shard_count says " << shard_count;
    return os.str();
  }
  return "";
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
  if (c.params_in_master) os << ";params_in_master";
  return os.str();
}

int clean_stale_tmp_dirs(const std::string& save_dir) { return detail::remove_abandoned_tmp_dirs(save_dir); }

}  // namespace ds::io
