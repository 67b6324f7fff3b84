// distribute-launch across nodes: what the launchers say when they meet (launch_nodes.hpp runs the
// meeting), as lines of space-separated words, every field checked against its bounds.
//
//   joiner -> HELLO distribute-launch-nodes/2 NONCE_J
//   node 0 -> CHALLENGE NONCE_0 PROOF_0          node 0 proves it holds the cluster token
//   joiner -> JOIN PROOF_J NNODES RANK TASKS HOST PORT_BASE
//   node 0 -> CLUSTER MASTER_ADDR MASTER_PORT N RANK,TASKS,HOST,PORT_BASE ...     (or ERROR why)
//
// Proofs are HMAC-SHA256 under the job's cluster token (net/detail/auth.hpp) of both nonces, and
// the joiner's of its fields too, so a node is admitted only once it has proved it holds the token,
// and a joiner tells nothing to a node 0 that has not. The token itself never travels.
#pragma once

#include <fmt/format.h>

#include <boost/algorithm/hex.hpp>

#include <distribute/net/detail/auth.hpp>

#include "launch_node_link.hpp"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace launch {

inline constexpr std::string_view kNodeProtocol = "distribute-launch-nodes/2";
/// The most nodes and tasks per node a meeting accepts (the launcher's own -n and --nnodes bound).
inline constexpr int kMaxNodes = 1024;
inline constexpr int kMaxNodeTasks = 1024;
/// The longest line a connection may send before it has proved the token (HELLO, JOIN).
inline constexpr std::size_t kMaxGreetingLine = 512;

/// What one node contributes to the cluster.
struct NodeEntry {
  int node_rank = 0;
  int tasks = 0;
  std::string host;   // the address its tasks listen on
  int port_base = 0;  // its tasks' ports are port_base .. port_base + tasks - 1

  bool operator==(const NodeEntry&) const = default;
};

/// The cluster every node agreed on (identical on every node).
struct NodeAgreement {
  std::vector<NodeEntry> nodes;  // by node rank
  std::string master_addr;       // MASTER_ADDR / MASTER_PORT for torch-style rank 0 (on node 0)
  int master_port = 0;

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

using Nonce = distribute::net::detail::Nonce;
using Mac = distribute::net::detail::Mac;

namespace nodes_detail {

inline int to_int_in(std::string_view s, std::string_view what, int lo, int hi) {
  const int v = to_int(s, what);
  if (v < lo || v > hi) throw RendezvousError(fmt::format("{} {} is not between {} and {}", what, v, lo, hi));
  return v;
}

template <typename Bytes>
std::string to_hex(const Bytes& bytes) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  boost::algorithm::hex_lower(p, p + bytes.size(), std::back_inserter(out));
  return out;
}

/// `N` bytes written as 2N hex digits.
template <typename Bytes>
Bytes from_hex(std::string_view text, std::string_view what) {
  Bytes out{};
  if (text.size() != 2 * out.size())
    throw RendezvousError(fmt::format("{} is not {} hex digits", what, 2 * out.size()));
  try {
    std::string raw;
    boost::algorithm::unhex(text.begin(), text.end(), std::back_inserter(raw));
    std::transform(raw.begin(), raw.end(), out.begin(), [](char c) { return static_cast<std::byte>(c); });
  } catch (const boost::algorithm::hex_decode_error&) {
    throw RendezvousError(fmt::format("{} is not {} hex digits", what, 2 * out.size()));
  }
  return out;
}

/// Node 0's "ERROR why" as the error a joiner throws (why cut to a bounded length).
[[noreturn]] inline void throw_refusal(std::string_view line) {
  const std::string_view why = line.substr(std::min<std::size_t>(line.size(), 6));
  throw RendezvousError(fmt::format("node 0 refused this node: {}", distribute::quote_input(why, 200)));
}

inline Mac proof(const std::string& token, std::string_view message) {
  return distribute::net::detail::hmac_sha256(token, std::as_bytes(std::span(message.data(), message.size())));
}

/// The host and port fields a node sends: bounded words, ports that fit.
inline NodeEntry checked_entry(std::string_view rank, std::string_view tasks, std::string_view host,
                               std::string_view port, int nnodes) {
  NodeEntry e;
  e.node_rank = to_int_in(rank, "node rank", 0, nnodes - 1);
  e.tasks = to_int_in(tasks, "task count", 1, kMaxNodeTasks);
  check_word(host, "host");
  e.host = std::string(host);
  e.port_base = to_int_in(port, "port", 1, 65535 - e.tasks + 1);
  return e;
}

}  // namespace nodes_detail

/// The joiner's HELLO and node 0's CHALLENGE for it.
inline std::string hello_line(const Nonce& nonce) {
  return fmt::format("HELLO {} {}", kNodeProtocol, nodes_detail::to_hex(nonce));
}

/// Node 0's reading of a HELLO: the joiner's nonce. Throws RendezvousError saying what is wrong.
inline Nonce parse_hello(std::string_view line) {
  const auto w = nodes_detail::words(line);
  if (w.empty() || w[0] != "HELLO") throw RendezvousError("not a distribute-launch node");
  if (w.size() < 2 || w[1] != kNodeProtocol)
    throw RendezvousError(fmt::format("node 0 speaks {}, not {}", kNodeProtocol,
                                      w.size() < 2 ? std::string("nothing") : distribute::quote_input(w[1])));
  if (w.size() != 3) throw RendezvousError(fmt::format("a HELLO has 3 words, not {}", w.size()));
  return nodes_detail::from_hex<Nonce>(w[2], "the nonce");
}

/// What node 0 proves: it holds `token` (for this joiner's nonce and its own).
inline Mac node0_proof(const std::string& token, const Nonce& joiner,
                                    const Nonce& node0) {
  return nodes_detail::proof(token, fmt::format("{} node 0|{}|{}", kNodeProtocol, nodes_detail::to_hex(joiner),
                                                nodes_detail::to_hex(node0)));
}

/// What a joiner proves: it holds `token`, and these are its fields.
inline Mac join_proof(const std::string& token, const Nonce& joiner,
                                   const Nonce& node0, std::string_view fields) {
  return nodes_detail::proof(token, fmt::format("{} join|{}|{}|{}", kNodeProtocol, nodes_detail::to_hex(node0),
                                                nodes_detail::to_hex(joiner), fields));
}

inline std::string challenge_line(const Nonce& node0, const Mac& proof) {
  return fmt::format("CHALLENGE {} {}", nodes_detail::to_hex(node0), nodes_detail::to_hex(proof));
}

struct Challenge {
  Nonce nonce{};
  Mac proof{};
};

/// A joiner's reading of node 0's answer to its HELLO (an ERROR is thrown as node 0's refusal).
inline Challenge parse_challenge(std::string_view line) {
  const auto w = nodes_detail::words(line);
  if (!w.empty() && w[0] == "ERROR") nodes_detail::throw_refusal(line);
  if (w.size() != 3 || w[0] != "CHALLENGE")
    throw RendezvousError(fmt::format("unexpected answer from node 0: {}", distribute::quote_input(line)));
  return {nodes_detail::from_hex<Nonce>(w[1], "node 0's nonce"),
          nodes_detail::from_hex<Mac>(w[2], "node 0's proof")};
}

/// The fields of a JOIN (what the proof covers).
inline std::string join_fields(int nnodes, const NodeEntry& me) {
  return fmt::format("{} {} {} {} {}", nnodes, me.node_rank, me.tasks, me.host, me.port_base);
}

inline std::string join_line(const Mac& proof, std::string_view fields) {
  return fmt::format("JOIN {} {}", nodes_detail::to_hex(proof), fields);
}

struct Join {
  Mac proof{};
  std::string fields;  // as sent: what the proof covers
};

/// Node 0's first reading of a JOIN: the proof and the fields it covers, nothing trusted yet.
inline Join parse_join(std::string_view line) {
  const auto w = nodes_detail::words(line);
  if (w.size() != 7 || w[0] != "JOIN") throw RendezvousError("a JOIN has 7 words");
  Join j;
  j.proof = nodes_detail::from_hex<Mac>(w[1], "the proof");
  j.fields = fmt::format("{} {} {} {} {}", w[2], w[3], w[4], w[5], w[6]);
  return j;
}

/// The node count a proven joiner was started with (checked against node 0's before its entry).
inline int joined_nnodes(std::string_view fields) {
  const auto w = nodes_detail::words(fields);
  if (w.size() != 5) throw RendezvousError("a JOIN has 5 fields");
  return nodes_detail::to_int_in(w[0], "--nnodes", 1, kMaxNodes);
}

/// A proven joiner's entry, every field within its bounds for a job of `nnodes` nodes.
inline NodeEntry joined_entry(std::string_view fields, int nnodes) {
  const auto w = nodes_detail::words(fields);
  if (w.size() != 5) throw RendezvousError("a JOIN has 5 fields");
  return nodes_detail::checked_entry(w[1], w[2], w[3], w[4], nnodes);
}

inline std::string agreement_line(const NodeAgreement& a) {
  std::string line = fmt::format("CLUSTER {} {} {}", a.master_addr, a.master_port, a.nodes.size());
  for (const auto& e : a.nodes) line += fmt::format(" {},{},{},{}", e.node_rank, e.tasks, e.host, e.port_base);
  return line;
}

/// A joiner's reading of node 0's cluster: `nnodes` entries by node rank, each within bounds, and
/// this node's entry as it sent it.
inline NodeAgreement parse_agreement(std::string_view line, int nnodes, const NodeEntry& me) {
  using nodes_detail::to_int_in;
  const auto w = nodes_detail::words(line);
  if (!w.empty() && w[0] == "ERROR") nodes_detail::throw_refusal(line);
  if (w.size() < 4 || w[0] != "CLUSTER")
    throw RendezvousError(fmt::format("unexpected message from node 0: {}", distribute::quote_input(line)));
  NodeAgreement a;
  nodes_detail::check_word(w[1], "master address");
  a.master_addr = std::string(w[1]);
  a.master_port = to_int_in(w[2], "master port", 1, 65535);
  const int n = to_int_in(w[3], "node count", 1, kMaxNodes);
  if (n != nnodes || static_cast<std::size_t>(n) + 4 != w.size())
    throw RendezvousError(fmt::format(
        "malformed cluster message from node 0 ({} nodes, {} words; this node has --nnodes {})", n, w.size(), nnodes));
  for (int k = 0; k < n; ++k) {
    const std::string_view entry = w[4 + static_cast<std::size_t>(k)];
    std::vector<std::string_view> f;
    std::size_t start = 0;
    for (;;) {
      const auto comma = entry.find(',', start);
      f.push_back(entry.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      if (comma == std::string_view::npos || f.size() > 4) break;
      start = comma + 1;
    }
    if (f.size() != 4)
      throw RendezvousError(fmt::format("malformed node entry {} from node 0", distribute::quote_input(entry)));
    NodeEntry e = nodes_detail::checked_entry(f[0], f[1], f[2], f[3], nnodes);
    if (e.node_rank != k) throw RendezvousError(fmt::format("node 0 sent node {}'s entry in place {}", e.node_rank, k));
    a.nodes.push_back(std::move(e));
  }
  if (a.nodes[static_cast<std::size_t>(me.node_rank)] != me)
    throw RendezvousError("node 0's cluster does not hold this node's entry as it sent it");
  return a;
}

}  // namespace launch
