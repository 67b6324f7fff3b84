// expect-error(1): (?s)(Opaque.*Strategy::gather: the value's type has no ds::tensor_traits|Strategy::gather: the value's type has no ds::tensor_traits.*Opaque)
// gather of per-replica values of a type without tensor_traits: one error naming tensor_traits
// and the type.
#include <distribute/strategy/mirrored.hpp>

namespace ds = distribute;

struct Opaque {
  int secret = 0;
};

int main() {
  ds::MirroredStrategy<> strategy(2);
  auto values = strategy.run([] { return Opaque{}; });
  strategy.gather(values, 0);
}
