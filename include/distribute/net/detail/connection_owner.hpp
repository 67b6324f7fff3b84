// What a connection (net/detail/connection.hpp) asks of its owner, a communicator's mesh of peers
// or an RPC server or client: how to read each frame type, where a bulk payload goes, and what to do
// when the connection fails. The owner's mutex guards the connection's state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/frame.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class Connection;

/// How a connection reads the frames of one type.
enum class FrameIntake : std::uint8_t {
  Heartbeat,  // no payload; the bytes count as traffic
  Goodbye,    // no payload; ConnectionOwner::on_goodbye
  Control,    // a small payload read whole, then ConnectionOwner::on_control
  Bulk,       // a payload read into memory the owner chooses (begin_bulk / end_bulk)
  Refuse      // not expected on this connection: malformed
};

/// What a connection reports to its owner. The reading hooks run on the event loop with the
/// owner's mutex released; the *_locked ones with it held.
class ConnectionOwner {
 public:
  virtual FrameIntake intake(const Connection& c, FrameType type) const noexcept = 0;
  virtual void on_goodbye(Connection& c) = 0;
  /// May throw FrameError: the connection then fails as malformed.
  virtual void on_control(Connection& c, const FrameHeader& h, std::span<const std::byte> payload) = 0;
  /// Where a bulk frame's `h.length` bytes go; nullptr: into memory that grows as they arrive
  /// (grow_bulk). May throw FrameError (the connection fails as malformed).
  virtual std::byte* begin_bulk(Connection& c, const FrameHeader& h) = 0;
  /// A growing destination of at least `bytes` bytes (its first bytes kept); may throw FrameError.
  virtual std::byte* grow_bulk(Connection& c, std::size_t bytes) {
    (void)c;
    (void)bytes;
    throw FrameError("this connection has no growing destination");
  }
  /// The bulk frame's bytes are in place; the connection reads the next header after this returns.
  virtual void end_bulk(Connection& c) = 0;
  /// The read side failed: the peer went away (`malformed` false) or broke the protocol.
  virtual void on_read_failed(Connection& c, const std::string& reason, bool malformed) = 0;

  /// The failure given to transfers that a lost connection could not complete.
  virtual Failure loss_locked(const Connection& c, const std::string& reason) const = 0;
  /// The failure given to a frame sent on a connection that is no longer open.
  virtual Failure closed_failure_locked(const Connection& c) const = 0;
  /// A write failed: the connection is lost.
  virtual void on_write_failed_locked(Connection& c, const std::string& reason) = 0;
  /// Whether a completed send must wake the threads waiting on the owner's mutex.
  virtual bool wake_on_progress_locked() const noexcept = 0;

 protected:
  ~ConnectionOwner() = default;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
