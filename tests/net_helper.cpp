// One rank of a test cluster for tests/test_net.cpp, run as a real process on 127.0.0.1.
//
//   net_helper MODE --rank R --ports P0,P1,... [--token T] [--op-timeout MS] [--hb-timeout MS]
//              [--connect-timeout MS] [--variant V] [--count N] [--iters N]
//              [--direct-max BYTES] [--hd-max BYTES] [--chunk-bytes BYTES] [--busy-poll-us US]
//              [--shm-min BYTES] [--shm-slot BYTES]
//   net_helper MODE --rank R --addresses HOST:PORT,HOST:PORT,... [options as above]
//
// --addresses replaces --ports where the ranks run on different (simulated) hosts
// (tests/support/netns_hosts.py).
//
// The last ones set the all-reduce thresholds (options.hpp), so that a test can drive every
// algorithm (shared memory, direct, halving-doubling, ring) over every size instead of the one the
// default picks.
//
// Prints "READY" once the cluster has formed and done one collective, "OK ..." on success, and
// "EXC <error type>: <message>" when a library error escapes. The exit code says which error:
// 0 ok, 1 wrong result, 2 usage, 3 PeerFailure, 4 CollectiveTimeout, 5 InvalidArgument,
// 6 ClusterConfigError, 7 Unavailable (e.g. the port was taken: the test retries), 8 other.
#define DISTRIBUTE_WITH_MULTI_WORKER
#define DISTRIBUTE_WITH_NET
#include <distribute/distribute.hpp>
#include <distribute/observe/collective_metrics.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "support/hashed_values.hpp"

namespace ds = distribute;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string mode;
  int rank = -1;
  std::vector<std::string> addresses;
  std::vector<std::string> names;
  ds::net::CommunicatorOptions options;
  std::string variant;
  std::size_t count = 1 << 20;
  int iters = 1000000;
};

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr, "net_helper: {}\n", why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("missing mode");
  a.mode = argv[1];
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc) usage(fmt::format("option {} needs a value", argv[i]));
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--rank") {
      a.rank = std::stoi(value);
    } else if (key == "--ports") {
      std::size_t at = 0;
      while (at <= value.size()) {
        const auto comma = value.find(',', at);
        const std::string port = value.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        a.names.push_back(fmt::format("worker:{}", a.addresses.size()));
        a.addresses.push_back("127.0.0.1:" + port);
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else if (key == "--addresses") {
      std::size_t at = 0;
      while (at <= value.size()) {
        const auto comma = value.find(',', at);
        a.names.push_back(fmt::format("worker:{}", a.addresses.size()));
        a.addresses.push_back(value.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else if (key == "--token") {
      a.options.cluster_token = value;
    } else if (key == "--op-timeout") {
      a.options.operation_timeout = std::chrono::milliseconds(std::stoll(value));
    } else if (key == "--hb-timeout") {
      a.options.heartbeat_timeout = std::chrono::milliseconds(std::stoll(value));
    } else if (key == "--hb-interval") {
      a.options.heartbeat_interval = std::chrono::milliseconds(std::stoll(value));
    } else if (key == "--connect-timeout") {
      a.options.connect_timeout = std::chrono::milliseconds(std::stoll(value));
    } else if (key == "--direct-max") {
      a.options.direct_max_bytes = std::stoull(value);
    } else if (key == "--hd-max") {
      a.options.halving_doubling_max_bytes = std::stoull(value);
    } else if (key == "--chunk-bytes") {
      a.options.chunk_bytes = std::stoull(value);
    } else if (key == "--busy-poll-us") {
      a.options.busy_poll = std::chrono::microseconds(std::stoll(value));
    } else if (key == "--shm-min") {
      a.options.shared_memory_min_bytes = std::stoull(value);
    } else if (key == "--shm-slot") {
      a.options.shared_memory_slot_bytes = std::stoull(value);
    } else if (key == "--variant") {
      a.variant = value;
    } else if (key == "--count") {
      a.count = std::stoull(value);
    } else if (key == "--iters") {
      a.iters = std::stoi(value);
    } else {
      usage("unknown option " + key);
    }
  }
  if (a.rank < 0 || a.addresses.empty()) usage("--rank and --ports are required");
  return a;
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

int failures = 0;

template <class... T>
void check(bool ok, fmt::format_string<T...> f, T&&... args) {
  if (ok) return;
  ++failures;
  if (failures <= 20) say("WRONG " + fmt::format(f, std::forward<T>(args)...));
}

// ---- all_reduce with exact expected values --------------------------------------------------

template <class T>
T value_of(ds::ReduceOp op, int r, std::size_t i) {
  switch (op) {
    case ds::ReduceOp::Sum:
    case ds::ReduceOp::Mean: return static_cast<T>(static_cast<long long>(r + 1) * static_cast<long long>(i % 13 + 1));
    case ds::ReduceOp::Min:
    case ds::ReduceOp::Max: return static_cast<T>(static_cast<long long>((i * 7 + static_cast<std::size_t>(r) * 13) % 101) - 50);
    case ds::ReduceOp::Product: {
      const bool hit = (i + static_cast<std::size_t>(r)) % 3 == 0;
      if constexpr (std::is_signed_v<T>) return static_cast<T>(hit ? -2 : 1);
      return static_cast<T>(hit ? 2 : 1);
    }
  }
  return T{};
}

template <class T>
T expected_of(ds::ReduceOp op, int n, std::size_t i) {
  T acc = value_of<T>(op, 0, i);
  for (int r = 1; r < n; ++r) {
    const T v = value_of<T>(op, r, i);
    switch (op) {
      case ds::ReduceOp::Sum:
      case ds::ReduceOp::Mean: acc = static_cast<T>(acc + v); break;
      case ds::ReduceOp::Min: acc = std::min(acc, v); break;
      case ds::ReduceOp::Max: acc = std::max(acc, v); break;
      case ds::ReduceOp::Product: acc = static_cast<T>(acc * v); break;
    }
  }
  if (op == ds::ReduceOp::Mean) acc = static_cast<T>(acc / static_cast<T>(n));
  return acc;
}

template <class T>
void all_reduce_case(ds::net::Communicator& comm, ds::ReduceOp op, std::size_t count) {
  std::vector<T> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = value_of<T>(op, comm.rank(), i);
  comm.all_reduce(std::span<T>(data), op);
  for (std::size_t i = 0; i < count; ++i) {
    const T want = expected_of<T>(op, comm.size(), i);
    if (data[i] != want) {
      check(false, "all_reduce {} {} count {}: element {} is {} but should be {}", ds::to_string(ds::dtype_of<T>()),
            ds::to_string(op), count, i, data[i], want);
      return;
    }
  }
}

// ---- all_reduce of inexact values: bitwise identical on every rank ---------------------------

// Values whose sums round differently in every order: both signs, magnitudes 1e-3 .. 1e3 by
// i % 7. Hashed, not libm: the checks recompute every rank's values for every element, and sin/pow
// made up two thirds of the whole battery's time.
constexpr double kInexactScale[7] = {1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3};
double inexact(int r, std::size_t i) {
  return test_support::hashed_unit(static_cast<std::uint64_t>(r), i) * kInexactScale[i % 7];
}

std::uint64_t fnv1a(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return h;
}

// Every rank's result must hash alike (all_gather of the hashes), and SUM, MEAN, MIN and MAX must
// be near the exact value (MIN and MAX exactly it).
template <class T>
void identical_case(ds::net::Communicator& comm, ds::ReduceOp op, std::size_t count) {
  const int n = comm.size();
  std::vector<T> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(inexact(comm.rank(), i));
  comm.all_reduce(std::span<T>(data), op);
  const std::uint64_t mine = fnv1a(data.data(), data.size() * sizeof(T));
  std::vector<std::byte> out;
  std::vector<std::size_t> sizes;
  comm.all_gather(&mine, sizeof mine, out, sizes);
  for (int r = 0; r < n; ++r) {
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, out.data() + static_cast<std::size_t>(r) * sizeof theirs, sizeof theirs);
    check(theirs == mine, "all_reduce {} {} count {}: rank {}'s result differs bitwise from rank {}'s",
          ds::to_string(ds::dtype_of<T>()), ds::to_string(op), count, r, comm.rank());
  }
  if (op == ds::ReduceOp::Product) return;
  const double tolerance = sizeof(T) == 4 ? 1e-4 : 1e-12;
  for (std::size_t i = 0; i < count; ++i) {
    long double want = static_cast<T>(inexact(0, i));
    for (int r = 1; r < n; ++r) {
      const long double v = static_cast<T>(inexact(r, i));
      want = op == ds::ReduceOp::Min ? std::min(want, v) : op == ds::ReduceOp::Max ? std::max(want, v) : want + v;
    }
    if (op == ds::ReduceOp::Mean) want /= n;
    const bool exact = op == ds::ReduceOp::Min || op == ds::ReduceOp::Max;
    const long double err = std::fabs(static_cast<long double>(data[i]) - want);
    const long double scale = static_cast<long double>(kInexactScale[i % 7]) * n;
    if (exact ? data[i] != static_cast<T>(want) : err > tolerance * scale) {
      check(false, "all_reduce {} {} count {}: element {} is {} but should be near {}", ds::to_string(ds::dtype_of<T>()),
            ds::to_string(op), count, i, static_cast<double>(data[i]), static_cast<double>(want));
      return;
    }
  }
}

std::byte pattern(int r, std::size_t i) { return static_cast<std::byte>((r * 31 + static_cast<int>(i % 251)) & 0xFF); }

// Bytes this host sent through eth0, where there is one.
std::optional<std::uint64_t> eth0_tx_bytes() {
  std::FILE* f = std::fopen("/sys/class/net/eth0/statistics/tx_bytes", "r");
  if (f == nullptr) return std::nullopt;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;
  std::fclose(f);
  return ok ? std::optional<std::uint64_t>(v) : std::nullopt;
}

// TCP segments this host has retransmitted (/proc/net/snmp of its network namespace: a line of
// names, then a line of values, for each protocol), where it says.
std::optional<std::uint64_t> tcp_retransmitted_segments() {
  std::ifstream snmp("/proc/net/snmp");
  std::string names, values;
  while (std::getline(snmp, names) && std::getline(snmp, values)) {
    if (!names.starts_with("Tcp:")) continue;
    std::istringstream name_words(names), value_words(values);
    std::string name, value;
    while (name_words >> name && value_words >> value)
      if (name == "RetransSegs") return std::stoull(value);
  }
  return std::nullopt;
}

// This task's distribute_collective_bytes_sent_total{kind="all_reduce"}.
std::uint64_t sent_by_all_reduces(const ds::observe::CollectiveMetrics& metrics) {
  const std::string text = metrics.registry()->expose();
  const std::string series = "distribute_collective_bytes_sent_total{";
  for (std::size_t at = text.find(series); at != std::string::npos; at = text.find(series, at + 1)) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    if (line.find("kind=\"all_reduce\"") != std::string::npos) return std::stoull(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

void run_collectives(ds::net::Communicator& comm, const ds::observe::CollectiveMetrics* metrics) {
  const int n = comm.size(), me = comm.rank();
  say(comm.uses_shared_memory() ? "SHARED MEMORY on" : "SHARED MEMORY off");
  // Which host this rank runs on and what carries its all-reduce data to each peer (the
  // multi-host test checks shared memory inside a host and never across).
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  say(fmt::format("HOST {}", host));
  for (int k = 0; k < n; ++k) {
    if (k != me) say(fmt::format("PAIR {} {} {}", me, k, comm.shares_memory_with(k) ? "shm" : "tcp"));
  }
  say("READY");
  const std::size_t big_f32 = (std::size_t{1} << 20) / 4 + 3;  // 1 MiB of float32 + 3 elements
  const std::size_t big_i64 = (std::size_t{1} << 20) / 8 + 3;
  for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean, ds::ReduceOp::Min, ds::ReduceOp::Max, ds::ReduceOp::Product}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{5001}, big_f32}) {
      all_reduce_case<float>(comm, op, count);
    }
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{3001}, big_i64}) {
      all_reduce_case<std::int64_t>(comm, op, count);
    }
  }
  // Fewer elements than ranks (empty ring segments) and a buffer that spans many chunks.
  all_reduce_case<float>(comm, ds::ReduceOp::Sum, static_cast<std::size_t>(n - 1));
  all_reduce_case<double>(comm, ds::ReduceOp::Sum, 3 * (std::size_t{1} << 20) + 1);
  // Inexact values, whose result depends on the order of reduction: every rank must end with the
  // same bits. Sizes: fewer elements than ranks, one small message, and buffers cut in parts that
  // span many shared-memory rounds and TCP chunks (6 MiB + 20 bytes of float32).
  const std::size_t huge_f32 = (std::size_t{6} << 20) / 4 + 5;
  for (auto op : {ds::ReduceOp::Sum, ds::ReduceOp::Mean, ds::ReduceOp::Min, ds::ReduceOp::Max, ds::ReduceOp::Product}) {
    for (std::size_t count : {std::size_t{1}, static_cast<std::size_t>(n - 1), std::size_t{5001}, big_f32, huge_f32}) {
      if (count > 0) identical_case<float>(comm, op, count);
    }
  }
  identical_case<double>(comm, ds::ReduceOp::Sum, big_i64);
  identical_case<double>(comm, ds::ReduceOp::Mean, 3 * (std::size_t{1} << 20) + 1);
  {
    std::vector<std::uint8_t> flags(100, 0);
    if (me == n - 1) flags[42] = 1;
    comm.all_reduce(flags.data(), flags.size(), ds::DType::Bool, ds::ReduceOp::Max);
    check(flags[42] == 1 && flags[41] == 0, "bool all_reduce MAX (any)");
  }

  // all_gather with uneven sizes, one rank contributing nothing, one spanning many chunks.
  for (int round = 0; round < 2; ++round) {
    const std::size_t mine = round == 0 ? static_cast<std::size_t>(me) * 1000 + 3
                                        : (me == 0 ? 0 : me == n - 1 ? std::size_t{700} * 1024 + 5 : 17);
    std::vector<std::byte> in(mine);
    for (std::size_t i = 0; i < mine; ++i) in[i] = pattern(me, i);
    std::vector<std::byte> out;
    std::vector<std::size_t> sizes;
    comm.all_gather(in.data(), in.size(), out, sizes);
    std::size_t offset = 0;
    check(sizes.size() == static_cast<std::size_t>(n), "all_gather returned {} sizes", sizes.size());
    for (int r = 0; r < n && sizes.size() == static_cast<std::size_t>(n); ++r) {
      const std::size_t want = round == 0 ? static_cast<std::size_t>(r) * 1000 + 3
                                          : (r == 0 ? 0 : r == n - 1 ? std::size_t{700} * 1024 + 5 : 17);
      check(sizes[static_cast<std::size_t>(r)] == want, "all_gather size of rank {} is {}, want {}", r,
            sizes[static_cast<std::size_t>(r)], want);
      for (std::size_t i = 0; i < want && offset + i < out.size(); ++i) {
        if (out[offset + i] != pattern(r, i)) {
          check(false, "all_gather round {} byte {} of rank {} differs", round, i, r);
          break;
        }
      }
      offset += want;
    }
    check(out.size() == offset, "all_gather output has {} bytes, want {}", out.size(), offset);
  }

  // broadcast from every root: empty, direct, chained over many chunks.
  for (int root = 0; root < n; ++root) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{5}, std::size_t{100000}, (std::size_t{1} << 20) + 1}) {
      std::vector<std::byte> buf(bytes, std::byte{0});
      if (me == root) {
        for (std::size_t i = 0; i < bytes; ++i) buf[i] = pattern(root + 7, i);
      }
      comm.broadcast(buf.data(), bytes, root);
      for (std::size_t i = 0; i < bytes; ++i) {
        if (buf[i] != pattern(root + 7, i)) {
          check(false, "broadcast of {} bytes from root {}: byte {} differs", bytes, root, i);
          break;
        }
      }
    }
  }

  // barrier: nobody leaves before the last one arrives.
  const auto before = Clock::now();
  if (me == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comm.barrier();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - before).count();
  check(waited >= 250, "barrier returned after {} ms although rank 0 arrived after 300 ms", waited);
  comm.barrier();

  // point-to-point around the ring, small and larger than a socket buffer, in order.
  for (std::size_t bytes : {std::size_t{4}, std::size_t{3} << 20}) {
    std::vector<std::byte> out(bytes), in(bytes);
    for (std::size_t i = 0; i < bytes; ++i) out[i] = pattern(me, i);
    comm.send((me + 1) % n, out);
    comm.send((me + 1) % n, std::span<const std::byte>(out).first(1));
    comm.recv((me - 1 + n) % n, in);
    std::byte one{};
    comm.recv((me - 1 + n) % n, std::span<std::byte>(&one, 1));
    const int from = (me - 1 + n) % n;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (in[i] != pattern(from, i)) {
        check(false, "recv of {} bytes from rank {}: byte {} differs", bytes, from, i);
        break;
      }
    }
    check(one == pattern(from, 0), "second message from rank {} differs", from);
  }
  // A receive of the wrong size throws InvalidArgument and leaves the communicator usable.
  if (me == 0) {
    const std::uint32_t v = 7;
    comm.send(1, std::as_bytes(std::span(&v, 1)));
  } else if (me == 1) {
    std::uint64_t w = 0;
    bool threw = false;
    try {
      comm.recv(0, std::as_writable_bytes(std::span(&w, 1)));
    } catch (const ds::InvalidArgument& e) {
      threw = std::string(e.what()).find("sent 4 bytes") != std::string::npos;
    }
    check(threw, "recv of the wrong size did not throw InvalidArgument naming the sizes");
  }
  comm.barrier();
  check(!comm.failure().has_value(), "communicator poisoned after the battery");

  // What one large all-reduce made this rank send (the metrics: TCP payload and what it put into
  // shared memory), for the multi-host test to check who carries the data across hosts; and what
  // left this host through eth0 (a simulated host's only way out) in a 4 and an 8 MiB all-reduce,
  // for it to check how often the data crosses between hosts.
  if (metrics != nullptr) {
    for (std::size_t bytes : {std::size_t{4} << 20, std::size_t{8} << 20}) {
      std::vector<float> grads(bytes / 4, 1.0f);
      comm.barrier();
      const std::uint64_t before = sent_by_all_reduces(*metrics);
      const auto link_before = eth0_tx_bytes();
      const auto retrans_before = tcp_retransmitted_segments();
      comm.all_reduce(std::span<float>(grads), ds::ReduceOp::Sum);
      comm.barrier();  // every rank's data has been received: none of it is still on its way out
      const auto link_after = eth0_tx_bytes();
      const auto retrans_after = tcp_retransmitted_segments();
      if (bytes == (std::size_t{8} << 20)) say(fmt::format("SENT {} of {}", sent_by_all_reduces(*metrics) - before, bytes));
      if (link_before && link_after) say(fmt::format("LINK {} of {}", *link_after - *link_before, bytes));
      if (retrans_before && retrans_after) say(fmt::format("RETRANSMITTED {} segments in {}", *retrans_after - *retrans_before, bytes));
    }
  }
}

// ---- mismatched collectives ---------------------------------------------------------------

void run_mismatch(ds::net::Communicator& comm, const std::string& variant) {
  const int n = comm.size(), me = comm.rank();
  const bool odd = me == n - 1;
  comm.barrier();
  say("READY");
  std::vector<float> f(odd && variant == "count" ? 11 : 10, 1.0f);
  // "ring-halves": the upper half of the ranks calls with one element more, so every rank has
  // partners on both sides of the disagreement.
  const bool bigger = (odd && variant == "ring-count") || (variant == "ring-halves" && me >= n / 2);
  std::vector<float> big((std::size_t{1} << 20) + (bigger ? 1 : 0), 1.0f);
  std::vector<std::int32_t> i32(10, 1);
  try {
    if (variant == "count") {
      comm.all_reduce(std::span<float>(f), ds::ReduceOp::Sum);
    } else if (variant == "ring-count" || variant == "ring-halves") {
      comm.all_reduce(std::span<float>(big), ds::ReduceOp::Sum);
    } else if (variant == "op") {
      comm.all_reduce(std::span<float>(f), odd ? ds::ReduceOp::Max : ds::ReduceOp::Sum);
    } else if (variant == "mean") {
      // MEAN is a SUM and a division below the communicator: it must still disagree with a SUM.
      comm.all_reduce(std::span<float>(f), odd ? ds::ReduceOp::Mean : ds::ReduceOp::Sum);
    } else if (variant == "dtype") {
      if (odd) {
        comm.all_reduce(std::span<std::int32_t>(i32), ds::ReduceOp::Sum);
      } else {
        comm.all_reduce(std::span<float>(f), ds::ReduceOp::Sum);
      }
    } else if (variant == "kind") {
      if (odd) {
        comm.broadcast(f.data(), f.size() * sizeof(float), 0);
      } else {
        comm.all_reduce(std::span<float>(f), ds::ReduceOp::Sum);
      }
    } else if (variant == "ring-kind") {
      // The all-reducing ranks wait in the ring (Op::wait_until) when the disagreeing descriptor arrives.
      if (odd) {
        comm.broadcast(big.data(), big.size() * sizeof(float), 0);
      } else {
        comm.all_reduce(std::span<float>(big), ds::ReduceOp::Sum);
      }
    } else if (variant == "root") {
      comm.broadcast(big.data(), big.size() * sizeof(float), odd ? 1 : 0);
    } else if (variant == "order") {
      if (odd) {
        comm.barrier();
        comm.all_reduce(std::span<float>(f), ds::ReduceOp::Sum);
      } else {
        comm.all_reduce(std::span<float>(f), ds::ReduceOp::Sum);
        comm.barrier();
      }
    } else {
      usage("unknown variant " + variant);
    }
    say("WRONG the mismatched collective returned normally");
    std::exit(1);
  } catch (const ds::InvalidArgument& e) {
    say(fmt::format("OK InvalidArgument: {}", e.what()));
  }
  // Poisoned: the next call fails the same way, at once.
  const auto t0 = Clock::now();
  try {
    comm.barrier();
    say("WRONG a poisoned communicator accepted a barrier");
    std::exit(1);
  } catch (const ds::InvalidArgument& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    check(ms < 1000, "the poisoned barrier took {} ms to throw", ms);
    say(fmt::format("OK poisoned: {}", e.what()));
  }
}

// ---- endless all-reduce, to be killed or stopped -----------------------------------------

void run_loop(ds::net::Communicator& comm, std::size_t count, int iters) {
  std::vector<float> data(count);
  for (int it = 0; it < iters; ++it) {
    std::fill(data.begin(), data.end(), 1.0f);
    comm.all_reduce(std::span<float>(data), ds::ReduceOp::Sum);
    check(data.empty() || data.back() == static_cast<float>(comm.size()), "loop: wrong sum {}", data.empty() ? 0.f : data.back());
    if (it == 0) say("READY");
  }
  say("OK loop");
}

// ---- a cluster with a token that keeps working while strangers knock ------------------------

void run_auth(ds::net::Communicator& comm, int iters) {
  say("READY");
  for (int it = 0; it < iters; ++it) {
    std::vector<std::int64_t> v(1000, comm.rank());
    comm.all_reduce(std::span<std::int64_t>(v), ds::ReduceOp::Sum);
    check(v[999] == static_cast<std::int64_t>(comm.size()) * (comm.size() - 1) / 2, "auth loop: wrong sum {}", v[999]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  comm.barrier();
  say("OK auth");
}

int run(Args a, std::unique_ptr<ds::net::Communicator>& comm) {
  if (a.mode == "collectives") {
    a.options.metrics = std::make_shared<ds::observe::CollectiveMetrics>(std::make_shared<ds::observe::MetricsRegistry>("worker", a.rank));
  }
  comm = std::make_unique<ds::net::Communicator>(a.addresses, a.rank, a.options, a.names);
  if (a.mode == "collectives") {
    run_collectives(*comm, a.options.metrics.get());
  } else if (a.mode == "mismatch") {
    run_mismatch(*comm, a.variant);
  } else if (a.mode == "loop") {
    run_loop(*comm, a.count, a.iters);
  } else if (a.mode == "auth") {
    run_auth(*comm, a.iters);
  } else if (a.mode == "join") {
    // Only joining is tested (an impostor); succeeding is the wrong outcome for it.
    say("OK joined");
  } else {
    usage("unknown mode " + a.mode);
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  // The communicator outlives the report, so the time of the EXC line is the time of the error,
  // not of the clean shutdown that follows it.
  std::unique_ptr<ds::net::Communicator> comm;
  int code = 0;
  try {
    code = run(a, comm);
  } catch (const ds::PeerFailure& e) {
    say(fmt::format("EXC PeerFailure: {}", e.what()));
    code = 3;
  } catch (const ds::CollectiveTimeout& e) {
    say(fmt::format("EXC CollectiveTimeout: {}", e.what()));
    code = 4;
  } catch (const ds::InvalidArgument& e) {
    say(fmt::format("EXC InvalidArgument: {}", e.what()));
    code = 5;
  } catch (const ds::ClusterConfigError& e) {
    say(fmt::format("EXC ClusterConfigError: {}", e.what()));
    code = 6;
  } catch (const ds::Unavailable& e) {
    say(fmt::format("EXC Unavailable: {}", e.what()));
    code = 7;
  } catch (const std::exception& e) {
    say(fmt::format("EXC other: {}", e.what()));
    code = 8;
  }
  comm.reset();
  if (failures > 0) say(fmt::format("FAILED {} checks", failures));
  return code;
}
