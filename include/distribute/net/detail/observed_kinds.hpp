// The names the metrics give the wire's collective and failure kinds (observe/collective_metrics.hpp
// lists what a task counts; net/detail/protocol.hpp what travels): one switch each way, and the
// compiler checks that both sides name every kind alike.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include <distribute/net/detail/protocol.hpp>
#include <distribute/observe/collective_metrics.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

constexpr observe::CallKind observed_kind(CollectiveKind kind) noexcept {
  switch (kind) {
    case CollectiveKind::AllReduce: return observe::CallKind::AllReduce;
    case CollectiveKind::AllGather: return observe::CallKind::AllGather;
    case CollectiveKind::Broadcast: return observe::CallKind::Broadcast;
    case CollectiveKind::Barrier: return observe::CallKind::Barrier;
    case CollectiveKind::ReduceScatter: return observe::CallKind::ReduceScatter;
    case CollectiveKind::AllToAll: return observe::CallKind::AllToAll;
  }
  return observe::CallKind::AllReduce;  // not reached: decode_descriptor admits only the kinds above
}

constexpr observe::FailureReason observed_reason(FailureKind kind) noexcept {
  switch (kind) {
    case FailureKind::Peer: return observe::FailureReason::PeerLost;
    case FailureKind::Timeout: return observe::FailureReason::Timeout;
    case FailureKind::Mismatch: return observe::FailureReason::Mismatch;
    case FailureKind::Config: return observe::FailureReason::Config;
  }
  return observe::FailureReason::PeerLost;  // not reached: decode_abort admits only the kinds above
}

static_assert([] {
  for (const CollectiveKind k : kCollectiveKinds) {
    if (to_string(k) != std::string_view(observe::kCallKindNames[static_cast<std::size_t>(observed_kind(k))])) return false;
  }
  return true;
}(), "a collective kind's name on the wire and in the metrics differ");

static_assert([] {
  std::array<bool, observe::kFailureReasons.size()> seen{};
  for (const FailureKind k : kFailureKinds) seen[static_cast<std::size_t>(observed_reason(k))] = true;
  for (const bool s : seen) {
    if (!s) return false;
  }
  return kFailureKinds.size() == seen.size();
}(), "every failure kind has its own reason in the metrics, and every reason a failure kind");

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
