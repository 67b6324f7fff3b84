// What one cross-worker call tells the metrics and the timeline: its kind, the algorithm it took,
// the bytes it moved, how long it took and, for a collective of the TCP transport, how much of that
// it waited for its peers to announce the same call (a straggler shows there). The TCP transport
// (net/detail/call.hpp) and NCCL (collective/nccl.hpp) record their calls through it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/observe/collective_metrics.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace observe {

class CallObservation {
 public:
  /// `observed` false: never observed (the transport's own set-up messages).
  explicit CallObservation(CallKind kind, bool observed = true) noexcept : kind_(kind), observed_(observed) {}

  /// Starts the clock if anyone looks (metrics, or the timeline). Off, observing costs this branch
  /// and the plain adds of count().
  void begin(const CollectiveMetrics* metrics) noexcept {
    if (observed_ && (metrics != nullptr || timeline_enabled())) start_ns_ = Timeline::now_ns();
  }
  bool active() const noexcept { return start_ns_ != 0; }

  void set_algorithm(const char* name) noexcept { algorithm_ = name; }
  void count(std::size_t sent, std::size_t received) noexcept {
    sent_ += sent;
    received_ += received;
  }
  std::size_t sent() const noexcept { return sent_; }
  std::size_t received() const noexcept { return received_; }

  /// A peer's announcement of this collective was seen at `ns`: waiting for peers ends at the last.
  void joined_at(std::int64_t ns) noexcept {
    if (active()) joined_ns_ = std::max(joined_ns_, ns);
  }

  /// The call's end, into the metrics and the timeline; call it once, when active(). `seq`: the
  /// collective's number, -1 for point to point; `bytes`: its payload; `error`: why it failed. A
  /// failed call also writes the timeline out at once: the process may not get to exit normally.
  void report(CollectiveMetrics* metrics, std::int64_t seq, std::size_t bytes, bool failed,
              std::string_view error) const noexcept {
    const std::int64_t end = Timeline::now_ns();
    try {
      if (metrics) metrics->call(kind_, static_cast<double>(end - start_ns_) / 1e9, sent_, received_, failed);
      if (!timeline_enabled()) return;
      const bool waited = seq >= 0 && joined_ns_ != 0;
      const std::int64_t joined = joined_ns_ == 0 ? end : std::clamp(joined_ns_, start_ns_, end);
      CallArgs args;
      args.seq = seq;
      args.bytes = bytes;
      args.sent = sent_;
      args.received = received_;
      args.algorithm = algorithm_;
      if (waited) args.wait_ns = joined - start_ns_;
      auto& tl = Timeline::instance();
      const char* name = kCallKindNames[static_cast<std::size_t>(kind_)];
      tl.call(name, start_ns_, end, args,
              failed ? fmt::format("\"error\":\"{}\"", json_escape(error)) : std::string());
      if (waited) {
        if (joined > start_ns_) tl.complete("wait for peers", "collective", start_ns_, joined);
        if (end > joined) tl.complete("transfer", "collective", joined, end);
      }
      if (failed) {
        tl.instant(fmt::format("{} failed", name), "failure", end,
                   fmt::format("\"error\":\"{}\"", json_escape(error)));
        tl.flush();
      }
    } catch (...) {
      // Observing must never turn a call's outcome into another error.
    }
  }

 private:
  CallKind kind_;
  bool observed_;
  const char* algorithm_ = nullptr;
  std::int64_t start_ns_ = 0;   // 0: not observed
  std::int64_t joined_ns_ = 0;  // when the last peer's announcement was seen (timeline only)
  std::size_t sent_ = 0, received_ = 0;
};

/// A call observed from its start to its end, where nothing else keeps the observation: finish()
/// reports it done, leaving by an exception reports it failed, skip() drops it (another layer
/// observes the call instead).
class ObservedCall {
 public:
  /// `observed` false (or neither metrics nor the timeline on): records nothing.
  ObservedCall(CollectiveMetrics* metrics, CallKind kind, bool observed, std::int64_t seq, std::size_t bytes,
               const char* algorithm) noexcept
      : metrics_(metrics), observation_(kind, observed), seq_(seq), bytes_(bytes) {
    observation_.begin(metrics);
    observation_.set_algorithm(algorithm);
    observation_.count(bytes, bytes);
  }
  ObservedCall(const ObservedCall&) = delete;
  ObservedCall& operator=(const ObservedCall&) = delete;
  ~ObservedCall() { end(true); }

  void finish() noexcept { end(false); }
  void skip() noexcept { pending_ = false; }

 private:
  void end(bool failed) noexcept {
    if (!pending_ || !observation_.active()) return;
    pending_ = false;
    observation_.report(metrics_, seq_, bytes_, failed, failed ? "ended by an error" : "");
  }

  CollectiveMetrics* metrics_;
  CallObservation observation_;
  std::int64_t seq_;
  std::size_t bytes_;
  bool pending_ = true;
};

}  // namespace observe
DISTRIBUTE_END_NAMESPACE
