// expect-error: reduce: this distributed value was made by a strategy of another type
// A PerReplica produced by OneDeviceStrategy cannot be reduced by a MirroredStrategy.
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>

namespace ds = distribute;

int main() {
  ds::OneDeviceStrategy<> one;
  ds::MirroredStrategy<> mirrored(2);
  auto values = one.run([] { return 1; });
  return mirrored.reduce("sum", values);
}
