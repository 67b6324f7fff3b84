// The TCP transport under the Communicator: one authenticated socket per peer (a full mesh, so every
// rank hears at once when any rank dies), an Asio io_context on a background thread doing all
// socket I/O, and a calling thread that posts sends and receives and waits for them.
//
// Sends are zero-copy: a frame's header and the caller's memory go out in one scatter-gather write.
// Receives are matched by (type, sequence, tag): a frame whose receive is already posted is read
// straight into the caller's buffer; an early one is buffered until its receive is posted. Every
// socket is always being read, so EOF, resets and heartbeats are seen whatever the caller does.
// A receive may carry a continuation that the io thread runs as soon as the frame is in (reduce,
// send on, post the next receive), so a pipelined collective does not wake the calling thread for
// every chunk.
//
// The first failure (a peer lost, a timeout, mismatched collectives) poisons the transport: it is
// sent to every peer in an Abort frame, and every later operation throws it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
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

#include <distribute/core/error.hpp>
#include <distribute/net/detail/address.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/congestion_control.hpp>
#include <distribute/net/detail/notifying_mutex.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/shared_memory_all_reduce.hpp>
#include <distribute/net/detail/transfer_all.hpp>
#include <distribute/net/frame.hpp>
#include <distribute/net/options.hpp>
#include <distribute/observe/collective_metrics.hpp>
#include <distribute/observe/timeline.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

/// How incoming frames find their receive.
struct MsgKey {
  FrameType type = FrameType::Data;
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  friend auto operator<=>(const MsgKey&, const MsgKey&) = default;
};

/// A buffer for a frame that arrived before its receive was posted (not zero-filled: it is
/// overwritten by the read at once). Spent ones are kept for reuse (Transport::BlobPool).
struct Blob {
  std::unique_ptr<std::byte[]> data;
  std::size_t size = 0;
  std::size_t capacity = 0;
};

/// Spent early-frame buffers kept for the next early frame. Early frames come in runs of one chunk
/// size (a peer running ahead), and a fresh allocation of a chunk costs an mmap, a page fault per
/// 4 KiB and an munmap each time: most of what an early frame cost. Guarded by the transport's mutex.
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
/// transport's mutex.
struct Transfer {
  enum class State : std::uint8_t {
    Queued,  // send: in the peer's queue; receive: posted, nothing arrived yet
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
  // it returns true when the thread waiting in Op::wait_until should look again.
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

struct Peer {
  enum class State : std::uint8_t { Connecting, Open, Closed, Failed };
  int rank = -1;
  std::string name;
  std::string address;
  HostPort endpoint;
  State state = State::Connecting;
  bool claimed = false;  // an accepted handshake is completing for this rank
  std::optional<tcp::socket> socket;
  bool socket_done = false;  // closed, or its read side reached EOF
  // Connecting to ranks below ours.
  std::optional<asio::steady_timer> retry_timer;
  std::chrono::milliseconds backoff{1};
  std::string last_error = "no attempt yet";
  // Writing.
  std::deque<OutFrame> queue;
  std::vector<OutFrame> batch;
  std::vector<asio::const_buffer> buffers;
  bool writing = false;
  bool half_close_pending = false;
  bool direct_sending = false;  // the calling thread is writing on the socket (mutex released)
  bool close_deferred = false;  // close_socket was called meanwhile: close once that write returns
  // Reading (io thread only).
  HeaderBytes rx_header{};
  std::array<std::byte, kMaxFramePad> rx_pad{};  // a frame's padding (before and after its payload) is read into this
  std::uint64_t tx_pos = 0;  // bytes of the stream given to frames so far (handshake included)
  FrameHeader rx{};
  std::vector<std::byte> rx_control;
  TransferPtr rx_transfer;
  Blob rx_blob;
  bool rx_keep = false;
  std::byte* rx_dst = nullptr;
  std::size_t rx_done = 0;
  std::size_t rx_pad_left = 0;  // front padding not read yet (read together with the payload)
  bool rx_low_water = false;  // SO_RCVLOWAT is raised for the payload being read
  // When a byte last arrived; written by the io thread, read for heartbeats and timeout messages.
  std::atomic<Clock::rep> last_rx{0};
  Clock::time_point last_tx{};

  void heard_now() noexcept { last_rx.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  Clock::duration silence(Clock::time_point now) const noexcept {
    return now - Clock::time_point(Clock::duration(last_rx.load(std::memory_order_relaxed)));
  }
  // Matching (guarded by the mutex).
  std::map<MsgKey, std::deque<TransferPtr>> posted;
  std::map<MsgKey, std::deque<Blob>> unexpected;
  std::map<std::uint64_t, Descriptor> descriptors;
  // When each of those arrived: kept only while the timeline records (waiting vs moving data).
  std::map<std::uint64_t, Clock::time_point> descriptor_at;
  std::uint64_t p2p_sent = 0;
  std::uint64_t p2p_received = 0;
};

struct Handshake {
  explicit Handshake(asio::io_context& io) : socket(io), timer(io) {}
  explicit Handshake(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
  tcp::socket socket;
  asio::steady_timer timer;
  HeaderBytes header{};
  std::vector<std::byte> in;
  std::vector<std::byte> out;
  Nonce nonce{};
  Nonce peer_nonce{};
  int peer = -1;
  std::string remote;
  bool timed_out = false;
  bool finished = false;
  std::uint64_t written = 0;  // bytes this side wrote during the handshake
  std::shared_ptr<void> pending;  // acceptor side: counts against max_pending_connections until reset
};

// A payload larger than this is read in pieces so that a long frame still counts as traffic.
inline constexpr std::size_t kReadPiece = std::size_t{4} << 20;
// Payloads at least this large are padded for alignment (place_locked).
inline constexpr std::size_t kPadMinBytes = 4096;
// The most a payload read asks the kernel to gather before waking the io thread.
inline constexpr std::size_t kLowWaterMax = std::size_t{256} << 10;
// One scatter-gather write carries at most this many frames / bytes.
inline constexpr std::size_t kBatchFrames = 64;
inline constexpr std::size_t kBatchBytes = std::size_t{8} << 20;
// After an error, how long in-flight I/O on the caller's memory may finish before its socket is cut.
inline constexpr std::chrono::milliseconds kAbandonGrace{500};
// The longest wait between two connection attempts to a peer that is not listening yet.
inline constexpr std::chrono::milliseconds kMaxConnectBackoff{50};
// How long a clean shutdown waits for goodbyes to be written and answered.
inline constexpr std::chrono::milliseconds kShutdownGrace{2000};

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

class Transport {
 public:
  class Op;

  Transport(std::vector<std::string> addresses, int rank, CommunicatorOptions options,
            std::vector<std::string> task_names)
      : options_(std::move(options)), rank_(rank), size_(static_cast<int>(addresses.size())) {
    if (addresses.empty()) throw InvalidArgument("Communicator: the address list is empty");
    if (rank < 0 || rank >= size_) {
      throw InvalidArgument(fmt::format("Communicator: rank {} is out of range for {} addresses", rank, size_));
    }
    if (!task_names.empty() && task_names.size() != addresses.size()) {
      throw InvalidArgument(fmt::format("Communicator: {} task names given for {} addresses", task_names.size(),
                                        addresses.size()));
    }
    if (options_.chunk_bytes == 0) throw InvalidArgument("Communicator: chunk_bytes must be positive, got 0");
    if (options_.max_frame_bytes < 4096) {
      throw InvalidArgument(fmt::format("Communicator: max_frame_bytes must be at least 4096, got {}", options_.max_frame_bytes));
    }
    if (options_.heartbeat_interval.count() <= 0) {
      throw InvalidArgument(fmt::format("Communicator: heartbeat_interval must be positive, got {} ms",
                                        options_.heartbeat_interval.count()));
    }
    chunk_bytes_ = std::min(options_.chunk_bytes, options_.max_frame_bytes);
    token_ = effective_cluster_token(options_.cluster_token);
    for (int i = 0; i < size_; ++i) {
      auto p = std::make_unique<Peer>();
      p->rank = i;
      p->name = task_names.empty() ? fmt::format("rank {}", i) : task_names[static_cast<std::size_t>(i)];
      p->address = addresses[static_cast<std::size_t>(i)];
      p->endpoint = parse_host_port(p->address);
      for (int j = 0; j < i; ++j) {
        if (peers_[static_cast<std::size_t>(j)]->address == p->address) {
          throw InvalidArgument(fmt::format("Communicator: ranks {} and {} have the same address '{}'", j, i, p->address));
        }
      }
      if (i != rank_) p->retry_timer.emplace(io_);
      peers_.push_back(std::move(p));
    }
    if (size_ == 1) return;

    listen();
    work_.emplace(io_.get_executor());
    io_thread_ = std::thread([this] { run_io(); });
    asio::post(io_, [this] {
      do_accept();
      for (int j = 0; j < rank_; ++j) start_connect(j);
      // Heartbeats start now, not once the cluster has formed: peers that connected early must
      // keep hearing from us while a late one is still awaited.
      heartbeat_tick();
    });

    std::unique_lock lk(mu_);
    const auto deadline = Clock::now() + options_.connect_timeout;
    const bool formed = mu_.wait_until(lk, deadline, [&] { return open_count_ == size_ - 1 || setup_failure_ || failure_; });
    if (!formed || setup_failure_ || failure_ || open_count_ != size_ - 1) {
      Failure f = setup_failure_ ? *setup_failure_ : failure_ ? *failure_ : Failure{FailureKind::Peer, missing_peers_locked()};
      lk.unlock();
      shutdown();
      raise(f.kind, f.message);
    }
  }

  ~Transport() { shutdown(); }

  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& task_name(int r) const { return peer_at(r).name; }
  const std::string& address(int r) const { return peer_at(r).address; }
  const CommunicatorOptions& options() const noexcept { return options_; }
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

  std::optional<Failure> failure() const {
    std::lock_guard lk(mu_);
    return failure_;
  }

  /// For the life of the result, one Op in flight does not make the io thread busy-poll: its
  /// data does not come through the sockets (shared memory), and the polling thread would take
  /// turns on the core with the one copying.
  ScopedCount<std::atomic<int>> exempt_from_busy_poll() noexcept { return ScopedCount<std::atomic<int>>(exempt_ops_, 1); }

  /// The shared-memory all-reduce, when every rank mapped one segment at construction.
  SharedMemoryAllReduce* shared_memory() const noexcept { return shared_memory_.get(); }
  void set_shared_memory(std::unique_ptr<SharedMemoryAllReduce> s) noexcept { shared_memory_ = std::move(s); }

  /// The TCP congestion control of the connection to rank `r` ("" where it cannot be read).
  std::string congestion_control(int r) {
    std::lock_guard lk(mu_);
    (void)peer_at(r);  // throws for a rank out of range
    Peer& p = peer(r);
    if (r == rank_ || !p.socket || !p.socket->is_open()) return {};
    return congestion_control_of(p.socket->native_handle());
  }

 private:
  const Peer& peer_at(int r) const {
    if (r < 0 || r >= size_) throw InvalidArgument(fmt::format("rank {} is out of range for a cluster of {}", r, size_));
    return *peers_[static_cast<std::size_t>(r)];
  }
  Peer& peer(int r) { return *peers_[static_cast<std::size_t>(r)]; }
  const std::string& me() const { return peers_[static_cast<std::size_t>(rank_)]->name; }

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      fmt::print(stderr, "distribute.net: {}\n", line);
    }
  }

  void run_io() {
    for (;;) {
      try {
        run_io_loop();
        return;
      } catch (const std::exception& e) {
        // A handler must not take the process down; the transport is unusable afterwards.
        std::lock_guard lk(mu_);
        fail_locked(Failure{FailureKind::Peer, fmt::format("internal error in the network thread of {}: {}", me(), e.what())},
                    true);
      }
    }
  }

  // Runs handlers until the io_context stops. While an Op is in flight the thread polls instead
  // of sleeping, until busy_poll has passed without an event: the next chunk usually comes within
  // that, and handling it at once saves a wake-up per chunk. It yields between polls so that on a
  // host with fewer cores than busy threads the others still run.
  void run_io_loop() {
    const auto spin = options_.busy_poll;
    if (spin.count() <= 0) {
      io_.run();
      return;
    }
    auto polling_wanted = [this] {
      return ops_in_flight_.load(std::memory_order_relaxed) > exempt_ops_.load(std::memory_order_relaxed);
    };
    for (;;) {
      if (polling_wanted()) {
        auto until = Clock::now() + spin;
        for (;;) {
          const std::size_t ran = io_.poll();
          if (io_.stopped()) return;
          const auto now = Clock::now();
          if (ran > 0) {
            until = now + spin;
          } else if (now >= until || !polling_wanted()) {
            break;
          } else {
            std::this_thread::yield();
          }
        }
      }
      if (io_.run_one() == 0) return;
    }
  }

  // ---- set-up ------------------------------------------------------------------------------

  void listen() {
    const Peer& self = peer(rank_);
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    const auto results = resolver.resolve(self.endpoint.host, self.endpoint.port, ec);
    if (ec) {
      throw Unavailable(fmt::format("{} cannot resolve its own address '{}': {}", self.name, self.address, ec.message()));
    }
    for (const auto& entry : results) {
      acceptor_.emplace(io_);
      acceptor_->open(entry.endpoint().protocol(), ec);
      if (!ec && is_loopback(entry.endpoint().address())) {
        // Accepted sockets inherit it, before their connection is established.
        const std::string refused = set_congestion_control(acceptor_->native_handle(), options_.loopback_congestion_control);
        if (!refused.empty()) {
          throw InvalidArgument(fmt::format(
              "Communicator: loopback_congestion_control '{}' is refused by the kernel: {} (the algorithms any user may "
              "pick are in /proc/sys/net/ipv4/tcp_allowed_congestion_control; \"\" keeps the system's default)",
              options_.loopback_congestion_control, refused));
        }
      }
      if (!ec) acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) acceptor_->bind(entry.endpoint(), ec);
      if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
      if (!ec) {
        if (!token_ && !is_loopback(entry.endpoint().address())) log(no_token_warning(self.name, self.address));
        return;
      }
      acceptor_.reset();
    }
    throw Unavailable(fmt::format("{} cannot listen on {}: {}", self.name, self.address,
                                  ec ? ec.message() : std::string("the host resolves to no address")));
  }

  std::string missing_peers_locked() const {
    std::string out;
    for (const auto& p : peers_) {
      if (p->rank == rank_ || p->state == Peer::State::Open) continue;
      if (!out.empty()) out += "; ";
      if (p->rank < rank_) {
        out += fmt::format("could not connect to {} at {} (last error: {})", p->name, p->address, p->last_error);
      } else {
        out += fmt::format("{} ({}) never connected", p->name, p->address);
      }
    }
    return fmt::format("{}: the cluster of {} did not form within {} ms: {}", me(), size_, options_.connect_timeout.count(),
                       out);
  }

  void setup_fail(FailureKind kind, std::string message) {
    std::lock_guard lk(mu_);
    if (!setup_failure_) setup_failure_ = Failure{kind, std::move(message)};
    mu_.notify_all_locked();
  }

  static std::string describe_error(const boost::system::error_code& ec) {
    if (ec == asio::error::eof) return "connection closed without a goodbye (the process exited or was killed)";
    if (ec == asio::error::connection_reset) return "connection reset by peer";
    if (ec == asio::error::broken_pipe) return "broken pipe (the peer closed its socket)";
    return ec.message();
  }

  std::string handshake_error(const Handshake& h, const boost::system::error_code& ec) const {
    if (h.timed_out) return fmt::format("handshake timed out after {} ms", options_.handshake_timeout.count());
    if (ec == asio::error::eof) return "connection closed during the handshake";
    return describe_error(ec);
  }

  void arm_handshake_timer(const std::shared_ptr<Handshake>& h) {
    h->timer.expires_after(options_.handshake_timeout);
    h->timer.async_wait([h](const boost::system::error_code& ec) {
      if (!ec && !h->finished) {
        h->timed_out = true;
        boost::system::error_code ignored;
        h->socket.close(ignored);
      }
    });
  }

  using HandshakeRead = std::function<void(const std::string& error, const FrameHeader& header)>;

  // Reads one handshake frame; handshake payloads are tiny, so a stranger cannot make us allocate.
  void handshake_read(const std::shared_ptr<Handshake>& h, HandshakeRead done) {
    asio::async_read(h->socket, asio::buffer(h->header),
                     [this, h, done = std::move(done)](const boost::system::error_code& ec, std::size_t) {
                       if (ec) return done(handshake_error(*h, ec), FrameHeader{});
                       FrameHeader fh;
                       try {
                         fh = decode_header(h->header, kMaxHandshakePayload);
                       } catch (const FrameError& e) {
                         return done(e.what(), FrameHeader{});
                       }
                       h->in.resize(static_cast<std::size_t>(fh.length));
                       asio::async_read(h->socket, asio::buffer(h->in),
                                        [this, h, done, fh](const boost::system::error_code& ec2, std::size_t) {
                                          if (ec2) return done(handshake_error(*h, ec2), FrameHeader{});
                                          done(std::string(), fh);
                                        });
                     });
  }

  void handshake_write(const std::shared_ptr<Handshake>& h, FrameType type, std::span<const std::byte> payload,
                       std::function<void(const std::string&)> done) {
    h->out = encode_frame(FrameHeader{type, 0, 0, 0}, payload);
    h->written += h->out.size();
    asio::async_write(h->socket, asio::buffer(h->out),
                      [this, h, done = std::move(done)](const boost::system::error_code& ec, std::size_t) {
                        done(ec ? handshake_error(*h, ec) : std::string());
                      });
  }

  // What a connector reports when a peer refused it (an acceptor tells the peer no more than "refused").
  std::string refused_by(const Peer& p, const std::string& text) const {
    if (text == kRefusedText) {
      return fmt::format("{} at {} refused {} (its log says why; cluster specs or cluster tokens that differ are the usual "
                         "cause)",
                         p.name, p.address, me());
    }
    return fmt::format("{} at {} refused {}: {}", p.name, p.address, me(), text);
  }

  // Connector side: ranks connect to every lower rank, retrying while it is not up yet.
  void start_connect(int j) {
    {
      std::lock_guard lk(mu_);
      if (closing_ || peer(j).state != Peer::State::Connecting) return;
    }
    auto resolver = std::make_shared<tcp::resolver>(io_);
    const HostPort& ep = peer(j).endpoint;
    resolver->async_resolve(ep.host, ep.port,
                            [this, j, resolver](const boost::system::error_code& ec, tcp::resolver::results_type results) {
                              if (ec) return retry_connect(j, ec.message());
                              std::vector<tcp::endpoint> endpoints;
                              for (const auto& entry : results) endpoints.push_back(entry.endpoint());
                              connect_to(j, std::move(endpoints), 0, "the host resolves to no address");
                            });
  }

  // Tries the endpoints from `i` on in turn. The socket is opened here rather than by
  // async_connect so that a loopback connection gets its congestion control before it exists.
  void connect_to(int j, std::vector<tcp::endpoint> endpoints, std::size_t i, std::string last_error) {
    if (i == endpoints.size()) return retry_connect(j, std::move(last_error));
    auto h = std::make_shared<Handshake>(io_);
    h->peer = j;
    const tcp::endpoint to = endpoints[i];  // a copy: the vector moves into the handler below
    boost::system::error_code ec;
    h->socket.open(to.protocol(), ec);
    if (ec) return connect_to(j, std::move(endpoints), i + 1, describe_error(ec));
    if (is_loopback(to.address())) {
      const std::string refused = set_congestion_control(h->socket.native_handle(), options_.loopback_congestion_control);
      if (!refused.empty() && !congestion_refusal_logged_) {
        congestion_refusal_logged_ = true;  // once, not once per connection attempt
        log(fmt::format("{}: connecting to {} with the system's congestion control: '{}' is refused by the kernel: {}", me(),
                        peer(j).name, options_.loopback_congestion_control, refused));
      }
    }
    h->socket.async_connect(to, [this, j, h, endpoints = std::move(endpoints), i](const boost::system::error_code& ec2) mutable {
      if (ec2) return connect_to(j, std::move(endpoints), i + 1, describe_error(ec2));
      client_handshake(h);
    });
  }

  void retry_connect(int j, std::string reason) {
    std::lock_guard lk(mu_);
    Peer& p = peer(j);
    if (closing_ || p.state != Peer::State::Connecting) return;
    p.last_error = std::move(reason);
    if (metrics_) metrics_->retry();
    // 1, 2, 4 ... ms, then every 50 ms: peers start within milliseconds of each other, and a
    // refused connect costs a round trip, so a late peer is met soon after it listens.
    const auto delay = p.backoff;
    p.backoff = std::min(p.backoff * 2, kMaxConnectBackoff);
    p.retry_timer->expires_after(delay);
    p.retry_timer->async_wait([this, j](const boost::system::error_code& ec) {
      if (!ec) start_connect(j);
    });
  }

  void client_handshake(const std::shared_ptr<Handshake>& h) {
    const int j = h->peer;
    arm_handshake_timer(h);
    h->nonce = random_nonce();
    const Hello hello{static_cast<std::uint32_t>(size_), static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(j),
                      token_.has_value(), h->nonce};
    handshake_write(h, FrameType::Hello, encode(hello), [this, h, j](const std::string& err) {
      if (!err.empty()) return retry_connect(j, err);
      handshake_read(h, [this, h, j](const std::string& err2, const FrameHeader& fh) {
        if (!err2.empty()) return retry_connect(j, err2);
        const Peer& p = peer(j);
        if (fh.type == FrameType::Reject) {
          return setup_fail(FailureKind::Config,
                            refused_by(p, decode_text(h->in)));
        }
        if (fh.type != FrameType::Challenge) {
          return retry_connect(j, fmt::format("{} answered with a {} frame instead of a challenge", p.address, to_string(fh.type)));
        }
        Challenge c;
        try {
          c = decode_challenge(h->in);
        } catch (const FrameError& e) {
          return retry_connect(j, fmt::format("{} sent a malformed challenge: {}", p.address, e.what()));
        }
        if (c.size != static_cast<std::uint32_t>(size_) || c.rank != static_cast<std::uint32_t>(j) ||
            c.peer_rank != static_cast<std::uint32_t>(rank_)) {
          return setup_fail(FailureKind::Config,
                            fmt::format("{} answered as rank {} of a {}-rank cluster, but {} (rank {} of {}) lists it as {} "
                                        "(rank {}): the processes were given different cluster specs",
                                        p.address, c.rank, c.size, me(), rank_, size_, p.name, j));
        }
        if (c.has_token != token_.has_value()) {
          return setup_fail(FailureKind::Config,
                            token_ ? fmt::format("{} at {} uses no cluster token but {} does", p.name, p.address, me())
                                   : fmt::format("{} at {} requires a cluster token (DISTRIBUTE_CLUSTER_TOKEN) but {} has none",
                                                 p.name, p.address, me()));
        }
        Mac proof{};
        if (token_) {
          const Mac expected = handshake_proof(*token_, true, h->nonce, c.nonce, c.size, c.rank, c.peer_rank);
          if (!macs_equal(expected, c.proof)) {
            const std::string why = "authentication failed: the acceptor's proof of the cluster token is wrong";
            handshake_write(h, FrameType::Reject, std::as_bytes(std::span(why.data(), why.size())), [](const std::string&) {});
            return setup_fail(FailureKind::Config,
                              fmt::format("{} at {} failed to prove it holds the cluster token (the tokens differ)",
                                          p.name, p.address));
          }
          proof = handshake_proof(*token_, false, h->nonce, c.nonce, c.size, c.rank, c.peer_rank);
        }
        handshake_write(h, FrameType::Response, proof, [this, h, j](const std::string& err3) {
          if (!err3.empty()) return retry_connect(j, err3);
          handshake_read(h, [this, h, j](const std::string& err4, const FrameHeader& fh2) {
            if (!err4.empty()) return retry_connect(j, err4);
            const Peer& p2 = peer(j);
            if (fh2.type == FrameType::Reject) {
              return setup_fail(FailureKind::Config,
                                refused_by(p2, decode_text(h->in)));
            }
            if (fh2.type != FrameType::Welcome) {
              return retry_connect(j, fmt::format("{} answered with a {} frame instead of a welcome", p2.address,
                                                  to_string(fh2.type)));
            }
            h->finished = true;
            h->timer.cancel();
            register_peer(j, std::move(h->socket), h->written);
          });
        });
      });
    });
  }

  // Acceptor side: anyone may connect; only a peer that proves the token and a valid rank joins.
  // At most max_pending_connections handshakes at once (more are closed when accepted); an accept
  // error (out of descriptors, buffers, memory) backs off 10 ms doubling to 500 ms and goes on.
  void do_accept() {
    acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      {
        std::lock_guard lk(mu_);
        if (closing_) return;
      }
      if (!ec) {
        accept_backoff_ = std::chrono::milliseconds(10);
        if (pending_handshakes_->load() >= options_.max_pending_connections) {
          boost::system::error_code ignored;
          const auto remote = socket.remote_endpoint(ignored);
          log_limited(fmt::format("{}: refused connection from {}:{}: {} connections are already in their handshake", me(),
                                  remote.address().to_string(), remote.port(), options_.max_pending_connections));
          socket.close(ignored);
        } else {
          auto h = std::make_shared<Handshake>(std::move(socket));
          pending_handshakes_->fetch_add(1);
          h->pending = std::shared_ptr<void>(nullptr, [n = pending_handshakes_](void*) { n->fetch_sub(1); });
          server_handshake(h);
        }
        do_accept();
      } else {
        log_limited(fmt::format("{}: accept failed: {}; retrying in {} ms", me(), ec.message(), accept_backoff_.count()));
        auto timer = std::make_shared<asio::steady_timer>(io_, accept_backoff_);
        accept_backoff_ = std::min(accept_backoff_ * 2, std::chrono::milliseconds(500));
        timer->async_wait([this, timer](const boost::system::error_code& e) {
          if (!e) do_accept();
        });
      }
    });
  }

  // Lines a stranger can cause: a few a second at most.
  void log_limited(const std::string& line) {
    if (std::string admitted = refusal_limiter_.admit(line); !admitted.empty()) log(admitted);
  }

  // The peer reads only "refused"; the reason goes to the (rate-limited) local log.
  void refuse(const std::shared_ptr<Handshake>& h, const std::string& reason, bool reply) {
    const std::string who = h->peer >= 0 ? fmt::format(" (claiming to be {})", peer(h->peer).name) : std::string();
    log_limited(fmt::format("{}: refused connection from {}{}: {}", me(), h->remote, who, reason));
    h->finished = true;
    h->timer.cancel();
    h->pending.reset();
    if (reply) {
      handshake_write(h, FrameType::Reject, std::as_bytes(std::span(kRefusedText.data(), kRefusedText.size())), [h](const std::string&) {
        boost::system::error_code ignored;
        h->socket.close(ignored);
      });
    } else {
      boost::system::error_code ignored;
      h->socket.close(ignored);
    }
  }

  void server_handshake(const std::shared_ptr<Handshake>& h) {
    boost::system::error_code ec;
    const auto remote = h->socket.remote_endpoint(ec);
    h->remote = ec ? std::string("an unknown address") : fmt::format("{}:{}", remote.address().to_string(), remote.port());
    arm_handshake_timer(h);
    handshake_read(h, [this, h](const std::string& err, const FrameHeader& fh) {
      if (!err.empty()) return refuse(h, err, false);
      if (fh.type != FrameType::Hello) {
        return refuse(h, fmt::format("expected a hello frame, got a {} frame", to_string(fh.type)), false);
      }
      Hello hello;
      try {
        hello = decode_hello(h->in);
      } catch (const FrameError& e) {
        return refuse(h, e.what(), false);
      }
      if (hello.size != static_cast<std::uint32_t>(size_) || hello.to_rank != static_cast<std::uint32_t>(rank_)) {
        return refuse(h,
                      fmt::format("it believes in a {}-rank cluster and called rank {}, but this is rank {} of {}", hello.size,
                                  hello.to_rank, rank_, size_),
                      true);
      }
      if (hello.from_rank <= static_cast<std::uint32_t>(rank_) || hello.from_rank >= static_cast<std::uint32_t>(size_)) {
        return refuse(h,
                      fmt::format("it claims rank {}, but only ranks {}..{} connect to rank {}", hello.from_rank, rank_ + 1,
                                  size_ - 1, rank_),
                      true);
      }
      h->peer = static_cast<int>(hello.from_rank);
      if (hello.has_token != token_.has_value()) {
        return refuse(h,
                      token_ ? std::string("it presented no cluster token, and this cluster requires one")
                             : std::string("it presented a cluster token, and this rank has none"),
                      true);
      }
      h->peer_nonce = hello.nonce;
      h->nonce = random_nonce();
      Challenge c{static_cast<std::uint32_t>(size_), static_cast<std::uint32_t>(rank_), hello.from_rank, token_.has_value(),
                  h->nonce, Mac{}};
      if (token_) c.proof = handshake_proof(*token_, true, hello.nonce, h->nonce, c.size, c.rank, c.peer_rank);
      handshake_write(h, FrameType::Challenge, encode(c), [this, h](const std::string& err2) {
        if (!err2.empty()) return refuse(h, err2, false);
        handshake_read(h, [this, h](const std::string& err3, const FrameHeader& fh2) {
          if (!err3.empty()) return refuse(h, err3, false);
          if (fh2.type == FrameType::Reject) {
            return refuse(h, fmt::format("it refused this rank's proof of the cluster token: {}", decode_text(h->in)), false);
          }
          if (fh2.type != FrameType::Response) {
            return refuse(h, fmt::format("expected a response frame, got a {} frame", to_string(fh2.type)), false);
          }
          Mac proof{};
          try {
            proof = decode_response(h->in);
          } catch (const FrameError& e) {
            return refuse(h, e.what(), false);
          }
          if (token_) {
            const Mac expected = handshake_proof(*token_, false, h->peer_nonce, h->nonce, static_cast<std::uint32_t>(size_),
                                                 static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(h->peer));
            if (!macs_equal(expected, proof)) {
              return refuse(h, "authentication failed: its proof of the cluster token is wrong (the tokens differ)", true);
            }
          }
          bool duplicate = false;
          {
            std::lock_guard lk(mu_);
            Peer& p = peer(h->peer);
            duplicate = closing_ || p.state != Peer::State::Connecting || p.claimed;
            if (!duplicate) p.claimed = true;
          }
          if (duplicate) return refuse(h, fmt::format("{} is already connected", peer(h->peer).name), true);
          handshake_write(h, FrameType::Welcome, {}, [this, h](const std::string& err4) {
            if (!err4.empty()) {
              {
                std::lock_guard lk(mu_);
                peer(h->peer).claimed = false;
              }
              return refuse(h, err4, false);
            }
            h->finished = true;
            h->timer.cancel();
            h->pending.reset();
            register_peer(h->peer, std::move(h->socket), h->written);
          });
        });
      });
    });
  }

  void register_peer(int j, tcp::socket socket, std::uint64_t handshake_bytes) {
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::unique_lock lk(mu_);
    Peer& p = peer(j);
    if (closing_ || p.state != Peer::State::Connecting) {
      socket.close(ignored);
      return;
    }
    p.socket.emplace(std::move(socket));
    p.tx_pos = handshake_bytes;
    p.state = Peer::State::Open;
    p.claimed = false;
    p.last_tx = Clock::now();
    p.heard_now();
    ++open_count_;
    mu_.notify_all_locked();
    lk.unlock();
    read_header(p);
  }

  // ---- steady state: reading ----------------------------------------------------------------

  // Reads the tail of the frame just handled (p.rx; none before the first) with the next header.
  void read_header(Peer& p) {
    const std::array<asio::mutable_buffer, 2> into{asio::buffer(p.rx_pad.data(), p.rx.tail), asio::buffer(p.rx_header)};
    asio::async_read(*p.socket, into, [this, &p](const boost::system::error_code& ec, std::size_t) { on_header(p, ec); });
  }

  void on_header(Peer& p, const boost::system::error_code& ec) {
    if (ec) return on_read_error(p, ec);
    p.heard_now();
    try {
      p.rx = decode_header(p.rx_header, options_.max_frame_bytes);
    } catch (const FrameError& e) {
      return protocol_error(p, e.what());
    }
    switch (p.rx.type) {
      case FrameType::Heartbeat: return read_header(p);
      case FrameType::Goodbye: {
        std::lock_guard lk(mu_);
        on_goodbye_locked(p);
      }
        return read_header(p);
      case FrameType::Abort:
      case FrameType::Descriptor:
        p.rx_control.resize(static_cast<std::size_t>(p.rx.length));
        asio::async_read(*p.socket, asio::buffer(p.rx_control),
                         [this, &p](const boost::system::error_code& ec2, std::size_t) { on_control(p, ec2); });
        return;
      case FrameType::Data:
      case FrameType::PointToPoint:
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
        return start_payload(p);  // read_payload reads the padding in the same call as the payload
#else
        if (p.rx.pad == 0) return start_payload(p);
        asio::async_read(*p.socket, asio::buffer(p.rx_pad.data(), p.rx.pad),
                         [this, &p](const boost::system::error_code& ec2, std::size_t) {
                           if (ec2) return on_read_error(p, ec2);
                           start_payload(p);
                         });
        return;
#endif
      default: return protocol_error(p, fmt::format("unexpected {} frame after the handshake", to_string(p.rx.type)));
    }
  }

  void on_control(Peer& p, const boost::system::error_code& ec) {
    if (ec) return on_read_error(p, ec);
    p.heard_now();
    try {
      if (p.rx.type == FrameType::Abort) {
        Failure f = decode_abort(p.rx_control);
        std::lock_guard lk(mu_);
        if (!closing_) {
          if (f.message.find(" (reported by ") == std::string::npos) f.message += fmt::format(" (reported by {})", p.name);
          // Relayed before anything else we send: a peer that hears our goodbye later must have
          // heard why first, or it would blame our departure instead of the real loss.
          fail_locked(std::move(f), true);
        }
      } else {
        std::lock_guard lk(mu_);
        on_descriptor_locked(p);
      }
    } catch (const FrameError& e) {
      return protocol_error(p, e.what());
    }
    read_header(p);
  }

  // Descriptors over TCP (no shared memory): every rank sends its own to rank 0 alone, and rank 0,
  // once it holds every rank's, sends the whole table to every rank: 2(n-1) frames per collective
  // instead of n(n-1), and every rank still compares every rank's call (the same pair is named
  // everywhere). The table's entries count as each peer's descriptor.
  void on_descriptor_locked(Peer& p) {
    const std::uint64_t seq = p.rx.seq;
    const std::size_t n = static_cast<std::size_t>(size_);
    auto store = [&](Peer& from, const Descriptor& d) {
      if (!from.descriptors.emplace(seq, d).second) {
        throw FrameError(fmt::format("second descriptor of {} for collective #{}", from.name, seq));
      }
    };
    if (rank_ == 0) {
      if (p.rx_control.size() != kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes (expected {})", p.rx_control.size(), kDescriptorBytes));
      }
      store(p, decode_descriptor(p.rx_control));
      relay_descriptors_locked();
    } else {
      if (p.rank != 0 || p.rx_control.size() != n * kDescriptorBytes) {
        throw FrameError(fmt::format("descriptor frame of {} bytes from rank {} (only rank 0 sends them, {} bytes)",
                                     p.rx_control.size(), p.rank, n * kDescriptorBytes));
      }
      const std::span<const std::byte> table(p.rx_control);
      for (std::size_t r = 0; r < n; ++r) {
        if (static_cast<int>(r) == rank_) continue;
        store(*peers_[r], decode_descriptor(table.subspan(r * kDescriptorBytes, kDescriptorBytes)));
      }
    }
    if (observe::timeline_enabled()) p.descriptor_at[seq] = Clock::now();
    if (descriptor_wakes_locked(seq)) mu_.notify_all_locked();
  }

  // Rank 0: once its own call and every peer's descriptor of it are in, sends the table out.
  void relay_descriptors_locked() {
    if (!root_pending_) return;
    const std::uint64_t seq = root_pending_->first;
    for (const auto& p : peers_) {
      if (p->rank != rank_ && p->descriptors.count(seq) == 0) return;
    }
    std::vector<std::byte> table;
    table.reserve(static_cast<std::size_t>(size_) * kDescriptorBytes);
    for (const auto& p : peers_) {
      const auto bytes = encode(p->rank == rank_ ? root_pending_->second : p->descriptors.at(seq));
      table.insert(table.end(), bytes.begin(), bytes.end());
    }
    root_pending_.reset();
    for (auto& p : peers_) {
      if (p->rank != rank_ && p->state == Peer::State::Open) enqueue_control_locked(*p, FrameType::Descriptor, seq, table);
    }
  }

  // Whether a peer's descriptor must wake the waiting threads. A thread in Op::wait_until (the
  // ring) need not wake for one that agrees with its own call: it checks every descriptor once its
  // data is in, and a descriptor that disagrees still wakes it at once. Sparing that wake-up saves
  // two context switches per call where the caller and the io thread share a core.
  // Disagreement is judged once every descriptor is in, so the thread is woken for every
  // arrival (the last one included) while any descriptor of its call disagrees, whichever
  // came first.
  bool descriptor_wakes_locked(std::uint64_t seq) const {
    if (progress_waiters_ > 0 || quiet_desc_ == nullptr || quiet_seq_ != seq) return true;
    for (const auto& p : peers_) {
      const auto it = p->descriptors.find(seq);
      if (it != p->descriptors.end() && !compatible(*quiet_desc_, it->second)) return true;
    }
    return false;
  }

  void start_payload(Peer& p) {
    const MsgKey key{p.rx.type, p.rx.seq, p.rx.tag};
    const auto length = static_cast<std::size_t>(p.rx.length);
    bool keep = true;
    {
      std::lock_guard lk(mu_);
      p.rx_transfer.reset();
      auto it = p.posted.find(key);
      if (it != p.posted.end()) {
        TransferPtr t = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) p.posted.erase(it);
        if (t->size == length) {
          t->state = Transfer::State::Active;
          p.rx_dst = t->dst;
          p.rx_transfer = std::move(t);
        } else {
          t->state = Transfer::State::Failed;
          t->error = Failure{FailureKind::Mismatch, size_mismatch(p, length, t->size, key)};
          keep = false;  // read and drop it: the stream stays in step
          mu_.notify_all_locked();
        }
      }
    }
    if (!p.rx_transfer) {
      try {
        {
          std::lock_guard lk(mu_);
          p.rx_blob = blobs_.take(length);
        }
        if (!p.rx_blob.data) p.rx_blob = Blob{std::make_unique_for_overwrite<std::byte[]>(length), length, length};
      } catch (const std::bad_alloc&) {
        return protocol_error(p, fmt::format("cannot buffer a frame of {} bytes: out of memory", length));
      }
      p.rx_dst = p.rx_blob.data.get();
      p.rx_keep = keep;
    }
    p.rx_done = 0;
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
    p.rx_pad_left = p.rx.pad;
#endif
    read_payload(p);
  }

  void read_payload(Peer& p) {
    const auto length = static_cast<std::size_t>(p.rx.length);
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
    // Reads what is there; when the rest has not arrived, raises the socket's receive low-water
    // mark to the rest (at most kLowWaterMax) before waiting, so that the io thread wakes once
    // for much of a large frame instead of once per loopback segment (64 KiB). The kernel still
    // reports EOF, errors and a nearly closed receive window at once.
    const int fd = p.socket->native_handle();
    for (;;) {
      const std::size_t rest = length - p.rx_done;
      if (rest == 0 && p.rx_pad_left == 0) {
        if (p.rx_low_water) set_low_water(p, 1);
        return finish_payload(p);
      }
      ::ssize_t got = 0;
      if (p.rx_pad_left == 0) {
        got = ::recv(fd, p.rx_dst + p.rx_done, std::min(kReadPiece, rest), MSG_DONTWAIT);
      } else {
        std::array<::iovec, 2> iov{::iovec{p.rx_pad.data() + (p.rx.pad - p.rx_pad_left), p.rx_pad_left},
                                   ::iovec{p.rx_dst + p.rx_done, std::min(kReadPiece, rest)}};
        ::msghdr msg{};
        msg.msg_iov = iov.data();
        msg.msg_iovlen = rest > 0 ? 2 : 1;
        got = ::recvmsg(fd, &msg, MSG_DONTWAIT);
      }
      if (got > 0) {
        p.heard_now();
        const std::size_t pad = std::min(static_cast<std::size_t>(got), p.rx_pad_left);
        p.rx_pad_left -= pad;
        p.rx_done += static_cast<std::size_t>(got) - pad;
        continue;
      }
      if (got == 0) return on_read_error(p, asio::error::eof);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return on_read_error(p, boost::system::error_code(errno, asio::error::get_system_category()));
      }
      const std::size_t want = std::min(rest + p.rx_pad_left, kLowWaterMax);
      if (want > 1 || p.rx_low_water) set_low_water(p, want);
      p.socket->async_wait(tcp::socket::wait_read, [this, &p](const boost::system::error_code& ec) {
        if (ec) return on_read_error(p, ec);
        read_payload(p);
      });
      return;
    }
#else
    if (p.rx_done == length) return finish_payload(p);
    const std::size_t n = std::min(kReadPiece, length - p.rx_done);
    asio::async_read(*p.socket, asio::buffer(p.rx_dst + p.rx_done, n),
                     [this, &p](const boost::system::error_code& ec, std::size_t got) {
                       if (ec) return on_read_error(p, ec);
                       p.heard_now();
                       p.rx_done += got;
                       read_payload(p);
                     });
#endif
  }

#if defined(DISTRIBUTE_NET_DIRECT_SEND)
  static void set_low_water(Peer& p, std::size_t bytes) {
    const int v = static_cast<int>(bytes);
    // Best effort: where it is refused, reads just wake more often.
    (void)::setsockopt(p.socket->native_handle(), SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
    p.rx_low_water = bytes > 1;
  }
#endif

  void finish_payload(Peer& p) {
    std::unique_lock lk(mu_);
    if (p.rx_transfer) {
      const TransferPtr t = std::move(p.rx_transfer);  // leaves rx_transfer empty
      complete_receive_locked(lk, t);
    } else if (p.rx_keep) {
      // Its receive may have been posted while the frame was arriving: hand it over now.
      const MsgKey key{p.rx.type, p.rx.seq, p.rx.tag};
      auto it = p.posted.find(key);
      if (it == p.posted.end()) {
        p.unexpected[key].push_back(std::move(p.rx_blob));
      } else {
        TransferPtr t = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) p.posted.erase(it);
        if (t->size == p.rx_blob.size) {
          t->state = Transfer::State::Active;
          lk.unlock();
          if (t->size > 0) std::memcpy(t->dst, p.rx_blob.data.get(), t->size);
          lk.lock();
          complete_receive_locked(lk, t);
        } else {
          t->state = Transfer::State::Failed;
          t->error = Failure{FailureKind::Mismatch, size_mismatch(p, p.rx_blob.size, t->size, key)};
          mu_.notify_all_locked();
        }
      }
    }
    blobs_.give(std::move(p.rx_blob));
    p.rx_blob = Blob{};
    lk.unlock();
    read_header(p);
  }

  // A receive's bytes are in place (state Active, `lk` held): runs its continuation, if any, with
  // the mutex released, then marks it Done. A continuation that throws fails the receive, and
  // with it the collective.
  void complete_receive_locked(std::unique_lock<NotifyingMutex>& lk, const TransferPtr& t) {
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
        t->error = Failure{FailureKind::Peer, fmt::format("{} failed while passing on received data: {}", me(), *error)};
        mu_.notify_all_locked();
        return;
      }
    }
    t->state = Transfer::State::Done;
    if (wake || progress_waiters_ > 0) mu_.notify_all_locked();
  }

  std::string size_mismatch(const Peer& p, std::size_t got, std::size_t want, const MsgKey& key) const {
    std::string msg = fmt::format("{} sent {} bytes where {} expected {}", p.name, got, me(), want);
    if (key.type == FrameType::Data) msg += fmt::format(" (collective #{}, piece {})", key.seq, key.tag);
    return msg;
  }

  void on_read_error(Peer& p, const boost::system::error_code& ec) {
    std::lock_guard lk(mu_);
    if (p.rx_transfer) {
      p.rx_transfer->state = Transfer::State::Failed;
      p.rx_transfer->error = loss_locked(p, describe_error(ec));
      p.rx_transfer.reset();
    }
    p.rx_blob = Blob{};
    peer_down_locked(p, describe_error(ec));
  }

  void protocol_error(Peer& p, const std::string& what) {
    std::lock_guard lk(mu_);
    if (p.rx_transfer) {
      p.rx_transfer->state = Transfer::State::Failed;
      p.rx_transfer->error = loss_locked(p, what);
      p.rx_transfer.reset();
    }
    peer_down_locked(p, fmt::format("it sent a malformed frame: {}", what));
  }

  // ---- steady state: writing ----------------------------------------------------------------

  // Gives `f` its place in p's stream, in the order frames are written. The kernel copies socket
  // data into pages that it fills in stream order, and a copy whose source and destination are
  // aligned alike mod 64 runs up to 20x faster on some CPUs (docs/performance.md). So a bulk
  // payload is padded in front until its stream position is congruent to its address, and every
  // frame gets a tail that ends it on a multiple of 64. The tail matters because the kernel's page
  // belongs to the writing thread, not the socket, and starts again at offset 0 whenever the
  // reader has freed it: both happen between frames, and with every frame ending aligned they
  // leave page offset and stream position congruent. Small payloads are not worth a front pad.
  static void place_locked(Peer& p, OutFrame& f) {
    FrameHeader h = f.fields;
    if ((h.type == FrameType::Data || h.type == FrameType::PointToPoint) && f.size >= kPadMinBytes) {
      const auto address = reinterpret_cast<std::uintptr_t>(f.payload);
      h.pad = static_cast<std::uint8_t>((address - (p.tx_pos + kFrameHeaderBytes)) % kMaxFramePad);
    }
    h.tail = static_cast<std::uint8_t>((kMaxFramePad - (p.tx_pos + kFrameHeaderBytes + h.pad + f.size) % kMaxFramePad) % kMaxFramePad);
    if (h.pad != f.fields.pad || h.tail != f.fields.tail) f.set_header(h);
    p.tx_pos += f.wire_bytes();
  }

  void enqueue_locked(Peer& p, OutFrame f) {
    if (p.state != Peer::State::Open) {
      if (f.transfer) {
        f.transfer->state = Transfer::State::Failed;
        f.transfer->error = closed_failure_locked(p);
      }
      return;
    }
    place_locked(p, f);
    p.queue.push_back(std::move(f));
    if (!p.writing) {
      p.writing = true;
      asio::post(io_, [this, &p] {
        std::lock_guard lk(mu_);
        write_next_locked(p);
      });
    }
  }

  // The hot path of a send (data frames and descriptors, from the calling thread): when nothing is
  // queued or being written to the peer, this thread writes the frame itself with one
  // non-blocking sendmsg (header and payload gathered), which saves waking the io thread and
  // running its completion handler for every chunk. The mutex is released around the syscall;
  // `writing` keeps the io thread from starting a write meanwhile (frames enqueued meanwhile wait
  // in the queue) and `direct_sending` defers a close of the socket until the syscall is over.
  // A frame not written whole goes to the front of the queue, its `sent` bytes skipped, and the
  // io thread writes the rest (or meets the error again and handles it as usual).
  void send_now_or_enqueue(std::unique_lock<NotifyingMutex>& lk, Peer& p, OutFrame f, bool direct = true) {
#if defined(DISTRIBUTE_NET_DIRECT_SEND)
    if (!direct || p.state != Peer::State::Open || p.writing || !p.queue.empty() || !p.socket || !p.socket->is_open()) {
      return enqueue_locked(p, std::move(f));
    }
    if (!f.owned.empty()) f.payload = f.owned.data();
    place_locked(p, f);
    p.writing = true;
    p.direct_sending = true;
    const int fd = p.socket->native_handle();
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
    p.direct_sending = false;
    if (p.close_deferred) {
      // Sockets are closed on the io thread only, as everywhere else.
      p.close_deferred = false;
      asio::post(io_, [this, &p] {
        std::lock_guard g(mu_);
        close_socket(p);
        mu_.notify_all_locked();
      });
    }
    p.last_tx = Clock::now();
    f.sent = n > 0 ? static_cast<std::size_t>(n) : 0;
    const bool whole = f.sent == f.wire_bytes();
    if (whole && f.transfer) {
      f.transfer->state = Transfer::State::Done;
      if (progress_waiters_ > 0) mu_.notify_all_locked();
    }
    if (p.state != Peer::State::Open) {
      // Lost or closed meanwhile: what was queued has been failed already; fail this frame too.
      p.writing = false;
      if (!whole && f.transfer) {
        f.transfer->state = Transfer::State::Failed;
        f.transfer->error = loss_locked(p, "the connection went down during a write");
        mu_.notify_all_locked();
      }
      if (p.half_close_pending) {
        p.half_close_pending = false;
        shutdown_send(p);
      }
      return;
    }
    if (!whole) {
      // Half a frame may be on the wire: it must be finished, never dropped from the queue.
      if (f.transfer) f.transfer->state = Transfer::State::Active;
      p.queue.push_front(std::move(f));
    }
    if (p.queue.empty()) {
      p.writing = false;
      return;
    }
    asio::post(io_, [this, &p] {
      std::lock_guard g(mu_);
      write_next_locked(p);
    });
#else
    (void)lk;
    enqueue_locked(p, std::move(f));
#endif
  }

  void enqueue_control_locked(Peer& p, FrameType type, std::uint64_t seq, std::vector<std::byte> payload,
                              bool half_close_after = false) {
    OutFrame f;
    f.set_header(FrameHeader{type, payload.size(), seq, 0});
    f.owned = std::move(payload);
    f.payload = f.owned.data();
    f.size = f.owned.size();
    f.half_close_after = half_close_after;
    enqueue_locked(p, std::move(f));
  }

  void write_next_locked(Peer& p) {
    if (p.state != Peer::State::Open || p.queue.empty() || !p.socket) {
      p.writing = false;
      return;
    }
    p.batch.clear();
    p.buffers.clear();
    std::size_t bytes = 0;
    while (!p.queue.empty() && p.batch.size() < kBatchFrames && (p.batch.empty() || bytes < kBatchBytes)) {
      bytes += p.queue.front().wire_bytes();
      p.batch.push_back(std::move(p.queue.front()));
      p.queue.pop_front();
    }
    for (OutFrame& f : p.batch) {
      if (f.transfer) f.transfer->state = Transfer::State::Active;
      // Owned payloads moved with their frame; re-point at their (unchanged) heap buffer.
      if (!f.owned.empty()) f.payload = f.owned.data();
      // A direct send may have written the start of the first frame.
      std::size_t written = f.sent;
      for (const auto part : f.wire_parts()) {
        const std::size_t skip = std::min(written, part.size());
        written -= skip;
        if (part.size() > skip) p.buffers.push_back(asio::buffer(part.data() + skip, part.size() - skip));
      }
    }
    p.last_tx = Clock::now();
    asio::async_write(*p.socket, p.buffers, TransferAllUncapped{},
                      [this, &p](const boost::system::error_code& ec, std::size_t) { on_written(p, ec); });
  }

  void on_written(Peer& p, const boost::system::error_code& ec) {
    std::lock_guard lk(mu_);
    bool half_close = false;
    for (OutFrame& f : p.batch) {
      half_close = half_close || f.half_close_after;
      if (!f.transfer) continue;
      if (ec) {
        f.transfer->state = Transfer::State::Failed;
        f.transfer->error = loss_locked(p, describe_error(ec));
      } else {
        f.transfer->state = Transfer::State::Done;
      }
    }
    p.batch.clear();
    if (ec || progress_waiters_ > 0) mu_.notify_all_locked();
    if (ec) {
      p.writing = false;
      peer_down_locked(p, describe_error(ec));
      return;
    }
    if (half_close || p.half_close_pending) {
      p.half_close_pending = false;
      p.writing = false;
      shutdown_send(p);
      return;
    }
    write_next_locked(p);
  }

  // ---- failure handling -------------------------------------------------------------------

  Failure loss_locked(const Peer& p, const std::string& reason) const {
    if (p.state == Peer::State::Failed && failure_) return *failure_;
    if (p.state == Peer::State::Closed) return closed_failure_locked(p);
    return Failure{FailureKind::Peer, fmt::format("lost task {} ({}): {}", p.name, p.address, reason)};
  }

  Failure closed_failure_locked(const Peer& p) const {
    if (p.state == Peer::State::Failed && failure_) return *failure_;
    return Failure{FailureKind::Peer, fmt::format("{} ({}) has closed its communicator", p.name, p.address)};
  }

  /// Records the first failure; `broadcast`: tell every peer (found here, or relayed).
  void fail_locked(Failure f, bool broadcast) {
    if (failure_) return;
    failure_ = f;
    if (metrics_) metrics_->failure(static_cast<int>(f.kind));
    if (observe::timeline_enabled()) {
      try {
        observe::Timeline::instance().instant("communicator failed", "failure", observe::Timeline::now_ns(),
                                              fmt::format("\"message\":\"{}\"", observe::detail::json_escape(f.message)));
      } catch (...) {
      }
    }
    if (broadcast) {
      const auto payload = encode(f);
      for (auto& p : peers_) {
        if (p->rank != rank_ && p->state == Peer::State::Open) enqueue_control_locked(*p, FrameType::Abort, 0, payload);
      }
    }
    mu_.notify_all_locked();
  }

  // Fails what waits on `p` and cannot complete any more (posted receives, queued sends).
  void fail_pending_locked(Peer& p, const Failure& f) {
    for (auto& [key, list] : p.posted) {
      for (auto& t : list) {
        t->state = Transfer::State::Failed;
        t->error = f;
      }
    }
    p.posted.clear();
    for (OutFrame& frame : p.queue) {
      if (frame.transfer) {
        frame.transfer->state = Transfer::State::Failed;
        frame.transfer->error = f;
      }
    }
    p.queue.clear();
  }

  void shutdown_send(Peer& p) {
    boost::system::error_code ignored;
    if (p.socket && p.socket->is_open()) p.socket->shutdown(tcp::socket::shutdown_send, ignored);
  }

  void close_socket(Peer& p) {
    if (p.direct_sending) {
      p.close_deferred = true;  // the calling thread is in sendmsg on it: it closes it after
      return;
    }
    boost::system::error_code ignored;
    if (p.socket && p.socket->is_open()) {
      p.socket->shutdown(tcp::socket::shutdown_both, ignored);
      p.socket->close(ignored);
    }
    p.socket_done = true;
  }

  void on_goodbye_locked(Peer& p) {
    if (p.state != Peer::State::Open) return;
    p.state = Peer::State::Closed;
    fail_pending_locked(p, closed_failure_locked(p));
    // It sends nothing more; end our side too once what is being written is out, so that both
    // ends close with empty receive buffers (a close with unread data would reset the stream).
    if (p.writing) {
      p.half_close_pending = true;
    } else {
      shutdown_send(p);
    }
    mu_.notify_all_locked();
  }

  void peer_down_locked(Peer& p, const std::string& reason) {
    if (p.state == Peer::State::Closed || p.state == Peer::State::Failed) {
      close_socket(p);
      mu_.notify_all_locked();
      return;
    }
    const bool expected = closing_;  // during our own shutdown every error is expected
    const Failure loss = loss_locked(p, reason);
    p.state = expected ? Peer::State::Closed : Peer::State::Failed;
    close_socket(p);
    fail_pending_locked(p, loss);
    if (!expected) fail_locked(loss, true);
    mu_.notify_all_locked();
  }

  void heartbeat_tick() {
    if (!heartbeat_timer_) heartbeat_timer_.emplace(io_);
    heartbeat_timer_->expires_after(options_.heartbeat_interval);
    heartbeat_timer_->async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      on_heartbeat();
      heartbeat_tick();
    });
  }

  void on_heartbeat() {
    std::lock_guard lk(mu_);
    if (closing_) return;
    const auto now = Clock::now();
    for (auto& pp : peers_) {
      Peer& p = *pp;
      if (p.rank == rank_ || p.state != Peer::State::Open) continue;
      const auto silent = p.silence(now);
      if (options_.heartbeat_timeout.count() > 0 && silent > options_.heartbeat_timeout) {
        // Bytes waiting in the kernel mean it is alive and this thread is behind.
        boost::system::error_code ec;
        if (p.socket->available(ec) > 0 && !ec) continue;
        peer_down_locked(p, fmt::format("no heartbeat for {:.1f} s",
                                        std::chrono::duration<double>(silent).count()));
        continue;
      }
      if (!p.writing && p.queue.empty() && now - p.last_tx >= options_.heartbeat_interval / 2) {
        enqueue_control_locked(p, FrameType::Heartbeat, 0, {});
      }
    }
  }

  // ---- shutdown -----------------------------------------------------------------------------

  void shutdown() noexcept {
    if (!io_thread_.joinable()) return;
    try {
      {
        std::unique_lock lk(mu_);
        closing_ = true;
        for (auto& p : peers_) {
          if (p->rank != rank_ && p->state == Peer::State::Open) enqueue_control_locked(*p, FrameType::Goodbye, 0, {}, true);
        }
        // A poisoned transport has told its peers already; a stopped peer would only delay us.
        mu_.wait_for(lk, failure_ ? kShutdownGrace / 4 : kShutdownGrace, [&] {
          return std::all_of(peers_.begin(), peers_.end(), [](const auto& p) { return !p->socket || p->socket_done; });
        });
      }
      std::promise<void> closed;
      asio::post(io_, [this, &closed] {
        boost::system::error_code ignored;
        if (acceptor_) acceptor_->close(ignored);
        if (heartbeat_timer_) heartbeat_timer_->cancel();
        std::lock_guard lk(mu_);
        for (auto& p : peers_) {
          if (p->retry_timer) p->retry_timer->cancel();
          close_socket(*p);
        }
        closed.set_value();
      });
      closed.get_future().wait_for(kShutdownGrace);
    } catch (...) {
      // Shutting down must not throw; stopping the io_context below releases everything anyway.
    }
    work_.reset();
    io_.stop();
    io_thread_.join();
  }

  // Members. io_ comes first so that it outlives every socket and timer that uses it.
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  CommunicatorOptions options_;
  observe::CollectiveMetrics* metrics_ = options_.metrics.get();  // null: no metrics
  int rank_;
  int size_;
  std::size_t chunk_bytes_ = 0;
  std::optional<std::string> token_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::optional<tcp::acceptor> acceptor_;
  std::chrono::milliseconds accept_backoff_{10};  // io thread only
  std::shared_ptr<std::atomic<std::size_t>> pending_handshakes_ = std::make_shared<std::atomic<std::size_t>>(0);
  RateLimiter refusal_limiter_;
  std::optional<asio::steady_timer> heartbeat_timer_;

  // The transport's lock and its condition: waiters are woken after it is released.
  mutable NotifyingMutex mu_;
  int open_count_ = 0;
  bool closing_ = false;
  std::optional<Failure> failure_;
  std::optional<Failure> setup_failure_;
  std::uint64_t next_seq_ = 0;
  BlobPool blobs_;
  bool congestion_refusal_logged_ = false;  // io thread only
  // Threads blocked in Op::block that want waking whenever a transfer completes; one in
  // Op::wait_until is woken only by a continuation's request, a failure, or a descriptor.
  int progress_waiters_ = 0;
  // Set once after construction when every rank mapped one segment (learn_topology);
  // used by the calling thread only.
  std::unique_ptr<SharedMemoryAllReduce> shared_memory_;
  // Rank 0 over TCP: its call whose descriptor table is not sent yet (relay_descriptors_locked).
  std::optional<std::pair<std::uint64_t, Descriptor>> root_pending_;
  // The call of the thread in Op::wait_until, if one is there (descriptor_wakes_locked).
  const Descriptor* quiet_desc_ = nullptr;
  std::uint64_t quiet_seq_ = 0;
  // Ops alive now: while there are any, the io thread busy-polls (run_io_loop).
  std::atomic<int> ops_in_flight_{0};
  std::atomic<int> exempt_ops_{0};  // of those, how many need no polling (exempt_from_busy_poll)
  std::thread io_thread_;
};

/// One call on the transport (a collective, or a point-to-point send/recv): it owns the transfers
/// it starts. If it ends by an exception, its destructor makes sure the io thread no longer
/// touches the caller's memory before the caller's frame unwinds.
class Transport::Op {
 public:
  /// A collective: takes the next collective number and announces `desc` to every peer.
  Op(Transport& t, const Descriptor& desc)
      : t_(t), collective_(true), mine_(desc), kind_(static_cast<observe::CallKind>(static_cast<int>(desc.kind) - 1)) {
    std::unique_lock lk(t_.mu_);
    label_ = fmt::format("{} #{}", to_string(desc.kind), t_.next_seq_);
    if (t_.failure_) fail_at_start(lk);
    seq_ = t_.next_seq_++;
    start();
    if (t_.size_ == 1) return;
    if (SharedMemoryAllReduce* shm = t_.shared_memory_.get()) {
      shm->announce(seq_, desc);  // every rank reads every announcement: no frames
    } else if (t_.rank_ == 0) {
      t_.root_pending_.emplace(seq_, desc);
      t_.relay_descriptors_locked();  // when every peer's came first
    } else {
      OutFrame f;
      f.owned = encode(desc);
      f.set_header(FrameHeader{FrameType::Descriptor, f.owned.size(), seq_, 0});
      f.size = f.owned.size();
      t_.send_now_or_enqueue(lk, t_.peer(0), std::move(f));
    }
  }

  /// Point-to-point with `peer`; `kind` (Send or Recv) counts it in the metrics and timeline,
  /// unset leaves it out (the transport's own set-up messages).
  Op(Transport& t, std::string label, int peer, std::optional<observe::CallKind> kind = std::nullopt)
      : t_(t), collective_(false), label_(std::move(label)), kind_(kind.value_or(observe::CallKind::Send)), observed_(kind.has_value()) {
    if (peer < 0 || peer >= t_.size_ || peer == t_.rank_) {
      throw InvalidArgument(fmt::format("{}: peer {} is not another rank of this cluster of {} (this is rank {})", label_,
                                        peer, t_.size_, t_.rank_));
    }
    std::unique_lock lk(t_.mu_);
    if (t_.failure_) fail_at_start(lk);
    start();
  }

  ~Op() {
    if (!finished_) {
      abandon();
      if (start_ns_ != 0) report(true);
    }
  }

  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  std::uint64_t seq() const noexcept { return seq_; }

  /// Names the algorithm or path this call takes, for the timeline ("ring", "shared_memory"...).
  void set_algorithm(const char* name) noexcept { algorithm_ = name; }

  /// Counts bytes moved outside the transport's frames (through shared memory), for the metrics.
  void count_bytes(std::size_t sent, std::size_t received) {
    if (start_ns_ == 0) return;
    std::lock_guard lk(t_.mu_);
    sent_ += sent;
    received_ += received;
  }

  /// Unless finish() completed: stops this Op's transfers and waits until neither the io thread
  /// nor a continuation touches the caller's memory (what the destructor does). An algorithm
  /// whose continuations use its own locals calls it before those go out of scope
  /// (ContinuationScope).
  void abandon_unless_finished() noexcept {
    if (!finished_) abandon();
  }

  /// Sends `data` (kept alive and unchanged by the caller until finish()) as a Data frame.
  TransferPtr send(int peer, std::uint64_t tag, std::span<const std::byte> data) {
    return send_frame(peer, MsgKey{FrameType::Data, seq_, tag}, data);
  }

  /// Like send(), but only the io thread writes the frame: directly when called there (from a
  /// continuation), else queued for it. For memory that a later receive of the same Op
  /// overwrites: the io thread's own write then happens before its read into that memory, which
  /// the peer's causality alone guarantees but a race detector cannot see.
  TransferPtr send_by_io_thread(int peer, std::uint64_t tag, std::span<const std::byte> data) {
    return send_frame(peer, MsgKey{FrameType::Data, seq_, tag}, data, std::this_thread::get_id() == t_.io_thread_.get_id());
  }

  /// Posts a receive of exactly `dst.size()` bytes. `on_arrival`, when given, runs once the bytes
  /// are in `dst`, on whichever thread completed the receive (the io thread, or this one when the
  /// frame was already here), before the receive counts as done. It may send and post receives
  /// on this Op; it must not wait, and it may run concurrently with this thread and with other
  /// continuations. It returns true when what wait_until() waits for may now hold. Once the Op is
  /// being abandoned, its sends and receives fail without starting.
  TransferPtr recv(int peer, std::uint64_t tag, std::span<std::byte> dst, std::function<bool()> on_arrival = {}) {
    return recv_frame(peer, MsgKey{FrameType::Data, seq_, tag}, dst, false, std::move(on_arrival));
  }

  TransferPtr send_p2p(int peer, std::span<const std::byte> data) {
    std::uint64_t n = 0;
    {
      std::lock_guard lk(t_.mu_);
      n = t_.peer(peer).p2p_sent++;
    }
    return send_frame(peer, MsgKey{FrameType::PointToPoint, n, 0}, data);
  }

  TransferPtr recv_p2p(int peer, std::span<std::byte> dst) {
    return recv_frame(peer, MsgKey{FrameType::PointToPoint, 0, 0}, dst, true);
  }

  /// Waits until `t` is done; throws the communicator's failure, a timeout, or a mismatch.
  void wait(const TransferPtr& t) {
    std::unique_lock lk(t_.mu_);
    block(lk, [&] { return settled_locked(*t); }, t->peer, t->is_send ? "a send to" : "data from");
  }

  /// Waits until `done()` holds, for state that continuations update: checked under the
  /// transport's mutex when a continuation returns true (not on every completed transfer), and on
  /// failures and descriptors. Throws like wait(), and for a failed transfer of this Op.
  /// `waiting_on` names the peer in a timeout's message.
  template <class Done>
  void wait_until(Done&& done, int waiting_on) {
    std::unique_lock lk(t_.mu_);
    quiet_ = true;
    const bool announce = collective_ && t_.quiet_desc_ == nullptr;
    if (announce) {
      t_.quiet_desc_ = &mine_;
      t_.quiet_seq_ = seq_;
    }
    struct Loud {  // destroyed before lk: runs with the mutex held
      Op& op;
      bool announced;
      ~Loud() {
        op.quiet_ = false;
        if (announced) op.t_.quiet_desc_ = nullptr;
      }
    } loud{*this, announce};
    block(
        lk,
        [&] {
          // By index: a continuation may append transfers whenever the mutex is released.
          for (std::size_t i = 0; i < transfers_.size(); ++i) {
            if (transfers_[i]->state == Transfer::State::Failed) (void)settled_locked(*transfers_[i]);
          }
          return done();
        },
        waiting_on, "data from");
  }

  /// For an algorithm that waits outside the transport (shared memory): throws what a wait would
  /// throw now (the communicator's failure, a mismatch once every descriptor is in, a passed
  /// deadline) without waiting. `waiting_on`: as for wait_until, or -1 (every rank).
  void check_progress(int waiting_on) {
    std::unique_lock lk(t_.mu_);
    if (t_.failure_) raise_failure_locked();
    if (collective_) poll_descriptors_locked();
    if (deadline_ && Clock::now() >= *deadline_) time_out_locked(waiting_on, "data from");
  }

  /// Poisons the communicator with `message` (sent to every peer) and throws it.
  [[noreturn]] void fail(FailureKind kind, std::string message) {
    std::unique_lock lk(t_.mu_);
    t_.fail_locked(Failure{kind, std::move(message)}, true);
    raise_failure_locked();
  }

  /// Every rank's descriptor of this collective, by rank (they agree; a mismatch throws).
  const std::vector<Descriptor>& descriptors() {
    std::unique_lock lk(t_.mu_);
    agreement_only_ = true;
    block(lk, [&] { return descs_ok_; }, -1, "");
    agreement_only_ = false;
    return all_;
  }

  /// Waits for every transfer started so far (continuations included) and goes on: for an
  /// algorithm run as one step of a larger one, which finish() ends.
  void settle() {
    std::unique_lock lk(t_.mu_);
    settle_locked(lk);
  }

  /// Waits for every transfer and, for a collective, every peer's agreeing descriptor. After it
  /// the transport holds no reference to the caller's memory.
  void finish() {
    std::unique_lock lk(t_.mu_);
    settle_locked(lk);
    if (collective_) {
      agreement_only_ = true;
      block(lk, [&] { return descs_ok_; }, -1, "");
    }
    transfers_.clear();
    finished_ = true;
    lk.unlock();
    if (start_ns_ != 0) report(false);
  }

 private:
  void settle_locked(std::unique_lock<NotifyingMutex>& lk) {
    // By index: a continuation may append transfers whenever the mutex is released.
    for (std::size_t i = 0; i < transfers_.size(); ++i) {
      const TransferPtr t = transfers_[i];
      block(lk, [&] { return settled_locked(*t); }, t->peer, t->is_send ? "a send to" : "data from");
    }
    transfers_.clear();
  }

  void start() {
    if (t_.options_.operation_timeout) deadline_ = Clock::now() + *t_.options_.operation_timeout;
    // Off, observing costs this branch (and the byte counts below, plain adds under a held lock).
    if (observed_ && (t_.metrics_ != nullptr || observe::timeline_enabled())) start_ns_ = observe::Timeline::now_ns();
  }

  // A call on a broken communicator: observed like one that failed, then its error.
  [[noreturn]] void fail_at_start(std::unique_lock<NotifyingMutex>& lk) {
    start();
    if (start_ns_ != 0) {
      lk.unlock();
      report(true);
      lk.lock();
    }
    raise_failure_locked();
  }

  // The call's end, into the metrics and the timeline (once). A failed call also writes the
  // timeline out at once: the process may not get to exit normally.
  void report(bool failed) noexcept {
    const std::int64_t end = observe::Timeline::now_ns();
    try {
      if (t_.metrics_) t_.metrics_->call(kind_, static_cast<double>(end - start_ns_) / 1e9, sent_, received_, failed);
      if (!observe::timeline_enabled()) return;
      std::string error;
      if (failed) {
        std::lock_guard lk(t_.mu_);
        error = t_.failure_ ? t_.failure_->message : std::string("ended by an error");
      }
      const std::size_t bytes = !collective_ ? std::max(sent_, received_)
                                : mine_.kind == CollectiveKind::AllReduce ? mine_.count * size_of(mine_.dtype)
                                                                         : mine_.count;
      const std::int64_t joined = joined_ns_ == 0 ? end : std::clamp(joined_ns_, start_ns_, end);
      observe::detail::CallArgs args;
      args.seq = collective_ ? static_cast<std::int64_t>(seq_) : -1;
      args.bytes = bytes;
      args.sent = sent_;
      args.received = received_;
      args.algorithm = algorithm_;
      if (collective_ && joined_ns_ != 0) args.wait_ns = joined - start_ns_;
      auto& tl = observe::Timeline::instance();
      const char* name = observe::kCallKindNames[static_cast<std::size_t>(kind_)];
      tl.call(name, start_ns_, end, args,
              failed ? fmt::format("\"error\":\"{}\"", observe::detail::json_escape(error)) : std::string());
      if (collective_ && joined_ns_ != 0) {
        // Waiting for every peer to announce the same call (a straggler shows here), then moving data.
        if (joined > start_ns_) tl.complete("wait for peers", "collective", start_ns_, joined);
        if (end > joined) tl.complete("transfer", "collective", joined, end);
      }
      if (failed) {
        tl.instant(fmt::format("{} failed", name), "failure", end,
                   fmt::format("\"error\":\"{}\"", observe::detail::json_escape(error)));
        tl.flush();
      }
    } catch (...) {
      // Observing must never turn a call's outcome into another error.
    }
  }

  TransferPtr send_frame(int peer, const MsgKey& key, std::span<const std::byte> data, bool direct = true) {
    if (data.size() > t_.options_.max_frame_bytes) {
      throw InvalidArgument(fmt::format("{}: a message of {} bytes exceeds max_frame_bytes ({})", label_, data.size(),
                                        t_.options_.max_frame_bytes));
    }
    auto t = std::make_shared<Transfer>();
    t->is_send = true;
    t->peer = peer;
    t->key = key;
    t->size = data.size();
    OutFrame f;
    f.set_header(FrameHeader{key.type, data.size(), key.seq, key.tag});
    f.payload = data.data();
    f.size = data.size();
    f.transfer = t;
    std::unique_lock lk(t_.mu_);
    transfers_.push_back(t);
    if (abandoning_) {
      t->state = Transfer::State::Failed;
      return t;
    }
    sent_ += data.size();
    t_.send_now_or_enqueue(lk, t_.peer(peer), std::move(f), direct);
    return t;
  }

  TransferPtr recv_frame(int peer, MsgKey key, std::span<std::byte> dst, bool p2p, std::function<bool()> on_arrival = {}) {
    if (dst.size() > t_.options_.max_frame_bytes) {
      throw InvalidArgument(fmt::format("{}: a message of {} bytes exceeds max_frame_bytes ({})", label_, dst.size(),
                                        t_.options_.max_frame_bytes));
    }
    auto t = std::make_shared<Transfer>();
    t->peer = peer;
    t->dst = dst.data();
    t->size = dst.size();
    t->on_arrival = std::move(on_arrival);
    Blob early;
    {
      std::lock_guard lk(t_.mu_);
      Peer& p = t_.peer(peer);
      if (p2p) key.seq = p.p2p_received++;
      t->key = key;
      transfers_.push_back(t);
      if (abandoning_) {
        t->state = Transfer::State::Failed;
        return t;
      }
      received_ += dst.size();
      if (auto it = p.unexpected.find(key); it != p.unexpected.end()) {
        early = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) p.unexpected.erase(it);
        t->state = Transfer::State::Active;  // abandon() must wait for the copy and the continuation
      } else if (p.state != Peer::State::Open) {
        t->state = Transfer::State::Failed;
        t->error = t_.closed_failure_locked(p);
        return t;
      } else {
        p.posted[key].push_back(t);
        return t;
      }
    }
    // It arrived before this receive was posted: copy it out of its buffer (outside the lock).
    if (early.size == dst.size()) {
      if (early.size > 0) std::memcpy(dst.data(), early.data.get(), early.size);
      std::unique_lock lk(t_.mu_);
      t_.blobs_.give(std::move(early));
      t_.complete_receive_locked(lk, t);
    } else {
      std::lock_guard lk(t_.mu_);
      t->state = Transfer::State::Failed;
      t->error = Failure{FailureKind::Mismatch, t_.size_mismatch(t_.peer(peer), early.size, dst.size(), t->key)};
      t_.mu_.notify_all_locked();  // posted by a continuation, the caller waits in wait_until
    }
    return t;
  }

  // Counts this thread, while it waits, among those to wake whenever a transfer completes.
  using ProgressWaiter = ScopedCount<int>;

  [[noreturn]] void raise_failure_locked() const { raise(t_.failure_->kind, fmt::format("{}: {}", label_, t_.failure_->message)); }

  bool settled_locked(const Transfer& t) {
    switch (t.state) {
      case Transfer::State::Done: return true;
      case Transfer::State::Failed:
        if (t.error.kind == FailureKind::Mismatch) {
          // A point-to-point size mismatch consumed the message: the streams are still in step.
          if (!collective_) raise(FailureKind::Mismatch, fmt::format("{}: {}", label_, t.error.message));
          // In a collective the descriptors (sent ahead of the data) say precisely what differs.
          if (!mismatch_) mismatch_ = t.error;
          return false;
        }
        t_.fail_locked(t.error, true);
        raise_failure_locked();
      default: return false;
    }
  }

  template <class Done>
  void block(std::unique_lock<NotifyingMutex>& lk, Done&& done, int waiting_on, std::string_view what) {
    int polls = 0;
    for (;;) {
      // Read before the announcements are looked at (poll_pause sleeps only if none came since).
      const std::uint32_t epoch = collective_ && t_.shared_memory_ ? t_.shared_memory_->announce_epoch() : 0;
      if (done()) return;
      if (t_.failure_) raise_failure_locked();
      if (collective_) {
        poll_descriptors_locked();
        if (descs_ok_ && mismatch_) {
          t_.fail_locked(*mismatch_, true);
          raise_failure_locked();
        }
        if (done()) return;  // the poll may have been what it waited for
      }
      const ProgressWaiter waiter(t_.progress_waiters_, quiet_ ? 0 : 1);
      if (collective_ && !descs_ok_ && t_.shared_memory_) {
        // The peers' descriptors come through shared memory, which does not wake the mutex.
        if (deadline_ && Clock::now() >= *deadline_) time_out_locked(waiting_on, what);
        poll_pause(lk, epoch, polls++);
        continue;
      }
      if (!deadline_) {
        t_.mu_.wait(lk);
        continue;
      }
      if (Clock::now() >= *deadline_) time_out_locked(waiting_on, what);
      t_.mu_.wait_until(lk, *deadline_);
    }
  }

  // Between two looks at shared memory. Waiting for the descriptors alone (finish, descriptors):
  // sleeps until a rank announces a call after `epoch` was read, or 1 ms passes (a failure, which
  // comes through the sockets, is seen within that). Waiting for transfers too: on the mutex, which
  // they wake, for 20 us doubling to 1 ms.
  void poll_pause(std::unique_lock<NotifyingMutex>& lk, std::uint32_t epoch, int round) {
    auto wait = agreement_only_ ? std::chrono::microseconds(1000)
                                : std::chrono::microseconds(std::min(1000, 20 << std::min(6, round)));
    if (deadline_) {
      wait = std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(*deadline_ - Clock::now()),
                        std::chrono::microseconds(1), wait);
    }
    if (!agreement_only_) {
      t_.mu_.wait_until(lk, Clock::now() + wait);
      return;
    }
    const SharedMemoryAllReduce* shm = t_.shared_memory_.get();
    lk.unlock();
    shm->wait_announcement(epoch, wait);
    lk.lock();
  }

  [[noreturn]] void time_out_locked(int waiting_on, std::string_view what) {
    const std::string waiting = waiting_on >= 0 ? fmt::format("{} {}", what, t_.peer(waiting_on).name) : missing_locked();
    t_.fail_locked(Failure{FailureKind::Timeout,
                           fmt::format("did not complete within {} ms ({} was waiting for {}{})",
                                       t_.options_.operation_timeout->count(), t_.me(), waiting, silent_peers_locked())},
                   true);
    raise_failure_locked();
  }

  // Peers quiet for longer than two heartbeat intervals: the likely culprits of a stall, which
  // need not be the peer this rank waits on (in a ring, everyone waits behind a stopped rank).
  std::string silent_peers_locked() const {
    std::string out;
    const auto now = Clock::now();
    for (const auto& p : t_.peers_) {
      if (p->rank == t_.rank_ || p->state != Peer::State::Open) continue;
      const auto quiet = p->silence(now);
      if (quiet > 2 * t_.options_.heartbeat_interval) {
        out += fmt::format("; {} has sent nothing for {:.1f} s", p->name, std::chrono::duration<double>(quiet).count());
      }
    }
    return out;
  }

  // Who has not announced this collective yet (for timeout messages).
  std::string missing_locked() const {
    if (descs_ok_) return "the other ranks";
    std::string names;
    for (const auto& p : t_.peers_) {
      if (p->rank == t_.rank_ || joined_locked(*p)) continue;
      names += (names.empty() ? "" : ", ") + p->name;
    }
    return names.empty() ? std::string("the other ranks") : fmt::format("{} to join", names);
  }

  // Whether rank `r`'s descriptor of this call is in (in shared memory, or from TCP).
  bool joined_locked(const Peer& p) const {
    if (const SharedMemoryAllReduce* shm = t_.shared_memory_.get()) return shm->announced(p.rank, seq_).has_value();
    return p.descriptors.count(seq_) != 0;
  }

  void poll_descriptors_locked() {
    if (descs_ok_) return;
    const SharedMemoryAllReduce* shm = t_.shared_memory_.get();
    for (auto& p : t_.peers_) {
      if (p->rank == t_.rank_ || joined_locked(*p)) continue;
      if (p->state != Peer::State::Open) {
        t_.fail_locked(Failure{FailureKind::Peer, fmt::format("{} ({}) closed its communicator before joining collective #{}",
                                                              p->name, p->address, seq_)},
                       true);
        raise_failure_locked();
      }
      return;
    }
    all_.assign(static_cast<std::size_t>(t_.size_), Descriptor{});
    for (auto& p : t_.peers_) {
      if (p->rank == t_.rank_) {
        all_[static_cast<std::size_t>(p->rank)] = mine_;
      } else if (shm != nullptr) {
        all_[static_cast<std::size_t>(p->rank)] = *shm->announced(p->rank, seq_);
        // The timeline's "waiting for peers" ends when this rank saw the last announcement.
        if (start_ns_ != 0) joined_ns_ = observe::Timeline::now_ns();
      } else {
        auto it = p->descriptors.find(seq_);
        all_[static_cast<std::size_t>(p->rank)] = it->second;
        p->descriptors.erase(it);
        if (!p->descriptor_at.empty()) note_joined_locked(*p);
      }
    }
    descs_ok_ = true;
    // Every rank compares every rank against rank 0 in rank order, so all report the same pair.
    for (std::size_t r = 1; r < all_.size(); ++r) {
      if (!compatible(all_[0], all_[r])) {
        t_.fail_locked(Failure{FailureKind::Mismatch,
                               fmt::format("mismatched collectives at collective #{}: {} called {} but {} called {}", seq_,
                                           t_.peer(0).name, describe(all_[0]), t_.peer(static_cast<int>(r)).name,
                                           describe(all_[r]))},
                       true);
        raise_failure_locked();
      }
    }
  }

  // The timeline's "waiting for peers" ends when the last peer's descriptor arrived.
  void note_joined_locked(Peer& p) {
    auto at = p.descriptor_at.find(seq_);
    if (at == p.descriptor_at.end()) return;
    if (start_ns_ != 0) {
      joined_ns_ = std::max<std::int64_t>(
          joined_ns_, std::chrono::duration_cast<std::chrono::nanoseconds>(at->second.time_since_epoch()).count());
    }
    p.descriptor_at.erase(p.descriptor_at.begin(), std::next(at));
  }

  void abandon() noexcept {
    try {
      std::unique_lock lk(t_.mu_);
      abandoning_ = true;  // continuations still running start nothing new
      for (const auto& t : transfers_) {
        if (t->state != Transfer::State::Queued) continue;
        Peer& p = t_.peer(t->peer);
        if (t->is_send) {
          std::erase_if(p.queue, [&](const OutFrame& f) { return f.transfer == t; });
        } else if (auto it = p.posted.find(t->key); it != p.posted.end()) {
          std::erase(it->second, t);
          if (it->second.empty()) p.posted.erase(it);
        }
        t->state = Transfer::State::Failed;
      }
      auto busy = [&] {
        return std::any_of(transfers_.begin(), transfers_.end(),
                           [](const TransferPtr& t) { return t->state == Transfer::State::Active; });
      };
      const ProgressWaiter waiter(t_.progress_waiters_, 1);
      if (!t_.mu_.wait_for(lk, kAbandonGrace, [&] { return !busy(); })) {
        // A peer that neither reads nor writes (stopped) holds our memory in a socket call: cut it.
        std::set<int> stuck;
        for (const auto& t : transfers_) {
          if (t->state == Transfer::State::Active) stuck.insert(t->peer);
        }
        for (int r : stuck) {
          asio::post(t_.io_, [tr = &t_, r] {
            std::lock_guard g(tr->mu_);
            tr->peer_down_locked(tr->peer(r), "connection cut: it stopped exchanging data");
          });
        }
        t_.mu_.wait(lk, [&] { return !busy(); });
      }
      transfers_.clear();
      finished_ = true;
    } catch (...) {
      // Only allocation can throw here; nothing better to do than carry on unwinding.
    }
  }

  Transport& t_;
  // Counts this Op in ops_in_flight_ for its whole life (after ~Op's abandon, too).
  ScopedCount<std::atomic<int>> in_flight_{t_.ops_in_flight_, 1};
  bool collective_;
  Descriptor mine_{};
  std::string label_;
  std::uint64_t seq_ = 0;
  std::optional<Clock::time_point> deadline_;
  std::vector<TransferPtr> transfers_;
  std::vector<Descriptor> all_;
  bool descs_ok_ = false;
  std::optional<Failure> mismatch_;
  bool finished_ = false;
  bool abandoning_ = false;
  bool quiet_ = false;  // in wait_until: only continuations that ask for it wake this thread
  bool agreement_only_ = false;  // in block() for the descriptors alone (poll_pause)
  // Observing (start_ns_ 0: not observed).
  observe::CallKind kind_;
  bool observed_ = true;
  const char* algorithm_ = nullptr;
  std::int64_t start_ns_ = 0;
  std::int64_t joined_ns_ = 0;  // when the last peer's descriptor arrived (timeline only)
  std::size_t sent_ = 0, received_ = 0;
};

/// Declared after the locals that an Op's continuations capture: if the scope is left by an
/// exception, the Op is abandoned while those locals still exist. An algorithm that returns
/// normally has settled or finished the Op first.
class ContinuationScope {
 public:
  explicit ContinuationScope(Transport::Op& op) noexcept : op_(op), unwinding_(std::uncaught_exceptions()) {}
  ~ContinuationScope() {
    if (std::uncaught_exceptions() > unwinding_) op_.abandon_unless_finished();
  }
  ContinuationScope(const ContinuationScope&) = delete;
  ContinuationScope& operator=(const ContinuationScope&) = delete;

 private:
  Transport::Op& op_;
  int unwinding_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
