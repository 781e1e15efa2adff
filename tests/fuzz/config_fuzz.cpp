// libFuzzer target for the ds_config.json parser (scripts/fuzz_config.sh runs it).
//
// Properties checked on every input:
//   * the only exception that escapes parsing / resolving is ds::Error (anything else, a
//     crash, a sanitizer report or a hang is a bug);
//   * the document kept in DsConfig::raw and the resolved JSON can be written out (valid UTF-8);
//   * the resolved config is itself a valid config that parses back to the same resolved JSON.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/core/log.h"

namespace {

[[noreturn]] void property_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void check_round_trip(const ds::config::DsConfig& cfg) {
  const nlohmann::json resolved = ds::config::to_json(cfg);
  const std::string text = resolved.dump(2);
  (void)cfg.raw.dump();
  ds::config::DsConfig again;
  try {
    again = ds::config::parse_config_text(text, "resolved.json");
  } catch (const ds::Error& e) {
    property_failed("resolved config does not parse", std::string(e.what()) + "\n" + text);
  }
  if (ds::config::to_json(again) != resolved) {
    property_failed("resolved config changes when re-read", text + "\n---\n" + ds::config::to_json(again).dump(2));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ds::log::set_level(ds::log::Level::Error);  // warnings on every input would swamp the run
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> warnings;
  ds::config::DsConfig cfg;
  try {
    cfg = ds::config::parse_config_text(text, "fuzz.json", &warnings);
  } catch (const ds::Error&) {
    return 0;  // rejected with a message: fine
  }
  check_round_trip(cfg);
  for (int ws : {1, 2, 3, 8}) {
    ds::config::DsConfig c = cfg;
    try {
      ds::config::resolve_batch_sizes(c, ws);
    } catch (const ds::Error&) {
      continue;
    }
    check_round_trip(c);
    ds::config::DsConfig again = c;
    try {
      ds::config::resolve_batch_sizes(again, ws);  // resolving a resolved config is a no-op
    } catch (const ds::Error& e) {
      property_failed("re-resolving a resolved config failed", e.what());
    }
  }
  return 0;
}
