// Errors that carry a message a user can act on.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace deepinfer {

// The one exception type the engine throws for bad input or bad state. The message names the
// file, tensor or field at fault, so the CLI can print it as the whole diagnosis.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

#define DI_CHECK(condition, ...)      \
  do {                                \
    if (!(condition)) {               \
      ::deepinfer::fail(__VA_ARGS__); \
    }                                 \
  } while (false)

}  // namespace deepinfer
