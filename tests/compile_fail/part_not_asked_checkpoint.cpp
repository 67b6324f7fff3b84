// expect-error(1): distribute::Checkpoint is not included: #define DISTRIBUTE_WITH_CHECKPOINT before #include <distribute/distribute.hpp>
// A class of a part not asked for, named without template arguments (as the real one is used).
#include <distribute/distribute.hpp>

namespace ds = distribute;

int main() {
  ds::Checkpoint ckpt;
  (void)ckpt;
}
