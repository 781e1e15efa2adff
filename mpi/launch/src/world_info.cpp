// world_info encoding and rank placement (DeepSpeed's launcher/runner.py and launch.py).
#include "ds/launch/world_info.h"

#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds::launch {

std::string json_quote(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

std::string world_info_json(const WorldInfo& info) {
  // Python json.dumps defaults: ", " and ": " separators, keys in order.
  std::string out = "{";
  bool first = true;
  for (const auto& [host, slots] : info) {
    if (!first) out += ", ";
    first = false;
    out += json_quote(host);
    out += ": [";
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(slots[i]);
    }
    out += "]";
  }
  out += "}";
  return out;
}

WorldInfo parse_world_info_json(std::string_view json) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    DS_THROW("world_info is not valid JSON: " << e.what());
  }
  DS_CHECK(j.is_object(), "world_info must be a JSON object of host -> [slots]");
  WorldInfo w;
  for (auto it = j.begin(); it != j.end(); ++it) {
    DS_CHECK(it.value().is_array(), "world_info: host '" << it.key() << "' needs a slot list");
    std::vector<int> slots;
    for (const auto& v : it.value()) {
      DS_CHECK(v.is_number_integer() && v.get<long long>() >= 0 && v.get<long long>() < (1 << 20),
               "world_info: bad slot for host '" << it.key() << "'");
      slots.push_back(v.get<int>());
    }
    w.emplace_back(it.key(), std::move(slots));
  }
  return w;
}

int world_size(const WorldInfo& info) {
  long n = 0;
  for (const auto& [h, s] : info) n += static_cast<long>(s.size());
  DS_CHECK(n < (1L << 30), "world size too large");
  return static_cast<int>(n);
}

RankPlace place_rank(const WorldInfo& info, int rank) {
  DS_CHECK(rank >= 0, "negative rank " << rank);
  int base = 0;
  for (std::size_t node = 0; node < info.size(); ++node) {
    int n = static_cast<int>(info[node].second.size());
    if (rank < base + n) return RankPlace{static_cast<int>(node), rank - base, n};
    base += n;
  }
  DS_THROW("rank " << rank << " is outside world_info (world size " << base << ")");
}

}  // namespace ds::launch
