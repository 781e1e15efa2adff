// world_info: encoding (JSON + URL-safe base64, as DeepSpeed's --world_info) and the
// host-major dense rank numbering (as DeepSpeed's launcher/runner.py).
#pragma once

#include <string>
#include <string_view>

#include "ds/core/base64.h"
#include "ds/launch/filter.h"

namespace ds::launch {

// {"a": [0, 1], "b": [0]} with Python json.dumps separators, hosts in order.
std::string world_info_json(const WorldInfo& info);
// Accepts any JSON object of host -> array of non-negative ints, keeping key order.
WorldInfo parse_world_info_json(std::string_view json);

// A JSON string literal (quotes and escapes) for `s`.
std::string json_quote(std::string_view s);

// world_info's transport encoding: ds_core's base64 (URL-safe, '=' padding; decoding throws
// on bad input).
using ds::base64_urlsafe_encode;
inline std::string base64_urlsafe_decode(std::string_view text) { return ds::base64_decode(text); }

int world_size(const WorldInfo& info);

// Where global rank `rank` lives: node index (CROSS_RANK), index into that host's slot list
// (LOCAL_RANK) and the host's slot count (LOCAL_SIZE). Throws if rank is out of range.
struct RankPlace {
  int node = 0;
  int local_rank = 0;
  int local_size = 0;
};
RankPlace place_rank(const WorldInfo& info, int rank);

}  // namespace ds::launch
