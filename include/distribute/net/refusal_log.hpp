// Shared by net/ and ps/ (internal use): what a server does with a connection it refuses: the peer is told only "refused" (a stranger
// learns nothing of the cluster), the reason goes to the local log, at most a few lines a second
// so that a flood of strangers cannot flood the log. Used by the collectives' acceptor and the
// parameter-server RPC alike.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// The whole text a refused peer reads.
inline constexpr std::string_view kRefusedText = "refused";

/// Lets through at most `burst` lines per `period`; the lines it drops are counted and named in the
/// next line it lets through ("(N similar lines suppressed)"). Thread-safe.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimiter(std::size_t burst = 10, Clock::duration period = std::chrono::seconds(1))
      : burst_(burst), period_(period) {}

  /// The line to write now (with the count of those suppressed before it), or "" to drop it.
  std::string admit(std::string_view line) {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    if (now - window_start_ >= period_) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++suppressed_;
      return {};
    }
    ++in_window_;
    if (suppressed_ == 0) return std::string(line);
    std::string out = fmt::format("{} ({} similar lines suppressed)", line, suppressed_);
    suppressed_ = 0;
    return out;
  }

  std::uint64_t suppressed() const {
    std::lock_guard lock(mutex_);
    return suppressed_;
  }

 private:
  std::size_t burst_;
  Clock::duration period_;
  mutable std::mutex mutex_;
  Clock::time_point window_start_{};
  std::size_t in_window_ = 0;
  std::uint64_t suppressed_ = 0;
};

/// Why a server does not listen beyond this machine without a cluster token (unless told to).
inline std::string no_token_refusal(std::string_view who, std::string_view address) {
  return fmt::format(
      "{} will not listen on {}, reachable from other machines, without a cluster token: anyone who can connect "
      "could join, run registered functions and read or change state. Set DISTRIBUTE_CLUSTER_TOKEN to the same "
      "secret for every task (distribute-launch does), listen on a loopback address, or accept the risk with the "
      "option insecure = true or DISTRIBUTE_INSECURE=1",
      who, address);
}

/// The one warning a server logs when it listens beyond this machine without a token, as chosen.
inline std::string no_token_warning(std::string_view who, std::string_view address) {
  return fmt::format(
      "WARNING: {} listens on {}, reachable from other machines, without a cluster token (insecure, as chosen): "
      "anyone who can connect can join, run registered functions and read or change state",
      who, address);
}

}  // namespace net
DISTRIBUTE_END_NAMESPACE
