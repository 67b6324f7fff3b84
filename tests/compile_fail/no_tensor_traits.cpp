// expect-error(1): (?s)(Opaque.*ReplicaContext::all_reduce: a value's type has no ds::tensor_traits|ReplicaContext::all_reduce: a value's type has no ds::tensor_traits.*Opaque)
// A type without a ds::tensor_traits specialisation given to all_reduce: one error, naming
// tensor_traits and the type, and no second one about run().
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>

namespace ds = distribute;

struct Opaque {
  int secret = 0;
};

int main() {
  ds::MirroredStrategy<> strategy(2);
  strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_reduce("sum", Opaque{}); });
}
