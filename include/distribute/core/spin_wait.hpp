// Waiting for another thread's write to an atomic: spin with the pause hint (a few microseconds
// when every waiter has a core of its own), then yield, then block in std::atomic::wait. A step
// of a replica group, the replica threads' start and end of a step.
#pragma once

#include <atomic>
#include <thread>

#include <distribute/core/cpu_relax.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

class SpinThenWait {
 public:
  /// Yields after the spins, before blocking.
  static constexpr unsigned kYields = 16;

  explicit SpinThenWait(unsigned spin_limit) noexcept : spin_limit_(spin_limit) {}

  /// One pause of a loop that waits for `a` to change from `seen` (the value it last loaded).
  template <class T>
  void pause(const std::atomic<T>& a, T seen) noexcept {
    if (spins_ < spin_limit_) {
      ++spins_;
      cpu_relax();
    } else if (spins_ < spin_limit_ + kYields) {
      ++spins_;
      std::this_thread::yield();
    } else {
      a.wait(seen, std::memory_order_acquire);
    }
  }

 private:
  const unsigned spin_limit_;
  unsigned spins_ = 0;
};

}  // namespace core
DISTRIBUTE_END_NAMESPACE
