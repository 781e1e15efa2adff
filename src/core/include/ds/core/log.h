// Rank-tagged logging. By default only rank 0 prints info; warnings and errors print on
// every rank. DS_LOG_ALL_RANKS=1 makes every rank print info; DS_LOG_LEVEL=debug|info|warn|error.
#pragma once

#include <sstream>
#include <string>

namespace ds::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void set_level(Level level);
Level level();
bool enabled(Level level);  // level threshold and rank filter
void write(Level level, const std::string& message);
// One-process tools (ds_config, ds_report, ...): every line goes to stderr as
// "<tool>: <level>: message" (info: "<tool>: message"), without the rank tag, so that a
// tool's stdout holds only its output. Call once at the start of main.
void set_tool(const char* name);

}  // namespace ds::log

#define DS_LOG_AT(lvl, msg_stream)                                   \
  do {                                                               \
    if (::ds::log::enabled(lvl)) {                                   \
      std::ostringstream ds_log_os_;                                 \
      ds_log_os_ << msg_stream;                                      \
      ::ds::log::write(lvl, ds_log_os_.str());                       \
    }                                                                \
  } while (0)
#define DS_DEBUG(m) DS_LOG_AT(::ds::log::Level::Debug, m)
#define DS_INFO(m) DS_LOG_AT(::ds::log::Level::Info, m)
#define DS_WARN(m) DS_LOG_AT(::ds::log::Level::Warn, m)
#define DS_ERROR(m) DS_LOG_AT(::ds::log::Level::Error, m)
