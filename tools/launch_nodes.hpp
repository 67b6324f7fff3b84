// distribute-launch across nodes: how the launchers of a job (one per node, torchrun's --nnodes,
// --node-rank, --master-addr, --master-port) meet, agree on one cluster and stop together.
//
// Node 0's launcher listens on --master-addr:--master-port; every other launcher connects to it
// (retrying until --rdzv-timeout) and says who it is. Once all have, node 0 checks that they
// agree (the same --nnodes, distinct node ranks) and sends every node the same description of the
// cluster: for each node its task host, the first of its task ports and its number of tasks, plus
// the address and port torch-style rank 0 listens on and the job's cluster token. Ranks follow
// the node ranks, so node r's tasks are ranks offset(r) .. offset(r) + tasks(r) - 1.
//
// The connections then stay open for the job's life, as its failure signal: a node whose task
// fails (or whose launcher gets a signal) sends FAIL; node 0 then sends STOP to the others; a
// connection that breaks before its node said DONE is a lost node and stops the job too. When a
// node's tasks are all done it sends DONE with its status and waits for END, node 0's verdict on
// the whole job, so every launcher exits with the same status.
//
// The protocol is lines of space-separated words (at most kMaxLine bytes each). Like torchrun's
// static rendezvous it is not authenticated: it carries no secret unless node 0 made the job's
// token; on a network not trusted, give every launcher the same DISTRIBUTE_CLUSTER_TOKEN, which is
// then never sent.
#pragma once

#include <fmt/format.h>

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

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace launch {

inline constexpr std::string_view kNodeProtocol = "distribute-launch-nodes/1";

/// The job could not be agreed on: mismatched launchers, a timeout, a node that went away.
struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What one node contributes to the cluster.
struct NodeEntry {
  int node_rank = 0;
  int tasks = 0;
  std::string host;   // the address its tasks listen on
  int port_base = 0;  // its tasks' ports are port_base .. port_base + tasks - 1
};

/// The cluster every node agreed on (identical on every node).
struct NodeAgreement {
  std::vector<NodeEntry> nodes;  // by node rank
  std::string master_addr;       // MASTER_ADDR / MASTER_PORT for torch-style rank 0 (on node 0)
  int master_port = 0;
  std::optional<std::string> token;  // node 0's generated token; unset when not sent

  int world_size() const {
    int n = 0;
    for (const auto& e : nodes) n += e.tasks;
    return n;
  }
  int rank_offset(int node_rank) const {
    int n = 0;
    for (int r = 0; r < node_rank; ++r) n += nodes[static_cast<std::size_t>(r)].tasks;
    return n;
  }
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
    throw RendezvousError(fmt::format("malformed node message: {} '{}' is not a number", what, s));
  return v;
}

/// A word carried in a message: non-empty, no spaces or control characters.
inline void check_word(std::string_view s, std::string_view what) {
  if (s.empty() || s.size() > 255 ||
      std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) <= ' '; }))
    throw RendezvousError(fmt::format("{} '{}' cannot be sent to the other nodes (empty, too long or with spaces)",
                                      what, s));
}

}  // namespace nodes_detail

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

/// The HELLO line a node sends to node 0.
inline std::string hello_line(int nnodes, const NodeEntry& me) {
  return fmt::format("HELLO {} {} {} {} {} {}", kNodeProtocol, nnodes, me.node_rank, me.tasks, me.host, me.port_base);
}

inline std::string agreement_line(const NodeAgreement& a) {
  std::string line = fmt::format("CLUSTER {} {} {} {}", a.master_addr, a.master_port, a.token ? *a.token : "-",
                                 a.nodes.size());
  for (const auto& e : a.nodes) line += fmt::format(" {},{},{},{}", e.node_rank, e.tasks, e.host, e.port_base);
  return line;
}

inline NodeAgreement parse_agreement(std::string_view line) {
  using nodes_detail::to_int;
  const auto w = nodes_detail::words(line);
  if (!w.empty() && w[0] == "ERROR") {
    std::string reason(line.substr(std::min(line.size(), std::size_t{6})));
    throw RendezvousError(fmt::format("node 0 refused this node: {}", reason));
  }
  if (w.size() < 5 || w[0] != "CLUSTER") throw RendezvousError(fmt::format("unexpected message from node 0: '{}'", line));
  NodeAgreement a;
  a.master_addr = std::string(w[1]);
  a.master_port = to_int(w[2], "master port");
  if (w[3] != "-") a.token = std::string(w[3]);
  const int n = to_int(w[4], "node count");
  if (n < 1 || static_cast<std::size_t>(n) + 5 != w.size())
    throw RendezvousError(fmt::format("malformed cluster message from node 0 ({} nodes, {} words)", n, w.size()));
  for (int k = 0; k < n; ++k) {
    const std::string_view entry = w[5 + static_cast<std::size_t>(k)];
    std::vector<std::string_view> f;
    std::size_t start = 0;
    for (;;) {
      const auto comma = entry.find(',', start);
      f.push_back(entry.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (f.size() != 4) throw RendezvousError(fmt::format("malformed node entry '{}' from node 0", entry));
    a.nodes.push_back({to_int(f[0], "node rank"), to_int(f[1], "task count"), std::string(f[2]),
                       to_int(f[3], "port")});
  }
  return a;
}

/// Node 0's listening socket on ADDR:PORT (the wildcard address of ADDR's family when ADDR is not
/// one of this host's, e.g. a name that resolves to a load balancer).
inline int listen_for_nodes(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res); rc != 0 || res == nullptr)
    throw RendezvousError(fmt::format("cannot resolve --master-addr '{}': {}", addr, ::gai_strerror(rc)));
  const int family = res->ai_family;
  sockaddr_storage sa{};
  std::memcpy(&sa, res->ai_addr, res->ai_addrlen);
  socklen_t len = res->ai_addrlen;
  ::freeaddrinfo(res);
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

/// Node 0's side of the meeting: accepts the other nnodes-1 launchers, checks them, sends the
/// agreement. Returns the links to nodes 1..nnodes-1 (by node rank). A launcher that disagrees
/// (another --nnodes, a node rank taken or out of range, another protocol) is told why and the
/// meeting fails for all.
inline std::vector<NodeLink> gather_nodes(int listen_fd, int nnodes, NodeEntry self, const std::string& master_addr,
                                          int master_port, const std::optional<std::string>& token,
                                          nodes_detail::Clock::time_point deadline, NodeAgreement& out) {
  using nodes_detail::to_int;
  std::vector<NodeLink> pending;  // connected, HELLO not read yet
  std::vector<std::optional<NodeEntry>> entries(static_cast<std::size_t>(nnodes));
  std::vector<NodeLink> links(static_cast<std::size_t>(nnodes));
  entries[0] = self;
  int joined = 1;
  auto fail_all = [&](const std::string& why) {
    for (auto& l : links)
      if (l.open()) l.send("ERROR " + why);
    throw RendezvousError(why);
  };
  while (joined < nnodes) {
    if (nodes_detail::Clock::now() >= deadline) {
      std::string missing;
      for (int r = 1; r < nnodes; ++r)
        if (!entries[static_cast<std::size_t>(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      fail_all(fmt::format("timed out after --rdzv-timeout waiting for node(s) {} to join", missing));
    }
    std::vector<pollfd> fds{{listen_fd, POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), std::min(nodes_detail::ms_until(deadline), 1000));
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) pending.emplace_back(fd);
    }
    for (std::size_t k = 0; k < pending.size();) {
      auto lines = pending[k].read_lines();
      if (lines.empty()) {
        if (pending[k].eof()) pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));  // a probe
        else ++k;
        continue;
      }
      NodeLink link = std::move(pending[k]);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      const auto w = nodes_detail::words(lines[0]);
      if (w.size() != 7 || w[0] != "HELLO") {
        link.send("ERROR not a distribute-launch node");  // a stranger: ignored, the meeting goes on
        continue;
      }
      if (w[1] != kNodeProtocol) {
        link.send(fmt::format("ERROR node 0 speaks {}, this launcher {}", kNodeProtocol, w[1]));
        fail_all(fmt::format("a launcher of another version joined ({}; this one speaks {})", w[1], kNodeProtocol));
      }
      const int their_nnodes = to_int(w[2], "nnodes");
      const int rank = to_int(w[3], "node rank");
      if (their_nnodes != nnodes) {
        link.send(fmt::format("ERROR node 0 was started with --nnodes {}, this node with --nnodes {}", nnodes,
                              their_nnodes));
        fail_all(fmt::format("node {} was started with --nnodes {}, node 0 with --nnodes {}", rank, their_nnodes,
                             nnodes));
      }
      if (rank < 1 || rank >= nnodes || entries[static_cast<std::size_t>(rank)]) {
        link.send(fmt::format("ERROR --node-rank {} is {}", rank, rank < 1 || rank >= nnodes ? "out of range" : "taken"));
        fail_all(fmt::format("two launchers say --node-rank {}", rank));
      }
      NodeEntry e{rank, to_int(w[4], "task count"), std::string(w[5]), to_int(w[6], "port")};
      entries[static_cast<std::size_t>(rank)] = e;
      link.set_peer_node(rank);
      links[static_cast<std::size_t>(rank)] = std::move(link);
      ++joined;
    }
  }
  out = NodeAgreement{};
  for (auto& e : entries) out.nodes.push_back(*e);
  out.master_addr = master_addr;
  out.master_port = master_port;
  out.token = token;
  const std::string line = agreement_line(out);
  for (int r = 1; r < nnodes; ++r) {
    if (!links[static_cast<std::size_t>(r)].send(line))
      fail_all(fmt::format("node {} went away before the cluster was agreed", r));
  }
  return links;
}

}  // namespace launch
