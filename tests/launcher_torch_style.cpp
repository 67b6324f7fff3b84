// A torch-style task program for tests/test_launcher.cpp: it knows nothing of TF_CONFIG and reads
// only torchrun's variables, as torch.distributed's env:// rendezvous does. Rank 0 listens on
// MASTER_ADDR:MASTER_PORT (where torch's TCPStore server would be); every other rank connects
// there and sends its RANK, WORLD_SIZE and LOCAL_RANK; rank 0 checks that each of 1..WORLD_SIZE-1
// joined once with the same world size and answers "go", and every rank prints one line:
//
//   TORCH rank=R local_rank=L world_size=W local_world_size=LW joined            (rank > 0)
//   TORCH rank=0 local_rank=0 world_size=W local_world_size=LW all W ranks joined (rank 0)
//
// A missing or malformed variable, a duplicate rank or no rendezvous within 20 s: a message on
// stderr and exit status 3.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;
const auto kDeadline = Clock::now() + std::chrono::seconds(20);

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "launcher_torch_style: %s\n", what.c_str());
  std::exit(3);
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) fail(std::string(name) + " is not set");
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n < 0 || n > 65535) fail(std::string(name) + "='" + v + "' is not a number");
  return static_cast<int>(n);
}

addrinfo* resolve(const char* host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  if (::getaddrinfo(host, std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    fail(std::string("cannot resolve MASTER_ADDR ") + host);
  return res;
}

int poll_ms() {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kDeadline - Clock::now()).count();
  if (left <= 0) fail("no rendezvous within 20 s");
  return static_cast<int>(left);
}

// One line, read a byte at a time (the messages are a few bytes).
std::string read_line(int fd) {
  std::string line;
  char c;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, poll_ms()) <= 0) fail("no rendezvous within 20 s");
    if (::read(fd, &c, 1) != 1) fail("the peer closed the connection");
    if (c == '\n') return line;
    line += c;
  }
}

void write_line(int fd, const std::string& s) {
  const std::string line = s + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) fail("write failed");
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  const int local_rank = env_int("LOCAL_RANK"), local_world = env_int("LOCAL_WORLD_SIZE");
  const int port = env_int("MASTER_PORT");
  const char* master = std::getenv("MASTER_ADDR");
  if (!master) fail("MASTER_ADDR is not set");
  if (rank >= world) fail("RANK is not below WORLD_SIZE");
  const std::string me = "rank=" + std::to_string(rank) + " local_rank=" + std::to_string(local_rank) +
                         " world_size=" + std::to_string(world) + " local_world_size=" + std::to_string(local_world);

  addrinfo* res = resolve(master, port, rank == 0);
  if (rank == 0) {
    const int ls = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ls < 0 || ::bind(ls, res->ai_addr, res->ai_addrlen) != 0 || ::listen(ls, 128) != 0)
      fail(std::string("rank 0 cannot listen on MASTER_ADDR:MASTER_PORT: ") + std::strerror(errno));
    std::set<int> joined;
    std::set<int> peers;
    while (static_cast<int>(joined.size()) < world - 1) {
      pollfd p{ls, POLLIN, 0};
      if (::poll(&p, 1, poll_ms()) <= 0) fail("no rendezvous within 20 s");
      const int fd = ::accept(ls, nullptr, nullptr);
      if (fd < 0) continue;
      int r = -1, w = -1, lr = -1;
      if (std::sscanf(read_line(fd).c_str(), "%d %d %d", &r, &w, &lr) != 3) fail("a malformed hello");
      if (w != world) fail("rank " + std::to_string(r) + " has WORLD_SIZE " + std::to_string(w));
      if (r <= 0 || r >= world || !joined.insert(r).second) fail("rank " + std::to_string(r) + " joined twice or is out of range");
      peers.insert(fd);
    }
    for (const int fd : peers) {
      write_line(fd, "go");
      ::close(fd);
    }
    ::close(ls);
    std::printf("TORCH %s all %d ranks joined\n", me.c_str(), world);
  } else {
    int fd = -1;
    for (;;) {  // rank 0 may not listen yet: retry, as torch's TCPStore clients do
      fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
      ::close(fd);
      poll_ms();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    write_line(fd, std::to_string(rank) + " " + std::to_string(world) + " " + std::to_string(local_rank));
    if (read_line(fd) != "go") fail("rank 0 did not say go");
    ::close(fd);
    std::printf("TORCH %s joined\n", me.c_str());
  }
  ::freeaddrinfo(res);
  return 0;
}
