// Shared by the multi-worker all-reduce drivers (ours, gloo, MPI): sizes, iteration counts, and
// the timing rule of /work/shared/PEERS.md (barrier, time one call, max over ranks per iteration,
// median after warm-up).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mw {

// The sizes: 4 KiB, 64 KiB, 1, 16, 64 MiB; MW_SIZES="1048576 16777216" (bytes, space-separated)
// picks others for a short targeted run.
inline std::vector<std::size_t> sizes() {
  if (const char* env = std::getenv("MW_SIZES"); env != nullptr && *env != '\0') {
    std::vector<std::size_t> out;
    char* end = nullptr;
    for (const char* p = env;; p = end) {
      const unsigned long long v = std::strtoull(p, &end, 10);
      if (end == p) break;
      if (v > 0) out.push_back(static_cast<std::size_t>(v));
    }
    if (!out.empty()) return out;
  }
  return {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20};
}

// MW_ITERS overrides the timed iterations (profiling runs want many).
inline int iters_for(std::size_t bytes) {
  if (const char* env = std::getenv("MW_ITERS"); env != nullptr && std::atoi(env) > 0) return std::atoi(env);
  return bytes >= (std::size_t{64} << 20) ? 20 : bytes >= (std::size_t{16} << 20) ? 25 : 50;
}
inline int warmup_for(std::size_t bytes) { return bytes >= (std::size_t{16} << 20) ? 2 : 5; }

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One CSV line: impl,np,bytes,iters,median_ms,min_ms
inline void print_row(const char* impl, int np, std::size_t bytes, const std::vector<double>& max_times_s) {
  const double med = median(max_times_s) * 1e3;
  const double mn = *std::min_element(max_times_s.begin(), max_times_s.end()) * 1e3;
  std::printf("%s,%d,%zu,%zu,%.4f,%.4f\n", impl, np, bytes, max_times_s.size(), med, mn);
  std::fflush(stdout);
}

// Fills the buffer with values whose float32 sums are exact, and checks the result.
inline void fill(std::vector<float>& v, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i % 7) + rank);
}
inline bool check(const std::vector<float>& v, int np) {
  // after one sum: sum_r (i%7 + r) = np*(i%7) + np(np-1)/2
  for (std::size_t i = 0; i < v.size(); i += 997) {
    const float want = static_cast<float>(np * static_cast<int>(i % 7) + np * (np - 1) / 2);
    if (v[i] != want) return false;
  }
  return true;
}

}  // namespace mw
