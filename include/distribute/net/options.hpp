// Tuning and security knobs of the transport's users: the communicator (collectives) and the
// request/response protocol the parameter-server service runs on it (RpcOptions).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace observe {
class CollectiveMetrics;
}
namespace net {

struct CommunicatorOptions {
  /// Total time the constructor waits for every peer to appear; connects are retried with
  /// exponential back-off (1 ms doubling to 50 ms) until then, because peers start in any order.
  std::chrono::milliseconds connect_timeout{60000};
  /// One handshake (hello, challenge, response, welcome) must finish within this; it also bounds
  /// how long a stranger that connects and says nothing holds a socket.
  std::chrono::milliseconds handshake_timeout{5000};
  /// An otherwise idle connection carries a heartbeat this often.
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A peer that sent nothing for this long is declared lost (PeerFailure). Zero disables it.
  std::chrono::milliseconds heartbeat_timeout{10000};
  /// Deadline of one collective or point-to-point call; expiry throws CollectiveTimeout here and
  /// aborts the peers. Unset: no deadline (a dead peer is still found by EOF or heartbeat).
  std::optional<std::chrono::milliseconds> operation_timeout;
  /// Shared secret every peer must prove it holds (HMAC-SHA256 challenge-response, both ways)
  /// before any data. Unset: the environment variable DISTRIBUTE_CLUSTER_TOKEN, if non-empty.
  /// Set to "": no authentication even when the variable is set.
  std::optional<std::string> cluster_token;
  /// Listen on an address other machines reach without a cluster token (anyone who can connect
  /// may join). Refused (ClusterConfigError) unless set, or DISTRIBUTE_INSECURE=1.
  bool insecure = false;
  /// Largest payload accepted in one frame; a peer claiming more is dropped as malformed.
  std::size_t max_frame_bytes = std::size_t{1} << 31;
  /// Granularity of pipelining: the ring cuts buffers into chunks of about this size so that
  /// sending, receiving and reducing overlap. (256 KiB was the default until fewer, larger frames
  /// measured faster: docs/performance.md, multi-worker section.)
  std::size_t chunk_bytes = std::size_t{512} << 10;
  /// all_reduce picks its algorithm in one table (net/detail/all_reduce.hpp), by where the ranks
  /// run and the buffer's size:
  ///  - every rank on this host, one shared segment: shared memory (shared_memory_min_bytes);
  ///  - several hosts, some ranks sharing one: hierarchical (through each host's segment, across
  ///    hosts by one leader per host up to direct_max_bytes, above it by a leader per part, as
  ///    many parts as the smallest host has ranks);
  ///  - otherwise over TCP: up to direct_max_bytes, direct (every rank sends its buffer to every
  ///    other and reduces all n; one hop, latency wins over bandwidth for small buffers), also at
  ///    any size for two ranks on two hosts; up to halving_doubling_max_bytes with n a power of
  ///    two >= 4, halving-doubling (recursive halving reduce-scatter + recursive doubling
  ///    all-gather, 2 log2(n) steps, nearest partners first); else the chunk-pipelined ring
  ///    (2(n-1) steps whose chunks overlap).
  /// The ring and halving-doubling send the same bytes; halving-doubling has fewer steps, the ring
  /// overlaps each step with the next. Both cut a step's data into chunks of about chunk_bytes.
  std::size_t direct_max_bytes = std::size_t{32} << 10;
  /// See direct_max_bytes. 0: never halving-doubling.
  std::size_t halving_doubling_max_bytes = std::size_t{4} << 20;
  /// While a call is in flight, the network thread keeps polling the sockets for this long after
  /// the last event before it sleeps: a frame that arrives meanwhile is handled at once instead of
  /// after a wake-up (tens of microseconds on a busy host, per chunk). It costs CPU only during
  /// calls, and it yields between polls to threads that need the core. Zero (or less): always
  /// sleep.
  std::chrono::microseconds busy_poll{100};
  /// When every rank runs on this host (and can map one shared-memory segment, which the
  /// constructor tries), all-reduces of at least this many bytes go through shared memory instead
  /// of TCP: two copies per rank and a reduction, no TCP stack (docs/performance.md, multi-worker
  /// section); the default, 1, sends every all-reduce that way. The segment then also carries every
  /// collective's descriptor (the agreement check); the TCP connections carry heartbeats and
  /// failures. 0 on any rank: TCP only, for every rank; otherwise rank 0's value counts for all.
  /// With ranks on several hosts each host maps a segment of its own for the hierarchical
  /// all-reduce, whatever the size; 0 on any rank of a host leaves that host's ranks on TCP.
  std::size_t shared_memory_min_bytes = 1;
  /// Each rank's slot in that segment (which holds ranks + 1 slots): larger buffers go through in
  /// pieces of this size (rounded up to whole 64-byte lines, at most 1 GiB). Rank 0's value counts.
  std::size_t shared_memory_slot_bytes = std::size_t{1} << 20;
  /// TCP congestion control for connections within this host (the listening address and the
  /// peer's are loopback addresses), set before they are established; "" keeps the system's
  /// default. There is no network on loopback to probe, and a BBR default paces every send with
  /// a kernel timer: reno, which Linux lets any user pick, does not (docs/performance.md,
  /// multi-worker section). Connections to other hosts always keep the system's choice. Linux
  /// only; a name the kernel refuses throws InvalidArgument from the constructor.
  std::string loopback_congestion_control = "reno";
  /// Connections still in their handshake at once; beyond it a new connection is closed as soon as
  /// it is accepted, so strangers cannot hold every descriptor (each holds one for at most
  /// handshake_timeout).
  std::size_t max_pending_connections = 64;
  /// Where refused connections are reported (a few lines a second at most; the refused peer is
  /// told only "refused"); default: one line on stderr.
  std::function<void(std::string_view)> log;
  /// When set, every call, connection retry and failure is counted there (observe/collective_metrics.hpp;
  /// a multi-worker strategy sets it when metrics are on). Unset: nothing is counted.
  std::shared_ptr<observe::CollectiveMetrics> metrics;
};

struct RpcOptions {
  /// How long a first connection retries (with back-off) while the server starts.
  std::chrono::milliseconds connect_timeout{60000};
  /// The whole handshake; also how long a silent stranger may hold a socket.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Server: once a request has begun, its bytes must keep coming: a request that sends nothing
  /// for this long is dropped with its connection, so a half-sent frame holds nothing for long.
  std::chrono::milliseconds read_timeout{30000};
  /// Server: how long an authenticated connection may go without a request (none: as long as it
  /// likes; a coordinator's connections are idle between closures).
  std::optional<std::chrono::milliseconds> idle_timeout = std::nullopt;
  /// An otherwise idle connection carries a heartbeat this often, both ways.
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A peer that sent nothing (not even a heartbeat) for this long is lost: a client's call fails
  /// with ConnectionLost, a server drops the connection. Zero disables it.
  std::chrono::milliseconds heartbeat_timeout{10000};
  /// Server: connections still in their handshake (or an HTTP request) at once; beyond it a new
  /// connection is closed as soon as it is accepted. Also capped by the descriptor limit
  /// (RLIMIT_NOFILE), so that strangers cannot use up the descriptors a worker needs.
  std::size_t max_pending_connections = 64;
  /// Server: threads that run the requests that may take long (a worker's closures); requests
  /// beyond them wait their turn. Quick requests run on the network thread.
  std::size_t handler_threads = 4;
  /// Shared secret (see net::CommunicatorOptions::cluster_token): unset means the
  /// DISTRIBUTE_CLUSTER_TOKEN environment variable, "" means none.
  std::optional<std::string> cluster_token = std::nullopt;
  /// Server: listen beyond loopback without a token (see CommunicatorOptions::insecure).
  bool insecure = false;
  /// Largest request or reply accepted in one frame.
  std::size_t max_frame_bytes = std::size_t{1} << 31;
  /// TCP congestion control for loopback connections (see CommunicatorOptions).
  std::string loopback_congestion_control = "reno";
  /// Refused connections are reported here; default: one line on stderr.
  std::function<void(std::string_view)> log = {};
};

}  // namespace net
DISTRIBUTE_END_NAMESPACE
