// The metrics of a task's cross-worker calls (net::Communicator): by kind, calls, bytes sent and
// received and a latency histogram; connection retries; failures that broke the communicator, by
// reason. Registered once in the task's MetricsRegistry; recording is a few relaxed atomic adds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <distribute/observe/metrics.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace observe {

/// The calls a task's metrics count, by kind (net/detail/observed_kinds.hpp maps the wire's kinds here).
enum class CallKind : std::uint8_t { AllReduce, AllGather, Broadcast, Barrier, ReduceScatter, AllToAll, Send, Recv };
inline constexpr std::array<const char*, 8> kCallKindNames = {"all_reduce", "all_gather",     "broadcast",
                                                               "barrier",    "reduce_scatter", "all_to_all",
                                                               "send",       "recv"};
static_assert(kCallKindNames.size() == static_cast<std::size_t>(CallKind::Recv) + 1);
/// Why a communicator broke (net/detail/observed_kinds.hpp maps the wire's failure kinds here).
enum class FailureReason : std::uint8_t { PeerLost, Timeout, Mismatch, Config };
inline constexpr std::array<const char*, 4> kFailureReasons = {"peer_lost", "timeout", "mismatch", "config"};
static_assert(kFailureReasons.size() == static_cast<std::size_t>(FailureReason::Config) + 1);

class CollectiveMetrics {
 public:
  explicit CollectiveMetrics(std::shared_ptr<MetricsRegistry> registry) : registry_(std::move(registry)) {
    MetricsRegistry& r = *registry_;
    for (std::size_t k = 0; k < kCallKindNames.size(); ++k) {
      const Labels kind{{"kind", kCallKindNames[k]}};
      calls_[k] = &r.counter("distribute_collectives_total", "Cross-worker calls completed or failed, by kind.", kind);
      failed_[k] = &r.counter("distribute_collectives_failed_total", "Cross-worker calls that ended by an error, by kind.", kind);
      sent_[k] = &r.counter("distribute_collective_bytes_sent_total",
                            "Payload bytes this task sent to its peers (sockets or shared memory), by kind.", kind);
      received_[k] = &r.counter("distribute_collective_bytes_received_total",
                                "Payload bytes this task received from its peers (sockets or shared memory), by kind.", kind);
      latency_[k] = &r.histogram("distribute_collective_latency_seconds",
                                 "Time from a call's start to its end on this task, by kind.", kind);
    }
    retries_ = &r.counter("distribute_connect_retries_total", "Connection attempts to a peer that were retried.");
    for (std::size_t k = 0; k < kFailureReasons.size(); ++k) {
      failures_[k] = &r.counter("distribute_peer_failures_total",
                                "Failures that broke this task's communicator (the first one only: it stays broken), "
                                "by reason.",
                                {{"reason", kFailureReasons[k]}});
    }
  }

  void call(CallKind kind, double seconds, std::uint64_t sent, std::uint64_t received, bool failed) noexcept {
    const auto k = static_cast<std::size_t>(kind);
    calls_[k]->add();
    if (failed) failed_[k]->add();
    sent_[k]->add(sent);
    received_[k]->add(received);
    latency_[k]->observe(seconds);
  }
  void retry() noexcept { retries_->add(); }
  void failure(FailureReason reason) noexcept { failures_[static_cast<std::size_t>(reason)]->add(); }

  const std::shared_ptr<MetricsRegistry>& registry() const noexcept { return registry_; }

 private:
  std::shared_ptr<MetricsRegistry> registry_;
  std::array<Counter*, kCallKindNames.size()> calls_{}, failed_{}, sent_{}, received_{};
  std::array<Histogram*, kCallKindNames.size()> latency_{};
  Counter* retries_ = nullptr;
  std::array<Counter*, kFailureReasons.size()> failures_{};
};

}  // namespace observe
DISTRIBUTE_END_NAMESPACE
