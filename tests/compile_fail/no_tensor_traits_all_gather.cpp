// expect-error(1): (?s)(Opaque.*ReplicaContext::all_gather: the value's type has no ds::tensor_traits|ReplicaContext::all_gather: the value's type has no ds::tensor_traits.*Opaque)
// all_gather of a type without tensor_traits: one error naming tensor_traits and the type.
#include <distribute/strategy/mirrored.hpp>

namespace ds = distribute;

struct Opaque {
  int secret = 0;
};

int main() {
  ds::MirroredStrategy<> strategy(2);
  strategy.run([](ds::ReplicaContext& ctx) { return ctx.all_gather(Opaque{}, 0); });
}
