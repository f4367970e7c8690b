#pragma once
// Internal access to the runtime's spdlog logger.

#include <spdlog/spdlog.h>

namespace popart::logging {
/// The runtime's logger, set up from POPART_LOG_LEVEL on first use.
spdlog::logger &logger();
} // namespace popart::logging
