// Shared by net/ and ps/ (internal use): the errors of the request/response protocol that the
// parameter-server service runs on the transport's connections (rpc_client.hpp, rpc_server.hpp),
// and how a server's exception travels in an error reply: the name of its type, then its message.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// The peer could not be reached, or the connection broke or timed out: the peer may be dead.
class ConnectionLost : public PeerFailure {
 public:
  using PeerFailure::PeerFailure;
};

/// A call did not complete within its deadline.
class TimedOut : public ConnectionLost {
 public:
  using ConnectionLost::ConnectionLost;
};

/// The peer answered a call with an error; `kind` names its exception type ("InvalidArgument"...).
class RemoteError : public Error {
 public:
  RemoteError(std::string kind, const std::string& message) : Error(message), kind_(std::move(kind)) {}
  const std::string& kind() const noexcept { return kind_; }

 private:
  std::string kind_;
};

/// The exception type's name, for an error reply.
inline std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const ClusterConfigError*>(&e)) return "ClusterConfigError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const OutOfRange*>(&e)) return "OutOfRange";
  if (dynamic_cast<const PeerFailure*>(&e)) return "PeerFailure";
  if (dynamic_cast<const CollectiveTimeout*>(&e)) return "CollectiveTimeout";
  if (dynamic_cast<const CheckpointError*>(&e)) return "CheckpointError";
  if (dynamic_cast<const Unavailable*>(&e)) return "Unavailable";
  if (dynamic_cast<const Cancelled*>(&e)) return "Cancelled";
  return "Error";
}

/// Rethrows an error reply as the library's exception of that kind.
[[noreturn]] inline void throw_as_kind(const std::string& kind, const std::string& message) {
  if (kind == "ClusterConfigError") throw ClusterConfigError(message);
  if (kind == "InvalidArgument") throw InvalidArgument(message);
  if (kind == "OutOfRange") throw OutOfRange(message);
  if (kind == "PeerFailure") throw PeerFailure(message);
  if (kind == "CollectiveTimeout") throw CollectiveTimeout(message);
  if (kind == "CheckpointError") throw CheckpointError(message);
  if (kind == "Unavailable") throw Unavailable(message);
  if (kind == "Cancelled") throw Cancelled(message);
  throw Error(message);
}

}  // namespace net
DISTRIBUTE_END_NAMESPACE
