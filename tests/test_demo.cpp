// The demo's claim: 4 replicas with global batch B end with the same weights as one device with B.
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include "../examples/common/logistic_model.hpp"

namespace ds = distribute;

TEST_CASE("MirroredStrategy(4) and OneDeviceStrategy end with the same weights (within 1e-5)") {
  const auto data = demo::make_data(1000, 8, 7);  // 1000 = 15 full batches of 64 and one of 40
  demo::TrainConfig config{.epochs = 3, .global_batch = 64, .learning_rate = 0.5f};
  ds::MirroredStrategy<ds::host> mirrored(4);
  ds::OneDeviceStrategy<ds::host> one("/cpu:0");
  int epochs_seen = 0;
  auto w4 = demo::train(mirrored, data, config, [&](const demo::EpochReport& r) {
    ++epochs_seen;
    CHECK(r.loss > 0);
    CHECK(r.examples_per_second > 0);
  });
  auto w1 = demo::train(one, data, config);
  CHECK(epochs_seen == 3);
  REQUIRE(w4.size() == w1.size());
  float max_diff = 0;
  for (std::size_t k = 0; k < w4.size(); ++k) max_diff = std::max(max_diff, std::abs(w4[k] - w1[k]));
  CHECK(max_diff <= 1e-5f);
  // It learned something: far better than chance.
  CHECK(demo::accuracy(data, w4) > 0.8);
}

TEST_CASE("the demo's input pipeline: uneven per-replica pieces (3 and 7 replicas) train like one device") {
  // 64 rows over 3 replicas: 22, 22, 20; the last batch of 40: 14, 14, 12. Over 7: 10 x 6 + 4 and
  // 6 x 6 + 4. The gradient is divided by the global batch's size however the rows were split.
  const auto data = demo::make_data(1000, 8, 7);
  demo::TrainConfig config{.epochs = 2, .global_batch = 64, .learning_rate = 0.5f};
  ds::OneDeviceStrategy<ds::host> one("/cpu:0");
  std::vector<double> reference_losses;
  const auto w1 = demo::train(one, data, config, [&](const demo::EpochReport& r) { reference_losses.push_back(r.loss); });
  for (int replicas : {3, 7}) {
    CAPTURE(replicas);
    ds::MirroredStrategy<ds::host> mirrored(replicas);
    std::vector<double> losses;
    const auto w = demo::train(mirrored, data, config, [&](const demo::EpochReport& r) { losses.push_back(r.loss); });
    REQUIRE(w.size() == w1.size());
    float max_diff = 0;
    for (std::size_t k = 0; k < w.size(); ++k) max_diff = std::max(max_diff, std::abs(w[k] - w1[k]));
    CHECK(max_diff <= 1e-5f);
    // The epoch loss is the mean over every example: each row was seen exactly once.
    REQUIRE(losses.size() == reference_losses.size());
    for (std::size_t e = 0; e < losses.size(); ++e) CHECK(losses[e] == doctest::Approx(reference_losses[e]).epsilon(1e-5));
  }
}
