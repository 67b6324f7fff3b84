// expect-ok
// The umbrella without switches, then a part's own header: the part's names are the real ones.
#include <distribute/distribute.hpp>
#include <distribute/summary/summary_writer.hpp>

#include <type_traits>

namespace ds = distribute;

static_assert(std::is_same_v<decltype(ds::summary::create_file_writer("logs")), ds::SummaryWriter>);

int main() {}
