// expect-error: (?s)constraints not satisfied.*TensorLike
// A type without a ds::tensor_traits specialisation is rejected by the TensorLike concept.
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
