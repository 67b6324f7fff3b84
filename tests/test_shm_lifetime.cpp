// The shared-memory segment of a communicator cannot outlive its job: rank 0 (which creates it)
// is SIGKILLed at 20 points of the set-up and of the first all-reduces, with real processes
// (tests/net_helper.cpp), and afterwards /dev/shm holds nothing of the job.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <distribute/net/detail/shared_segment.hpp>

#include "support/processes.hpp"

namespace {

namespace nd = distribute::net::detail;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string helper_path() {
  if (const char* p = std::getenv("DISTRIBUTE_NET_HELPER"); p != nullptr && *p != '\0') return p;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "net_helper").string();
}

// "distribute-" and the 16 hex digits after it, where `text` names a segment.
std::optional<std::string> segment_label(const std::string& text) {
  const auto at = text.find("distribute-");
  if (at == std::string::npos || at + 27 > text.size()) return std::nullopt;
  return text.substr(at, 27);
}

// The segment process `pid` holds, by a descriptor (while it creates or offers it) or a mapping:
// "/dev/shm/distribute-..." for a named POSIX segment, "/memfd:distribute-..." for a nameless one.
std::optional<std::string> segment_of(pid_t pid) {
  const std::string fd_dir = fmt::format("/proc/{}/fd", pid);
  if (DIR* d = ::opendir(fd_dir.c_str()); d != nullptr) {
    std::optional<std::string> found;
    while (const dirent* e = ::readdir(d)) {
      char target[512];
      const ssize_t n = ::readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      const std::string t(target, static_cast<std::size_t>(n));
      if (t.find("distribute-") != std::string::npos && (t.find("/dev/shm/") == 0 || t.find("/memfd:") == 0)) {
        found = segment_label(t);
        break;
      }
    }
    ::closedir(d);
    if (found) return found;
  }
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/distribute-") != std::string::npos || line.find("/memfd:distribute-") != std::string::npos) {
      return segment_label(line);
    }
  }
  return std::nullopt;
}

doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

std::set<std::string> dev_shm_names() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("distribute-")) out.insert(name);
  }
  return out;
}

}  // namespace

TEST_CASE("processes: rank 0 SIGKILLed at 20 points of the shared-memory set-up leaves nothing in /dev/shm") {
  // Kill times after rank 0 is first seen holding the segment: from its creation (reserving 64 MiB
  // of pages takes milliseconds), through the offer, the peers mapping it and answering, to the
  // first all-reduces through it.
  const std::vector<double> offsets_ms{0, 0.1, 0.2, 0.4, 0.7, 1, 1.5, 2, 3, 4, 5, 6, 8, 10, 13, 16, 20, 30, 50, 100};
  const std::set<std::string> before = dev_shm_names();
  std::set<std::string> labels;  // every job's segment
  int before_ready = 0;
  const auto start = Clock::now();
  for (std::size_t point = 0; point < offsets_ms.size(); ++point) {
    CAPTURE(point);
    CAPTURE(offsets_ms[point]);
    const int n = 3;
    std::vector<test_support::Child> procs;
    std::optional<std::string> label;
    // On a loaded machine this thread can miss the whole job (a few ms): rank 0 then ends without
    // having been seen with its segment, and the job is run again (3 tries).
    for (int attempt = 1; attempt <= 3 && !label; ++attempt) {
      procs.clear();
      std::string port_list;
      for (int p : test_support::free_ports(n)) port_list += fmt::format("{}{}", port_list.empty() ? "" : ",", p);
      for (int r = 0; r < n; ++r) {
        // 16 MiB slots: a (3 + 1) x 16 MiB segment; 4000-byte all-reduces go through it.
        procs.push_back(test_support::spawn({helper_path(), "loop", "--rank", std::to_string(r), "--ports", port_list,
                                             "--count", "1000", "--iters", "200", "--shm-min", "1", "--shm-slot",
                                             "16777216", "--connect-timeout", "20000"},
                                            {}));
      }
      // Watch rank 0 until it holds the segment, then kill it `offset` later.
      const auto give_up = Clock::now() + 20s;
      while (!label && Clock::now() < give_up) {
        label = segment_of(procs[0].pid);
        int st = 0;
        if (!label && ::waitpid(procs[0].pid, &st, WNOHANG) == procs[0].pid) {
          procs[0].done = true;
          procs[0].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          break;
        }
      }
      if (!label) {
        const bool ended = test_support::wait_all(procs, 20s);
        if (attempt < 3 && ended && procs[0].status == 0) {
          MESSAGE("rank 0 ran its whole job before this thread saw its segment; the job runs again");
          continue;
        }
        FAIL("rank 0 never held a shared-memory segment:\n" << procs[0].output << "\n" << procs[1].output);
      }
    }
    labels.insert(*label);
    std::this_thread::sleep_until(Clock::now() + std::chrono::duration<double, std::milli>(offsets_ms[point]));
    ::kill(procs[0].pid, SIGKILL);
    // The others notice the lost peer (connection closed) and exit: PeerFailure (3), or 0 where
    // rank 0 had finished before the kill.
    const bool exited = test_support::wait_all(procs, 20s);
    INFO("rank 0: " << procs[0].output << "\nrank 1: " << procs[1].output << "\nrank 2: " << procs[2].output);
    CHECK(exited);
    if (procs[0].output.find("READY") == std::string::npos) ++before_ready;
    for (int r = 1; r < n; ++r) {
      CHECK((procs[static_cast<std::size_t>(r)].status == 3 || procs[static_cast<std::size_t>(r)].status == 0));
    }
    std::error_code ec;
    CHECK_MESSAGE(!std::filesystem::exists("/dev/shm/" + *label, ec), "/dev/shm/", *label, " outlived its job");
  }
  // No other name of ours appeared and stayed (another test process may be setting one up right
  // now, so a name counts only if it is still there 2 s later).
  auto left_behind = [&] {
    auto now = dev_shm_names();
    for (const auto& name : before) now.erase(name);
    return now;
  };
  for (const auto deadline = Clock::now() + 2s; !left_behind().empty() && Clock::now() < deadline;) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(left_behind().empty());
  CHECK(labels.size() == offsets_ms.size());  // one segment per job, each seen
  MESSAGE(fmt::format("{} kills, {} before rank 0's first all-reduce returned; {:.1f} s in all", offsets_ms.size(),
                      before_ready, std::chrono::duration<double>(Clock::now() - start).count()));
}

TEST_CASE("SharedSegment: nameless, opened by its creator's /proc path; a path off the wire that is anything else is refused") {
  auto seg = nd::SharedSegment::create(4096);
  CHECK(nd::is_proc_fd_path(seg->name()));
  CHECK(seg->name().starts_with(fmt::format("/proc/{}/fd/", ::getpid())));
  CHECK(dev_shm_names().count(*segment_label(*segment_of(::getpid()))) == 0);  // never in /dev/shm
  auto peer = nd::SharedSegment::open(seg->name(), 4096);
  seg->data()[100] = std::byte{42};
  CHECK(peer->data()[100] == std::byte{42});  // one memory
  CHECK_THROWS_WITH_AS(nd::SharedSegment::open(seg->name(), 8192),
                       contains(fmt::format("{} is not the 8192 bytes expected", seg->name())), distribute::Unavailable);
  const std::string path = seg->name();
  seg->close_handle();  // set-up over: the segment can no longer be opened, the mappings stay
  CHECK_THROWS_WITH_AS(nd::SharedSegment::open(path, 4096), contains(fmt::format("open({}): ", path)),
                       distribute::Unavailable);
  CHECK(peer->data()[100] == std::byte{42});

  for (const char* bad : {"/etc/passwd", "/dev/shm/distribute-0011223344556677", "/proc/self/fd/0", "/proc/1/fd/",
                          "/proc//fd/3", "/proc/1/fd/3/..", "proc/1/fd/3", "/proc/12345678901/fd/3", ""}) {
    INFO(bad);
    CHECK_FALSE(nd::is_proc_fd_path(bad));
    CHECK_THROWS_WITH_AS(nd::SharedSegment::open(bad, 4096),
                         contains(fmt::format("shared-memory segment '{}' is not /proc/<pid>/fd/<fd>", bad)),
                         distribute::Unavailable);
  }
  // A descriptor that is not a file (a pipe) is refused, not blocked on.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const std::string pipe_path = fmt::format("/proc/{}/fd/{}", ::getpid(), fds[0]);
  CHECK_THROWS_WITH_AS(nd::SharedSegment::open(pipe_path, 4096), contains(fmt::format("{} is not the 4096 bytes expected", pipe_path)),
                       distribute::Unavailable);
  ::close(fds[0]);
  ::close(fds[1]);
}
