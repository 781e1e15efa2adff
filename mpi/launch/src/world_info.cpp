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

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
int decode_char(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-' || c == '+') return 62;
  if (c == '_' || c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64_urlsafe_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                 static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  std::size_t rest = bytes.size() - i;
  if (rest == 1) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64_urlsafe_decode(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  DS_CHECK(text.size() % 4 != 1, "bad base64 length");
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (char c : text) {
    int v = decode_char(c);
    DS_CHECK(v >= 0, "bad base64 character '" << c << "'");
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
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
