// What the example programs share on their command line: number parsing, usage errors, the
// exit statuses, and a main() wrapper that turns exceptions into those statuses.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace cli {

inline constexpr double kTargetAccuracy = 0.95;
inline constexpr int kExitBelowTarget = 1, kExitUsage = 2, kExitError = 3;

/// A bad command line (exit 2 with the usage text). An empty message means --help (exit 0).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The whole of `text` as a T, else UsageError naming the flag.
template <class T>
T parse_number(std::string_view flag, const std::string& text) {
  try {
    std::size_t used = 0;
    T value{};
    if constexpr (std::is_floating_point_v<T>) value = static_cast<T>(std::stod(text, &used));
    else value = static_cast<T>(std::stoll(text, &used));
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("{}: '{}' is not a number", flag, text));
}

/// Runs `body` with line-buffered stdout (under distribute-launch stdout is a pipe, and progress
/// should show as it happens). UsageError: the usage text and exit 2 (exit 0 for --help); any
/// other exception: "<program>: error: ..." and exit 3.
inline int run_main(std::string_view program, std::string_view usage, const std::function<int()>& body) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return body();
  } catch (const UsageError& e) {
    if (!*e.what()) {
      fmt::print("{}", usage);
      return 0;
    }
    fmt::print(stderr, "{}: {}\n{}", program, e.what(), usage);
    return kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return kExitError;
  }
}

}  // namespace cli
