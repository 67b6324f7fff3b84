// Shared by net/ and ps/ (internal use): the errors of the request/response protocol that the
// parameter-server service runs on the transport's connections (rpc_client.hpp, rpc_server.hpp),
// and how a server's exception travels in an error reply: the name of its type, then its message.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <distribute/core/error.hpp>

// The library's errors that an error reply names, most derived first (a reply names the first one an
// exception is). The one table the kind enum, the names on the wire and both directions of the
// translation are generated from; ds::Error stands for any other exception.
#define DISTRIBUTE_DETAIL_WIRE_ERRORS(X) \
  X(ClusterConfigError)                  \
  X(InvalidArgument)                     \
  X(OutOfRange)                          \
  X(PeerFailure)                         \
  X(CollectiveTimeout)                   \
  X(CheckpointError)                     \
  X(Unavailable)                         \
  X(Cancelled)

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// The kind of error a peer answered with: one per class of DISTRIBUTE_DETAIL_WIRE_ERRORS, then Error.
enum class ErrorKind : std::uint8_t {
#define DISTRIBUTE_DETAIL_KIND(E) E,
  DISTRIBUTE_DETAIL_WIRE_ERRORS(DISTRIBUTE_DETAIL_KIND)
#undef DISTRIBUTE_DETAIL_KIND
  Error
};

namespace detail {
// Whether no class of E... is a base of one after it (else the later one could never be named).
template <class... E>
constexpr bool most_derived_first() {
  bool ok = true;
  std::size_t i = 0;
  ([&]<class A>(std::type_identity<A>) {
    std::size_t j = 0;
    ((ok = ok && !(j > i && std::is_base_of_v<A, E>), ++j), ...);
    ++i;
  }(std::type_identity<E>{}), ...);
  return ok;
}
#define DISTRIBUTE_DETAIL_TYPE(E) E,
static_assert(most_derived_first<DISTRIBUTE_DETAIL_WIRE_ERRORS(DISTRIBUTE_DETAIL_TYPE) Error>(),
              "DISTRIBUTE_DETAIL_WIRE_ERRORS: list a derived error before its base");
#undef DISTRIBUTE_DETAIL_TYPE

inline constexpr std::array kErrorKindNames{
#define DISTRIBUTE_DETAIL_NAME(E) std::string_view(#E),
    DISTRIBUTE_DETAIL_WIRE_ERRORS(DISTRIBUTE_DETAIL_NAME)
#undef DISTRIBUTE_DETAIL_NAME
        std::string_view("Error")};
static_assert(kErrorKindNames.size() == static_cast<std::size_t>(ErrorKind::Error) + 1);
}  // namespace detail

/// The name an error reply carries for `kind` ("InvalidArgument"...).
constexpr std::string_view error_kind_name(ErrorKind kind) noexcept {
  return detail::kErrorKindNames[static_cast<std::size_t>(kind)];
}

/// The kind an error reply's name stands for; a name this build does not know is Error.
constexpr ErrorKind error_kind_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < detail::kErrorKindNames.size(); ++i) {
    if (detail::kErrorKindNames[i] == name) return static_cast<ErrorKind>(i);
  }
  return ErrorKind::Error;
}

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

/// The peer answered a call with an error of `kind`.
class RemoteError : public Error {
 public:
  RemoteError(ErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }
  std::string_view kind_name() const noexcept { return error_kind_name(kind_); }

 private:
  ErrorKind kind_;
};

/// The kind of an exception, for an error reply.
inline ErrorKind error_kind(const std::exception& e) {
#define DISTRIBUTE_DETAIL_CAST(E) \
  if (dynamic_cast<const E*>(&e)) return ErrorKind::E;
  DISTRIBUTE_DETAIL_WIRE_ERRORS(DISTRIBUTE_DETAIL_CAST)
#undef DISTRIBUTE_DETAIL_CAST
  return ErrorKind::Error;
}

/// Rethrows an error reply as the library's exception of its kind.
[[noreturn]] inline void throw_as_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
#define DISTRIBUTE_DETAIL_THROW(E) \
  case ErrorKind::E:               \
    throw E(message);
    DISTRIBUTE_DETAIL_WIRE_ERRORS(DISTRIBUTE_DETAIL_THROW)
#undef DISTRIBUTE_DETAIL_THROW
    case ErrorKind::Error:
      break;
  }
  throw Error(message);
}

}  // namespace net
DISTRIBUTE_END_NAMESPACE
