// One other rank of a communicator's mesh: its connection, and the receives and early frames its
// incoming frames are matched against (by type, sequence and tag).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <distribute/net/address.hpp>
#include <distribute/net/detail/connection.hpp>
#include <distribute/net/detail/connector.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/detail/transfer.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// One other rank: its connection and what its frames are matched against.
struct Peer {
  Peer(ConnectionOwner& owner, NotifyingMutex& mu, asio::io_context& io, int r, std::string name, std::string address,
       std::size_t max_frame_bytes)
      : conn(owner, mu, io, r, std::move(name), std::move(address), max_frame_bytes), rank(r) {}
  Connection conn;
  int rank;
  HostPort endpoint;
  const std::string& name() const noexcept { return conn.name(); }
  const std::string& address() const noexcept { return conn.address(); }
  Connection::State& state() noexcept { return conn.state; }
  Connection::State state() const noexcept { return conn.state; }
  bool claimed = false;  // an accepted handshake is completing for this rank
  // Connecting to ranks below ours.
  std::optional<Dialer> dialer;
  std::string last_error = "no attempt yet";
  // The frame being read (io thread only): the receive it goes to, or the buffer it waits in.
  TransferPtr rx_transfer;
  Blob rx_blob;
  bool rx_keep = false;
  // Matching (guarded by the mutex).
  std::map<MsgKey, std::deque<TransferPtr>> posted;
  std::map<MsgKey, std::deque<Blob>> unexpected;
  std::uint64_t p2p_sent = 0;
  std::uint64_t p2p_received = 0;

  /// The receive posted first for `key`, taken off the list; null when none is.
  TransferPtr take_posted_locked(const MsgKey& key) {
    auto it = posted.find(key);
    if (it == posted.end()) return nullptr;
    TransferPtr t = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) posted.erase(it);
    return t;
  }
  /// Takes a receive that has not started off the list (its call is being abandoned).
  void unpost_locked(const TransferPtr& t) {
    if (auto it = posted.find(t->key); it != posted.end()) {
      std::erase(it->second, t);
      if (it->second.empty()) posted.erase(it);
    }
  }
  /// The frame for `key` that arrived before its receive was posted, taken; false when none did.
  bool take_early_locked(const MsgKey& key, Blob& out) {
    auto it = unexpected.find(key);
    if (it == unexpected.end()) return false;
    out = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) unexpected.erase(it);
    return true;
  }
  /// Fails what waits on this peer and cannot complete any more (posted receives, queued sends).
  void fail_pending_locked(const Failure& f) {
    for (auto& [key, list] : posted) {
      for (auto& t : list) {
        t->state = Transfer::State::Failed;
        t->error = f;
      }
    }
    posted.clear();
    conn.fail_queued_locked(f);
  }
  /// Why a frame of `got` bytes cannot go to a receive of `want` (`me`: the receiving rank).
  std::string size_mismatch(std::size_t got, std::size_t want, const MsgKey& key, const std::string& me) const {
    std::string msg = fmt::format("{} sent {} bytes where {} expected {}", name(), got, me, want);
    if (key.type == FrameType::Data) msg += fmt::format(" (collective #{}, piece {})", key.seq, key.tag);
    return msg;
  }
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
