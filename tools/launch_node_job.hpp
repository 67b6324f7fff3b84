// distribute-launch across nodes, one launcher's part (--nnodes > 1): meeting the others
// (launch_nodes.hpp), telling them when this node fails, hearing when another does, and ending
// together with one verdict.
//
// Node 0 holds a link to every other node (index = node rank, [0] unused); the others hold one, to
// node 0. A node whose task fails or whose launcher gets a signal sends FAIL; node 0 then sends
// STOP to the others; a link that breaks before its node said DONE is a lost node and stops the
// job too. When a node's tasks are all done it sends DONE with its status and waits for END.
#pragma once

#include <fmt/format.h>

#include "launch_args.hpp"
#include "launch_cluster.hpp"
#include "launch_node_link.hpp"
#include "launch_nodes.hpp"
#include "launch_output.hpp"
#include "launch_process.hpp"

#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <poll.h>
#include <unistd.h>

namespace launch {

class NodeJob {
 public:
  explicit NodeJob(const Options& opt) : opt_(opt) {}

  /// Meets the other launchers within --rdzv-timeout, proving to each other that they hold
  /// `token` (every launcher's, given by the user).
  void meet(const std::string& token) {
    const auto deadline = nodes_detail::Clock::now() + std::chrono::duration_cast<nodes_detail::Clock::duration>(
                                                           std::chrono::duration<double>(opt_.rdzv_timeout));
    NodeEntry me;
    me.node_rank = opt_.node_rank;
    me.tasks = opt_.workers;
    try {
      if (opt_.node_rank == 0) {
        me.host = opt_.host_given ? opt_.host : opt_.master_addr;
        nodes_detail::check_word(me.host, "--host");
        // One port more on node 0: MASTER_PORT for torch-style rank 0, as on one host.
        const int base = pick_port_block(me.host, me.tasks + 1);
        me.port_base = base + 1;
        const int listen_fd = listen_for_nodes(opt_.master_addr, opt_.master_port);
        note("node 0: waiting for {} other node(s) on {}", opt_.nnodes - 1,
             host_port(opt_.master_addr, opt_.master_port));
        links_ = gather_nodes(listen_fd, opt_.nnodes, me, me.host, base, token, deadline, agreement_);
      } else {
        auto complete = [&](NodeEntry& e, const NodeLink& link) {
          e.host = opt_.host_given ? opt_.host : link.local_address();
          nodes_detail::check_word(e.host, "--host");
          e.port_base = pick_port_block(e.host, e.tasks);
        };
        links_.resize(1);
        links_[0] = join_nodes(opt_.master_addr, opt_.master_port, opt_.nnodes, me, token, deadline, complete,
                               agreement_);
      }
    } catch (const RendezvousError& e) {
      throw std::runtime_error(
          fmt::format("node {}: the launchers could not agree on the job: {}", opt_.node_rank, e.what()));
    }
    note("node {}: {} nodes, {} tasks; this node's are ranks {}..{}", opt_.node_rank, agreement_.nodes.size(),
         agreement_.world_size(), agreement_.rank_offset(opt_.node_rank),
         agreement_.rank_offset(opt_.node_rank) + opt_.workers - 1);
  }

  const NodeAgreement& agreement() const { return agreement_; }

  /// TF_CONFIG's cluster for every node's tasks: the whole job's workers, node by node.
  boost::json::object tf_config_cluster() const {
    TaskIdentity worker;
    worker.type = "worker";
    std::vector<TaskIdentity> workers;
    std::vector<std::string> addresses;
    for (const auto& node : agreement_.nodes) {
      for (int k = 0; k < node.tasks; ++k) {
        workers.push_back(worker);
        addresses.push_back(host_port(node.host, node.port_base + k));
      }
    }
    return launch::tf_config_cluster(workers, addresses);
  }

  /// Tells the other launchers, once, that this node failed with `code` (node 0: STOP to all).
  void tell_failure(std::optional<int> code) {
    if (!code || failure_told_) return;
    failure_told_ = true;
    if (opt_.node_rank == 0) {
      for (auto& l : links_)
        if (l.open()) l.send(fmt::format("STOP 0 {}", *code));
    } else if (!links_.empty()) {
      links_[0].send(fmt::format("FAIL {}", *code));
    }
  }

  /// Adds the open links to a poll set (they are read in handle_messages).
  void add_poll_fds(std::vector<pollfd>& fds) const {
    for (const auto& l : links_)
      if (l.open()) fds.push_back({l.fd(), POLLIN, 0});
  }

  /// Reads what the other launchers said (node 0: FAIL and DONE; the others: STOP and END) and
  /// calls on_failure(node, status, what) for each failure of another node.
  template <typename OnFailure>
  void handle_messages(OnFailure&& on_failure) {
    auto failed = [&](int node, int code, const std::string& what) {
      if (opt_.node_rank != 0) failure_told_ = true;  // a node does not echo node 0's verdict
      on_failure(node, code, what);
    };
    for (auto& link : links_) {
      if (!link.open()) continue;
      std::vector<std::string> lines = link.take_pending();
      for (auto& l : link.read_lines()) lines.push_back(std::move(l));
      for (const auto& line : lines) {
        const auto w = nodes_detail::words(line);
        if (w.empty()) continue;
        const int code = w.size() >= 2 ? std::atoi(std::string(w.back()).c_str()) : 1;
        if (opt_.node_rank == 0 && (w[0] == "FAIL" || w[0] == "DONE")) {
          if (w[0] == "DONE") done_.insert(link.peer_node());
          if (code != 0) failed(link.peer_node(), code, fmt::format("failed with status {}", code));
        } else if (w[0] == "STOP") {
          failed(0, code, fmt::format("says the job failed (status {})", code));
        } else if (w[0] == "END") {
          job_end_ = code;
        }
      }
      if (link.eof()) {
        const int peer = link.peer_node();
        link.close();
        if (job_end_) continue;
        if (opt_.node_rank == 0 && done_.count(peer)) continue;
        failed(peer, 1, "launcher was lost (its connection closed)");
      }
    }
  }

  /// After this node's tasks ended with status `mine`: node 0 waits for every node's DONE and
  /// sends END with the job's verdict; the others send DONE and wait for END. `on_wake()` runs after
  /// every wait (signals, then handle_messages); `verdict()` is the job's status so far. Returns
  /// this launcher's exit status: the same on every node.
  template <typename OnWake, typename Verdict>
  int finish(int mine, OnWake&& on_wake, Verdict&& verdict) {
    if (opt_.node_rank != 0 && !links_.empty() && links_[0].open()) links_[0].send(fmt::format("DONE {}", mine));
    while (waiting()) {
      std::vector<pollfd> fds{{signal_fd(), POLLIN, 0}};
      add_poll_fds(fds);
      if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) break;
      on_wake();
    }
    const std::optional<int> so_far = verdict();
    if (opt_.node_rank == 0) {
      const int v = so_far.value_or(0);
      for (auto& l : links_)
        if (l.open()) l.send(fmt::format("END {}", v));
      return v;
    }
    return job_end_ ? (*job_end_ != 0 && mine == 0 ? *job_end_ : mine) : so_far.value_or(1);
  }

 private:
  bool waiting() const {
    if (opt_.node_rank != 0) return !job_end_ && !links_.empty() && links_[0].open();
    for (std::size_t r = 1; r < links_.size(); ++r)
      if (links_[r].open() && !done_.count(static_cast<int>(r))) return true;
    return false;
  }

  const Options& opt_;
  NodeAgreement agreement_;
  std::vector<NodeLink> links_;
  std::set<int> done_;           // node 0: nodes whose tasks are all done (DONE received)
  std::optional<int> job_end_;   // the others: node 0's verdict (END)
  bool failure_told_ = false;
};

}  // namespace launch
