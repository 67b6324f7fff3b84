// Byte buffers kept for reuse. A parameter-server step moves the same sizes again and again (a
// closure's arguments, an update's value); a fresh buffer of a MiB costs an allocation and a page
// fault per 4 KiB, and glibc hands freed ones of that size back to the kernel, so the next step
// pays again. Kept buffers cost neither.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// Spare strings of at least 64 KiB, 64 MiB of them at most (smaller ones the allocator serves
/// well). Thread-safe.
class SpareBuffers {
 public:
  /// An empty string whose capacity holds `bytes` when a spare one does (the smallest that does).
  std::string take(std::size_t bytes) {
    std::string out;
    if (bytes < kMinKept) return out;
    std::lock_guard lock(mutex_);
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->capacity() >= bytes && (best == spare_.end() || it->capacity() < best->capacity())) best = it;
    }
    if (best != spare_.end()) {
      out = std::move(*best);
      kept_ -= out.capacity();
      spare_.erase(best);
      out.clear();
    }
    return out;
  }

  void give(std::string s) {
    if (s.capacity() < kMinKept) return;
    std::lock_guard lock(mutex_);
    if (kept_ + s.capacity() > kMaxKept) return;
    kept_ += s.capacity();
    spare_.push_back(std::move(s));
  }

 private:
  static constexpr std::size_t kMinKept = std::size_t{64} << 10;
  static constexpr std::size_t kMaxKept = std::size_t{64} << 20;
  std::mutex mutex_;
  std::vector<std::string> spare_;
  std::size_t kept_ = 0;
};

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE
