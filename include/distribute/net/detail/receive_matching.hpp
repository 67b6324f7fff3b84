// Matching incoming frames to the receives calls post, for every connection of a mesh: receives
// are matched by (type, sequence, tag); a frame whose receive is already posted is read straight
// into the caller's buffer; an early one is buffered (in a pooled buffer) until its receive is
// posted. A receive may carry a continuation that runs as soon as the frame is in (reduce, send
// on, post the next receive), so a pipelined collective does not wake the calling thread for every
// chunk. The lists themselves are each Peer's (peer.hpp); this holds what they share.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <distribute/net/detail/notifying_mutex.hpp>
#include <distribute/net/detail/peer.hpp>
#include <distribute/net/detail/transfer.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class ReceiveMatching {
 public:
  /// `mu`: the mesh's mutex, which guards the peers' lists; `progress_waiters`: how many threads
  /// want waking whenever a receive completes (the mesh's count).
  ReceiveMatching(NotifyingMutex& mu, const int& progress_waiters) noexcept : mu_(mu), progress_waiters_(progress_waiters) {}

  /// Posts the receive `t` from `p` (its key, destination and size set; `p2p`: its key's sequence
  /// becomes the number of the next message from `p`). A frame that came before it is copied in
  /// now, the mutex released meanwhile, and the receive completes (continuation included); a
  /// frame of another size fails it with a mismatch. Returns false, posting nothing, when no frame
  /// came and `p`'s connection is not open. `me`: this rank's name, for messages.
  bool post_locked(std::unique_lock<NotifyingMutex>& lk, Peer& p, const TransferPtr& t, bool p2p, const std::string& me) {
    if (p2p) t->key.seq = p.p2p_received++;
    Blob early;
    if (!p.take_early_locked(t->key, early)) {
      if (p.state() != Connection::State::Open) return false;
      p.posted[t->key].push_back(t);
      return true;
    }
    if (early.size != t->size) {
      t->state = Transfer::State::Failed;
      t->error = Failure{FailureKind::Mismatch, p.size_mismatch(early.size, t->size, t->key, me)};
      mu_.notify_all_locked();  // posted by a continuation, the caller waits in wait_until
      return true;
    }
    t->state = Transfer::State::Active;  // an abandoning call waits for the copy and the continuation
    lk.unlock();
    if (early.size > 0) std::memcpy(t->dst, early.data.get(), early.size);
    lk.lock();
    blobs_.give(std::move(early));
    complete_locked(lk, t, me);
    return true;
  }

  /// A data frame from `p` begins (io thread): where its payload goes, the posted receive's
  /// buffer or a buffer of its own.
  std::byte* begin_frame(Peer& p, const FrameHeader& h, const std::string& me) {
    const MsgKey key{h.type, h.seq, h.tag};
    const auto length = static_cast<std::size_t>(h.length);
    bool keep = true;
    {
      std::lock_guard lk(mu_);
      p.rx_transfer.reset();
      if (TransferPtr t = p.take_posted_locked(key)) {
        if (t->size == length) {
          t->state = Transfer::State::Active;
          p.rx_transfer = std::move(t);
          return p.rx_transfer->dst;
        }
        t->state = Transfer::State::Failed;
        t->error = Failure{FailureKind::Mismatch, p.size_mismatch(length, t->size, key, me)};
        keep = false;  // read and drop it: the stream stays in step
        mu_.notify_all_locked();
      }
    }
    try {
      {
        std::lock_guard lk(mu_);
        p.rx_blob = blobs_.take(length);
      }
      if (!p.rx_blob.data) p.rx_blob = Blob{std::make_unique_for_overwrite<std::byte[]>(length), length, length};
    } catch (const std::bad_alloc&) {
      throw FrameError(fmt::format("cannot buffer a frame of {} bytes: out of memory", length));
    }
    p.rx_keep = keep;
    return p.rx_blob.data.get();
  }

  /// The data frame from `p` whose header is `h` is in (io thread): completes its receive, hands
  /// it to a receive posted meanwhile, or keeps it until one is.
  void end_frame(Peer& p, const FrameHeader& h, const std::string& me) {
    std::unique_lock lk(mu_);
    if (p.rx_transfer) {
      const TransferPtr t = std::move(p.rx_transfer);  // leaves rx_transfer empty
      complete_locked(lk, t, me);
    } else if (p.rx_keep) {
      // Its receive may have been posted while the frame was arriving: hand it over now.
      const MsgKey key{h.type, h.seq, h.tag};
      TransferPtr t = p.take_posted_locked(key);
      if (!t) {
        p.unexpected[key].push_back(std::move(p.rx_blob));
      } else if (t->size == p.rx_blob.size) {
        t->state = Transfer::State::Active;
        lk.unlock();
        if (t->size > 0) std::memcpy(t->dst, p.rx_blob.data.get(), t->size);
        lk.lock();
        complete_locked(lk, t, me);
      } else {
        t->state = Transfer::State::Failed;
        t->error = Failure{FailureKind::Mismatch, p.size_mismatch(p.rx_blob.size, t->size, key, me)};
        mu_.notify_all_locked();
      }
    }
    blobs_.give(std::move(p.rx_blob));
    p.rx_blob = Blob{};
  }

  /// A receive's bytes are in place (state Active, `lk` held): runs its continuation, if any, with
  /// the mutex released, then marks it Done. A continuation that throws fails the receive, and
  /// with it the collective.
  void complete_locked(std::unique_lock<NotifyingMutex>& lk, const TransferPtr& t, const std::string& me) {
    bool wake = progress_waiters_ > 0;
    if (t->on_arrival) {
      const std::function<bool()> next = std::move(t->on_arrival);
      t->on_arrival = nullptr;
      std::optional<std::string> error;
      lk.unlock();
      try {
        wake = next() || wake;
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown exception";
      }
      lk.lock();
      if (error) {
        t->state = Transfer::State::Failed;
        t->error = Failure{FailureKind::Peer, fmt::format("{} failed while passing on received data: {}", me, *error)};
        mu_.notify_all_locked();
        return;
      }
    }
    t->state = Transfer::State::Done;
    if (wake || progress_waiters_ > 0) mu_.notify_all_locked();
  }

 private:
  NotifyingMutex& mu_;
  const int& progress_waiters_;
  BlobPool blobs_;  // early frames' buffers, reused
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
