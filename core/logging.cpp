#include "core/log.hpp"
#include <popart/error.hpp>
#include <popart/logging.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace popart::logging {

static spdlog::level::level_enum toSpd(Level level) {
  switch (level) {
  case Level::Trace: return spdlog::level::trace;
  case Level::Debug: return spdlog::level::debug;
  case Level::Info: return spdlog::level::info;
  case Level::Warn: return spdlog::level::warn;
  case Level::Err: return spdlog::level::err;
  case Level::Off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

Level levelFromString(const std::string &name) {
  if (name == "trace" || name == "TRACE") return Level::Trace;
  if (name == "debug" || name == "DEBUG") return Level::Debug;
  if (name == "info" || name == "INFO") return Level::Info;
  if (name == "warn" || name == "WARN") return Level::Warn;
  if (name == "err" || name == "ERR" || name == "error") return Level::Err;
  if (name == "off" || name == "OFF") return Level::Off;
  throw error("unknown log level '", name, "' (expected trace, debug, info, warn, err or off)");
}

spdlog::logger &logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("popart");
    l->set_pattern("[%H:%M:%S.%e] [popart] [%l] %v");
    Level level = Level::Warn;
    if (const char *env = std::getenv("POPART_LOG_LEVEL")) {
      try {
        level = levelFromString(env);
      } catch (const error &e) {
        l->warn("POPART_LOG_LEVEL: {}; using warn", e.what());
      }
    }
    l->set_level(toSpd(level));
    return l;
  }();
  return *instance;
}

void setLogLevel(Level level) { logger().set_level(toSpd(level)); }

void log(Level level, const std::string &message) { logger().log(toSpd(level), message); }

} // namespace popart::logging
