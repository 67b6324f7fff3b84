// expect-error(1): DISTRIBUTE_REMOTE_FUNCTION is not included: #define DISTRIBUTE_WITH_PS before
// The parameter-server part's registration macro, used without the part.
#include <distribute/distribute.hpp>

namespace ds = distribute;

float step(float x) { return x; }
DISTRIBUTE_REMOTE_FUNCTION(step);

int main() {}
