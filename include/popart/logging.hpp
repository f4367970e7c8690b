#pragma once
/// \file Logging setup. The level comes from POPART_LOG_LEVEL (trace, debug, info, warn, err, off).

#include <string>

namespace popart::logging {

/// Log levels, as PopART names them.
enum class Level { Trace, Debug, Info, Warn, Err, Off };

/// Sets the level of the runtime's logger.
void setLogLevel(Level level);
/// \returns the level named \p name; throws popart::error for an unknown name.
Level levelFromString(const std::string &name);
/// Sends \p message at \p level (used where spdlog is not included).
void log(Level level, const std::string &message);

} // namespace popart::logging
