// distribute-launch across nodes: the control connections between the launchers of a job (see
// launch_nodes.hpp for what they say): line-oriented TCP links, node 0's listening socket and the
// other nodes' connection to it, retried until node 0 is up.
#pragma once

#include <fmt/format.h>

#include <distribute/core/error.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace launch {
/// The job could not be agreed on: mismatched launchers, a timeout, a node that went away.
struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace nodes_detail {

inline constexpr std::size_t kMaxLine = 1 << 20;

using Clock = std::chrono::steady_clock;

inline int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

inline std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  while (!line.empty()) {
    const auto start = line.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    line.remove_prefix(start);
    const auto end = line.find(' ');
    out.push_back(line.substr(0, end));
    if (end == std::string_view::npos) break;
    line.remove_prefix(end);
  }
  return out;
}

inline int to_int(std::string_view s, std::string_view what) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size())
    throw RendezvousError(fmt::format("malformed node message: {} {} is not a number", what, distribute::quote_input(s)));
  return v;
}

/// A word carried in a message: non-empty, no spaces or control characters.
inline void check_word(std::string_view s, std::string_view what) {
  if (s.empty() || s.size() > 255 ||
      std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) <= ' '; }))
    throw RendezvousError(fmt::format("{} {} cannot be sent to the other nodes (empty, too long or with spaces)",
                                      what, distribute::quote_input(s)));
}

}  // namespace nodes_detail

/// The first TCP address `host`:`port` resolves to (numeric port); none, with `error` saying why,
/// when it does not resolve.
struct SocketAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_UNSPEC;
};

inline std::optional<SocketAddress> resolve_tcp(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0 || res == nullptr) {
    error = ::gai_strerror(rc);
    return std::nullopt;
  }
  SocketAddress a;
  std::memcpy(&a.addr, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  a.family = res->ai_family;
  ::freeaddrinfo(res);
  return a;
}

/// One line-oriented control connection between two launchers (non-blocking reads; blocking
/// writes of short lines).
class NodeLink {
 public:
  NodeLink() = default;
  explicit NodeLink(int fd, int peer_node = -1) : fd_(fd), peer_node_(peer_node) {}
  NodeLink(NodeLink&& o) noexcept { *this = std::move(o); }
  NodeLink& operator=(NodeLink&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      peer_node_ = o.peer_node_;
      buf_ = std::move(o.buf_);
      eof_ = o.eof_;
    }
    return *this;
  }
  ~NodeLink() { close(); }

  int fd() const { return fd_; }
  int peer_node() const { return peer_node_; }
  void set_peer_node(int r) { peer_node_ = r; }
  bool open() const { return fd_ >= 0; }
  bool eof() const { return eof_; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  /// Sends one line; false when the peer is gone.
  bool send(std::string_view line) {
    if (fd_ < 0) return false;
    std::string data(line);
    data += '\n';
    std::string_view rest(data);
    while (!rest.empty()) {
      const ssize_t n = ::send(fd_, rest.data(), rest.size(), MSG_NOSIGNAL);
      if (n > 0) {
        rest.remove_prefix(static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};
        if (::poll(&p, 1, 5000) <= 0) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  /// Reads what has arrived; returns the complete lines (EOF sets eof()).
  std::vector<std::string> read_lines() {
    std::vector<std::string> lines;
    char chunk[4096];
    while (fd_ >= 0 && !eof_) {
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, MSG_DONTWAIT);
      if (n > 0) {
        buf_.append(chunk, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      eof_ = true;  // EOF or a reset
    }
    std::size_t start = 0;
    for (;;) {
      const auto nl = buf_.find('\n', start);
      if (nl == std::string::npos) break;
      lines.emplace_back(buf_, start, nl - start);
      start = nl + 1;
    }
    buf_.erase(0, start);
    if (buf_.size() > nodes_detail::kMaxLine) throw RendezvousError("a node sent a line longer than 1 MiB");
    return lines;
  }

  /// Waits for one line until `deadline`.
  std::string read_line(nodes_detail::Clock::time_point deadline, std::string_view waiting_for) {
    for (;;) {
      auto lines = read_lines();
      if (!lines.empty()) {
        for (std::size_t k = 1; k < lines.size(); ++k) pending_.push_back(std::move(lines[k]));
        return std::move(lines[0]);
      }
      if (eof_) throw RendezvousError(fmt::format("the connection closed while waiting for {}", waiting_for));
      if (nodes_detail::Clock::now() >= deadline)
        throw RendezvousError(fmt::format("timed out waiting for {}", waiting_for));
      pollfd p{fd_, POLLIN, 0};
      ::poll(&p, 1, nodes_detail::ms_until(deadline));
    }
  }

  /// Lines that arrived together with the last read_line (handed out before new ones).
  std::vector<std::string> take_pending() { return std::exchange(pending_, {}); }

  /// The local address of the connection, numeric ("10.0.0.2", "fd00::2").
  std::string local_address() const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return {};
    char host[NI_MAXHOST];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
      return {};
    std::string h = host;
    if (const auto pct = h.find('%'); pct != std::string::npos) h.erase(pct);  // a link-local scope
    return h;
  }

 private:
  int fd_ = -1;
  int peer_node_ = -1;
  std::string buf_;
  std::vector<std::string> pending_;
  bool eof_ = false;
};

/// Node 0's listening socket on ADDR:PORT (the wildcard address of ADDR's family when ADDR is not
/// one of this host's, e.g. a name that resolves to a load balancer).
inline int listen_for_nodes(const std::string& addr, int port) {
  std::string error;
  const auto resolved = resolve_tcp(addr, port, error);
  if (!resolved) throw RendezvousError(fmt::format("cannot resolve --master-addr '{}': {}", addr, error));
  const int family = resolved->family;
  sockaddr_storage sa = resolved->addr;
  socklen_t len = resolved->len;
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RendezvousError(fmt::format("socket: {}", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0;
  if (!bound && errno == EADDRNOTAVAIL) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(family);
    if (family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&any)->sin6_port = htons(static_cast<in_port_t>(port));
      len = sizeof(sockaddr_in6);
    } else {
      reinterpret_cast<sockaddr_in*>(&any)->sin_port = htons(static_cast<in_port_t>(port));
      len = sizeof(sockaddr_in);
    }
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&any), len) == 0;
  }
  if (!bound || ::listen(fd, 128) != 0) {
    const int e = errno;
    ::close(fd);
    throw RendezvousError(fmt::format("cannot listen on --master-addr {} --master-port {}: {}", addr, port,
                                      std::strerror(e)));
  }
  return fd;
}

/// A node's connection to node 0, retried (quickly at first) until `deadline`: node 0 may start later.
inline NodeLink connect_to_master(const std::string& addr, int port, nodes_detail::Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  std::string last_error;
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res); rc != 0 || res == nullptr) {
      last_error = fmt::format("cannot resolve: {}", ::gai_strerror(rc));  // DNS may not know it yet
    } else {
      for (addrinfo* r = res; r; r = r->ai_next) {
        const int fd = ::socket(r->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, r->ai_addr, r->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
          return NodeLink(fd, 0);
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (nodes_detail::Clock::now() + pause >= deadline)
      throw RendezvousError(fmt::format("cannot reach node 0 at {}:{} within --rdzv-timeout ({})", addr, port,
                                        last_error));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace launch
