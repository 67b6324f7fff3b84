// A simulated wire between two network namespaces, for two_hosts.py: a TAP device named eth0 in
// each, and every frame one side transmits comes out of the other side `delay` microseconds later
// (this kernel has no netem; the rate limit is a tbf qdisc on each eth0, set by the script).
//
//   wire_relay NETNS_A NETNS_B DELAY_US [CPU_A CPU_B]   (root; prints "ready" once both devices exist)
//
// The devices carry virtio-net headers with TSO/checksum offload, so the relay moves the kernel's
// large segments (up to 64 KiB) rather than every 1500-byte frame; tbf accounts each segment's
// frames on the wire. One thread per direction, SCHED_FIFO when allowed, sleeps in ppoll until the
// next frame is due. Given the hosts' CPUs, the thread that delivers to a host runs on that host's
// CPU: its write() runs the host's receive path (TCP, the copy to the socket), which a real host
// also pays on its own CPU; unpinned, that work lands on either host, and a host computing beside
// its communication would be charged its peer's receiving.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "wire_relay: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Opens eth0 as a TAP device in network namespace `ns` (the thread returns to its own afterwards).
int open_tap(const std::string& ns) {
  const int self = ::open("/proc/self/ns/net", O_RDONLY);
  const int there = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
  if (self < 0 || there < 0) die("open namespace " + ns);
  if (::setns(there, CLONE_NEWNET) != 0) die("setns " + ns);
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK);
  if (fd < 0) die("open /dev/net/tun");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
  std::strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0) die("TUNSETIFF in " + ns);
  if (::ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) != 0) die("TUNSETOFFLOAD");
  if (::setns(self, CLONE_NEWNET) != 0) die("setns back");
  ::close(self);
  ::close(there);
  return fd;
}

long long now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct Frame {
  long long due;
  std::size_t size;
  std::unique_ptr<char[]> bytes;
};

// Frames read from `from` are written to `to` `delay_ns` after they were read; on `cpu` if >= 0.
void carry(int from, int to, long long delay_ns, int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (const int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set); rc != 0) {
      errno = rc;  // it returns the error rather than setting errno
      die("pin to CPU " + std::to_string(cpu));
    }
  }
  sched_param sp{};
  sp.sched_priority = 50;
  ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &sp);  // best effort
  std::deque<Frame> queue;
  std::vector<std::unique_ptr<char[]>> spare;
  constexpr std::size_t kMaxFrame = 65536 + 256;
  constexpr std::size_t kMaxQueued = 4096;  // far beyond what 1 Gbit/s puts on the wire in the delay
  for (;;) {
    pollfd p{from, POLLIN, 0};
    timespec wait{};
    timespec* timeout = nullptr;
    if (!queue.empty()) {
      const long long left = std::max(0LL, queue.front().due - now_ns());
      wait.tv_sec = left / 1000000000LL;
      wait.tv_nsec = left % 1000000000LL;
      timeout = &wait;
    }
    if (::ppoll(&p, 1, timeout, nullptr) < 0 && errno != EINTR) die("ppoll");
    for (;;) {  // every frame that is waiting
      std::unique_ptr<char[]> buf;
      if (!spare.empty()) {
        buf = std::move(spare.back());
        spare.pop_back();
      } else {
        buf.reset(new char[kMaxFrame]);  // not zeroed: read() fills what is sent
      }
      const ssize_t n = ::read(from, buf.get(), kMaxFrame);
      if (n < 0) {
        spare.push_back(std::move(buf));
        if (errno == EAGAIN || errno == EINTR) break;
        die("read");
      }
      if (queue.size() < kMaxQueued) queue.push_back(Frame{now_ns() + delay_ns, static_cast<std::size_t>(n), std::move(buf)});
    }
    const long long t = now_ns();
    while (!queue.empty() && queue.front().due <= t) {
      Frame& f = queue.front();
      if (::write(to, f.bytes.get(), f.size) < 0 && errno != EAGAIN && errno != EIO) die("write");
      spare.push_back(std::move(f.bytes));
      queue.pop_front();
    }
  }
}

// A whole decimal number from `least` to `most`, or a usage error naming the argument.
long long number(const char* what, const char* text, long long least, long long most) {
  long long v = 0;
  const char* end = text + std::strlen(text);
  const auto [at, ec] = std::from_chars(text, end, v);
  if (ec != std::errc{} || at != end || *text == '\0' || v < least || v > most) {
    std::fprintf(stderr, "wire_relay: %s must be a whole number from %lld to %lld, not '%s'\n", what, least, most, text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr, "usage: wire_relay NETNS_A NETNS_B DELAY_US [CPU_A CPU_B]\n");
    return 2;
  }
  const long long delay_ns = number("DELAY_US", argv[3], 0, 10'000'000) * 1000LL;
  // CPU_SETSIZE bounds what a cpu_set_t can name; a CPU that exists but is not ours fails the pin.
  const int cpu_a = argc == 6 ? static_cast<int>(number("CPU_A", argv[4], 0, CPU_SETSIZE - 1)) : -1;
  const int cpu_b = argc == 6 ? static_cast<int>(number("CPU_B", argv[5], 0, CPU_SETSIZE - 1)) : -1;
  const int a = open_tap(argv[1]), b = open_tap(argv[2]);
  std::printf("ready\n");
  std::fflush(stdout);
  std::thread ab([&] { carry(a, b, delay_ns, cpu_b); });  // delivers to B: B's receive path
  std::thread ba([&] { carry(b, a, delay_ns, cpu_a); });
  ab.join();
  ba.join();
}
