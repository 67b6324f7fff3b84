// What a call hands to a connection and gets back: one send or receive of a frame into or out of
// the caller's memory (Transfer), a frame waiting to be written (OutFrame), and buffers for frames
// that arrive before their receive is posted (Blob, BlobPool).
#pragma once

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/frame.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// How incoming frames find their receive.
struct MsgKey {
  FrameType type = FrameType::Data;
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  friend auto operator<=>(const MsgKey&, const MsgKey&) = default;
};

/// A buffer for a frame that arrived before its receive was posted (not zero-filled: it is
/// overwritten by the read at once). Spent ones are kept for reuse (BlobPool).
struct Blob {
  std::unique_ptr<std::byte[]> data;
  std::size_t size = 0;
  std::size_t capacity = 0;
};

/// Spent early-frame buffers kept for the next early frame. Early frames come in runs of one chunk
/// size (a peer running ahead), and a fresh allocation of a chunk costs an mmap, a page fault per
/// 4 KiB and an munmap each time: most of what an early frame cost. Guarded by its owner's mutex.
class BlobPool {
 public:
  /// A spare buffer of at least `size` bytes, or an empty Blob (the caller allocates).
  Blob take(std::size_t size) {
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->capacity >= size && (best == spare_.end() || it->capacity < best->capacity)) best = it;
    }
    if (best == spare_.end()) return {};
    Blob b = std::move(*best);
    spare_.erase(best);
    bytes_ -= b.capacity;
    b.size = size;
    return b;
  }
  void give(Blob b) {
    if (!b.data || b.capacity > kMaxBlob || bytes_ + b.capacity > kMaxBytes) return;
    bytes_ += b.capacity;
    spare_.push_back(std::move(b));
  }
  std::size_t spare_bytes() const noexcept { return bytes_; }

  static constexpr std::size_t kMaxBlob = std::size_t{4} << 20;   // larger ones are freed
  static constexpr std::size_t kMaxBytes = std::size_t{32} << 20;  // spares kept in all

 private:
  std::vector<Blob> spare_;
  std::size_t bytes_ = 0;
};

/// One send or receive; shared between the calling thread and the io thread, guarded by the
/// owner's mutex.
struct Transfer {
  enum class State : std::uint8_t {
    Queued,  // send: in the connection's queue; receive: posted, nothing arrived yet
    Active,  // the io thread is writing from / reading into the caller's memory
    Done,
    Failed
  };
  State state = State::Queued;
  bool is_send = false;
  int peer = -1;
  MsgKey key{};
  std::byte* dst = nullptr;  // receive destination
  std::size_t size = 0;
  Failure error;  // when Failed
  // A receive's continuation: run by the thread that completes the receive (usually the io
  // thread, right after reading the frame), without the mutex, before the receive counts as Done.
  // It lets an algorithm reduce and pass a chunk on without waking the calling thread per chunk;
  // it returns true when the thread waiting in Call::wait_until should look again.
  std::function<bool()> on_arrival;
};
using TransferPtr = std::shared_ptr<Transfer>;

/// What a frame's tail is written from (zero bytes).
inline constexpr std::array<std::byte, kMaxFramePad> kZeroTail{};

struct OutFrame {
  FrameHeader fields;
  // The header, then fields.pad zero bytes: what goes out before the payload.
  std::array<std::byte, kFrameHeaderBytes + kMaxFramePad> head{};
  std::size_t head_len = kFrameHeaderBytes;
  void set_header(const FrameHeader& h) {
    fields = h;
    const HeaderBytes bytes = encode_header(h);
    std::copy(bytes.begin(), bytes.end(), head.begin());
    head_len = kFrameHeaderBytes + h.pad;
  }
  const std::byte* payload = nullptr;
  std::size_t size = 0;
  /// What goes on the wire, in order: header and front padding, payload, tail.
  std::array<std::span<const std::byte>, 3> wire_parts() const noexcept {
    return {std::span<const std::byte>(head.data(), head_len), std::span<const std::byte>(payload, size),
            std::span<const std::byte>(kZeroTail.data(), fields.tail)};
  }
  std::size_t wire_bytes() const noexcept { return head_len + size + fields.tail; }
  std::vector<std::byte> owned;  // control payloads travel with their frame
  TransferPtr transfer;          // null for control frames
  bool half_close_after = false;  // goodbye: shut our sending side once it is written
  std::size_t sent = 0;           // bytes (header first) already written by a direct send
};

/// Adds `by` to a counter for the life of the object (an int guarded by a mutex, or an atomic).
template <class Counter>
class ScopedCount {
 public:
  ScopedCount(Counter& counter, int by) noexcept : counter_(counter), by_(by) { counter_ += by_; }
  ~ScopedCount() { counter_ -= by_; }
  ScopedCount(const ScopedCount&) = delete;
  ScopedCount& operator=(const ScopedCount&) = delete;

 private:
  Counter& counter_;
  int by_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
