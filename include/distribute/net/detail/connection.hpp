// One authenticated socket to a peer: framed, bounded reads and writes. The connection is always
// being read (so EOF, resets and heartbeats are seen whatever its owner does); each frame header
// is checked against the size limit before anything is allocated, and what a frame's payload goes
// into is the owner's choice (ConnectionOwner). Writes are queued in order and go out in
// scatter-gather batches, or straight from the calling thread when nothing is queued.
//
// A connection belongs to an owner (a communicator's mesh of peers, an RPC server or client) whose
// mutex guards its state: the methods named *_locked are called with it held. All socket I/O runs
// on the owner's event loop, except a direct send, which the calling thread makes with the mutex
// released.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <fmt/format.h>

#if defined(__unix__) || defined(__APPLE__)
#include <cerrno>
#include <sys/socket.h>
#include <sys/uio.h>
#define DISTRIBUTE_NET_DIRECT_SEND 1
#endif

#include <distribute/net/detail/connection_owner.hpp>
#include <distribute/net/detail/notifying_mutex.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/transfer.hpp>
#include <distribute/net/detail/transfer_all.hpp>
#include <distribute/net/frame.hpp>
#include <distribute/net/wire_counters.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// A payload larger than this is read in pieces so that a long frame still counts as traffic.
inline constexpr std::size_t kReadPiece = std::size_t{4} << 20;
// Payloads at least this large are padded for alignment (Connection::place_locked).
inline constexpr std::size_t kPadMinBytes = 4096;
// The most a payload read asks the kernel to gather before waking the io thread.
inline constexpr std::size_t kLowWaterMax = std::size_t{256} << 10;
// One scatter-gather write carries at most this many frames / bytes.
inline constexpr std::size_t kBatchFrames = 64;
inline constexpr std::size_t kBatchBytes = std::size_t{8} << 20;
// A growing destination (ConnectionOwner::grow_bulk) is extended by at most this much per read:
// memory follows the bytes that arrive, never the length a header claims.
inline constexpr std::size_t kGrowPiece = std::size_t{1} << 20;

inline std::string describe_error(const boost::system::error_code& ec) {
  if (ec == asio::error::eof) return "connection closed without a goodbye (the process exited or was killed)";
  if (ec == asio::error::connection_reset) return "connection reset by peer";
  if (ec == asio::error::broken_pipe) return "broken pipe (the peer closed its socket)";
  return ec.message();
}

class Connection {
 public:
  enum class State : std::uint8_t { Connecting, Open, Closed, Failed };

  Connection(ConnectionOwner& owner, NotifyingMutex& mu, asio::io_context& io, int id, std::string name,
             std::string address, std::size_t max_frame_bytes)
      : owner_(owner), mu_(mu), io_(io), id_(id), name_(std::move(name)), address_(std::move(address)),
        max_frame_bytes_(max_frame_bytes) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// The owner's number for the peer (a rank, or a client's index).
  int id() const noexcept { return id_; }
  const std::string& name() const noexcept { return name_; }
  const std::string& address() const noexcept { return address_; }

  // Guarded by the owner's mutex.
  State state = State::Connecting;
  bool is_open_locked() const noexcept { return state == State::Open; }
  /// Closed, or its read side reached EOF (or never had a socket).
  bool done_locked() const noexcept { return !socket_ || socket_done_; }
  /// Its reading has ended (an error, EOF, a malformed frame, or the socket closed): no read of
  /// it is pending.
  bool read_ended() const noexcept { return read_ended_.load(std::memory_order_acquire); }
  /// Nothing of the event loop refers to it any more (no read, write or posted handler pending):
  /// it may be destroyed.
  bool quiescent_locked() const noexcept { return read_ended() && !writing_ && !direct_sending_ && !close_posted_; }
  bool has_socket() const noexcept { return socket_.has_value() && socket_->is_open(); }
  tcp::socket& socket() { return *socket_; }

  /// Takes the authenticated socket (`handshake_bytes` of the stream already written by this side).
  void open_locked(tcp::socket socket, std::uint64_t handshake_bytes) {
    socket_.emplace(std::move(socket));
    tx_pos_ = handshake_bytes;
    state = State::Open;
    last_tx = Clock::now();
    heard_now();
  }

  /// Starts reading frames (event loop, after open_locked; the mutex released).
  void start_reading() { read_header(); }

  /// The header of the frame being read (event loop only).
  const FrameHeader& current() const noexcept { return rx_; }

  // ---- liveness -------------------------------------------------------------------------------

  void heard_now() noexcept { last_rx_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  Clock::duration silence(Clock::time_point now) const noexcept {
    return now - Clock::time_point(Clock::duration(last_rx_.load(std::memory_order_relaxed)));
  }
  /// Bytes waiting in the kernel: the peer is alive and the reader is behind.
  bool bytes_waiting() const {
    boost::system::error_code ec;
    return socket_ && socket_->available(ec) > 0 && !ec;
  }
  /// Nothing queued or being written.
  bool idle_locked() const noexcept { return !writing_ && queue_.empty(); }
  Clock::time_point last_tx{};  // guarded by the mutex

  /// The heartbeat policy of every owner (mesh, RPC server, RPC client), on its tick: a peer silent
  /// past `timeout` (0: never) with no bytes waiting to be read is lost, and its silence returned;
  /// else a heartbeat is queued when nothing was sent for half an `interval`.
  std::optional<Clock::duration> heartbeat_locked(Clock::time_point now, std::chrono::milliseconds interval,
                                                  std::chrono::milliseconds timeout) {
    const Clock::duration silent = silence(now);
    if (timeout.count() > 0 && silent > timeout && !bytes_waiting()) return silent;
    if (idle_locked() && now - last_tx >= interval / 2) enqueue_control_locked(FrameType::Heartbeat, 0, {});
    return std::nullopt;
  }

  // ---- writing --------------------------------------------------------------------------------

  void enqueue_locked(OutFrame f) {
    if (state != State::Open) {
      if (f.transfer) {
        f.transfer->state = Transfer::State::Failed;
        f.transfer->error = owner_.closed_failure_locked(*this);
      }
      return;
    }
    place_locked(f);
    queue_.push_back(std::move(f));
    if (!writing_) {
      writing_ = true;
      asio::post(io_, [this] {
        std::lock_guard lk(mu_);
        write_next_locked();
      });
    }
  }

  void enqueue_control_locked(FrameType type, std::uint64_t seq, std::vector<std::byte> payload,
                              bool half_close_after = false) {
    OutFrame f;
    f.set_header(FrameHeader{type, payload.size(), seq, 0});
    f.owned = std::move(payload);
    f.payload = f.owned.data();
    f.size = f.owned.size();
    f.half_close_after = half_close_after;
    enqueue_locked(std::move(f));
  }

  // The hot path of a send (from the calling thread): when nothing is queued or being written, this
  // thread writes the frame itself with one non-blocking sendmsg (header and payload gathered),
  // which saves waking the io thread and running its completion handler for every chunk. The mutex
  // is released around the syscall; `writing_` keeps the io thread from starting a write meanwhile
  // (frames enqueued meanwhile wait in the queue) and `direct_sending_` defers a close of the
  // socket until the syscall is over. A frame not written whole goes to the front of the queue, its
  // `sent` bytes skipped, and the io thread writes the rest (or meets the error again and handles
  // it as usual).
  void send_now_or_enqueue(std::unique_lock<NotifyingMutex>& lk, OutFrame f, bool direct = true) {
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
    if (!direct || state != State::Open || writing_ || !queue_.empty() || !socket_ || !socket_->is_open()) {
      return enqueue_locked(std::move(f));
    }
    if (!f.owned.empty()) f.payload = f.owned.data();
    place_locked(f);
    writing_ = true;
    direct_sending_ = true;
    const int fd = socket_->native_handle();
    lk.unlock();
    ::iovec iov[3];
    std::size_t parts = 0;
    for (const auto part : f.wire_parts()) {
      if (!part.empty()) iov[parts++] = ::iovec{const_cast<std::byte*>(part.data()), part.size()};
    }
    ::msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = parts;
    int flags = MSG_DONTWAIT;
#if defined(MSG_NOSIGNAL)
    flags |= MSG_NOSIGNAL;
#endif
    ::ssize_t n = 0;
    do {
      n = ::sendmsg(fd, &msg, flags);
    } while (n < 0 && errno == EINTR);
    lk.lock();
    direct_sending_ = false;
    if (close_deferred_) {
      // Sockets are closed on the io thread only, as everywhere else.
      close_deferred_ = false;
      close_posted_ = true;
      asio::post(io_, [this] {
        std::lock_guard g(mu_);
        close_posted_ = false;
        close_locked();
        mu_.notify_all_locked();
      });
    }
    last_tx = Clock::now();
    f.sent = n > 0 ? static_cast<std::size_t>(n) : 0;
    const bool whole = f.sent == f.wire_bytes();
    if (whole && f.transfer) {
      f.transfer->state = Transfer::State::Done;
      if (owner_.wake_on_progress_locked()) mu_.notify_all_locked();
    }
    if (state != State::Open) {
      // Lost or closed meanwhile: what was queued has been failed already; fail this frame too.
      writing_ = false;
      if (!whole && f.transfer) {
        f.transfer->state = Transfer::State::Failed;
        f.transfer->error = owner_.loss_locked(*this, "the connection went down during a write");
        mu_.notify_all_locked();
      }
      if (half_close_pending_) {
        half_close_pending_ = false;
        shutdown_send_locked();
      }
      return;
    }
    if (!whole) {
      // Half a frame may be on the wire: it must be finished, never dropped from the queue.
      if (f.transfer) f.transfer->state = Transfer::State::Active;
      queue_.push_front(std::move(f));
    }
    if (queue_.empty()) {
      writing_ = false;
      return;
    }
    asio::post(io_, [this] {
      std::lock_guard g(mu_);
      write_next_locked();
    });
#else
    (void)lk;
    (void)direct;
    enqueue_locked(std::move(f));
#endif
  }

  /// Fails the queued frames' transfers with `f` and drops them (they can never be written).
  void fail_queued_locked(const Failure& f) {
    for (OutFrame& frame : queue_) {
      if (frame.transfer) {
        frame.transfer->state = Transfer::State::Failed;
        frame.transfer->error = f;
      }
    }
    queue_.clear();
  }

  /// Takes a frame that has not started out of the queue (its call is being abandoned).
  void unqueue_locked(const TransferPtr& t) {
    std::erase_if(queue_, [&](const OutFrame& f) { return f.transfer == t; });
  }

  // ---- closing --------------------------------------------------------------------------------

  /// Ends our sending side once what is being written is out (the peer said goodbye: both ends
  /// then close with empty receive buffers, and a close with unread data would reset the stream).
  void half_close_when_written_locked() {
    if (writing_) {
      half_close_pending_ = true;
    } else {
      shutdown_send_locked();
    }
  }

  void shutdown_send_locked() {
    boost::system::error_code ignored;
    if (socket_ && socket_->is_open()) socket_->shutdown(tcp::socket::shutdown_send, ignored);
  }

  void close_locked() {
    if (direct_sending_) {
      close_deferred_ = true;  // the calling thread is in sendmsg on it: it closes it after
      return;
    }
    boost::system::error_code ignored;
    if (socket_ && socket_->is_open()) {
      socket_->shutdown(tcp::socket::shutdown_both, ignored);
      socket_->close(ignored);
    }
    socket_done_ = true;
  }

 private:
  // ---- reading (event loop only) ---------------------------------------------------------------

  // Reads the tail of the frame just handled (rx_; none before the first) with the next header.
  void read_header() {
    const std::array<asio::mutable_buffer, 2> into{asio::buffer(rx_pad_.data(), rx_.tail), asio::buffer(rx_header_)};
    asio::async_read(*socket_, into, [this](const boost::system::error_code& ec, std::size_t) { on_header(ec); });
  }

  void on_header(const boost::system::error_code& ec) {
    if (ec) return read_failed(ec);
    heard_now();
    try {
      rx_ = decode_header(rx_header_, max_frame_bytes_);
      wire_counters().received.fetch_add(kFrameHeaderBytes + rx_.pad + rx_.length + rx_.tail, std::memory_order_relaxed);
    } catch (const FrameError& e) {
      return malformed(e.what());
    }
    switch (owner_.intake(*this, rx_.type)) {
      case FrameIntake::Heartbeat: return read_header();
      case FrameIntake::Goodbye:
        owner_.on_goodbye(*this);
        return read_header();
      case FrameIntake::Control:
        rx_control_.resize(static_cast<std::size_t>(rx_.length));
        asio::async_read(*socket_, asio::buffer(rx_control_),
                         [this](const boost::system::error_code& ec2, std::size_t) { on_control(ec2); });
        return;
      case FrameIntake::Bulk:
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
        return start_payload();  // read_payload reads the padding in the same call as the payload
#else
        if (rx_.pad == 0) return start_payload();
        asio::async_read(*socket_, asio::buffer(rx_pad_.data(), rx_.pad), [this](const boost::system::error_code& ec2, std::size_t) {
          if (ec2) return read_failed(ec2);
          start_payload();
        });
        return;
#endif
      case FrameIntake::Refuse: break;
    }
    malformed(fmt::format("unexpected {} frame after the handshake", to_string(rx_.type)));
  }

  void on_control(const boost::system::error_code& ec) {
    if (ec) return read_failed(ec);
    heard_now();
    try {
      owner_.on_control(*this, rx_, rx_control_);
    } catch (const FrameError& e) {
      return malformed(e.what());
    }
    read_header();
  }

  void start_payload() {
    try {
      rx_dst_ = owner_.begin_bulk(*this, rx_);
      rx_room_ = rx_dst_ != nullptr ? static_cast<std::size_t>(rx_.length) : 0;
    } catch (const FrameError& e) {
      return malformed(e.what());
    }
    rx_done_ = 0;
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
    rx_pad_left_ = rx_.pad;
#endif
    read_payload();
  }

  // Makes room for the next piece of a growing destination; false when the connection failed.
  bool make_room() {
    const auto length = static_cast<std::size_t>(rx_.length);
    if (rx_done_ < rx_room_ || rx_room_ == length) return true;
    try {
      const std::size_t want = rx_room_ + std::min(kGrowPiece, length - rx_room_);
      rx_dst_ = owner_.grow_bulk(*this, want);
      rx_room_ = want;
    } catch (const FrameError& e) {
      malformed(e.what());
      return false;
    }
    return true;
  }

  void read_payload() {
    const auto length = static_cast<std::size_t>(rx_.length);
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
    // Reads what is there; when the rest has not arrived, raises the socket's receive low-water
    // mark to the rest (at most kLowWaterMax) before waiting, so that the io thread wakes once
    // for much of a large frame instead of once per loopback segment (64 KiB). The kernel still
    // reports EOF, errors and a nearly closed receive window at once.
    const int fd = socket_->native_handle();
    for (;;) {
      const std::size_t rest = length - rx_done_;
      if (rest == 0 && rx_pad_left_ == 0) {
        if (rx_low_water_) set_low_water(1);
        return end_payload();
      }
      if (!make_room()) return;
      const std::size_t piece = std::min(kReadPiece, rx_room_ - rx_done_);
      ::ssize_t got = 0;
      if (rx_pad_left_ == 0) {
        got = ::recv(fd, rx_dst_ + rx_done_, piece, MSG_DONTWAIT);
      } else {
        std::array<::iovec, 2> iov{::iovec{rx_pad_.data() + (rx_.pad - rx_pad_left_), rx_pad_left_},
                                   ::iovec{rx_dst_ + rx_done_, piece}};
        ::msghdr msg{};
        msg.msg_iov = iov.data();
        msg.msg_iovlen = piece > 0 ? 2 : 1;
        got = ::recvmsg(fd, &msg, MSG_DONTWAIT);
      }
      if (got > 0) {
        heard_now();
        const std::size_t pad = std::min(static_cast<std::size_t>(got), rx_pad_left_);
        rx_pad_left_ -= pad;
        rx_done_ += static_cast<std::size_t>(got) - pad;
        continue;
      }
      if (got == 0) return read_failed(asio::error::eof);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return read_failed(boost::system::error_code(errno, asio::error::get_system_category()));
      }
      const std::size_t want = std::min(rest + rx_pad_left_, kLowWaterMax);
      if (want > 1 || rx_low_water_) set_low_water(want);
      socket_->async_wait(tcp::socket::wait_read, [this](const boost::system::error_code& ec) {
        if (ec) return read_failed(ec);
        read_payload();
      });
      return;
    }
#else
    if (rx_done_ == length) return end_payload();
    if (!make_room()) return;
    const std::size_t n = std::min(kReadPiece, rx_room_ - rx_done_);
    asio::async_read(*socket_, asio::buffer(rx_dst_ + rx_done_, n), [this](const boost::system::error_code& ec, std::size_t got) {
      if (ec) return read_failed(ec);
      heard_now();
      rx_done_ += got;
      read_payload();
    });
#endif
  }

#if defined(DISTRIBUTE_NET_DIRECT_SEND)
  void set_low_water(std::size_t bytes) {
    const int v = static_cast<int>(bytes);
    // Best effort: where it is refused, reads just wake more often.
    (void)::setsockopt(socket_->native_handle(), SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
    rx_low_water_ = bytes > 1;
  }
#endif

  void end_payload() {
    owner_.end_bulk(*this);
    read_header();
  }

  void read_failed(const boost::system::error_code& ec) {
    owner_.on_read_failed(*this, describe_error(ec), false);
    end_read();
  }
  void malformed(const std::string& what) {
    owner_.on_read_failed(*this, what, true);
    end_read();
  }
  // After the owner's handler, under the owner's mutex, and the last thing this connection does: an
  // owner waiting for its connections to end their reads (a destructor) may free this connection and
  // itself as soon as it sees the flag. No notification, whose wake-up would touch the mutex after its
  // release: such a wait polls.
  void end_read() {
    const std::lock_guard g(mu_);
    read_ended_.store(true, std::memory_order_release);
  }

  // ---- writing (the mutex held) ------------------------------------------------------------------

  // Gives `f` its place in the stream, in the order frames are written. The kernel copies socket
  // data into pages that it fills in stream order, and a copy whose source and destination are
  // aligned alike mod 64 runs up to 20x faster on some CPUs (docs/performance.md). So a bulk
  // payload is padded in front until its stream position is congruent to its address, and every
  // frame gets a tail that ends it on a multiple of 64. The tail matters because the kernel's page
  // belongs to the writing thread, not the socket, and starts again at offset 0 whenever the
  // reader has freed it: both happen between frames, and with every frame ending aligned they
  // leave page offset and stream position congruent. Small payloads are not worth a front pad.
  void place_locked(OutFrame& f) {
    FrameHeader h = f.fields;
    if (may_pad(h.type) && f.size >= kPadMinBytes) {
      const auto address = reinterpret_cast<std::uintptr_t>(f.payload);
      h.pad = static_cast<std::uint8_t>((address - (tx_pos_ + kFrameHeaderBytes)) % kMaxFramePad);
    }
    h.tail = static_cast<std::uint8_t>((kMaxFramePad - (tx_pos_ + kFrameHeaderBytes + h.pad + f.size) % kMaxFramePad) % kMaxFramePad);
    if (h.pad != f.fields.pad || h.tail != f.fields.tail) f.set_header(h);
    tx_pos_ += f.wire_bytes();
    wire_counters().sent.fetch_add(f.wire_bytes(), std::memory_order_relaxed);
  }

  static constexpr bool may_pad(FrameType t) noexcept { return bulk_frame(t); }

  void write_next_locked() {
    if (state != State::Open || queue_.empty() || !socket_) {
      writing_ = false;
      return;
    }
    batch_.clear();
    buffers_.clear();
    std::size_t bytes = 0;
    while (!queue_.empty() && batch_.size() < kBatchFrames && (batch_.empty() || bytes < kBatchBytes)) {
      bytes += queue_.front().wire_bytes();
      batch_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    for (OutFrame& f : batch_) {
      if (f.transfer) f.transfer->state = Transfer::State::Active;
      // Owned payloads moved with their frame; re-point at their (unchanged) heap buffer.
      if (!f.owned.empty()) f.payload = f.owned.data();
      // A direct send may have written the start of the first frame.
      std::size_t written = f.sent;
      for (const auto part : f.wire_parts()) {
        const std::size_t skip = std::min(written, part.size());
        written -= skip;
        if (part.size() > skip) buffers_.push_back(asio::buffer(part.data() + skip, part.size() - skip));
      }
    }
    last_tx = Clock::now();
    asio::async_write(*socket_, buffers_, TransferAllUncapped{},
                      [this](const boost::system::error_code& ec, std::size_t) { on_written(ec); });
  }

  void on_written(const boost::system::error_code& ec) {
    std::lock_guard lk(mu_);
    bool half_close = false;
    for (OutFrame& f : batch_) {
      half_close = half_close || f.half_close_after;
      if (!f.transfer) continue;
      if (ec) {
        f.transfer->state = Transfer::State::Failed;
        f.transfer->error = owner_.loss_locked(*this, describe_error(ec));
      } else {
        f.transfer->state = Transfer::State::Done;
      }
    }
    batch_.clear();
    if (ec || owner_.wake_on_progress_locked()) mu_.notify_all_locked();
    if (ec) {
      writing_ = false;
      owner_.on_write_failed_locked(*this, describe_error(ec));
      return;
    }
    if (half_close || half_close_pending_) {
      half_close_pending_ = false;
      writing_ = false;
      shutdown_send_locked();
      return;
    }
    write_next_locked();
  }

  ConnectionOwner& owner_;
  NotifyingMutex& mu_;
  asio::io_context& io_;
  int id_;
  std::string name_;
  std::string address_;
  std::size_t max_frame_bytes_;
  std::optional<tcp::socket> socket_;
  bool socket_done_ = false;  // closed, or its read side reached EOF
  // Writing (the mutex held).
  std::deque<OutFrame> queue_;
  std::vector<OutFrame> batch_;
  std::vector<asio::const_buffer> buffers_;
  bool writing_ = false;
  bool half_close_pending_ = false;
  bool direct_sending_ = false;  // the calling thread is writing on the socket (mutex released)
  bool close_deferred_ = false;  // close_locked was called meanwhile: close once that write returns
  bool close_posted_ = false;    // that close is posted to the io thread, not run yet
  std::uint64_t tx_pos_ = 0;     // bytes of the stream given to frames so far (handshake included)
  // Reading (event loop only).
  HeaderBytes rx_header_{};
  std::array<std::byte, kMaxFramePad> rx_pad_{};  // a frame's padding (before and after its payload) is read into this
  FrameHeader rx_{};
  std::vector<std::byte> rx_control_;
  std::byte* rx_dst_ = nullptr;
  std::size_t rx_room_ = 0;      // bytes of rx_dst_ that may be written
  std::size_t rx_done_ = 0;
  std::size_t rx_pad_left_ = 0;  // front padding not read yet (read together with the payload)
  bool rx_low_water_ = false;    // SO_RCVLOWAT is raised for the payload being read
  std::atomic<bool> read_ended_{false};
  // When a byte last arrived; written by the event loop, read for heartbeats and timeout messages.
  std::atomic<Clock::rep> last_rx_{0};
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
