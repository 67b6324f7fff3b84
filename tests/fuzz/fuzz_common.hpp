// What every fuzz target shares: the input as a reader of a selector byte and the rest, and the
// rule that decoding may fail only with a typed ds::Error (any other exception escapes, aborts,
// and libFuzzer reports it as a crash, as it does a sanitizer finding or a broken invariant).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

#include <distribute/core/error.hpp>

namespace fuzz {

inline std::span<const std::byte> bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

inline std::string_view text(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

/// An invariant the decoder promises: a violation is a crash.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
    std::abort();
  }
}

/// Runs `decode`; a distribute::Error is the expected answer to bad input, anything else escapes.
template <class F>
void expect_typed_errors(F&& decode) {
  try {
    decode();
  } catch (const distribute::Error&) {
  }
}

}  // namespace fuzz
