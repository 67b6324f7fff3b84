// ds::ServerOptions: what a ps or worker task's ds::Server can be told (ps/server.hpp): its
// token and exposure, its deadlines, the bounds on what a peer may cost it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

struct ServerOptions {
  /// Shared secret every peer must prove (see net::CommunicatorOptions::cluster_token); with one,
  /// GET /metrics on this port wants it as `Authorization: Bearer TOKEN`.
  std::optional<std::string> cluster_token = std::nullopt;
  /// Listen beyond loopback without a token, where anyone who can connect may create variables,
  /// run functions and stop the task: refused (ClusterConfigError) unless set, or
  /// DISTRIBUTE_INSECURE=1.
  bool insecure = false;
  /// A worker's first call to a ps task waits this long for it to come up.
  std::chrono::milliseconds connect_timeout{60000};
  /// The whole handshake: how long a connection that has not proved the token may stay.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Once a request has begun, its bytes must keep coming: a request that sends nothing for this
  /// long is dropped with its connection.
  std::chrono::milliseconds read_timeout{30000};
  /// Connections in their handshake at once; more are closed when accepted (and no more than the
  /// descriptor limit allows: see docs/parameter-server.md).
  std::size_t max_pending_connections = 64;
  /// Refused connections and malformed frames are reported here (a few lines a second at most);
  /// default: stderr.
  std::function<void(std::string_view)> log = {};
  /// The most bytes one variable a ps task fills itself (an Initializer) may hold: its request is a
  /// few bytes whatever the shape, so the shape is checked against this before anything is
  /// allocated. 0: this machine's memory.
  std::uint64_t max_initialized_bytes = 0;
};

DISTRIBUTE_END_NAMESPACE
