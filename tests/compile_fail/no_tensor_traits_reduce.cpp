// expect-error(1): (?s)(Opaque.*Strategy::reduce: the value's type has no ds::tensor_traits|Strategy::reduce: the value's type has no ds::tensor_traits.*Opaque)
// reduce of per-replica values of a type without tensor_traits: one error at the call, naming
// tensor_traits and the type (not a failure inside an internal function).
#include <distribute/strategy/mirrored.hpp>

namespace ds = distribute;

struct Opaque {
  int secret = 0;
};

int main() {
  ds::MirroredStrategy<> strategy(2);
  auto values = strategy.run([] { return Opaque{}; });
  strategy.reduce(ds::ReduceOp::Sum, values, 0);
}
