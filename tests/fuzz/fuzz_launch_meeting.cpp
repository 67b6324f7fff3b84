// libFuzzer target: the lines of distribute-launch's node meeting (tools/launch_node_protocol.hpp),
// read as node 0 reads a stranger's HELLO and JOIN and as a joiner reads node 0's CHALLENGE and
// CLUSTER. The first byte picks the message, the rest is the line.
// Oracles: only RendezvousError; what is accepted is within its bounds (a node's tasks 1..1024,
// ports that fit below 65536, hosts of one word), and written again it reads back the same.
#include "../../tools/launch_node_protocol.hpp"

#include <string>
#include <string_view>

#include "fuzz_common.hpp"

namespace {

template <class F>
void expect_refusals(F&& read) {
  try {
    read();
  } catch (const launch::RendezvousError&) {
  }
}

void check_entry(const launch::NodeEntry& e, int nnodes) {
  fuzz::require(e.node_rank >= 0 && e.node_rank < nnodes, "a node rank within the job");
  fuzz::require(e.tasks >= 1 && e.tasks <= launch::kMaxNodeTasks, "a task count within bounds");
  fuzz::require(e.port_base >= 1 && e.port_base + e.tasks - 1 <= 65535, "every task port below 65536");
  fuzz::require(!e.host.empty() && e.host.size() <= 255 && e.host.find(' ') == std::string::npos, "a host of one word");
}

// What a joiner of the CLUSTER line is: node 1 of 2 with one task, "h" port 1 (the seeds use it).
const launch::NodeEntry kJoiner{1, 1, "h", 1};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view line(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:  // node 0 reads a HELLO
      expect_refusals([&] {
        const auto nonce = launch::parse_hello(line);
        fuzz::require(launch::parse_hello(launch::hello_line(nonce)) == nonce, "a HELLO reads back");
      });
      break;
    case 1:  // a joiner reads node 0's CHALLENGE
      expect_refusals([&] {
        const auto c = launch::parse_challenge(line);
        const auto again = launch::parse_challenge(launch::challenge_line(c.nonce, c.proof));
        fuzz::require(again.nonce == c.nonce && again.proof == c.proof, "a CHALLENGE reads back");
      });
      break;
    case 2:  // node 0 reads a JOIN, then (as if its proof held) its fields
      expect_refusals([&] {
        const auto j = launch::parse_join(line);
        const int nnodes = launch::joined_nnodes(j.fields);
        fuzz::require(nnodes >= 1 && nnodes <= launch::kMaxNodes, "a node count within bounds");
        const auto e = launch::joined_entry(j.fields, nnodes);
        check_entry(e, nnodes);
        fuzz::require(launch::joined_entry(launch::join_fields(nnodes, e), nnodes) == e, "a JOIN's fields read back");
      });
      break;
    default:  // a joiner reads node 0's CLUSTER
      expect_refusals([&] {
        const auto a = launch::parse_agreement(line, 2, kJoiner);
        fuzz::require(a.nodes.size() == 2, "one entry per node");
        for (const auto& e : a.nodes) check_entry(e, 2);
        fuzz::require(a.master_port >= 1 && a.master_port <= 65535, "a master port below 65536");
        const auto again = launch::parse_agreement(launch::agreement_line(a), 2, kJoiner);
        fuzz::require(again.nodes == a.nodes && again.master_addr == a.master_addr && again.master_port == a.master_port,
                      "a CLUSTER reads back");
      });
  }
  return 0;
}
