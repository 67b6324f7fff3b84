// A POSIX shared-memory segment that the ranks of one communicator map when they run on one host.
// Rank 0 creates it under a random name and unlinks the name as soon as every rank has mapped it
// (or failed to), so nothing is left in /dev/shm when a process is killed later. Its pages are
// reserved with posix_fallocate at creation: a full /dev/shm is an error here, not a SIGBUS later.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
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

class SharedSegment {
 public:
#if defined(DISTRIBUTE_NET_SHARED_MEMORY)
  /// A new zero-filled segment of `bytes` under a fresh random name. Throws Unavailable.
  static std::unique_ptr<SharedSegment> create(std::size_t bytes) {
    const Nonce n = random_nonce();
    std::string name = "/distribute-";
    for (std::size_t i = 0; i < 8; ++i) name += fmt::format("{:02x}", static_cast<unsigned>(n[i]));
    auto seg = std::unique_ptr<SharedSegment>(new SharedSegment(name, false));
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) throw Unavailable(fmt::format("shm_open({}): {}", name, std::strerror(errno)));
    seg->owner_ = true;  // from here on the destructor removes the name
    seg->map(fd, bytes, true);
    return seg;
  }

  /// Maps the segment `name` that another process created. Throws Unavailable.
  static std::unique_ptr<SharedSegment> open(const std::string& name, std::size_t bytes) {
    auto seg = std::unique_ptr<SharedSegment>(new SharedSegment(name, false));
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) throw Unavailable(fmt::format("shm_open({}): {}", name, std::strerror(errno)));
    seg->map(fd, bytes, false);
    return seg;
  }

  ~SharedSegment() {
    if (base_ != nullptr) ::munmap(base_, size_);
    unlink();
  }

  /// Removes the name (creator only; once is enough): the mapping stays valid.
  void unlink() noexcept {
    if (owner_) ::shm_unlink(name_.c_str());
    owner_ = false;
  }
#else
  static std::unique_ptr<SharedSegment> create(std::size_t) { throw Unavailable("shared memory: not supported on this OS"); }
  static std::unique_ptr<SharedSegment> open(const std::string&, std::size_t) {
    throw Unavailable("shared memory: not supported on this OS");
  }
  void unlink() noexcept {}
#endif

  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  std::byte* data() const noexcept { return static_cast<std::byte*>(base_); }
  std::size_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }

 private:
  SharedSegment(std::string name, bool owner) : name_(std::move(name)), owner_(owner) {}

#if defined(DISTRIBUTE_NET_SHARED_MEMORY)
  // Takes ownership of `fd` (closed here whatever happens: the mapping keeps the memory).
  void map(int fd, std::size_t bytes, bool reserve) {
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    if (reserve) {
      if (::ftruncate(fd, static_cast<::off_t>(bytes)) != 0) {
        throw Unavailable(fmt::format("ftruncate({}, {}): {}", name_, bytes, std::strerror(errno)));
      }
      if (const int err = ::posix_fallocate(fd, 0, static_cast<::off_t>(bytes)); err != 0) {
        throw Unavailable(fmt::format("reserving {} bytes for {}: {}", bytes, name_, std::strerror(err)));
      }
    } else {
      struct ::stat st{};
      if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
        throw Unavailable(fmt::format("{} is not the {} bytes expected", name_, bytes));
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw Unavailable(fmt::format("mmap({}): {}", name_, std::strerror(errno)));
    base_ = p;
    size_ = bytes;
  }
#endif

  std::string name_;
  bool owner_ = false;
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
