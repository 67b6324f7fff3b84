// distribute-launch across nodes: how the launchers of a job (one per node, torchrun's --nnodes,
// --node-rank, --master-addr, --master-port) meet and agree on one cluster.
//
// Node 0's launcher listens on --master-addr:--master-port; every other launcher connects to it
// (retrying until --rdzv-timeout), and each side proves it holds the job's cluster token
// (launch_node_protocol.hpp) before the joiner says who it is. Once all have, node 0 checks that
// they agree (the same --nnodes, distinct node ranks) and sends every node the same description of
// the cluster: for each node its task host, the first of its task ports and its number of tasks,
// plus the address and port torch-style rank 0 listens on. Ranks follow the node ranks, so node r's
// tasks are ranks offset(r) .. offset(r) + tasks(r) - 1. The links then stay open for the job's
// life as its failure signal (launch_node_job.hpp).
//
// Node 0's listener follows the library's accept policy (net/detail/accept_loop.hpp): a bounded
// number of connections not yet proven, each with a bounded time and line length. A connection
// that fails to prove the token, or says anything malformed before it has, is refused and closed,
// and the meeting goes on; only a proven launcher that disagrees with node 0 ends it.
#pragma once

#include <fmt/format.h>

#include <boost/asio.hpp>

#include <distribute/net/detail/accept_loop.hpp>
#include <distribute/net/refusal_log.hpp>

#include "launch_cluster.hpp"
#include "launch_node_link.hpp"
#include "launch_node_protocol.hpp"
#include "launch_output.hpp"

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

namespace launch {

namespace nodes_detail {

namespace net_detail = distribute::net::detail;

/// How long a connection may take to prove the token and join.
inline constexpr auto kGreetingTimeout = std::chrono::seconds(10);
/// How many connections may be in their greeting at once (the accept policy lowers it when few
/// descriptors are left).
inline constexpr std::size_t kMaxGreeting = 32;

/// Node 0's meeting: one event loop, one accept policy, one greeting per connection.
class Meeting {
 public:
  using tcp = boost::asio::ip::tcp;

  Meeting(int listen_fd, int nnodes, NodeEntry self, std::string token, Clock::time_point deadline)
      : acceptor_(io_), nnodes_(nnodes), token_(std::move(token)), deadline_(deadline),
        entries_(static_cast<std::size_t>(nnodes)), members_(static_cast<std::size_t>(nnodes)),
        accept_(io_, acceptor_, "node 0", "in their greeting", kMaxGreeting, [this](const std::string& line) {
          if (auto l = refusals_.admit(line); !l.empty()) note("{}", l);
        }) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    acceptor_.assign(a.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), listen_fd);  // owns it from here
    entries_[0] = std::move(self);
  }

  /// Runs until every node joined (their links, by node rank) or the meeting failed (throws).
  std::vector<NodeLink> run(NodeAgreement& out, const std::string& master_addr, int master_port) {
    boost::asio::steady_timer overall(io_, deadline_);
    overall.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      std::string missing;
      for (int r = 1; r < nnodes_; ++r)
        if (!entries_[static_cast<std::size_t>(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      fail(fmt::format("timed out after --rdzv-timeout waiting for node(s) {} to join", missing));
    });
    accept_.start([this](tcp::socket socket, net_detail::AcceptLoop::Slot slot) {
      greet(std::make_shared<Guest>(std::move(socket), std::move(slot), io_));
      return true;
    });
    io_.run();
    boost::system::error_code ignored;
    acceptor_.close(ignored);  // the job's members are known: later connections are refused

    std::vector<NodeLink> links(static_cast<std::size_t>(nnodes_));
    for (int r = 1; r < nnodes_; ++r) {
      auto& s = members_[static_cast<std::size_t>(r)];
      if (s) links[static_cast<std::size_t>(r)] = NodeLink(::dup(s->native_handle()), r);
    }
    members_.clear();
    if (failure_) {
      for (auto& l : links)
        if (l.open()) l.send("ERROR " + *failure_);
      throw RendezvousError(*failure_);
    }
    out = NodeAgreement{};
    for (auto& e : entries_) out.nodes.push_back(*e);
    out.master_addr = master_addr;
    out.master_port = master_port;
    const std::string line = agreement_line(out);
    for (int r = 1; r < nnodes_; ++r) {
      if (!links[static_cast<std::size_t>(r)].send(line))
        throw RendezvousError(fmt::format("node {} went away before the cluster was agreed", r));
    }
    return links;
  }

 private:
  struct Guest {
    Guest(tcp::socket s, net_detail::AcceptLoop::Slot sl, boost::asio::io_context& io)
        : socket(std::move(s)), slot(std::move(sl)), timer(io) {}
    tcp::socket socket;
    net_detail::AcceptLoop::Slot slot;
    boost::asio::steady_timer timer;
    std::string in, out;
    distribute::net::detail::Nonce theirs{}, mine{};
    std::string remote;
  };
  using GuestPtr = std::shared_ptr<Guest>;

  void greet(GuestPtr g) {
    boost::system::error_code ec;
    const auto ep = g->socket.remote_endpoint(ec);
    g->remote = ec ? "?" : fmt::format("{}:{}", ep.address().to_string(), ep.port());
    g->timer.expires_at(std::min(deadline_, Clock::now() + kGreetingTimeout));
    g->timer.async_wait([g](const boost::system::error_code& e) {
      if (e) return;
      boost::system::error_code ignored;
      g->socket.close(ignored);  // its read ends with an error: dropped
    });
    read_line(g, [this](GuestPtr g, std::string line) {
      try {
        g->theirs = parse_hello(line);
      } catch (const RendezvousError& e) {
        return refuse(g, e.what());
      }
      g->mine = distribute::net::detail::random_nonce();
      write_line(g, challenge_line(g->mine, node0_proof(token_, g->theirs, g->mine)), [this](GuestPtr g) {
        read_line(g, [this](GuestPtr g, std::string line) { joined(g, line); });
      });
    });
  }

  void joined(const GuestPtr& g, std::string_view line) {
    Join j;
    try {
      j = parse_join(line);
    } catch (const RendezvousError& e) {
      return refuse(g, e.what());
    }
    if (!distribute::net::detail::macs_equal(j.proof, join_proof(token_, g->theirs, g->mine, j.fields)))
      return refuse(g, "not proven to hold this job's cluster token");
    // Proven: a launcher of this job. What it says that disagrees ends the meeting for all.
    g->timer.cancel();
    g->slot.reset();
    try {
      const int theirs = joined_nnodes(j.fields);
      if (theirs != nnodes_) {
        const NodeEntry e = joined_entry(j.fields, theirs);
        send_now(*g, fmt::format("ERROR node 0 was started with --nnodes {}, this node with --nnodes {}", nnodes_,
                                 theirs));
        return fail(fmt::format("node {} was started with --nnodes {}, node 0 with --nnodes {}", e.node_rank, theirs,
                                nnodes_));
      }
      NodeEntry e = joined_entry(j.fields, nnodes_);
      auto& slot = entries_[static_cast<std::size_t>(e.node_rank)];
      if (e.node_rank == 0 || slot) {
        send_now(*g, fmt::format("ERROR --node-rank {} is taken", e.node_rank));
        return fail(fmt::format("two launchers say --node-rank {}", e.node_rank));
      }
      slot = std::move(e);
      members_[static_cast<std::size_t>(slot->node_rank)] = std::move(g->socket);
      if (++joined_ == nnodes_) io_.stop();
    } catch (const RendezvousError& e) {
      send_now(*g, fmt::format("ERROR {}", e.what()));
      fail(fmt::format("a launcher from {} sent a malformed JOIN: {}", g->remote, e.what()));
    }
  }

  /// Tells a connection that has not proved the token why it is refused, and closes it; the
  /// meeting goes on.
  void refuse(const GuestPtr& g, std::string_view why) {
    if (auto l = refusals_.admit(fmt::format("node 0: refused a connection from {}: {}", g->remote, why)); !l.empty())
      note("{}", l);
    write_line(g, fmt::format("ERROR refused: {}", why), [](GuestPtr g) {
      boost::system::error_code ignored;
      g->socket.shutdown(tcp::socket::shutdown_both, ignored);
      g->socket.close(ignored);
      g->timer.cancel();
    });
  }

  void fail(std::string why) {
    if (!failure_) failure_ = std::move(why);
    io_.stop();
  }

  template <typename Next>
  void read_line(const GuestPtr& g, Next next) {
    boost::asio::async_read_until(g->socket, boost::asio::dynamic_buffer(g->in, kMaxGreetingLine), '\n',
                                  [g, next](const boost::system::error_code& ec, std::size_t n) {
                                    if (ec) {  // closed, timed out, or a line too long: dropped
                                      boost::system::error_code ignored;
                                      g->socket.close(ignored);
                                      g->timer.cancel();
                                      return;
                                    }
                                    std::string line = g->in.substr(0, n - 1);
                                    g->in.erase(0, n);
                                    next(g, std::move(line));
                                  });
  }

  template <typename Next>
  void write_line(const GuestPtr& g, std::string line, Next next) {
    g->out = std::move(line) + "\n";
    boost::asio::async_write(g->socket, boost::asio::buffer(g->out),
                             [g, next](const boost::system::error_code& ec, std::size_t) {
                               if (!ec) next(g);
                             });
  }

  static void send_now(Guest& g, const std::string& line) {
    boost::system::error_code ignored;
    boost::asio::write(g.socket, boost::asio::buffer(line + "\n"), ignored);
  }

  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  int nnodes_;
  std::string token_;
  Clock::time_point deadline_;
  std::vector<std::optional<NodeEntry>> entries_;
  std::vector<std::optional<tcp::socket>> members_;
  int joined_ = 1;
  std::optional<std::string> failure_;
  distribute::net::RateLimiter refusals_;
  net_detail::AcceptLoop accept_;
};

}  // namespace nodes_detail

/// Node 0's side of the meeting on `listen_fd` (which it takes): admits the other nnodes-1
/// launchers once they proved they hold `token`, checks them, sends the agreement. Returns the
/// links to nodes 1..nnodes-1 (by node rank).
inline std::vector<NodeLink> gather_nodes(int listen_fd, int nnodes, NodeEntry self, const std::string& master_addr,
                                          int master_port, const std::string& token,
                                          nodes_detail::Clock::time_point deadline, NodeAgreement& out) {
  nodes_detail::Meeting meeting(listen_fd, nnodes, std::move(self), token, deadline);
  return meeting.run(out, master_addr, master_port);
}

/// A joining node's side: proves it holds `token` to node 0 (after node 0 proved it), says who it
/// is (`me`, completed by `complete_entry` once connected: its host may be the connection's) and
/// reads the cluster. A connection node 0 closes before its challenge (its greeting slots were
/// full) is tried again until `deadline`. Returns the link to node 0.
inline NodeLink join_nodes(const std::string& master_addr, int master_port, int nnodes, NodeEntry& me,
                           const std::string& token, nodes_detail::Clock::time_point deadline,
                           const std::function<void(NodeEntry&, const NodeLink&)>& complete_entry,
                           NodeAgreement& out) {
  auto pause = std::chrono::milliseconds(50);
  for (;;) {
    NodeLink link = connect_to_master(master_addr, master_port, deadline);
    const auto nonce = distribute::net::detail::random_nonce();
    std::optional<std::string> answer;
    if (link.send(hello_line(nonce))) {
      try {
        answer = link.read_line(deadline, "node 0's challenge");
      } catch (const RendezvousError&) {
        if (!link.eof()) throw;  // timed out
      }
    }
    if (!answer) {  // closed unanswered: node 0 is busy with other connections
      if (nodes_detail::Clock::now() + pause >= deadline)
        throw RendezvousError(fmt::format("node 0 at {} closed every connection before answering, until "
                                          "--rdzv-timeout",
                                          host_port(master_addr, master_port)));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
      continue;
    }
    const Challenge c = parse_challenge(*answer);
    if (!distribute::net::detail::macs_equal(c.proof, node0_proof(token, nonce, c.nonce)))
      throw RendezvousError(fmt::format("node 0 at {} did not prove it holds this job's cluster token: give every "
                                        "launcher the same DISTRIBUTE_CLUSTER_TOKEN",
                                        host_port(master_addr, master_port)));
    complete_entry(me, link);
    const std::string fields = join_fields(nnodes, me);
    if (!link.send(join_line(join_proof(token, nonce, c.nonce, fields), fields)))
      throw RendezvousError("node 0 closed the connection before this node joined");
    out = parse_agreement(link.read_line(deadline, "node 0's cluster"), nnodes, me);
    return link;
  }
}

}  // namespace launch
