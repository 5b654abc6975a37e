// What every fuzz target shares: which exceptions are the answer to bad input (Error, ApiError)
// and which are bugs. A parser that lets anything else escape (nlohmann's type_error,
// std::out_of_range, ...) would become a 500 in the server, so the harness aborts on it and
// libFuzzer reports the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "core/error.h"
#include "protocol/openai.h"

namespace deepinfer::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `body`; returns normally when it succeeds or refuses the input with a user-facing
// error, aborts on any other exception.
template <typename Body>
void expect_clean(Body&& body) {
  try {
    body();
  } catch (const protocol::ApiError& error) {
    if (error.status() < 400 || error.status() >= 500) {
      std::fprintf(stderr, "client input answered %d: %s\n", error.status(), error.what());
      std::abort();
    }
  } catch (const Error&) {
  } catch (const std::exception& error) {
    std::fprintf(stderr, "unexpected exception: %s\n", error.what());
    std::abort();
  }
}

// Splits `text` at the first occurrence of `separator`: [before, after]; all of it is
// `before` when the separator is absent.
inline std::pair<std::string_view, std::string_view> split_once(std::string_view text,
                                                                std::string_view separator) {
  size_t at = text.find(separator);
  if (at == std::string_view::npos) return {text, {}};
  return {text.substr(0, at), text.substr(at + separator.size())};
}

}  // namespace deepinfer::fuzz
