// expect-error(1): distribute::net::Communicator is not included: #define DISTRIBUTE_WITH_NET before #include <distribute/distribute.hpp>
// A class of a part not asked for in the part's own namespace (ds::net).
#include <distribute/distribute.hpp>

namespace ds = distribute;

int main() {
  ds::net::Communicator comm;
  (void)comm;
}
