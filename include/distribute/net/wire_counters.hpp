// Shared by net/ and ps/ (internal use): the bytes this process's connections have written and
// read since it started, frames whole (header, padding, payload), counted by the connection layer:
// what a task reports as its traffic (a ps task's /metrics), for benchmarks and operators. The
// handshakes are not counted.
#pragma once

#include <atomic>
#include <cstdint>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

struct WireCounters {
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> received{0};
};

inline WireCounters& wire_counters() noexcept {
  static WireCounters counters;
  return counters;
}

}  // namespace net
DISTRIBUTE_END_NAMESPACE
