// Payloads of the control frames: the handshake (hello, challenge, response, reject), abort, and
// the collective descriptor. Parsers check sizes and ranges and throw FrameError, like the header
// decoder, so a peer's bytes are never trusted.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/frame.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// Handshake frames are tiny; this bounds what an unauthenticated socket may make us read.
inline constexpr std::uint64_t kMaxHandshakePayload = 1024;
static_assert(kMaxHandshakePayload <= kMaxPreAuthPayload, "the collectives' handshake stays under the pre-auth cap");

class Writer {
 public:
  Writer& u8(std::uint8_t v) { return put(v, 1); }
  Writer& u32(std::uint32_t v) { return put(v, 4); }
  Writer& u64(std::uint64_t v) { return put(v, 8); }
  Writer& bytes(std::span<const std::byte> b) {
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  Writer& text(std::string_view s) { return bytes(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  Writer& put(std::uint64_t v, std::size_t n) {
    const std::size_t at = out_.size();
    out_.resize(at + n);
    store_le(out_.data() + at, v, n);
    return *this;
  }
  std::vector<std::byte> out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, std::string_view what) : in_(in), what_(what) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(get(1)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::uint64_t u64() { return get(8); }
  template <std::size_t N>
  std::array<std::byte, N> array() {
    need(N);
    std::array<std::byte, N> out{};
    std::copy_n(in_.begin(), N, out.begin());
    in_ = in_.subspan(N);
    return out;
  }
  std::string rest_text() {
    std::string s(reinterpret_cast<const char*>(in_.data()), in_.size());
    in_ = {};
    return s;
  }
  void done() const {
    if (!in_.empty()) throw FrameError(fmt::format("{} payload has {} trailing bytes", what_, in_.size()));
  }

 private:
  void need(std::size_t n) const {
    if (in_.size() < n) throw FrameError(fmt::format("{} payload is truncated", what_));
  }
  std::uint64_t get(std::size_t n) {
    need(n);
    const std::uint64_t v = load_le(in_.data(), n);
    in_ = in_.subspan(n);
    return v;
  }
  std::span<const std::byte> in_;
  std::string_view what_;
};

// ---- handshake ---------------------------------------------------------------------------

// Flags of a hello and a challenge.
inline constexpr std::uint32_t kHandshakeToken = 1;    // the sender holds a cluster token
inline constexpr std::uint32_t kHandshakeService = 2;  // a client of a service (RPC), not a rank of a mesh

struct Hello {
  std::uint32_t size = 0;       // cluster size the connector believes in (0 for a service client)
  std::uint32_t from_rank = 0;  // the connector
  std::uint32_t to_rank = 0;    // whom it believes it is calling
  bool has_token = false;
  Nonce nonce{};
  bool service = false;
};

struct Challenge {
  std::uint32_t size = 0;
  std::uint32_t rank = 0;       // the acceptor
  std::uint32_t peer_rank = 0;  // echo of Hello::from_rank
  bool has_token = false;
  Nonce nonce{};
  Mac proof{};  // HMAC(token, acceptor label, nonces, ranks); zero without a token
  bool service = false;  // echo of Hello::service
};

constexpr std::uint32_t handshake_flags(bool has_token, bool service) noexcept {
  return (has_token ? kHandshakeToken : 0) | (service ? kHandshakeService : 0);
}

inline std::vector<std::byte> encode(const Hello& h) {
  return Writer().u32(h.size).u32(h.from_rank).u32(h.to_rank).u32(handshake_flags(h.has_token, h.service)).bytes(h.nonce).take();
}

inline Hello decode_hello(std::span<const std::byte> in) {
  Reader r(in, "hello");
  Hello h;
  h.size = r.u32();
  h.from_rank = r.u32();
  h.to_rank = r.u32();
  const std::uint32_t flags = r.u32();
  if (flags > (kHandshakeToken | kHandshakeService)) throw FrameError(fmt::format("hello has unknown flags 0x{:x}", flags));
  h.has_token = (flags & kHandshakeToken) != 0;
  h.service = (flags & kHandshakeService) != 0;
  h.nonce = r.array<kNonceBytes>();
  r.done();
  return h;
}

inline std::vector<std::byte> encode(const Challenge& c) {
  return Writer()
      .u32(c.size)
      .u32(c.rank)
      .u32(c.peer_rank)
      .u32(handshake_flags(c.has_token, c.service))
      .bytes(c.nonce)
      .bytes(c.proof)
      .take();
}

inline Challenge decode_challenge(std::span<const std::byte> in) {
  Reader r(in, "challenge");
  Challenge c;
  c.size = r.u32();
  c.rank = r.u32();
  c.peer_rank = r.u32();
  const std::uint32_t flags = r.u32();
  if (flags > (kHandshakeToken | kHandshakeService)) throw FrameError(fmt::format("challenge has unknown flags 0x{:x}", flags));
  c.has_token = (flags & kHandshakeToken) != 0;
  c.service = (flags & kHandshakeService) != 0;
  c.nonce = r.array<kNonceBytes>();
  c.proof = r.array<kMacBytes>();
  r.done();
  return c;
}

inline Mac decode_response(std::span<const std::byte> in) {
  Reader r(in, "response");
  const Mac m = r.array<kMacBytes>();
  r.done();
  return m;
}

/// The proof each side sends: distinct labels for the two directions so that one side's proof
/// can never be replayed as the other's, and for a mesh's ranks and a service's clients, with both
/// nonces and both ranks bound in.
inline Mac handshake_proof(std::string_view token, bool from_acceptor, const Nonce& connector_nonce,
                           const Nonce& acceptor_nonce, std::uint32_t size, std::uint32_t acceptor_rank,
                           std::uint32_t connector_rank, bool service = false) {
  Writer w;
  if (service) {
    w.text(from_acceptor ? "distribute.rpc/v1 server proof" : "distribute.rpc/v1 client proof");
  } else {
    w.text(from_acceptor ? "distribute.net/v1 acceptor proof" : "distribute.net/v1 connector proof");
  }
  w.bytes(connector_nonce).bytes(acceptor_nonce).u32(size).u32(acceptor_rank).u32(connector_rank);
  const auto msg = w.take();
  return hmac_sha256(token, msg);
}

inline std::string decode_text(std::span<const std::byte> in) {
  return std::string(reinterpret_cast<const char*>(in.data()), in.size());
}

// ---- abort -------------------------------------------------------------------------------

/// Why a communicator failed; travels in Abort frames so every peer throws the same kind.
enum class FailureKind : std::uint8_t { Peer = 1, Timeout = 2, Mismatch = 3, Config = 4 };
/// Every failure kind, in wire order (1, 2, ...): what decode_abort admits.
inline constexpr std::array kFailureKinds{FailureKind::Peer, FailureKind::Timeout, FailureKind::Mismatch, FailureKind::Config};

struct Failure {
  FailureKind kind = FailureKind::Peer;
  std::string message;
};

inline std::vector<std::byte> encode(const Failure& f) {
  const std::string_view msg = std::string_view(f.message).substr(0, kMaxControlPayload - 1);
  return Writer().u8(static_cast<std::uint8_t>(f.kind)).text(msg).take();
}

inline Failure decode_abort(std::span<const std::byte> in) {
  Reader r(in, "abort");
  const std::uint8_t kind = r.u8();
  if (kind < 1 || kind > kFailureKinds.size()) throw FrameError(fmt::format("abort frame has unknown failure kind {}", kind));
  return Failure{static_cast<FailureKind>(kind), r.rest_text()};
}

/// Throws the library error that matches `kind`.
[[noreturn]] inline void raise(FailureKind kind, const std::string& message) {
  switch (kind) {
    case FailureKind::Peer: throw PeerFailure(message);
    case FailureKind::Timeout: throw CollectiveTimeout(message);
    case FailureKind::Mismatch: throw InvalidArgument(message);
    case FailureKind::Config: throw ClusterConfigError(message);
  }
  throw Error(message);
}

// ---- collective descriptor -----------------------------------------------------------------

/// (net/detail/observed_kinds.hpp names each in the metrics.)
enum class CollectiveKind : std::uint8_t { AllReduce = 1, AllGather = 2, Broadcast = 3, Barrier = 4, ReduceScatter = 5, AllToAll = 6 };
/// Every collective kind, in wire order (1, 2, ...): what decode_descriptor admits.
inline constexpr std::array kCollectiveKinds{CollectiveKind::AllReduce, CollectiveKind::AllGather,     CollectiveKind::Broadcast,
                                             CollectiveKind::Barrier,   CollectiveKind::ReduceScatter, CollectiveKind::AllToAll};

static_assert([] {
  for (std::size_t i = 0; i < kFailureKinds.size(); ++i) {
    if (static_cast<std::size_t>(kFailureKinds[i]) != i + 1) return false;
  }
  for (std::size_t i = 0; i < kCollectiveKinds.size(); ++i) {
    if (static_cast<std::size_t>(kCollectiveKinds[i]) != i + 1) return false;
  }
  return true;
}(), "kFailureKinds and kCollectiveKinds list the kinds 1, 2, ... in order");

constexpr std::string_view to_string(detail::CollectiveKind k) noexcept {
  switch (k) {
    case detail::CollectiveKind::AllReduce: return "all_reduce";
    case detail::CollectiveKind::AllGather: return "all_gather";
    case detail::CollectiveKind::Broadcast: return "broadcast";
    case detail::CollectiveKind::Barrier: return "barrier";
    case detail::CollectiveKind::ReduceScatter: return "reduce_scatter";
    case detail::CollectiveKind::AllToAll: return "all_to_all";
  }
  return "?";
}

/// What a rank says it is doing in collective number `seq`; every rank checks every other's.
struct Descriptor {
  detail::CollectiveKind kind = detail::CollectiveKind::Barrier;
  DType dtype = DType::U8;
  ReduceOp op = ReduceOp::Sum;
  std::uint32_t root = 0;   // broadcast: the root rank; all_reduce: a digest of the shapes (0: none)
  std::uint64_t count = 0;  // all_reduce: elements; broadcast, all_gather: bytes
};

inline constexpr std::size_t kDescriptorBytes = 16;

inline std::string describe(const Descriptor& d) {
  switch (d.kind) {
    case detail::CollectiveKind::AllReduce:
      if (d.root == 0) return fmt::format("all_reduce(count={}, dtype={}, op={})", d.count, to_string(d.dtype), to_string(d.op));
      return fmt::format("all_reduce(count={}, dtype={}, op={}, shapes #{:08x})", d.count, to_string(d.dtype),
                         to_string(d.op), d.root);
    case detail::CollectiveKind::AllGather: return fmt::format("all_gather(bytes={})", d.count);
    case detail::CollectiveKind::Broadcast: return fmt::format("broadcast(bytes={}, root={})", d.count, d.root);
    case detail::CollectiveKind::Barrier: return "barrier()";
    case detail::CollectiveKind::ReduceScatter:
      return fmt::format("reduce_scatter(count={}, dtype={}, op={}, shapes #{:08x})", d.count, to_string(d.dtype),
                         to_string(d.op), d.root);
    case detail::CollectiveKind::AllToAll: return "all_to_all()";
  }
  return "?";
}

/// Whether two ranks' calls can form one collective (all_gather sizes may differ by design).
inline bool compatible(const Descriptor& a, const Descriptor& b) noexcept {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    // root: the digest of the values' shapes (0 where the caller gave none).
    case detail::CollectiveKind::AllReduce:
    case detail::CollectiveKind::ReduceScatter: return a.count == b.count && a.dtype == b.dtype && a.op == b.op && a.root == b.root;
    case detail::CollectiveKind::Broadcast: return a.count == b.count && a.root == b.root;
    case detail::CollectiveKind::AllGather:  // all_to_all: the callers agreed on every size before
    case detail::CollectiveKind::AllToAll:
    case detail::CollectiveKind::Barrier: return true;
  }
  return false;
}

inline std::vector<std::byte> encode(const Descriptor& d) {
  return Writer()
      .u8(static_cast<std::uint8_t>(d.kind))
      .u8(static_cast<std::uint8_t>(d.dtype))
      .u8(static_cast<std::uint8_t>(d.op))
      .u8(0)
      .u32(d.root)
      .u64(d.count)
      .take();
}

inline Descriptor decode_descriptor(std::span<const std::byte> in) {
  Reader r(in, "descriptor");
  const std::uint8_t kind = r.u8(), dtype = r.u8(), op = r.u8(), pad = r.u8();
  if (kind < 1 || kind > kCollectiveKinds.size()) throw FrameError(fmt::format("descriptor has unknown collective kind {}", kind));
  if (!is_dtype_code(dtype)) throw FrameError(fmt::format("descriptor has unknown dtype {}", dtype));
  if (op > static_cast<std::uint8_t>(ReduceOp::Product)) throw FrameError(fmt::format("descriptor has unknown reduce op {}", op));
  if (pad != 0) throw FrameError("descriptor has a non-zero reserved byte");
  Descriptor d;
  d.kind = static_cast<detail::CollectiveKind>(kind);
  d.dtype = static_cast<DType>(dtype);
  d.op = static_cast<ReduceOp>(op);
  d.root = r.u32();
  d.count = r.u64();
  r.done();
  return d;
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
