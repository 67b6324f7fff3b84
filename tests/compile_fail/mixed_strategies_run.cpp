// expect-error: a distributed value made by one strategy type was passed to a strategy of another type
// A PerReplica produced by MirroredStrategy cannot be fed to OneDeviceStrategy::run.
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>

namespace ds = distribute;

int main() {
  ds::MirroredStrategy<> mirrored(2);
  ds::OneDeviceStrategy<> one;
  auto values = mirrored.run([] { return 1; });
  one.run([](int v) { return v; }, values);
}
