// net/: frame decoding (fuzzed), the handshake primitives, and the Communicator — in threads for
// the quick cases, and as real processes (tests/net_helper.cpp) on 127.0.0.1 for collectives,
// mismatches, SIGKILL, SIGSTOP and authentication. Every test runs under a watchdog that kills its
// processes and fails the run instead of hanging.
#define DISTRIBUTE_WITH_MULTI_WORKER
#define DISTRIBUTE_WITH_NET
#include <distribute/distribute.hpp>
#include <distribute/net/rpc_errors.hpp>  // internal: the error replies of the RPC protocol

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "support/processes.hpp"

namespace ds = distribute;
namespace net = distribute::net;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using test_support::worker_names;

extern char** environ;

namespace {

// ---- processes ------------------------------------------------------------------------------

std::mutex g_children_mu;
std::set<pid_t> g_children;  // alive children, killed by the watchdog

/// Fails the test run (instead of hanging it) when a test exceeds its time bound.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::string what)
      : thread_([this, limit, what = std::move(what)] {
          std::unique_lock lk(mu_);
          if (cv_.wait_for(lk, limit, [&] { return done_; })) return;
          fmt::print(stderr, "test_net watchdog: '{}' did not finish within {} s; killing its processes\n", what,
                     limit.count());
          std::lock_guard g(g_children_mu);
          for (pid_t pid : g_children) ::kill(pid, SIGKILL);
          std::_Exit(3);
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::string net_helper_path() {
  if (const char* p = std::getenv("DISTRIBUTE_NET_HELPER"); p != nullptr && *p != '\0') return p;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / "net_helper").string();
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string output;
  std::string partial;
  std::vector<std::pair<Clock::time_point, std::string>> lines;
  std::optional<int> exit_code;  // 128 + signal when killed by one

  std::optional<Clock::time_point> line_time(std::string_view prefix) const {
    for (const auto& [t, line] : lines) {
      if (line.starts_with(prefix)) return t;
    }
    return std::nullopt;
  }
  bool done() const { return exit_code.has_value() && fd < 0; }
};

/// The processes of one scenario; whatever is still alive at the end is killed.
class Procs {
 public:
  Procs() = default;
  Procs(const Procs&) = delete;
  Procs& operator=(const Procs&) = delete;
  ~Procs() {
    for (auto& c : children_) {
      if (!c.exit_code) {
        ::kill(c.pid, SIGKILL);
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        forget(c.pid);
      }
      if (c.fd >= 0) ::close(c.fd);
    }
  }

  /// Starts the helper with `args`; `env` overrides (nullopt removes). DISTRIBUTE_CLUSTER_TOKEN
  /// is removed unless given, so the test's own environment never leaks into a cluster.
  int spawn(const std::vector<std::string>& args, std::map<std::string, std::optional<std::string>> env = {}) {
    env.try_emplace("DISTRIBUTE_CLUSTER_TOKEN", std::nullopt);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string key = entry.substr(0, entry.find('='));
      if (env.count(key) == 0) env_strings.push_back(entry);
    }
    for (const auto& [k, v] : env) {
      if (v) env_strings.push_back(k + "=" + *v);
    }
    const std::string path = net_helper_path();
    std::vector<std::string> argv_strings{path};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv, envp;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    std::lock_guard g(g_children_mu);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::execve(path.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    g_children.insert(pid);
    Child c;
    c.pid = pid;
    c.fd = fds[0];
    children_.push_back(std::move(c));
    return static_cast<int>(children_.size()) - 1;
  }

  Child& operator[](int i) { return children_[static_cast<std::size_t>(i)]; }
  int size() const { return static_cast<int>(children_.size()); }

  void signal(int i, int sig) { ::kill(children_[static_cast<std::size_t>(i)].pid, sig); }

  /// Reads whatever output is there (waiting up to `wait` for some) and reaps exited children.
  void pump(std::chrono::milliseconds wait) {
    std::vector<pollfd> fds;
    for (auto& c : children_) {
      if (c.fd >= 0) fds.push_back(pollfd{c.fd, POLLIN, 0});
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    const auto now = Clock::now();
    for (auto& c : children_) {
      while (c.fd >= 0) {
        char buf[4096];
        const ssize_t n = ::read(c.fd, buf, sizeof buf);
        if (n > 0) {
          c.output.append(buf, static_cast<std::size_t>(n));
          c.partial.append(buf, static_cast<std::size_t>(n));
          for (auto nl = c.partial.find('\n'); nl != std::string::npos; nl = c.partial.find('\n')) {
            c.lines.emplace_back(now, c.partial.substr(0, nl));
            c.partial.erase(0, nl + 1);
          }
        } else if (n == 0) {
          ::close(c.fd);
          c.fd = -1;
        } else {
          break;  // EAGAIN: nothing more for now
        }
      }
      if (!c.exit_code) {
        int status = 0;
        if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          forget(c.pid);
        }
      }
    }
    if (fds.empty()) std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(20)));
  }

  bool wait_until(const std::function<bool()>& done, Clock::time_point deadline) {
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      pump(20ms);
    }
    return true;
  }

  bool wait_line(int i, std::string_view prefix, Clock::time_point deadline) {
    return wait_until([&] { return (*this)[i].line_time(prefix).has_value() || (*this)[i].done(); }, deadline) &&
           (*this)[i].line_time(prefix).has_value();
  }

  bool wait_exit(const std::vector<int>& which, Clock::time_point deadline) {
    return wait_until(
        [&] { return std::all_of(which.begin(), which.end(), [&](int i) { return (*this)[i].done(); }); }, deadline);
  }

  bool wait_all(Clock::time_point deadline) {
    std::vector<int> all(children_.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return wait_exit(all, deadline);
  }

  std::string dump() const {
    std::string out;
    for (std::size_t i = 0; i < children_.size(); ++i) {
      out += fmt::format("---- process {} (exit {}):\n{}\n", i,
                         children_[i].exit_code ? std::to_string(*children_[i].exit_code) : "running", children_[i].output);
    }
    return out;
  }

 private:
  static void forget(pid_t pid) {
    std::lock_guard g(g_children_mu);
    g_children.erase(pid);
  }
  std::vector<Child> children_;
};

/// Ports that were free a moment ago (a race with other programs is possible: the cluster tests
/// retry when a helper reports it could not listen).
std::vector<int> free_ports(int n) {
  std::vector<int> socks, ports;
  for (int i = 0; i < n; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(s >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    socks.push_back(s);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int s : socks) ::close(s);
  return ports;
}

std::string join_ports(const std::vector<int>& ports) {
  std::string s;
  for (int p : ports) s += (s.empty() ? "" : ",") + std::to_string(p);
  return s;
}

std::vector<std::string> addresses_of(const std::vector<int>& ports) {
  std::vector<std::string> out;
  for (int p : ports) out.push_back(fmt::format("127.0.0.1:{}", p));
  return out;
}


constexpr int kExitUnavailable = 7;

/// Runs `scenario` (which starts a cluster on `ports`) again with fresh ports when a helper could
/// not listen because another program took its port in between.
template <class F>
void with_ports(int n, F&& scenario) {
  for (int attempt = 0;; ++attempt) {
    Procs procs;
    const auto ports = free_ports(n);
    const bool port_race = scenario(procs, ports);
    if (!port_race || attempt == 2) return;
    MESSAGE("a port was taken between choosing and binding it; retrying with new ports");
  }
}

bool any_port_race(Procs& procs) {
  for (int i = 0; i < procs.size(); ++i) {
    if (procs[i].exit_code == kExitUnavailable) return true;
  }
  return false;
}

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// ---- threads ------------------------------------------------------------------------------

/// Runs fn(rank) on n threads; returns each rank's exception message ("" when none).
std::vector<std::string> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

/// A log sink for CommunicatorOptions::log that tests can read.
struct LogSink {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(std::string_view)> fn() {
    return [this](std::string_view line) {
      std::lock_guard lk(mu);
      lines.emplace_back(line);
    };
  }
  bool contains(std::string_view needle) {
    std::lock_guard lk(mu);
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(needle) != std::string::npos; });
  }
  std::string all() {
    std::lock_guard lk(mu);
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

/// A raw TCP client for playing a stranger.
struct RawSocket {
  int fd = -1;
  explicit RawSocket(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawSocket() {
    if (fd >= 0) ::close(fd);
  }
  void send_bytes(std::span<const std::byte> b) const { (void)!::send(fd, b.data(), b.size(), MSG_NOSIGNAL); }
  /// Everything the peer sends until it closes (or 5 s pass).
  std::vector<std::byte> read_to_close() const {
    std::vector<std::byte> out;
    std::byte buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.insert(out.end(), buf, buf + n);
    }
    return out;
  }
};

std::vector<std::byte> bytes_of(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(p, p + s.size());
}

}  // namespace

// =============================================================================================
// Frames

TEST_CASE("NotifyingMutex: wakes waiters after the notifier unlocks, times out, loses no wake-up") {
  using net::detail::NotifyingMutex;
  NotifyingMutex mu;
  // True when `ready` came true through notifications; a wake-up that never came runs into the
  // deadline (the state may have changed meanwhile: that is exactly a lost wake-up).
  auto woken_in_time = [&mu](std::unique_lock<NotifyingMutex>& lk, auto ready) {
    const auto deadline = Clock::now() + 5s;
    while (!ready()) {
      if (mu.wait_until(lk, deadline) == std::cv_status::timeout) return false;
    }
    return true;
  };

  SUBCASE("a deadline passes without a notification") {
    std::unique_lock lk(mu);
    const auto t0 = Clock::now();
    CHECK(mu.wait_until(lk, t0 + 20ms) == std::cv_status::timeout);
    CHECK(Clock::now() - t0 >= 20ms);
    CHECK(lk.owns_lock());
    CHECK_FALSE(mu.wait_for(lk, 5ms, [] { return false; }));
  }

  SUBCASE("a waiter is woken by a notification made under the lock, and holds the lock again") {
    bool ready = false;
    std::thread notifier([&] {
      std::this_thread::sleep_for(10ms);
      const std::lock_guard g(mu);
      ready = true;
      mu.notify_all_locked();
    });
    std::unique_lock lk(mu);
    CHECK(woken_in_time(lk, [&] { return ready; }));
    CHECK(lk.owns_lock());
    lk.unlock();
    notifier.join();
  }

  SUBCASE("a waiter that notified before waiting wakes the others") {
    bool mine = false, theirs = false;
    std::thread other([&] {
      std::unique_lock lk(mu);
      CHECK(woken_in_time(lk, [&] { return mine; }));
      theirs = true;
      mu.notify_all_locked();
    });
    std::unique_lock lk(mu);
    mine = true;
    mu.notify_all_locked();  // pending when this thread goes to wait: sent as it sleeps
    CHECK(woken_in_time(lk, [&] { return theirs; }));
    lk.unlock();
    other.join();
  }

  SUBCASE("ping-pong between two threads: every hand-off is seen (a lost wake-up would time out)") {
    constexpr int kRounds = 20000;
    int turn = 0;  // even: main's turn, odd: the other's
    bool stuck = false;
    std::thread other([&] {
      std::unique_lock lk(mu);
      for (int i = 0; i < kRounds; ++i) {
        if (!woken_in_time(lk, [&] { return turn % 2 == 1 || stuck; }) || stuck) {
          stuck = true;
          mu.notify_all_locked();
          return;
        }
        ++turn;
        mu.notify_all_locked();
      }
    });
    {
      std::unique_lock lk(mu);
      for (int i = 0; i < kRounds && !stuck; ++i) {
        if (!woken_in_time(lk, [&] { return turn % 2 == 0 || stuck; })) {
          stuck = true;
          mu.notify_all_locked();
          break;
        }
        ++turn;
        mu.notify_all_locked();
      }
    }
    other.join();
    CHECK_FALSE(stuck);
    CHECK(turn == 2 * kRounds);
  }
}

TEST_CASE("NotifyingMutex: its owner may be destroyed as soon as another thread sees the notified state") {
  // As RpcClient's destructor does: poll the state under the mutex, and destroy the owner once it
  // says done. A notifier is then still between releasing the mutex and waking its waiters; the
  // owner's memory is overwritten at once, as a reuse would, so a notifier that touched the mutex
  // after that would lock garbage (it hangs there: found by the deadline below).
  using net::detail::NotifyingMutex;
  struct Owner {
    NotifyingMutex mu;
    bool done = false;
  };
  alignas(Owner) static std::byte storage[sizeof(Owner)];  // static: a stuck notifier outlives the test
  constexpr int kRounds = 20000;
  int round = 0;
  for (; round < kRounds; ++round) {
    auto* owner = new (storage) Owner;
    std::promise<void> finished;
    std::future<void> notifier_done = finished.get_future();
    std::thread notifier([owner, finished = std::move(finished)]() mutable {
      {
        const std::lock_guard g(owner->mu);
        owner->done = true;
        owner->mu.notify_all_locked();
      }
      finished.set_value();
    });
    for (;;) {
      const std::lock_guard g(owner->mu);
      if (owner->done) break;
    }
    owner->~Owner();
    std::memset(storage, 0xA5, sizeof storage);
    if (notifier_done.wait_for(10s) != std::future_status::ready) {
      notifier.detach();
      FAIL("round " << round << ": the notifier still used the mutex after its owner was destroyed");
    }
    notifier.join();
  }
  CHECK(round == kRounds);
}

/// The name an exception of type Sent is given in an error reply, and whether the caller's side
/// rethrows it as exactly Expected, with the same message.
template <class Sent, class Expected = Sent>
std::string name_on_the_wire() {
  const Sent sent("the message");
  const auto kind = ds::net::error_kind_from_name(std::string(ds::net::error_kind_name(ds::net::error_kind(sent))));
  try {
    ds::net::throw_as_kind(kind, sent.what());
  } catch (const std::exception& again) {
    CHECK(std::string(again.what()) == "the message");
    CHECK(typeid(again) == typeid(Expected));
  }
  return std::string(ds::net::error_kind_name(kind));
}

TEST_CASE("error replies: each library error is named on the wire and rethrown as its own class") {
  CHECK(name_on_the_wire<ds::InvalidArgument>() == "InvalidArgument");
  CHECK(name_on_the_wire<ds::ClusterConfigError>() == "ClusterConfigError");
  CHECK(name_on_the_wire<ds::OutOfRange>() == "OutOfRange");
  CHECK(name_on_the_wire<ds::PeerFailure>() == "PeerFailure");
  CHECK(name_on_the_wire<ds::CollectiveTimeout>() == "CollectiveTimeout");
  CHECK(name_on_the_wire<ds::CheckpointError>() == "CheckpointError");
  CHECK(name_on_the_wire<ds::Unavailable>() == "Unavailable");
  CHECK(name_on_the_wire<ds::Cancelled>() == "Cancelled");
  // A lost connection is a PeerFailure to the caller; any other exception a plain ds::Error.
  CHECK(name_on_the_wire<ds::net::TimedOut, ds::PeerFailure>() == "PeerFailure");
  CHECK(name_on_the_wire<std::runtime_error, ds::Error>() == "Error");
  // A name this build does not know (a newer peer's) is a plain ds::Error.
  CHECK(ds::net::error_kind_from_name("QuotaExceeded") == ds::net::ErrorKind::Error);
}

TEST_CASE("frame header: round trip, and every malformed header is rejected with a reason") {
  const net::FrameHeader h{net::FrameType::Data, 1234, 56, 78};
  const auto bytes = net::encode_header(h);
  CHECK(net::decode_header(bytes, 1 << 20) == h);
  CHECK(bytes[0] == std::byte{'D'});
  CHECK(bytes[3] == std::byte{'T'});

  auto mutated = [&](std::size_t at, std::uint8_t value) {
    auto b = bytes;
    b[at] = static_cast<std::byte>(value);
    return b;
  };
  CHECK_THROWS_WITH_AS(net::decode_header(std::span(bytes).first(31), 1 << 20), "truncated frame header: 31 of 32 bytes",
                       net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(0, 'X'), 1 << 20), doctest::Contains("bad frame magic 0x544e5358"),
                       net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(4, 9), 1 << 20),
                       "unsupported protocol version 9 (this build speaks version 4)", net::FrameError);
  // Older peers (version 1 had reserved bytes where pad and tail are now, version 2 no tail,
  // version 3 no padding on the ps service's frames nor a service flag in the handshake) are
  // refused by their version.
  for (const int old : {1, 2, 3}) {
    const std::string expected = fmt::format("unsupported protocol version {} (this build speaks version 4)", old);
    CHECK_THROWS_WITH_AS(net::decode_header(mutated(4, static_cast<std::uint8_t>(old)), 1 << 20), expected.c_str(),
                         net::FrameError);
  }
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(5, 0), 1 << 20), "unknown frame type 0", net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(5, 200), 1 << 20), "unknown frame type 200", net::FrameError);
  // Padding: below 64 bytes, and only before Data and PointToPoint payloads.
  for (const auto type : {net::FrameType::Data, net::FrameType::PointToPoint, net::FrameType::Request, net::FrameType::Reply}) {
    for (const std::uint8_t pad : {0, 1, 16, 63}) {
      const net::FrameHeader padded{type, 100, 1, 2, pad};
      const auto padded_bytes = net::encode_header(padded);
      CHECK(padded_bytes[6] == std::byte{pad});
      CHECK(net::decode_header(padded_bytes, 1 << 20) == padded);
    }
  }
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(6, 64), 1 << 20),
                       "data frame with 64 bytes of padding before its payload (allowed: fewer than 64)", net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(net::encode_header({net::FrameType::Descriptor, 16, 0, 0, 8}), 1 << 20),
                       "descriptor frame with 8 bytes of padding before its payload (allowed: none)", net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(net::encode_header({net::FrameType::Goodbye, 0, 0, 0, 1}), 1 << 20),
                       "goodbye frame with 1 bytes of padding before its payload (allowed: none)", net::FrameError);
  // Tails: below 64 bytes, on the frames exchanged after the handshake (the collectives' and the
  // ps service's), not on the handshake's (their reader does not skip one).
  for (const auto type : {net::FrameType::Heartbeat, net::FrameType::Goodbye, net::FrameType::Abort, net::FrameType::Descriptor,
                          net::FrameType::Data, net::FrameType::PointToPoint, net::FrameType::Request, net::FrameType::Reply}) {
    for (const std::uint8_t tail : {0, 1, 32, 63}) {
      const net::FrameHeader tailed{type, 0, 1, 2, 0, tail};
      const auto tailed_bytes = net::encode_header(tailed);
      CHECK(tailed_bytes[7] == std::byte{tail});
      CHECK(net::decode_header(tailed_bytes, 1 << 20) == tailed);
    }
  }
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(7, 64), 1 << 20),
                       "data frame with 64 bytes of padding after its payload (allowed: fewer than 64)", net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(mutated(7, 255), 1 << 20),
                       "data frame with 255 bytes of padding after its payload (allowed: fewer than 64)", net::FrameError);
  for (const auto type : {net::FrameType::Hello, net::FrameType::Challenge, net::FrameType::Response,
                          net::FrameType::Welcome, net::FrameType::Reject}) {
    const std::string expected = fmt::format("{} frame with 5 bytes of padding after its payload (allowed: none)", net::to_string(type));
    CHECK_THROWS_WITH_AS(net::decode_header(net::encode_header({type, 0, 0, 0, 0, 5}), 1 << 20), expected.c_str(),
                         net::FrameError);
  }
  CHECK_THROWS_WITH_AS(net::decode_header(bytes, 1000), "data frame payload of 1234 bytes exceeds the limit of 1000 bytes",
                       net::FrameError);
  // Control frames are small whatever the configured limit; empty kinds must be empty.
  CHECK_THROWS_AS(net::decode_header(net::encode_header({net::FrameType::Abort, 1 << 20, 0, 0}), 1ull << 40),
                  net::FrameError);
  CHECK_THROWS_WITH_AS(net::decode_header(net::encode_header({net::FrameType::Heartbeat, 1, 0, 0}), 1 << 20),
                       "heartbeat frame payload of 1 bytes exceeds the limit of 0 bytes", net::FrameError);
  // A FrameError is an InvalidArgument, hence a ds::Error.
  CHECK_THROWS_AS(net::decode_header(mutated(0, 0), 1), ds::InvalidArgument);
}

TEST_CASE("frame decoder: a stream cut anywhere yields the same frames") {
  std::vector<std::byte> stream;
  std::vector<net::Frame> sent;
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    net::Frame f;
    f.header = {i % 3 == 0 ? net::FrameType::Heartbeat : net::FrameType::Data, 0, static_cast<std::uint64_t>(i), 3};
    if (f.header.type == net::FrameType::Data) f.header.pad = static_cast<std::uint8_t>(rng() % 64);  // skipped by the decoder
    f.header.tail = static_cast<std::uint8_t>(rng() % 64);  // likewise
    if (f.header.type == net::FrameType::Data) f.payload.resize(rng() % 300);
    for (auto& b : f.payload) b = static_cast<std::byte>(rng());
    f.header.length = f.payload.size();
    const auto bytes = net::encode_frame(f.header, f.payload);
    stream.insert(stream.end(), bytes.begin(), bytes.end());
    sent.push_back(f);
  }
  for (std::size_t piece : {std::size_t{1}, std::size_t{3}, std::size_t{31}, std::size_t{32}, std::size_t{33},
                            std::size_t{1000}, stream.size()}) {
    net::FrameDecoder dec(1 << 20);
    std::vector<net::Frame> got;
    for (std::size_t at = 0; at < stream.size(); at += piece) {
      auto frames = dec.feed(std::span(stream).subspan(at, std::min(piece, stream.size() - at)));
      got.insert(got.end(), frames.begin(), frames.end());
    }
    REQUIRE(got.size() == sent.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].header == sent[i].header);
      CHECK(got[i].payload == sent[i].payload);
    }
    CHECK(dec.buffered() == 0);
  }
}

TEST_CASE("frame decoder fuzz: random, mutated and truncated input never crashes") {
  std::mt19937_64 rng(12345);
  // A valid stream to mutate.
  std::vector<std::byte> valid;
  for (int i = 0; i < 8; ++i) {
    std::vector<std::byte> payload(static_cast<std::size_t>(i * 17));
    const auto f = net::encode_frame({net::FrameType::Data, 0, 1, static_cast<std::uint64_t>(i)}, payload);
    valid.insert(valid.end(), f.begin(), f.end());
  }
  int errors = 0, frames = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::byte> input;
    switch (iter % 4) {
      case 0:  // pure noise
        input.resize(rng() % 200);
        for (auto& b : input) b = static_cast<std::byte>(rng());
        break;
      case 1:  // valid with a few flipped bytes
        input = valid;
        for (int k = 0; k < 3; ++k) input[rng() % input.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
        break;
      case 2:  // valid, truncated
        input.assign(valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(rng() % valid.size()));
        break;
      default: {  // a header claiming a huge length, then noise
        auto h = net::encode_header({net::FrameType::Data, rng(), 0, 0});
        input.assign(h.begin(), h.end());
        input.resize(input.size() + rng() % 64);
        break;
      }
    }
    net::FrameDecoder dec(1 << 16);
    try {
      std::size_t at = 0;
      while (at < input.size()) {
        const std::size_t n = 1 + rng() % 50;
        frames += static_cast<int>(dec.feed(std::span(input).subspan(at, std::min(n, input.size() - at))).size());
        at += n;
      }
      CHECK(dec.buffered() <= input.size());
    } catch (const net::FrameError&) {
      ++errors;
      CHECK(dec.failed());
      CHECK_THROWS_AS(dec.feed(std::span(valid).first(1)), net::FrameError);  // stays failed
    }
    // The payload decoders too: they must throw FrameError or succeed on any bytes.
    const auto some = std::span(input).first(std::min<std::size_t>(input.size(), rng() % 100));
    for (auto fn : {+[](std::span<const std::byte> b) { (void)net::detail::decode_hello(b); },
                    +[](std::span<const std::byte> b) { (void)net::detail::decode_challenge(b); },
                    +[](std::span<const std::byte> b) { (void)net::detail::decode_response(b); },
                    +[](std::span<const std::byte> b) { (void)net::detail::decode_descriptor(b); },
                    +[](std::span<const std::byte> b) { (void)net::detail::decode_abort(b); }}) {
      try {
        fn(some);
      } catch (const net::FrameError&) {
      }
    }
  }
  CHECK(errors > 1000);
  CHECK(frames > 1000);
}

TEST_CASE("protocol payloads round-trip and reject bad values") {
  using namespace net::detail;
  const Descriptor d{CollectiveKind::AllReduce, ds::DType::I64, ds::ReduceOp::Max, 3, 123456789};
  const Descriptor back = decode_descriptor(encode(d));
  CHECK(describe(back) == "all_reduce(count=123456789, dtype=int64, op=MAX, shapes #00000003)");
  CHECK(back.root == 3);
  CHECK(describe(Descriptor{CollectiveKind::AllReduce, ds::DType::F32, ds::ReduceOp::Sum, 0, 6}) ==
        "all_reduce(count=6, dtype=float32, op=SUM)");
  // All-reduces of as many elements in other shapes (another digest in root) do not agree.
  CHECK_FALSE(compatible(Descriptor{CollectiveKind::AllReduce, ds::DType::F32, ds::ReduceOp::Sum, 7, 6},
                         Descriptor{CollectiveKind::AllReduce, ds::DType::F32, ds::ReduceOp::Sum, 8, 6}));
  CHECK(ds::core::shapes_digest({2, 3}) != ds::core::shapes_digest({3, 2}));
  CHECK(ds::core::shapes_digest({6}) != ds::core::shapes_digest({1, 6}));
  CHECK(ds::core::shapes_digest({}) != 0);
  auto bad = encode(d);
  bad[1] = std::byte{99};
  CHECK_THROWS_WITH_AS(decode_descriptor(bad), "descriptor has unknown dtype 99", net::FrameError);
  const auto good = encode(d);
  CHECK_THROWS_WITH_AS(decode_descriptor(std::span(good).first(5)), "descriptor payload is truncated", net::FrameError);
  // Kinds past the last one, and 0, are refused by name.
  auto beyond = encode(d);
  beyond[0] = std::byte{7};
  CHECK_THROWS_WITH_AS(decode_descriptor(beyond), "descriptor has unknown collective kind 7", net::FrameError);
  beyond[0] = std::byte{0};
  CHECK_THROWS_WITH_AS(decode_descriptor(beyond), "descriptor has unknown collective kind 0", net::FrameError);
  auto abort_frame = encode(Failure{FailureKind::Config, "bad config"});
  CHECK(decode_abort(abort_frame).kind == FailureKind::Config);
  abort_frame[0] = std::byte{5};
  CHECK_THROWS_WITH_AS(decode_abort(abort_frame), "abort frame has unknown failure kind 5", net::FrameError);
  CHECK(compatible(Descriptor{CollectiveKind::AllGather, ds::DType::U8, ds::ReduceOp::Sum, 0, 5},
                   Descriptor{CollectiveKind::AllGather, ds::DType::U8, ds::ReduceOp::Sum, 0, 9}));
  CHECK_FALSE(compatible(Descriptor{CollectiveKind::Broadcast, ds::DType::U8, ds::ReduceOp::Sum, 0, 5},
                         Descriptor{CollectiveKind::Broadcast, ds::DType::U8, ds::ReduceOp::Sum, 1, 5}));

  Hello h{4, 3, 1, true, random_nonce()};
  const Hello h2 = decode_hello(encode(h));
  CHECK(h2.size == 4);
  CHECK(h2.from_rank == 3);
  CHECK(h2.nonce == h.nonce);
  CHECK(h2.has_token);
  CHECK_FALSE(h2.service);
  // A service client (the ps RPC) says so in the flags; flags beyond the two known are malformed.
  const Hello client = decode_hello(encode(Hello{0, 0, 0, false, random_nonce(), true}));
  CHECK(client.service);
  CHECK_FALSE(client.has_token);
  auto flagged = encode(h);
  flagged[12] = std::byte{4};
  CHECK_THROWS_WITH_AS(decode_hello(flagged), "hello has unknown flags 0x4", net::FrameError);
  const Challenge c = decode_challenge(encode(Challenge{0, 0, 0, true, random_nonce(), Mac{}, true}));
  CHECK(c.service);
  CHECK(c.has_token);
  const Failure f = decode_abort(encode(Failure{FailureKind::Timeout, "slow"}));
  CHECK(f.kind == FailureKind::Timeout);
  CHECK(f.message == "slow");
}

TEST_CASE("auth: OpenSSL HMAC-SHA256 (RFC 4231 case 2), nonces, token from option or environment") {
  using namespace net::detail;
  const auto mac = hmac_sha256("Jefe", bytes_of("what do ya want for nothing?"));
  CHECK(fmt::format("{:02x}", fmt::join(reinterpret_cast<const std::uint8_t*>(mac.data()),
                                        reinterpret_cast<const std::uint8_t*>(mac.data()) + mac.size(), "")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(random_nonce() != random_nonce());
  const Nonce a = random_nonce(), b = random_nonce();
  // The two directions' proofs differ, and differ with the token.
  CHECK_FALSE(macs_equal(handshake_proof("t", true, a, b, 2, 0, 1), handshake_proof("t", false, a, b, 2, 0, 1)));
  CHECK_FALSE(macs_equal(handshake_proof("t", true, a, b, 2, 0, 1), handshake_proof("u", true, a, b, 2, 0, 1)));
  CHECK(macs_equal(handshake_proof("t", true, a, b, 2, 0, 1), handshake_proof("t", true, a, b, 2, 0, 1)));
  // A service's proofs are not a mesh's: one handshake's proof never passes in the other.
  CHECK_FALSE(macs_equal(handshake_proof("t", true, a, b, 0, 0, 0, true), handshake_proof("t", true, a, b, 0, 0, 0, false)));
  CHECK_FALSE(macs_equal(handshake_proof("t", true, a, b, 0, 0, 0, true), handshake_proof("t", false, a, b, 0, 0, 0, true)));

  ::unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
  CHECK_FALSE(effective_cluster_token(std::nullopt).has_value());
  ::setenv("DISTRIBUTE_CLUSTER_TOKEN", "from-env", 1);
  CHECK(effective_cluster_token(std::nullopt) == "from-env");
  CHECK(effective_cluster_token(std::string("opt")) == "opt");
  CHECK_FALSE(effective_cluster_token(std::string()).has_value());  // "" switches it off
  ::unsetenv("DISTRIBUTE_CLUSTER_TOKEN");
}

TEST_CASE("blob pool: an early frame reuses the smallest spare buffer that fits, within the limits") {
  using net::detail::Blob;
  using net::detail::BlobPool;
  auto blob = [](std::size_t capacity) {
    return Blob{std::make_unique<std::byte[]>(capacity), capacity, capacity};
  };
  BlobPool pool;
  CHECK_FALSE(pool.take(1).data);  // empty: the caller allocates

  pool.give(blob(1000));
  pool.give(blob(300));
  pool.give(blob(500));
  CHECK(pool.spare_bytes() == 1800);
  Blob b = pool.take(400);  // 500 fits best
  REQUIRE(b.data);
  CHECK(b.capacity == 500);
  CHECK(b.size == 400);
  CHECK(pool.spare_bytes() == 1300);
  CHECK_FALSE(pool.take(1001).data);  // nothing large enough
  CHECK(pool.take(1000).capacity == 1000);
  CHECK(pool.take(1).capacity == 300);
  CHECK(pool.spare_bytes() == 0);

  pool.give(Blob{});                         // a moved-from blob is ignored
  pool.give(blob(BlobPool::kMaxBlob + 1));  // too large to keep
  CHECK(pool.spare_bytes() == 0);
  const std::size_t fit = BlobPool::kMaxBytes / BlobPool::kMaxBlob;
  for (std::size_t i = 0; i < fit + 2; ++i) pool.give(blob(BlobPool::kMaxBlob));
  CHECK(pool.spare_bytes() == fit * BlobPool::kMaxBlob);  // the rest were freed
  std::size_t taken = 0;
  while (pool.take(1).data) ++taken;
  CHECK(taken == fit);
}

TEST_CASE("all-reduce table: the algorithm docs/multi-worker.md's table names for each case") {
  using net::detail::AllReduceAlgorithm;
  using net::detail::AllReduceCase;
  using Where = AllReduceCase::Where;
  net::detail::AllReduceLimits limits;
  limits.shared_min = 1;
  limits.direct_max = std::size_t{32} << 10;
  limits.halving_doubling_max = std::size_t{4} << 20;
  auto pick = [&](Where where, std::size_t bytes, int ranks, int hosts) {
    return net::detail::choose_all_reduce(AllReduceCase{where, bytes, ranks, hosts}, limits);
  };
  constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;
  // One host with a segment: shared memory from shared_min; below it, the TCP rows.
  CHECK(pick(Where::OneHostShared, 4, 8, 1).algorithm == AllReduceAlgorithm::SharedMemory);
  CHECK(pick(Where::OneHostShared, 64 * MiB, 2, 1).algorithm == AllReduceAlgorithm::SharedMemory);
  limits.shared_min = 256 * KiB;
  CHECK(pick(Where::OneHostShared, 4 * KiB, 4, 1).algorithm == AllReduceAlgorithm::Direct);
  CHECK(pick(Where::OneHostShared, 128 * KiB, 4, 1).algorithm == AllReduceAlgorithm::HalvingDoubling);
  CHECK(pick(Where::OneHostShared, 128 * KiB, 2, 1).algorithm == AllReduceAlgorithm::Ring);
  limits.shared_min = 1;
  // Several hosts sharing segments: one part up to direct_max, a part per worker of the smallest host above.
  CHECK(pick(Where::HostsSharing, 32 * KiB, 4, 2).algorithm == AllReduceAlgorithm::Hierarchical);
  CHECK(pick(Where::HostsSharing, 32 * KiB, 4, 2).one_part);
  CHECK(pick(Where::HostsSharing, 32 * KiB + 1, 4, 2).algorithm == AllReduceAlgorithm::Hierarchical);
  CHECK_FALSE(pick(Where::HostsSharing, 32 * KiB + 1, 4, 2).one_part);
  CHECK_FALSE(pick(Where::HostsSharing, 64 * MiB, 6, 3).one_part);
  // Over TCP: direct when small, and for two ranks on two hosts at any size (not on one host).
  CHECK(pick(Where::Tcp, 32 * KiB, 16, 16).algorithm == AllReduceAlgorithm::Direct);
  CHECK(pick(Where::Tcp, 64 * MiB, 2, 2).algorithm == AllReduceAlgorithm::Direct);
  CHECK(pick(Where::Tcp, 64 * MiB, 2, 1).algorithm == AllReduceAlgorithm::Ring);
  // Halving-doubling for a power of two >= 4 up to its limit; the ring otherwise.
  CHECK(pick(Where::Tcp, 4 * MiB, 4, 2).algorithm == AllReduceAlgorithm::HalvingDoubling);
  CHECK(pick(Where::Tcp, 1 * MiB, 8, 2).algorithm == AllReduceAlgorithm::HalvingDoubling);
  CHECK(pick(Where::Tcp, 4 * MiB + 1, 4, 2).algorithm == AllReduceAlgorithm::Ring);
  CHECK(pick(Where::Tcp, 1 * MiB, 6, 3).algorithm == AllReduceAlgorithm::Ring);
  CHECK(pick(Where::Tcp, 1 * MiB, 3, 3).algorithm == AllReduceAlgorithm::Ring);
  limits.halving_doubling_max = 0;
  CHECK(pick(Where::Tcp, 1 * MiB, 4, 1).algorithm == AllReduceAlgorithm::Ring);
}

TEST_CASE("addresses: host:port parsing") {
  using net::parse_host_port;
  CHECK(parse_host_port("127.0.0.1:5000").host == "127.0.0.1");
  CHECK(parse_host_port("[::1]:80").host == "::1");
  CHECK(parse_host_port("worker-0:2222").port == "2222");
  CHECK_THROWS_WITH_AS(parse_host_port("localhost"), "address 'localhost' is not of the form host:port", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_host_port("h:0"), "address 'h:0' has port 0 outside 1..65535", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_host_port("h:12ab"), "address 'h:12ab' has an invalid port '12ab'", ds::InvalidArgument);
  // A megabyte of input is quoted by its first 64 bytes and its length, not whole.
  const std::string mega(std::size_t{1} << 20, 'h');
  CHECK_THROWS_WITH_AS(parse_host_port(mega),
                       fmt::format("address '{}...' (1048576 bytes) is not of the form host:port", std::string(64, 'h')).c_str(),
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_host_port("h:" + mega),
                       fmt::format("address 'h:{}...' (1048578 bytes) has an invalid port '{}...' (1048576 bytes)",
                                   std::string(62, 'h'), std::string(64, 'h'))
                           .c_str(),
                       ds::InvalidArgument);
}

// =============================================================================================
// Communicator, in threads

TEST_CASE("communicator: argument errors name the value") {
  CHECK_THROWS_WITH_AS(net::Communicator({}, 0), "Communicator: the address list is empty", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(net::Communicator({"127.0.0.1:1"}, 1), "Communicator: rank 1 is out of range for 1 addresses",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(net::Communicator({"127.0.0.1:1", "127.0.0.1:2"}, 0, {}, {"a"}),
                       "Communicator: 1 task names given for 2 addresses", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(net::Communicator({"127.0.0.1:1", "127.0.0.1:1"}, 0),
                       "Communicator: ranks 0 and 1 have the same address '127.0.0.1:1'", ds::InvalidArgument);
  CHECK_THROWS_AS(net::Communicator({"nonsense"}, 0), ds::InvalidArgument);
}

TEST_CASE("communicator: a cluster of one needs no network") {
  net::Communicator comm({"127.0.0.1:1"}, 0);
  CHECK(comm.size() == 1);
  CHECK(comm.task_name(0) == "rank 0");
  std::vector<float> v{1, 2, 3};
  comm.all_reduce(std::span<float>(v), ds::ReduceOp::Mean);
  CHECK(v == std::vector<float>{1, 2, 3});
  std::vector<std::byte> out;
  std::vector<std::size_t> sizes;
  comm.all_gather(v.data(), 12, out, sizes);
  CHECK(out.size() == 12);
  CHECK(sizes == std::vector<std::size_t>{12});
  comm.broadcast(v.data(), 12, 0);
  comm.barrier();
  CHECK_THROWS_WITH_AS(comm.broadcast(v.data(), 12, 1), "broadcast: root 1 is out of range for a cluster of 1",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(comm.send(0, {}), doctest::Contains("peer 0 is not another rank"), ds::InvalidArgument);
  std::vector<std::uint8_t> flags{1};
  CHECK_THROWS_WITH_AS(comm.all_reduce(flags.data(), 1, ds::DType::Bool, ds::ReduceOp::Mean),
                       "all_reduce: MEAN is not defined for bool values", ds::InvalidArgument);
}

TEST_CASE("communicator: a peer that never appears fails the constructor in time, naming it") {
  Watchdog dog(20s, "connect timeout");
  const auto ports = free_ports(2);
  net::CommunicatorOptions opt;
  opt.connect_timeout = 400ms;
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(net::Communicator(addresses_of(ports), 1, opt, worker_names(2)),
                       doctest::Contains(fmt::format("could not connect to worker:0 at 127.0.0.1:{}", ports[0]).c_str()),
                       ds::PeerFailure);
  const double took = seconds_between(t0, Clock::now());
  CHECK(took >= 0.35);
  CHECK(took < 3.0);
  // And the acceptor side: rank 0 waits for rank 1, which never comes.
  CHECK_THROWS_WITH_AS(net::Communicator(addresses_of(ports), 0, opt, worker_names(2)),
                       doctest::Contains(fmt::format("worker:1 (127.0.0.1:{}) never connected", ports[1]).c_str()), ds::PeerFailure);
}

TEST_CASE("communicator: a port already in use is Unavailable") {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 1) == 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  CHECK_THROWS_WITH_AS(net::Communicator({fmt::format("127.0.0.1:{}", port), "127.0.0.1:1"}, 0),
                       doctest::Contains(fmt::format("rank 0 cannot listen on 127.0.0.1:{}", port).c_str()), ds::Unavailable);
  ::close(s);
}

#if defined(__linux__)
// The system's default congestion control, or "" where it cannot be read.
static std::string system_congestion_control() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  in >> name;
  return name;
}

TEST_CASE("transport in threads: loopback connections use loopback_congestion_control, set before they exist") {
  Watchdog dog(60s, "threads: congestion control");
  namespace nd = net::detail;
  for (const std::string choice : {"reno", ""}) {
    CAPTURE(choice);
    // With "" the connections keep the system's default; which one that is depends on the host.
    const std::string expected = choice.empty() ? system_congestion_control() : choice;
    if (expected.empty()) continue;
    const auto ports = free_ports(3);
    std::barrier all_up(3), all_checked(3);  // no rank closes a connection another is still looking at
    const auto errors = run_ranks(3, [&](int r) {
      net::CommunicatorOptions opt;
      opt.connect_timeout = 30s;
      opt.loopback_congestion_control = choice;
      nd::Transport tr(addresses_of(ports), r, opt, worker_names(3));
      all_up.arrive_and_wait();
      // Rank 0 accepted both of its connections, rank 2 connected both of its own, rank 1 one each.
      for (int k = 0; k < 3; ++k) {
        if (k != r) CHECK_MESSAGE(tr.congestion_control(k) == expected, "rank ", r, " to rank ", k);
      }
      CHECK(tr.congestion_control(r) == "");
      CHECK_THROWS_WITH_AS(tr.congestion_control(3), "rank 3 is out of range for a cluster of 3", ds::InvalidArgument);
      all_checked.arrive_and_wait();
    });
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE("transport in threads: a refused congestion control on a connecting socket is logged, and it connects anyway") {
  Watchdog dog(60s, "threads: refused congestion control");
  namespace nd = net::detail;
  // Rank 1 listens on a wildcard address, so the constructor does not check its choice; its
  // connection to rank 0 (loopback) meets the refusal instead.
  const auto ports = free_ports(2);
  const std::vector<std::string> addresses{fmt::format("127.0.0.1:{}", ports[0]), fmt::format("0.0.0.0:{}", ports[1])};
  std::mutex mu;
  std::vector<std::string> logged;
  std::barrier all_up(2), all_checked(2);
  const auto errors = run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    // Rank 0 starts late, so rank 1's first connection attempts are refused and retried.
    if (r == 0) std::this_thread::sleep_for(500ms);
    if (r == 1) {
      opt.insecure = true;  // on 0.0.0.0 without a token
      opt.loopback_congestion_control = "no-such-cc";
      opt.log = [&](std::string_view line) {
        std::lock_guard lk(mu);
        logged.emplace_back(line);
      };
    }
    nd::Transport tr(addresses, r, opt, worker_names(2));
    all_up.arrive_and_wait();
    if (r == 1 && !system_congestion_control().empty()) CHECK(tr.congestion_control(0) == system_congestion_control());
    all_checked.arrive_and_wait();
  });
  for (const auto& e : errors) CHECK(e == "");
  // The refusal once, however many attempts it took; and, as rank 1 listens on 0.0.0.0 without a
  // token (insecure, as chosen), the one warning about that.
  REQUIRE(logged.size() == 2);
  CHECK(logged[0] == fmt::format("WARNING: worker:1 listens on 0.0.0.0:{}, reachable from other machines, without a cluster "
                                 "token (insecure, as chosen): anyone who can connect can join, run registered functions "
                                 "and read or change state",
                                 ports[1]));
  CHECK(logged[1] ==
        "worker:1: connecting to worker:0 with the system's congestion control: 'no-such-cc' is refused by the kernel: "
        "No such file or directory");
}

TEST_CASE("communicator: a congestion control the kernel refuses is an InvalidArgument naming it") {
  net::CommunicatorOptions opt;
  opt.loopback_congestion_control = "no-such-cc";
  CHECK_THROWS_WITH_AS(net::Communicator({"127.0.0.1:1", "127.0.0.1:2"}, 0, opt),
                       "Communicator: loopback_congestion_control 'no-such-cc' is refused by the kernel: No such file or "
                       "directory (the algorithms any user may pick are in "
                       "/proc/sys/net/ipv4/tcp_allowed_congestion_control; \"\" keeps the system's default)",
                       ds::InvalidArgument);
}
#endif

TEST_CASE("communicator in threads: strangers are refused and logged while the cluster forms and works") {
  Watchdog dog(60s, "threads: strangers");
  const int n = 3;
  const auto ports = free_ports(n);
  LogSink log;
  std::atomic<bool> strangers_done{false};
  std::string stranger_problems;
  std::thread strangers([&] {
    std::this_thread::sleep_for(100ms);  // rank 0 is listening by now
    auto problem = [&](const std::string& what) { stranger_problems += what + "\n"; };
    {  // junk: not even a frame
      RawSocket s(ports[0]);
      s.send_bytes(bytes_of("GET / HTTP/1.0\r\nHost: distribute.invalid\r\n\r\n"));
      if (!s.read_to_close().empty()) problem("junk got an answer");
    }
    {  // silent: dropped after the handshake timeout
      const auto t0 = Clock::now();
      RawSocket s(ports[0]);
      if (!s.read_to_close().empty()) problem("silent stranger got an answer");
      if (seconds_between(t0, Clock::now()) > 3.0) problem("silent stranger held its socket too long");
    }
    {  // a well-formed hello from a rank that does not exist: challenged like any hello (its claim
       // is checked only after the handshake's proofs), then refused, then dropped
      RawSocket s(ports[0]);
      net::detail::Hello hello{3, 7, 0, false, net::detail::random_nonce()};
      s.send_bytes(net::encode_frame({net::FrameType::Hello, 0, 0, 0}, net::detail::encode(hello)));
      std::vector<std::byte> head(net::kFrameHeaderBytes);
      if (::recv(s.fd, head.data(), head.size(), MSG_WAITALL) != static_cast<ssize_t>(head.size()) ||
          net::decode_header(head, 1024).type != net::FrameType::Challenge) {
        problem("the hello from rank 7 was not answered by a challenge");
      } else {
        std::vector<std::byte> challenge(static_cast<std::size_t>(net::decode_header(head, 1024).length));
        (void)::recv(s.fd, challenge.data(), challenge.size(), MSG_WAITALL);
        s.send_bytes(net::encode_frame({net::FrameType::Response, 0, 0, 0}, net::detail::Mac{}));  // no token: no proof
        const auto reply = s.read_to_close();
        if (reply.size() < net::kFrameHeaderBytes || net::decode_header(reply, 1024).type != net::FrameType::Reject) {
          problem("the response of rank 7 was not answered by a reject frame");
        }
      }
    }
    {  // a huge claimed length before any handshake
      RawSocket s(ports[0]);
      s.send_bytes(net::encode_header({net::FrameType::Hello, 1ull << 40, 0, 0}));
      if (!s.read_to_close().empty()) problem("oversized hello got an answer");
    }
    strangers_done = true;
  });
  const auto errors = run_ranks(n, [&](int r) {
    net::CommunicatorOptions opt;
    opt.handshake_timeout = 300ms;
    opt.connect_timeout = 30s;
    if (r == 0) opt.log = log.fn();
    // Rank 2 joins late, so that the strangers knock while the cluster is still forming.
    if (r == 2) std::this_thread::sleep_for(200ms);
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(n));
    for (int it = 0; it < 40 || !strangers_done; ++it) {
      std::vector<std::int64_t> v(5000, r + it);
      comm.all_reduce(std::span<std::int64_t>(v), ds::ReduceOp::Sum);
      if (v[4999] != 3 * it + 3) throw std::runtime_error(fmt::format("wrong sum {} in iteration {}", v[4999], it));
      std::this_thread::sleep_for(5ms);
    }
    comm.barrier();
  });
  strangers.join();
  for (const auto& e : errors) CHECK(e == "");
  CHECK(stranger_problems == "");
  INFO(log.all());
  CHECK(log.contains("worker:0: refused connection from 127.0.0.1:"));
  CHECK(log.contains("bad frame magic"));
  CHECK(log.contains("handshake timed out after 300 ms"));
  CHECK(log.contains("it claims rank 7"));
  CHECK(log.contains("hello frame payload of 1099511627776 bytes exceeds the limit of 1024 bytes"));
}

TEST_CASE("communicator in threads: connections beyond max_pending_connections are closed at once; the cluster still forms") {
  Watchdog dog(60s, "threads: pending bound");
  const auto ports = free_ports(2);
  LogSink log;
  std::vector<std::unique_ptr<RawSocket>> idle;
  std::atomic<bool> listening{false};
  std::string problems;
  std::thread strangers([&] {
    while (!listening) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(100ms);
    for (int i = 0; i < 2; ++i) idle.push_back(std::make_unique<RawSocket>(ports[0]));  // fill the 2 slots
    std::this_thread::sleep_for(100ms);
    for (int i = 0; i < 5; ++i) {  // the next ones are closed as soon as they are accepted
      const auto t0 = Clock::now();
      RawSocket s(ports[0]);
      if (!s.read_to_close().empty()) problems += "a stranger beyond the bound got an answer\n";
      if (seconds_between(t0, Clock::now()) > 0.5) problems += "a stranger beyond the bound was held\n";
    }
  });
  const auto errors = run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.handshake_timeout = 1000ms;
    opt.connect_timeout = 30s;
    opt.max_pending_connections = 2;
    if (r == 0) {
      opt.log = log.fn();
      listening = true;
    } else {
      std::this_thread::sleep_for(400ms);  // after the strangers took the slots
    }
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(2));
    std::vector<float> v(10, 1.0f);
    comm.all_reduce(std::span<float>(v), ds::ReduceOp::Sum);
    if (v[9] != 2.0f) throw std::runtime_error("wrong sum");
  });
  strangers.join();
  for (const auto& e : errors) CHECK(e == "");
  CHECK(problems == "");
  INFO(log.all());
  CHECK(log.contains("worker:0: refused connection from 127.0.0.1:"));
  CHECK(log.contains(": 2 connections are already in their handshake"));
}

TEST_CASE("communicator in threads: ranks that connected early stay alive while a late one is awaited") {
  Watchdog dog(60s, "threads: late rank");
  const auto ports = free_ports(3);
  const auto errors = run_ranks(3, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    opt.heartbeat_interval = 100ms;
    opt.heartbeat_timeout = 1000ms;
    if (r == 2) std::this_thread::sleep_for(2000ms);
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(3));
    std::vector<float> v(10, 1.0f);
    comm.all_reduce(std::span<float>(v), ds::ReduceOp::Sum);
    if (v[9] != 3.0f) throw std::runtime_error("wrong sum");
    // Idle for several heartbeat timeouts: heartbeats keep everyone alive.
    std::this_thread::sleep_for(2000ms);
    comm.barrier();
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("communicator in threads: a wrong or missing token is refused, the right one joins") {
  Watchdog dog(60s, "threads: tokens");
  const auto ports = free_ports(2);
  LogSink log;
  std::string intruder_wrong, intruder_none;
  const auto errors = run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.cluster_token.emplace("right token");  // not `= "..."`: GCC 12 warns falsely (maybe-uninitialized) on that
    opt.connect_timeout = 30s;
    if (r == 0) {
      opt.log = log.fn();
    } else {
      // Two impostors try to be rank 1 first.
      std::this_thread::sleep_for(100ms);
      net::CommunicatorOptions bad = opt;
      bad.cluster_token = "wrong token";
      try {
        net::Communicator impostor(addresses_of(ports), 1, bad, worker_names(2));
      } catch (const ds::ClusterConfigError& e) {
        intruder_wrong = e.what();
      }
      bad.cluster_token = "";
      try {
        net::Communicator impostor(addresses_of(ports), 1, bad, worker_names(2));
      } catch (const ds::ClusterConfigError& e) {
        intruder_none = e.what();
      }
    }
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(2));
    std::vector<float> v(100, 1.0f);
    comm.all_reduce(std::span<float>(v), ds::ReduceOp::Sum);
    if (v[0] != 2.0f) throw std::runtime_error("wrong sum");
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK(intruder_wrong == fmt::format("worker:0 at 127.0.0.1:{} failed to prove it holds the cluster token (the tokens differ)",
                                      ports[0]));
  // The peer is told only "refused"; the reason is in the acceptor's log.
  CHECK(intruder_none == fmt::format("worker:0 at 127.0.0.1:{} refused worker:1 (its log says why; cluster specs or cluster "
                                     "tokens that differ are the usual cause)",
                                     ports[0]));
  INFO(log.all());
  CHECK(log.contains("(claiming to be worker:1): it presented no cluster token, and this cluster requires one"));
  CHECK(log.contains("(claiming to be worker:1): it refused this rank's proof of the cluster token"));
}

TEST_CASE("communicator in threads: a stranger's hellos get the same answers whatever cluster shape they claim") {
  Watchdog dog(120s, "threads: hellos of every shape");
  // A cluster of 4 with a token. A stranger (no token proof) sends 120 hellos to rank 1, claiming
  // every cluster size 1..6, every rank it calls 0..3 and every rank it is 0..4: the true shape
  // (4, to rank 1, from rank 2 or 3) must not stand out. Each gets a challenge that only echoes
  // its claim, then, for a response without the proof, "refused".
  const auto ports = free_ports(4);
  LogSink log;
  std::latch formed(4), probed(1);
  std::vector<std::string> errors;
  std::thread cluster([&] {
    errors = run_ranks(4, [&](int r) {
      net::CommunicatorOptions opt;
      opt.cluster_token.emplace("the token");
      opt.connect_timeout = 30s;
      if (r == 1) opt.log = log.fn();
      std::optional<net::Communicator> comm;
      try {
        comm.emplace(addresses_of(ports), r, opt, worker_names(4));
      } catch (...) {
        formed.count_down();
        throw;
      }
      formed.count_down();
      probed.wait();
      comm->barrier();  // the cluster is whole after the probes
    });
  });
  formed.wait();
  // Lets the cluster finish and joins it, once: at the end, or when a REQUIRE leaves early.
  struct Finish {
    std::latch& probed;
    std::thread& cluster;
    void operator()() {
      if (!cluster.joinable()) return;
      probed.count_down();
      cluster.join();
    }
    ~Finish() { (*this)(); }
  } finish{probed, cluster};
  struct Answer {
    net::FrameType first, second;
    std::string text;
    bool operator==(const Answer&) const = default;
  };
  std::vector<Answer> answers;
  for (std::uint32_t size = 1; size <= 6; ++size) {
    for (std::uint32_t to = 0; to < 4; ++to) {
      for (std::uint32_t from = 0; from < 5; ++from) {
        CAPTURE(size);
        CAPTURE(to);
        CAPTURE(from);
        RawSocket s(ports[1]);
        auto read_frame = [&] {
          std::vector<std::byte> head(net::kFrameHeaderBytes);
          REQUIRE(::recv(s.fd, head.data(), head.size(), MSG_WAITALL) == static_cast<ssize_t>(head.size()));
          const net::FrameHeader h = net::decode_header(head, 1024);
          std::vector<std::byte> payload(static_cast<std::size_t>(h.length));
          if (!payload.empty()) {
            REQUIRE(::recv(s.fd, payload.data(), payload.size(), MSG_WAITALL) == static_cast<ssize_t>(payload.size()));
          }
          return std::pair{h, payload};
        };
        const net::detail::Hello hello{size, from, to, true, net::detail::random_nonce()};
        s.send_bytes(net::encode_frame({net::FrameType::Hello, 0, 0, 0}, net::detail::encode(hello)));
        const auto [h1, challenge] = read_frame();
        Answer a{h1.type, net::FrameType::Data, ""};
        if (h1.type == net::FrameType::Challenge) {
          const net::detail::Challenge c = net::detail::decode_challenge(challenge);
          CHECK(c.size == size);  // an echo of the claim, nothing of the cluster
          CHECK(c.rank == to);
          CHECK(c.peer_rank == from);
          s.send_bytes(net::encode_frame({net::FrameType::Response, 0, 0, 0}, net::detail::Mac{}));
          const auto [h2, verdict] = read_frame();
          a.second = h2.type;
          a.text.assign(reinterpret_cast<const char*>(verdict.data()), verdict.size());
        }
        answers.push_back(a);
      }
    }
  }
  finish();
  for (const auto& e : errors) CHECK(e == "");
  REQUIRE(answers.size() == 120);
  for (const Answer& a : answers) CHECK(a == Answer{net::FrameType::Challenge, net::FrameType::Reject, "refused"});
  // The reason is in rank 1's own log, for every shape alike.
  CHECK(log.contains("(claiming to be worker:3): authentication failed: its proof of the cluster token is wrong"));
}

TEST_CASE("communicator in threads: a connected peer that sends a malformed frame is dropped as lost") {
  Watchdog dog(60s, "threads: malformed peer");
  struct Garbage {
    const char* name;
    std::vector<std::byte> bytes;
    const char* expected;
  };
  std::vector<Garbage> cases;
  cases.push_back({"bad magic", std::vector<std::byte>(32, std::byte{0x5a}), "it sent a malformed frame: bad frame magic 0x5a5a5a5a"});
  {
    auto h = net::encode_header({net::FrameType::Data, 1ull << 33, 0, 0});
    cases.push_back({"oversize", std::vector<std::byte>(h.begin(), h.end()),
                     "it sent a malformed frame: data frame payload of 8589934592 bytes exceeds the limit of 1048576 bytes"});
  }
  {
    auto h = net::encode_header({net::FrameType::Data, 0, 0, 0});
    h[4] = static_cast<std::byte>(net::kProtocolVersion + 1);  // a newer peer
    static const std::string expected =
        fmt::format("it sent a malformed frame: unsupported protocol version {} (this build speaks version {})",
                    net::kProtocolVersion + 1, net::kProtocolVersion);
    cases.push_back({"version", std::vector<std::byte>(h.begin(), h.end()), expected.c_str()});
  }
  for (const auto& g : cases) {
    CAPTURE(g.name);
    const auto ports = free_ports(2);
    std::string error;
    std::thread rank0([&] {
      net::CommunicatorOptions opt;
      opt.connect_timeout = 20s;
      opt.max_frame_bytes = 1 << 20;
      try {
        net::Communicator comm(addresses_of(ports), 0, opt, worker_names(2));
        comm.barrier();
      } catch (const ds::PeerFailure& e) {
        error = e.what();
      }
    });
    // Play rank 1 by hand: a correct handshake (no token), then garbage.
    std::optional<RawSocket> s;
    for (int attempt = 0; attempt < 100 && !s; ++attempt) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(ports[0]));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (ok) {
        s.emplace(ports[0]);
      } else {
        std::this_thread::sleep_for(20ms);
      }
    }
    REQUIRE(s.has_value());
    auto read_exact = [&](std::size_t n) {
      std::vector<std::byte> out(n);
      std::size_t got = 0;
      while (got < n) {
        const ssize_t r = ::recv(s->fd, out.data() + got, n - got, 0);
        REQUIRE(r > 0);
        got += static_cast<std::size_t>(r);
      }
      return out;
    };
    net::detail::Hello hello{2, 1, 0, false, net::detail::random_nonce()};
    s->send_bytes(net::encode_frame({net::FrameType::Hello, 0, 0, 0}, net::detail::encode(hello)));
    const auto challenge = read_exact(net::kFrameHeaderBytes);
    REQUIRE(net::decode_header(challenge, 1024).type == net::FrameType::Challenge);
    read_exact(static_cast<std::size_t>(net::decode_header(challenge, 1024).length));
    s->send_bytes(net::encode_frame({net::FrameType::Response, 0, 0, 0}, net::detail::Mac{}));
    REQUIRE(net::decode_header(read_exact(net::kFrameHeaderBytes), 1024).type == net::FrameType::Welcome);
    s->send_bytes(g.bytes);
    rank0.join();
    // From the barrier, or from the constructor when the garbage beat its return.
    CHECK(error.find(fmt::format("lost task worker:1 (127.0.0.1:{}): {}", ports[1], g.expected)) != std::string::npos);
  }
}

TEST_CASE("communicator in threads: point-to-point size mismatch is local, a collective one poisons") {
  Watchdog dog(60s, "threads: mismatch");
  const auto ports = free_ports(2);
  const auto errors = run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(2));
    if (r == 0) {
      const std::uint16_t v = 7;
      comm.send(1, std::as_bytes(std::span(&v, 1)));
    } else {
      std::uint32_t w = 0;
      CHECK_THROWS_WITH_AS(comm.recv(0, std::as_writable_bytes(std::span(&w, 1))),
                           "recv from worker:0: worker:0 sent 2 bytes where worker:1 expected 4", ds::InvalidArgument);
    }
    comm.barrier();  // still usable
    std::vector<double> v(r == 0 ? 3 : 4, 1.0);
    CHECK_THROWS_WITH_AS(comm.all_reduce(std::span<double>(v), ds::ReduceOp::Sum),
                         doctest::Contains("mismatched collectives at collective #1: worker:0 called all_reduce(count=3, "
                                           "dtype=float64, op=SUM) but worker:1 called all_reduce(count=4, dtype=float64, op=SUM)"),
                         ds::InvalidArgument);
    CHECK(comm.failure().has_value());
    CHECK_THROWS_AS(comm.barrier(), ds::InvalidArgument);
  });
  for (const auto& e : errors) CHECK(e == "");
}

// Names in /dev/shm that a communicator would have made.
std::set<std::string> shared_memory_names() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("distribute-")) out.insert(name);
  }
  return out;
}

TEST_CASE("communicator in threads: shared memory is used only when every rank enables it, and leaves no name behind") {
  Watchdog dog(60s, "threads: shared memory");
  const auto before = shared_memory_names();
  for (int disabled : {-1, 0, 2}) {  // which rank sets shared_memory_min_bytes = 0 (-1: none)
    CAPTURE(disabled);
    const auto ports = free_ports(3);
    std::atomic<int> using_it{0};
    const auto errors = run_ranks(3, [&](int r) {
      net::CommunicatorOptions opt;
      opt.connect_timeout = 30s;
      opt.shared_memory_min_bytes = r == disabled ? 0 : 1024;
      opt.shared_memory_slot_bytes = 4096;
      net::Communicator comm(addresses_of(ports), r, opt, worker_names(3));
      if (comm.uses_shared_memory()) ++using_it;
      // 3 pieces of 1024 floats and a short one; every element sums to 0 + 1 + 2 plus 3 x its index.
      std::vector<float> v(3 * 1024 + 5);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r) + static_cast<float>(i);
      comm.all_reduce(std::span<float>(v), ds::ReduceOp::Sum);
      for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == 3.0f + 3.0f * static_cast<float>(i));
      std::vector<std::int32_t> w(4096, r + 1);
      comm.all_reduce(std::span<std::int32_t>(w), ds::ReduceOp::Mean);  // (1 + 2 + 3) / 3
      CHECK(std::all_of(w.begin(), w.end(), [](std::int32_t x) { return x == 2; }));
    });
    for (const auto& e : errors) CHECK(e == "");
    CHECK(using_it.load() == (disabled == -1 ? 3 : 0));
  }
  // Rank 0 unlinks the name once every rank has mapped it. Another test process may be setting up
  // a segment right now, so a name counts as left behind only if it stays.
  auto left_behind = [&] {
    auto now = shared_memory_names();
    for (const auto& name : before) now.erase(name);
    return now;
  };
  for (const auto deadline = Clock::now() + 2s; !left_behind().empty() && Clock::now() < deadline;) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(left_behind().empty());
}

TEST_CASE("communicator in threads: a shared-memory slot size that is not whole lines is rounded up, and results stay exact") {
  Watchdog dog(60s, "threads: shared memory slot");
  const auto ports = free_ports(2);
  const auto errors = run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    opt.shared_memory_min_bytes = 1;
    opt.shared_memory_slot_bytes = 100;  // 25 floats, or 12.5 doubles: rounded to 128 bytes
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(2));
    CHECK(comm.uses_shared_memory());
    std::vector<double> v(1001);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(r * 10000 + static_cast<int>(i));
    comm.all_reduce(std::span<double>(v), ds::ReduceOp::Max);
    for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == static_cast<double>(10000 + static_cast<int>(i)));
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("communicator in threads: the destructor of one rank makes a waiting peer fail, not hang") {
  Watchdog dog(60s, "threads: goodbye");
  const auto ports = free_ports(2);
  std::string error;
  run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(2));
    if (r == 1) {
      try {
        comm.barrier();  // rank 0 leaves instead
      } catch (const ds::PeerFailure& e) {
        error = e.what();
      }
    }
  });
  CHECK(error == fmt::format("barrier #0: worker:0 (127.0.0.1:{}) closed its communicator before joining collective #0", ports[0]));
}

TEST_CASE("transport in threads: payloads from and to every alignment mod 64 arrive intact (padded frames, every tail length)") {
  Watchdog dog(60s, "threads: padded frames");
  const auto ports = free_ports(3);
  constexpr std::size_t kMessage = 5000;  // above the size from which frames are padded
  auto pattern = [](std::size_t from, std::size_t i) { return static_cast<std::byte>((from * 131 + i * 7) & 0xFF); };
  const auto errors = run_ranks(3, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    net::Communicator comm(addresses_of(ports), r, opt, worker_names(3));
    // Point-to-point: rank 0 sends from offsets 0..63 of its buffer, rank 1 receives each at the
    // mirrored offset, so every (source, destination) alignment pair meets a different padding.
    std::vector<std::byte> buf(kMessage + 128);
    for (std::size_t off = 0; off < 64; ++off) {
      if (r == 0) {
        for (std::size_t i = 0; i < kMessage; ++i) buf[off + i] = pattern(off, i);
        comm.send(1, std::span<const std::byte>(buf.data() + off, kMessage));
      } else if (r == 1) {
        const std::size_t at = 63 - off;
        std::fill(buf.begin(), buf.end(), std::byte{0xEE});
        comm.recv(0, std::span<std::byte>(buf.data() + at, kMessage));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < kMessage; ++i) wrong += buf[at + i] != pattern(off, i) ? 1 : 0;
        CHECK_MESSAGE(wrong == 0, "offset ", off, ": ", wrong, " bytes wrong");
        CHECK(buf[at + kMessage] == std::byte{0xEE});  // nothing written past the message
        if (at > 0) CHECK(buf[at - 1] == std::byte{0xEE});
      }
    }
    // Messages of 0..69 bytes: their frames need every tail length from 0 to 63 to end aligned.
    for (std::size_t len = 0; len < 70; ++len) {
      if (r == 0) {
        for (std::size_t i = 0; i < len; ++i) buf[i] = pattern(len, i);
        comm.send(1, std::span<const std::byte>(buf.data(), len));
      } else if (r == 1) {
        std::fill(buf.begin(), buf.end(), std::byte{0xEE});
        comm.recv(0, std::span<std::byte>(buf.data(), len));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < len; ++i) wrong += buf[i] != pattern(len, i) ? 1 : 0;
        CHECK_MESSAGE(wrong == 0, "length ", len, ": ", wrong, " bytes wrong");
        CHECK(buf[len] == std::byte{0xEE});
      }
    }
    // All-reduce (ring, three ranks) of floats that start 4..60 bytes past a 64-byte boundary.
    for (std::size_t shift = 1; shift < 16; shift += 3) {
      std::vector<float> storage(70000 + 32);  // room for the shift to a boundary and past it
      float* data = storage.data() + (16 - reinterpret_cast<std::uintptr_t>(storage.data()) / 4 % 16) % 16 + shift;
      const std::size_t count = 70000;
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i % 11) + 100 * r);
      comm.all_reduce(data, count, ds::DType::F32, ds::ReduceOp::Sum);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) wrong += data[i] != static_cast<float>(3 * (i % 11) + 300) ? 1 : 0;
      CHECK_MESSAGE(wrong == 0, "rank ", r, ", shift ", shift, ": ", wrong, " elements wrong");
    }
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("transport in threads: a receive continuation that throws fails the collective on every rank, naming it") {
  Watchdog dog(60s, "threads: continuation throws");
  namespace nd = net::detail;
  const auto ports = free_ports(2);
  std::atomic<bool> rank1_done{false};
  std::string rank1_error;
  const auto errors = run_ranks(2, [&](int r) {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 30s;
    nd::Transport tr(addresses_of(ports), r, opt, worker_names(2));
    const nd::Descriptor desc{nd::CollectiveKind::Broadcast, ds::DType::U8, ds::ReduceOp::Sum, 0, 4};
    std::array<std::byte, 4> buf{};
    if (r == 0) {
      nd::Call op(tr, tr.tcp_agreement(), desc);
      op.recv(1, 0, buf, []() -> bool { throw std::runtime_error("no room to reduce into"); });
      CHECK_THROWS_WITH_AS(op.wait_until([] { return false; }, 1),
                           "broadcast #0: worker:0 failed while passing on received data: no room to reduce into",
                           ds::PeerFailure);
      while (!rank1_done) std::this_thread::sleep_for(10ms);  // keep the connection until rank 1 heard
    } else {
      {
        nd::Call op(tr, tr.tcp_agreement(), desc);
        op.send(0, 0, buf);
        try {
          op.finish();  // the abort may already be here
        } catch (const ds::Error&) {
        }
      }
      try {
        nd::Call next(tr, tr.tcp_agreement(), nd::Descriptor{});  // a barrier: rank 0 never joins it
        next.finish();
      } catch (const ds::PeerFailure& e) {
        rank1_error = e.what();
      }
      rank1_done = true;
    }
  });
  for (const auto& e : errors) CHECK(e == "");
  CHECK_MESSAGE(rank1_error.find("worker:0 failed while passing on received data: no room to reduce into") != std::string::npos,
                rank1_error);
}

// =============================================================================================
// Communicator, as processes

TEST_CASE("processes: every collective with exact results on 2, 3 and 4 ranks") {
  Watchdog dog(400s, "processes: collectives");
  // The default thresholds, then each all-reduce algorithm forced onto every size of the battery
  // (count 1 to 3 MiB + 1 element): "ring" never takes the direct or halving-doubling path;
  // "halving-doubling" takes it wherever the rank count allows (4 here; 2 and 3 fall back to the
  // ring), with 4 KiB chunks so that its steps are cut into many pieces; "direct" sends every
  // buffer whole to every peer. "ring, sleeping" is the ring with busy_poll off: the network
  // thread sleeps in epoll_wait between frames instead of polling while a call is in flight.
  struct Config {
    const char* name;
    std::vector<std::string> options;
  };
  // Those four run over TCP (--shm-min 0). "shared memory" takes every all-reduce through the
  // segment, in 4 KiB pieces (so most buffers span many pieces and uneven slices).
  const Config configs[] = {
      {"default", {}},
      {"ring", {"--direct-max", "0", "--hd-max", "0", "--shm-min", "0"}},
      {"halving-doubling", {"--direct-max", "0", "--hd-max", "1000000000000", "--chunk-bytes", "4096", "--shm-min", "0"}},
      {"direct", {"--direct-max", "1000000000000", "--shm-min", "0"}},
      {"ring, sleeping", {"--direct-max", "0", "--hd-max", "0", "--busy-poll-us", "0", "--shm-min", "0"}},
      {"shared memory", {"--shm-min", "1", "--shm-slot", "4096"}},
  };
  for (const Config& config : configs) {
    for (int n : {2, 3, 4}) {
      const std::string algorithm = config.name;
      CAPTURE(algorithm);
      CAPTURE(n);
      with_ports(n, [&](Procs& procs, const std::vector<int>& ports) {
        const auto t0 = Clock::now();
        for (int r = 0; r < n; ++r) {
          std::vector<std::string> args{"collectives", "--rank", std::to_string(r), "--ports", join_ports(ports),
                                        "--op-timeout", "60000"};
          args.insert(args.end(), config.options.begin(), config.options.end());
          procs.spawn(args);
        }
        const bool finished = procs.wait_all(Clock::now() + 120s);
        if (any_port_race(procs)) return true;
        INFO(procs.dump());
        CHECK(finished);
        for (int r = 0; r < n; ++r) {
          CHECK(procs[r].exit_code == 0);
          // On one host the default is shared memory; --shm-min 0 turns it off.
          const bool tcp_only = std::find(config.options.begin(), config.options.end(), "--shm-min") != config.options.end() &&
                                config.options.back() == "0";
          CHECK(procs[r].output.find(tcp_only ? "SHARED MEMORY off" : "SHARED MEMORY on") != std::string::npos);
        }
        MESSAGE(fmt::format("{}, {} ranks: the whole battery took {:.2f} s", config.name, n, seconds_between(t0, Clock::now())));
        return false;
      });
    }
  }
}

TEST_CASE("processes: mismatched collectives throw InvalidArgument on every rank") {
  Watchdog dog(120s, "processes: mismatch");
  // The 4 MiB "ring-" variants run twice: through shared memory (the default on one host) and
  // over TCP (the ring).
  // On one host every collective agrees through shared memory; " tcp" runs the same over TCP only,
  // where the descriptors go to rank 0 and its table comes back.
  for (const std::string variant : {"count", "ring-count", "op", "mean", "dtype", "kind", "ring-kind", "root", "order",
                                    "ring-count tcp", "ring-kind tcp", "ring-halves tcp", "ring-halves", "count tcp", "op tcp",
                                    "mean tcp", "dtype tcp", "kind tcp", "root tcp", "order tcp"}) {
    // Two against two: a rank's own partner's descriptor may arrive after the disagreeing ones.
    for (int n : variant.starts_with("ring-halves") ? std::vector<int>{4} : std::vector<int>{2, 3}) {
      CAPTURE(variant);
      CAPTURE(n);
      const bool tcp = variant.ends_with(" tcp");
      with_ports(n, [&](Procs& procs, const std::vector<int>& ports) {
        for (int r = 0; r < n; ++r) {
          std::vector<std::string> args{"mismatch", "--variant", variant.substr(0, variant.find(' ')), "--rank", std::to_string(r),
                                        "--ports", join_ports(ports)};
          if (tcp) args.insert(args.end(), {"--shm-min", "0"});
          procs.spawn(args);
        }
        const bool finished = procs.wait_all(Clock::now() + 30s);
        if (any_port_race(procs)) return true;
        INFO(procs.dump());
        CHECK(finished);
        for (int r = 0; r < n; ++r) {
          CHECK(procs[r].exit_code == 0);
          CHECK(procs[r].output.find("OK InvalidArgument: ") != std::string::npos);
          CHECK(procs[r].output.find("mismatched collectives at collective #1") != std::string::npos);
          if (variant.starts_with("mean")) CHECK(procs[r].output.find("op=MEAN") != std::string::npos);
          CHECK(procs[r].output.find("OK poisoned") != std::string::npos);
        }
        return false;
      });
    }
  }
}

TEST_CASE("processes: SIGKILL mid-all-reduce makes every survivor throw PeerFailure naming the lost task (x20)") {
  Watchdog dog(120s, "processes: SIGKILL");
  std::mt19937 rng(2024);
  double worst = 0;
  const auto start = Clock::now();
  for (int iter = 0; iter < 20; ++iter) {
    const int n = iter % 2 == 0 ? 3 : 4;
    const int victim = static_cast<int>(rng() % static_cast<unsigned>(n));
    const bool timeout_set = iter % 4 < 2;
    // On 4 ranks, some kills hit the halving-doubling all-reduce (with and without a timeout);
    // of the others, some hit the shared-memory all-reduce (the default on one host) and the
    // rest the ring over TCP.
    const bool halving_doubling = n == 4 && (iter % 8 == 1 || iter % 8 == 7);
    const bool shared_memory = !halving_doubling && iter % 5 >= 3;
    CAPTURE(iter);
    CAPTURE(n);
    CAPTURE(victim);
    CAPTURE(halving_doubling);
    CAPTURE(shared_memory);
    with_ports(n, [&](Procs& procs, const std::vector<int>& ports) {
      for (int r = 0; r < n; ++r) {
        std::vector<std::string> args{"loop", "--rank", std::to_string(r), "--ports", join_ports(ports), "--count", "2000000",
                                      "--hd-max", halving_doubling ? "1000000000000" : "0"};
        if (!shared_memory) args.insert(args.end(), {"--shm-min", "0"});
        if (timeout_set) args.insert(args.end(), {"--op-timeout", "5000"});
        procs.spawn(args);
      }
      for (int r = 0; r < n; ++r) {
        if (!procs.wait_line(r, "READY", Clock::now() + 20s)) {
          if (any_port_race(procs)) return true;
          FAIL("rank " << r << " never became ready\n" << procs.dump());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
      procs.signal(victim, SIGKILL);
      const auto killed = Clock::now();
      std::vector<int> survivors;
      for (int r = 0; r < n; ++r) {
        if (r != victim) survivors.push_back(r);
      }
      const bool finished = procs.wait_exit(survivors, killed + 12s);
      INFO(procs.dump());
      CHECK(finished);
      for (int r : survivors) {
        CHECK(procs[r].exit_code == 3);
        CHECK(procs[r].output.find("EXC PeerFailure: ") != std::string::npos);
        CHECK(procs[r].output.find(fmt::format("lost task worker:{} (127.0.0.1:{})", victim, ports[static_cast<std::size_t>(victim)])) !=
              std::string::npos);
        const auto when = procs[r].line_time("EXC");
        REQUIRE(when.has_value());
        const double after = seconds_between(killed, *when);
        worst = std::max(worst, after);
        CHECK(after < (timeout_set ? 5.0 : 10.0));
      }
      return false;
    });
  }
  MESSAGE(fmt::format("20 kills: slowest survivor reported the loss {:.3f} s after the kill; {:.1f} s in all", worst,
                      seconds_between(start, Clock::now())));
}

TEST_CASE("processes: SIGSTOP of one rank ends in CollectiveTimeout (operation_timeout) or PeerFailure (heartbeat)") {
  Watchdog dog(180s, "processes: SIGSTOP");
  struct Case {
    std::vector<std::string> options;
    int expected_exit;
    const char* expected_text;
    double bound_s;
  };
  const Case cases[] = {
      {{"--op-timeout", "1500", "--hb-interval", "200"}, 4, "did not complete within 1500 ms", 1.5 + 2.0},
      {{"--hb-timeout", "3000", "--hb-interval", "200"}, 3, "no heartbeat for", 3.0 + 2.0},
  };
  // 3 ranks run the ring; 4 ranks the halving-doubling all-reduce (forced: 4 MB is its range's
  // edge by default).
  for (const Case& c : cases) {
   for (int n : {3, 4}) {
    CAPTURE(c.expected_text);
    CAPTURE(n);
    with_ports(n, [&](Procs& procs, const std::vector<int>& ports) {
      for (int r = 0; r < n; ++r) {
        std::vector<std::string> args{"loop", "--rank", std::to_string(r), "--ports", join_ports(ports), "--count", "1000000",
                                      "--hd-max", n == 4 ? "1000000000000" : "0"};
        args.insert(args.end(), c.options.begin(), c.options.end());
        procs.spawn(args);
      }
      for (int r = 0; r < n; ++r) {
        if (!procs.wait_line(r, "READY", Clock::now() + 20s)) {
          if (any_port_race(procs)) return true;
          FAIL("rank " << r << " never became ready\n" << procs.dump());
        }
      }
      std::this_thread::sleep_for(50ms);
      procs.signal(1, SIGSTOP);
      const auto stopped = Clock::now();
      const std::vector<int> others = n == 3 ? std::vector<int>{0, 2} : std::vector<int>{0, 2, 3};
      const bool finished = procs.wait_exit(others, stopped + 20s);
      procs.signal(1, SIGKILL);
      procs.wait_exit({1}, Clock::now() + 10s);
      INFO(procs.dump());
      CHECK(finished);
      for (int r : others) {
        CHECK(procs[r].exit_code == c.expected_exit);
        CHECK(procs[r].output.find(c.expected_text) != std::string::npos);
        // The stalled rank is named, whoever timed out first.
        CHECK((procs[r].output.find("lost task worker:1") != std::string::npos ||
               procs[r].output.find("worker:1 has sent nothing for") != std::string::npos));
        const auto when = procs[r].line_time("EXC");
        REQUIRE(when.has_value());
        CHECK(seconds_between(stopped, *when) < c.bound_s);
        MESSAGE(fmt::format("rank {} reported after {:.2f} s", r, seconds_between(stopped, *when)));
      }
      return false;
    });
   }
  }
}

TEST_CASE("processes: with a cluster token, strangers and impostors are refused and the cluster keeps working") {
  Watchdog dog(90s, "processes: token");
  with_ports(3, [&](Procs& procs, const std::vector<int>& ports) {
    const std::map<std::string, std::optional<std::string>> token_env{{"DISTRIBUTE_CLUSTER_TOKEN", "s3cret"}};
    for (int r = 0; r < 3; ++r) {
      procs.spawn({"auth", "--rank", std::to_string(r), "--ports", join_ports(ports), "--iters", "60"}, token_env);
    }
    for (int r = 0; r < 3; ++r) {
      if (!procs.wait_line(r, "READY", Clock::now() + 20s)) {
        if (any_port_race(procs)) return true;
        FAIL("rank " << r << " never became ready\n" << procs.dump());
      }
    }
    {  // junk
      RawSocket s(ports[0]);
      s.send_bytes(bytes_of("\x16\x03\x01 this is not a distribute frame at all"));
      CHECK(s.read_to_close().empty());
    }
    {  // a hello without a token, claiming an existing rank: told no, then dropped
      RawSocket s(ports[0]);
      net::detail::Hello hello{3, 2, 0, false, net::detail::random_nonce()};
      s.send_bytes(net::encode_frame({net::FrameType::Hello, 0, 0, 0}, net::detail::encode(hello)));
      const auto reply = s.read_to_close();
      REQUIRE(reply.size() >= net::kFrameHeaderBytes);
      CHECK(net::decode_header(reply, 1024).type == net::FrameType::Reject);
    }
    // Impostor processes claiming rank 2 (each listening on a port of its own): a wrong token,
    // and no token at all.
    const auto own = free_ports(2);
    const int wrong = procs.spawn({"join", "--rank", "2", "--ports", join_ports({ports[0], ports[1], own[0]}),
                                   "--connect-timeout", "10000"},
                                  {{"DISTRIBUTE_CLUSTER_TOKEN", "guess"}});
    const int none = procs.spawn(
        {"join", "--rank", "2", "--ports", join_ports({ports[0], ports[1], own[1]}), "--connect-timeout", "10000"});
    const bool finished = procs.wait_all(Clock::now() + 40s);
    INFO(procs.dump());
    CHECK(finished);
    for (int r = 0; r < 3; ++r) {
      CHECK(procs[r].exit_code == 0);
      CHECK(procs[r].output.find("OK auth") != std::string::npos);
    }
    CHECK(procs[wrong].exit_code == 6);
    CHECK(procs[wrong].output.find("failed to prove it holds the cluster token") != std::string::npos);
    CHECK(procs[none].exit_code == 6);
    CHECK(procs[none].output.find("refused worker:2 (its log says why") != std::string::npos);
    const std::string& log0 = procs[0].output;
    CHECK(log0.find("distribute.net: worker:0: refused connection from 127.0.0.1:") != std::string::npos);
    CHECK(log0.find("bad frame magic") != std::string::npos);
    CHECK(log0.find("it presented no cluster token") != std::string::npos);
    // The impostors call ranks 0 and 1 at once and give up at the first refusal, so which of the
    // two logs the token mismatch depends on timing.
    const std::string logs = procs[0].output + procs[1].output;
    CHECK(logs.find("(claiming to be worker:2): it refused this rank's proof of the cluster token") != std::string::npos);
    return false;
  });
}

// =============================================================================================
// Agreement and set-up costs (issue 21, item 2)

namespace {

/// Plays rank 1 of a 2-rank cluster by hand against a real rank 0 listening on `port`: the
/// handshake (no token) and the topology set-up (net/detail/topology.hpp) as a rank on another host.
struct FakeRank1 {
  std::optional<RawSocket> s;
  explicit FakeRank1(int port) {
    for (int attempt = 0; attempt < 200 && !s; ++attempt) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (ok) {
        s.emplace(port);
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
    REQUIRE(s.has_value());
    net::detail::Hello hello{2, 1, 0, false, net::detail::random_nonce()};
    s->send_bytes(net::encode_frame({net::FrameType::Hello, 0, 0, 0}, net::detail::encode(hello)));
    REQUIRE(next().type == net::FrameType::Challenge);
    s->send_bytes(net::encode_frame({net::FrameType::Response, 0, 0, 0}, net::detail::Mac{}));
    REQUIRE(next().type == net::FrameType::Welcome);
    // Topology: our hostname to rank 0 and its table back, then our group (ourselves) and that table.
    std::array<std::byte, 64> host{};
    std::memcpy(host.data(), "fake-host", 9);
    s->send_bytes(net::encode_frame({net::FrameType::PointToPoint, 0, 0, 0}, host));
    REQUIRE(next().type == net::FrameType::PointToPoint);
    REQUIRE(payload.size() == 2 * host.size());
    const std::uint64_t group = 1;
    s->send_bytes(net::encode_frame({net::FrameType::PointToPoint, 0, 1, 0}, std::as_bytes(std::span(&group, 1))));
    REQUIRE(next().type == net::FrameType::PointToPoint);
    REQUIRE(payload.size() == 2 * sizeof group);
  }
  std::vector<std::byte> read_exact(std::size_t n) const {
    std::vector<std::byte> out(n);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(s->fd, out.data() + got, n - got, 0);
      REQUIRE(r > 0);
      got += static_cast<std::size_t>(r);
    }
    return out;
  }
  std::vector<std::byte> payload;
  /// The next frame other than a heartbeat; its payload goes to `payload`.
  net::FrameHeader next() {
    for (;;) {
      const auto h = net::decode_header(read_exact(net::kFrameHeaderBytes), 1u << 20);
      const auto body = read_exact(static_cast<std::size_t>(h.pad + h.length + h.tail));
      payload.assign(body.begin() + h.pad, body.begin() + static_cast<std::ptrdiff_t>(h.pad + h.length));
      if (h.type != net::FrameType::Heartbeat) return h;
    }
  }
  /// Whether any byte arrives within `wait`.
  bool quiet_for(std::chrono::milliseconds wait) const {
    pollfd p{s->fd, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(wait.count())) == 0;
  }
  void send_descriptor(std::uint64_t seq, std::span<const std::byte> bytes) const {
    s->send_bytes(net::encode_frame({net::FrameType::Descriptor, 0, seq, 0}, bytes));
  }
};

}  // namespace

TEST_CASE("transport in threads: over TCP a rank sends its descriptor to rank 0 alone, which answers with every rank's") {
  Watchdog dog(60s, "threads: descriptor table");
  const auto ports = free_ports(2);
  std::string error;
  std::atomic<int> barriers{0};
  std::thread rank0([&] {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 20s;
    opt.shared_memory_min_bytes = 0;  // TCP: descriptors travel as frames
    opt.heartbeat_interval = 5s;      // no heartbeat among the frames read below
    opt.heartbeat_timeout = 20s;
    try {
      net::Communicator comm(addresses_of(ports), 0, opt, worker_names(2));
      comm.barrier();
      ++barriers;
      comm.barrier();  // rank 1 sends a malformed descriptor for this one
      ++barriers;
    } catch (const ds::PeerFailure& e) {
      error = e.what();
    }
  });
  FakeRank1 fake(ports[0]);
  // Rank 0 entered collective #0 but sends nothing until it holds every rank's descriptor.
  CHECK(fake.quiet_for(200ms));
  const net::detail::Descriptor barrier{net::detail::CollectiveKind::Barrier, ds::DType::U8, ds::ReduceOp::Sum, 0, 0};
  fake.send_descriptor(0, net::detail::encode(barrier));
  const auto h = fake.next();
  CHECK(h.type == net::FrameType::Descriptor);
  CHECK(h.seq == 0);
  REQUIRE(fake.payload.size() == 2 * net::detail::kDescriptorBytes);
  for (std::size_t r = 0; r < 2; ++r) {
    const auto d = net::detail::decode_descriptor(std::span(fake.payload).subspan(r * 16, 16));
    CHECK(d.kind == net::detail::CollectiveKind::Barrier);
  }
  // A descriptor of the wrong size drops the peer, naming the frame (once the first barrier has
  // returned: a failure that comes first may end it too).
  for (int i = 0; i < 1000 && barriers == 0; ++i) std::this_thread::sleep_for(5ms);
  const std::vector<std::byte> too_long(32, std::byte{0});
  fake.send_descriptor(1, too_long);
  rank0.join();
  CHECK(barriers == 1);
  CHECK(error.find("lost task worker:1") != std::string::npos);
  CHECK(error.find("it sent a malformed frame: descriptor frame of 32 bytes (expected 16)") != std::string::npos);
}

TEST_CASE("communicator in threads: a rank that starts before its peer listens retries within milliseconds") {
  Watchdog dog(60s, "threads: connect back-off");
  const auto ports = free_ports(2);
  auto registry = std::make_shared<ds::observe::MetricsRegistry>("worker", 1);
  std::thread rank1([&] {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 20s;
    opt.metrics = std::make_shared<ds::observe::CollectiveMetrics>(registry);
    net::Communicator comm(addresses_of(ports), 1, opt, worker_names(2));
    comm.barrier();
  });
  std::this_thread::sleep_for(300ms);
  {
    net::CommunicatorOptions opt;
    opt.connect_timeout = 20s;
    net::Communicator comm(addresses_of(ports), 0, opt, worker_names(2));
    comm.barrier();
  }
  rank1.join();
  // Attempts 1, 2, 4 ... ms apart, then every 50 ms: about 10 refused in 300 ms (a first wait of
  // 50 ms doubling, as before, made 3).
  const std::string text = registry->expose();
  const auto at = text.find("distribute_connect_retries_total{");
  REQUIRE(at != std::string::npos);
  const auto value = std::stoull(text.substr(text.find("} ", at) + 2));
  CAPTURE(text.substr(at, 120));
  CHECK(value >= 6);
}
