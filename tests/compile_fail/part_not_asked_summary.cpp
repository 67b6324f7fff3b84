// expect-error(1): distribute::summary::create_file_writer\(\) is not included: #define DISTRIBUTE_WITH_SUMMARY before
// A function of a part not asked for, in the part's own namespace (ds::summary).
#include <distribute/distribute.hpp>

namespace ds = distribute;

int main() { ds::summary::create_file_writer("logs"); }
