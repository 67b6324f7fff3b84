// expect-error(1): distribute::MultiWorkerMirroredStrategy is not included: #define DISTRIBUTE_WITH_MULTI_WORKER before #include <distribute/distribute.hpp>
// A part of the umbrella header the program did not ask for: one error, naming the switch.
#include <distribute/distribute.hpp>

namespace ds = distribute;

int main() {
  ds::MultiWorkerMirroredStrategy<ds::host> strategy;
  (void)strategy;
}
