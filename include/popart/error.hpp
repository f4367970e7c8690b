#pragma once
/// \file The single exception type of the runtime.

#include <sstream>
#include <stdexcept>
#include <string>

namespace popart {

/// The exception every part of the runtime throws; its message names what is at fault.
class error : public std::runtime_error {
public:
  /// Builds the message by streaming each of \p args in turn.
  template <typename... Args> explicit error(const Args &...args) : std::runtime_error(concat(args...)) {}

private:
  template <typename... Args> static std::string concat(const Args &...args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
  }
};

} // namespace popart
