#pragma once
// A helper for tests that check an error's message.

#include <exception>
#include <string>

/// What \p f throws ("" if nothing).
template <typename F> std::string thrown(F f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}
