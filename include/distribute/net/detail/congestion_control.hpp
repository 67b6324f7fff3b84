// Choosing a socket's TCP congestion control for connections that never leave the host.
//
// On loopback there is no network to probe, yet a BBR default (common, and this project's test
// machine's) paces every send with a kernel timer and keeps pacing even if the algorithm is
// switched later. The choice must therefore be made before the connection is established: on
// the connecting socket before connect, and on the listening socket, whose accepted sockets
// inherit it. Linux only (TCP_CONGESTION); elsewhere nothing is set.
#pragma once

#include <string>
#include <string_view>

#if defined(__linux__)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#endif

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// Sets `algorithm` on the socket `fd`; returns "" or the kernel's reason for refusing it.
/// An empty algorithm, or a platform without the option, sets nothing.
inline std::string set_congestion_control(int fd, std::string_view algorithm) {
#if defined(__linux__) && defined(TCP_CONGESTION)
  if (algorithm.empty()) return {};
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(), static_cast<socklen_t>(algorithm.size())) == 0) {
    return {};
  }
  return std::strerror(errno);
#else
  (void)fd;
  (void)algorithm;
  return {};
#endif
}

/// The congestion control the socket `fd` uses ("" where it cannot be read).
inline std::string congestion_control_of(int fd) {
#if defined(__linux__) && defined(TCP_CONGESTION)
  char name[64] = {};
  socklen_t len = sizeof name - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return {};
  return std::string(name, ::strnlen(name, len));
#else
  (void)fd;
  return {};
#endif
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
