// How fast `rep movsb` copies 64 KiB for each (destination - source) mod 64, the instruction the
// Linux kernel uses to copy socket data on CPUs with FSRM. A diagnostic for docs/performance.md
// (multi-worker section), built beside the benchmarks (not run by `meson test --benchmark`):
//   ninja -C build-bench bench/bench_copy_alignment && build-bench/bench/bench_copy_alignment
#if !defined(__x86_64__)
#error "x86-64 only: it times the rep movsb instruction"
#endif
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

void rep_movsb(void* dst, const void* src, std::size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

}  // namespace

int main() {
  constexpr std::size_t kBytes = std::size_t{64} << 10;
  constexpr std::size_t kSlack = 8192;
  auto* src = static_cast<char*>(std::aligned_alloc(4096, kBytes + kSlack));
  auto* dst = static_cast<char*>(std::aligned_alloc(4096, kBytes + kSlack));
  if (src == nullptr || dst == nullptr) return 1;
  std::memset(src, 1, kBytes + kSlack);
  std::memset(dst, 2, kBytes + kSlack);
  for (const int src_offset : {0, 16}) {
    std::printf("source at 64-byte boundary + %d; GB/s by (destination - source) mod 64:\n", src_offset);
    for (int delta = 0; delta < 64; ++delta) {
      double best = 1e30;
      for (int rep = 0; rep < 100; ++rep) {  // best of 100: the copy alone, caches warm
        const auto t0 = std::chrono::steady_clock::now();
        rep_movsb(dst + (src_offset + delta) % 64, src + src_offset, kBytes);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("%2d:%5.1f%s", delta, static_cast<double>(kBytes) / best / 1e9, delta % 8 == 7 ? "\n" : "  ");
    }
  }
  std::free(src);
  std::free(dst);
  return 0;
}
