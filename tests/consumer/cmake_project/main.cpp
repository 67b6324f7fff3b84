// Downstream program of the CMake consumer check: built with find_package(distribute) and
// target_link_libraries(consumer PRIVATE distribute::distribute), nothing else.
#include <distribute/distribute.hpp>

#include <cstdio>
#include <string>

// CMakeLists.txt sets no C++ standard: this comes from the target's cxx_std_20 feature.
static_assert(__cplusplus >= 202002L, "distribute::distribute did not request C++20");

namespace ds = distribute;

int main() {
  try {
    // One synchronous step on two host replicas: exercises the replica threads (Threads::Threads).
    ds::MirroredStrategy<ds::host> strategy(2);
    auto per_replica = strategy.run([] { return 1; });
    const int sum = strategy.reduce("sum", per_replica);
    if (sum != 2) {
      std::fprintf(stderr, "MirroredStrategy<host>(2): reduce(\"sum\") gave %d, expected 2\n", sum);
      return 1;
    }
    // Goes through libfmt, so a missing fmt::fmt shows up as a link error.
    const std::string text = fmt::format("{}", ds::ReduceOp::Sum);
    if (text != "SUM") {
      std::fprintf(stderr, "formatting ReduceOp::Sum gave '%s'\n", text.c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::printf("distribute %s\n", DISTRIBUTE_VERSION_STRING);
  return 0;
}
