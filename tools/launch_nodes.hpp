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

#include "launch_node_link.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <poll.h>
#include <sys/socket.h>

namespace launch {

inline constexpr std::string_view kNodeProtocol = "distribute-launch-nodes/1";

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
