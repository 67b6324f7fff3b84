// expect-error(1): (?s)Opaque.*ds::Variable<T>: T needs a ds::tensor_traits specialisation \(see TensorLike\)
// Variables hold TensorLike values only.
#include <distribute/strategy/mirrored.hpp>
#include <distribute/strategy/one_device.hpp>

struct Opaque {
  int secret = 0;
};

int main() {
  distribute::Variable<Opaque> v(Opaque{});
  (void)v;
}
