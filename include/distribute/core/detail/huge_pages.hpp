// Large buffers the library fills right after allocating them (a copy of a value an all-reduce
// may not write): glibc maps every allocation over 32 MiB freshly and unmaps it on free, so each
// step faults its pages in again. Asking for transparent huge pages before the first write turns
// 4 KiB faults into 2 MiB ones (on kernels whose THP mode is "madvise", the common default).
#pragma once

#include <cstddef>
#include <cstdint>

#include <distribute/version.hpp>

#if defined(__linux__)
#include <sys/mman.h>
#endif

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

// glibc's largest mmap threshold: smaller blocks come from (and go back to) its heap, reused.
inline constexpr std::size_t kFreshlyMappedBytes = std::size_t{32} << 20;

/// Advises huge pages for the whole pages inside [p, p + bytes) when the block is large enough to
/// be freshly mapped; best effort (a kernel without THP ignores it).
inline void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p == nullptr || bytes < kFreshlyMappedBytes) return;
  constexpr std::uintptr_t page = 4096;
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE
