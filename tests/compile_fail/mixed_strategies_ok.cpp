// expect-ok
// The control for the two snippets above: the same program with matching strategy types.
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>

namespace ds = distribute;

int main() {
  ds::MirroredStrategy<> mirrored(2);
  auto values = mirrored.run([] { return 1; });
  mirrored.run([](int v) { return v; }, values);
  return mirrored.reduce("sum", values) == 2 ? 0 : 1;
}
