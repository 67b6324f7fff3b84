// The parameter-server service's vocabulary on the transport's request/response protocol
// (net/rpc_client.hpp, net/rpc_server.hpp): its operations, and what its messages share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include <openssl/rand.h>

#include <distribute/core/error.hpp>
#include <distribute/net/options.hpp>
#include <distribute/net/rpc_client.hpp>
#include <distribute/net/rpc_errors.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

using net::ConnectionLost;
using net::error_kind;
using net::ErrorKind;
using net::RemoteError;
using net::RpcClient;
using net::RpcOptions;
using net::throw_as_kind;
using net::TimedOut;

enum class RpcOp : std::uint64_t {
  Ping = 1,
  CreateVar = 2,
  ReadVar = 3,
  ReadRows = 4,
  UpdateVar = 5,
  Commit = 6,
  RunClosure = 7,
  MakeDataset = 8,
  Stop = 9,
  CreateInitialized = 10,
};

/// Whether a request of `op` may take long on a worker (a closure, a dataset's construction): those
/// run on the server's handler threads, the rest on its network thread.
constexpr bool takes_long(RpcOp op) noexcept { return op == RpcOp::RunClosure || op == RpcOp::MakeDataset; }

/// A random 64-bit id (sessions, server incarnations), from OpenSSL like the handshake nonces.
inline std::uint64_t random_id() {
  std::uint64_t id = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), static_cast<int>(sizeof id)) != 1) {
    throw Error("distribute.ps: OpenSSL RAND_bytes failed to produce an id");
  }
  return id;
}

inline std::vector<std::byte> to_bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}
inline std::string_view as_chars(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE
