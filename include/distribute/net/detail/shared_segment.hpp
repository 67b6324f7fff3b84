// A shared-memory segment that the ranks of one communicator map when they run on one host.
// Rank 0 creates it with memfd_create: it never has a name in /dev/shm, so no rank can leave it
// behind whichever dies when (a named segment outlives a creator killed before it unlinks the
// name). The other ranks open it through /proc/<pid>/fd/<fd> of rank 0 while rank 0 holds the
// descriptor (during set-up); the kernel frees the memory when the last descriptor and mapping go.
// Its pages are reserved with posix_fallocate at creation: no memory means an error here (and TCP),
// not a SIGBUS later.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/detail/auth.hpp>

#if defined(__linux__)
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define DISTRIBUTE_NET_SHARED_MEMORY 1
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// True for "/proc/<digits>/fd/<digits>": the only paths SharedSegment::open accepts, since the
/// path comes off the wire (a peer must not make us open an arbitrary file).
inline bool is_proc_fd_path(std::string_view path) {
  auto digits = [&](std::string_view prefix, char end) {
    if (!path.starts_with(prefix)) return false;
    path.remove_prefix(prefix.size());
    std::size_t n = 0;
    while (n < path.size() && n < 10 && path[n] >= '0' && path[n] <= '9') ++n;
    if (n == 0 || (end != '\0' ? n >= path.size() || path[n] != end : n != path.size())) return false;
    path.remove_prefix(n);
    return true;
  };
  return digits("/proc/", '/') && digits("/fd/", '\0');
}

class SharedSegment {
 public:
#if defined(DISTRIBUTE_NET_SHARED_MEMORY)
  /// A new zero-filled anonymous segment of `bytes`; name() is the path other processes of this
  /// user open it by until close_handle(). Throws Unavailable.
  static std::unique_ptr<SharedSegment> create(std::size_t bytes) {
    const Nonce n = random_nonce();
    std::string label = "distribute-";
    for (std::size_t i = 0; i < 8; ++i) label += fmt::format("{:02x}", static_cast<unsigned>(n[i]));
    auto seg = std::unique_ptr<SharedSegment>(new SharedSegment(label));
    const int fd = ::memfd_create(label.c_str(), MFD_CLOEXEC);
    if (fd < 0) throw Unavailable(fmt::format("memfd_create({}): {}", label, std::strerror(errno)));
    seg->fd_ = fd;  // from here on the destructor closes it
    seg->name_ = fmt::format("/proc/{}/fd/{}", ::getpid(), fd);
    seg->map(fd, bytes, true);
    return seg;
  }

  /// Maps the segment that another process created, by its create()'s name(). Throws Unavailable.
  static std::unique_ptr<SharedSegment> open(const std::string& name, std::size_t bytes) {
    if (!is_proc_fd_path(name)) throw Unavailable(fmt::format("shared-memory segment '{}' is not /proc/<pid>/fd/<fd>", name));
    auto seg = std::unique_ptr<SharedSegment>(new SharedSegment(name));
    // O_NONBLOCK: a descriptor that is a FIFO must not block us (the nonce check rejects it later).
    const int fd = ::open(name.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) throw Unavailable(fmt::format("open({}): {}", name, std::strerror(errno)));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    seg->map(fd, bytes, false);
    return seg;
  }

  ~SharedSegment() {
    if (base_ != nullptr) ::munmap(base_, size_);
    close_handle();
  }

  /// Creator: closes the descriptor others open the segment by (once all have, or have failed
  /// to); the mapping stays valid. Once is enough.
  void close_handle() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
#else
  static std::unique_ptr<SharedSegment> create(std::size_t) { throw Unavailable("shared memory: not supported on this OS"); }
  static std::unique_ptr<SharedSegment> open(const std::string&, std::size_t) {
    throw Unavailable("shared memory: not supported on this OS");
  }
  void close_handle() noexcept {}
#endif

  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  std::byte* data() const noexcept { return static_cast<std::byte*>(base_); }
  std::size_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }

 private:
  explicit SharedSegment(std::string name) : name_(std::move(name)) {}

#if defined(DISTRIBUTE_NET_SHARED_MEMORY)
  // Maps `fd` (which the caller closes; the mapping keeps the memory).
  void map(int fd, std::size_t bytes, bool reserve) {
    if (reserve) {
      if (::ftruncate(fd, static_cast<::off_t>(bytes)) != 0) {
        throw Unavailable(fmt::format("ftruncate({}, {}): {}", name_, bytes, std::strerror(errno)));
      }
      if (const int err = ::posix_fallocate(fd, 0, static_cast<::off_t>(bytes)); err != 0) {
        throw Unavailable(fmt::format("reserving {} bytes for {}: {}", bytes, name_, std::strerror(err)));
      }
    } else {
      struct ::stat st{};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) != bytes) {
        throw Unavailable(fmt::format("{} is not the {} bytes expected", name_, bytes));
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw Unavailable(fmt::format("mmap({}): {}", name_, std::strerror(errno)));
    base_ = p;
    size_ = bytes;
  }

  int fd_ = -1;
#endif

  std::string name_;
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
