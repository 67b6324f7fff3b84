// expect-ok
// Switches, implied parts, and including the umbrella again: the header first without a switch
// (its stand-ins declared), then with DISTRIBUTE_WITH_PS (ParameterServerStrategy, and the
// multi-worker and cluster parts it brings) and with DISTRIBUTE_WITH_CHECKPOINT, then a part's
// own header: the real names win over the stand-ins, qualified and through a using-directive.
#include <distribute/distribute.hpp>
#define DISTRIBUTE_WITH_PS
#define DISTRIBUTE_WITH_CHECKPOINT
#include <distribute/distribute.hpp>
#include <distribute/distribute.hpp>

#include <memory>
#include <type_traits>

namespace ds = distribute;

float step(float x) { return x; }
DISTRIBUTE_REMOTE_FUNCTION(step);

static_assert(std::is_base_of_v<ds::AnyStrategy, ds::MultiWorkerMirroredStrategy<ds::host>>);
static_assert(std::is_base_of_v<ds::AnyStrategy, ds::ParameterServerStrategy>);
static_assert(std::is_base_of_v<ds::ClusterResolver, ds::TFConfigClusterResolver>);
static_assert(std::is_class_v<ds::net::Communicator>);

int main() {
  std::shared_ptr<ds::ClusterResolver> resolver;
  ds::Checkpoint ckpt;
  ds::Variable<float> w(0.0f, {.name = "w"});
  ckpt.track("w", w);
  (void)resolver;
}
