// Demo: logistic regression trained data-parallel with MirroredStrategy on 4 host replicas,
// then the same training with OneDeviceStrategy to show both end with the same weights.
//
//   logistic_regression [--replicas N] [--epochs E] [--batch B] [--examples N]
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/logistic_model.hpp"

namespace ds = distribute;

int main(int argc, char** argv) {
  int replicas = 4;
  demo::TrainConfig config{.epochs = 10, .global_batch = 128, .learning_rate = 0.5f};
  std::int64_t examples = 20000;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&]() -> long {
      if (i + 1 >= argc) {
        fmt::print(stderr, "{} needs a value\n", arg);
        std::exit(2);
      }
      return std::stol(argv[++i]);
    };
    if (arg == "--replicas") replicas = static_cast<int>(value());
    else if (arg == "--epochs") config.epochs = static_cast<int>(value());
    else if (arg == "--batch") config.global_batch = value();
    else if (arg == "--examples") examples = value();
    else {
      fmt::print(stderr, "usage: {} [--replicas N] [--epochs E] [--batch B] [--examples N]\n", argv[0]);
      return 2;
    }
  }
  try {
    const auto data = demo::make_data(examples, 32, 42);
    ds::MirroredStrategy<ds::host> strategy(replicas);
    fmt::print("MirroredStrategy<host> with {} replicas, {} examples, global batch {}\n",
               strategy.num_replicas_in_sync(), examples, config.global_batch);
    auto weights = demo::train(strategy, data, config, [](const demo::EpochReport& r) {
      fmt::print("epoch {:3d}  loss {:.5f}  {:>12.0f} examples/s\n", r.epoch, r.loss, r.examples_per_second);
    });
    fmt::print("accuracy {:.2f}%\n", 100.0 * demo::accuracy(data, weights));

    ds::OneDeviceStrategy<ds::host> one("/cpu:0");
    auto reference = demo::train(one, data, config);
    float max_diff = 0;
    for (std::size_t k = 0; k < weights.size(); ++k) max_diff = std::max(max_diff, std::abs(weights[k] - reference[k]));
    fmt::print("max |w_mirrored - w_one_device| = {:.3g}\n", max_diff);
    return max_diff <= 1e-4f ? 0 : 1;
  } catch (const ds::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
