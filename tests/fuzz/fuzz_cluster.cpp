// libFuzzer target: what a cluster is configured from: TF_CONFIG (JSON), Slurm's hostlist and
// tasks-per-node lists and a whole Slurm environment, the launcher's environment, and host:port
// addresses (cluster/address.hpp and net/'s parser). The first byte picks the parser; the rest is
// the text (environments: variables separated by '\n').
// Oracles: only typed errors; a hostlist expands within its bounds (names, bytes, 253-byte hosts);
// an address that parses prints back to one that parses the same.
#include <distribute/cluster/address.hpp>
#include <distribute/cluster/launcher.hpp>
#include <distribute/cluster/slurm.hpp>
#include <distribute/cluster/tf_config.hpp>
#include <distribute/net/address.hpp>

#include <string>
#include <vector>

#include "fuzz_common.hpp"

namespace ds = distribute;

namespace {

// "a\nb\nc" → the first `n` lines (missing ones empty).
std::vector<std::string> lines(std::string_view text, std::size_t n) {
  std::vector<std::string> out;
  while (out.size() + 1 < n) {
    const auto nl = text.find('\n');
    if (nl == std::string_view::npos) break;
    out.emplace_back(text.substr(0, nl));
    text.remove_prefix(nl + 1);
  }
  out.emplace_back(text);
  out.resize(n);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view text = fuzz::text(fuzz::bytes(data + 1, size - 1));
  switch (data[0] % 7) {
    case 0:
      fuzz::expect_typed_errors([&] {
        ds::TFConfigClusterResolver r{std::string(text)};
        (void)r.cluster_spec().as_dict();
        (void)r.master();
      });
      break;
    case 1:
      fuzz::expect_typed_errors([&] {
        const auto hosts = ds::SlurmClusterResolver::expand_hostlist(text);
        fuzz::require(!hosts.empty() && hosts.size() <= static_cast<std::size_t>(ds::cluster::detail::kSlurmMaxCount), "host count within bound");
        std::size_t bytes = 0;
        for (const auto& h : hosts) {
          fuzz::require(!h.empty() && h.size() <= ds::kMaxHostNameBytes, "a host name of 1..253 bytes");
          bytes += h.size();
        }
        fuzz::require(bytes <= static_cast<std::size_t>(ds::cluster::detail::kSlurmMaxHostlistBytes), "host text within bound");
      });
      break;
    case 2: fuzz::expect_typed_errors([&] { (void)ds::SlurmClusterResolver::expand_tasks_per_node(text); }); break;
    case 3:
      fuzz::expect_typed_errors([&] {
        const ds::HostPort hp = ds::split_host_port(text);
        fuzz::require(ds::split_host_port(hp.to_string()) == hp, "an address prints back to itself");
        fuzz::require(hp.host.size() <= ds::kMaxHostNameBytes, "a host of at most 253 bytes");
      });
      break;
    case 4:
      fuzz::expect_typed_errors([&] {
        const auto hp = ds::net::parse_host_port(text);
        fuzz::require(hp.host.size() <= ds::kMaxHostNameBytes, "a host of at most 253 bytes");
      });
      break;
    case 5:
      fuzz::expect_typed_errors([&] {
        const auto v = lines(text, 4);
        ds::SlurmClusterResolver r({}, ds::EnvVars{{"SLURM_PROCID", v[0]},
                                                   {"SLURM_STEP_NUM_TASKS", v[1]},
                                                   {"SLURM_STEP_NODELIST", v[2]},
                                                   {"SLURM_STEP_TASKS_PER_NODE", v[3]}});
        (void)r.cluster_spec().as_dict();
      });
      break;
    case 6:
      fuzz::expect_typed_errors([&] {
        const auto v = lines(text, 4);
        ds::LauncherClusterResolver r({}, ds::EnvVars{{"RANK", v[0]}, {"WORLD_SIZE", v[1]}, {"MASTER_ADDR", v[2]}, {"MASTER_PORT", v[3]}});
        (void)r.cluster_spec().as_dict();
      });
      break;
  }
  return 0;
}
