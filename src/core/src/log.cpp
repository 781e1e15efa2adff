#include "ds/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ds/core/env.h"
#include "ds/core/error.h"

namespace ds::log {

namespace {
// Read at static initialisation, where a throw would terminate: a bad value falls back to the
// default here, and the app's env::check_all() at the start of main reports it as an error.
Level initial_level() {
  std::string v;
  try { v = env::get_string("DS_LOG_LEVEL"); } catch (const Error&) { return Level::Info; }
  if (v == "debug") return Level::Debug;
  if (v == "warn") return Level::Warn;
  if (v == "error") return Level::Error;
  return Level::Info;
}
Level g_level = initial_level();
const bool g_all_ranks = [] {
  try { return env::get_bool("DS_LOG_ALL_RANKS"); } catch (const Error&) { return false; }
}();
std::mutex g_mutex;
const char* g_tool = nullptr;
}  // namespace

void set_tool(const char* name) { g_tool = name; }

void set_level(Level level) { g_level = level; }
Level level() { return g_level; }

bool enabled(Level lvl) {
  if (lvl < g_level) return false;
  if (lvl >= Level::Warn || g_all_ranks) return true;
  return process_rank() <= 0;
}

void write(Level lvl, const std::string& message) {
  static const char* names[] = {"debug", "info", "warning", "error"};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_tool) {
    if (lvl == Level::Info) std::fprintf(stderr, "%s: %s\n", g_tool, message.c_str());
    else std::fprintf(stderr, "%s: %s: %s\n", g_tool, names[int(lvl)], message.c_str());
    std::fflush(stderr);
    return;
  }
  FILE* out = lvl >= Level::Warn ? stderr : stdout;
  const int r = process_rank();
  if (lvl == Level::Info) {
    std::fprintf(out, "[rank %d] %s\n", r < 0 ? 0 : r, message.c_str());
  } else {
    std::fprintf(out, "[rank %d] %s: %s\n", r < 0 ? 0 : r, names[int(lvl)], message.c_str());
  }
  std::fflush(out);
}

}  // namespace ds::log
