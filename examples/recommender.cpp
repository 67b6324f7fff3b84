// A recommender trained asynchronously on parameter servers: a user and an item embedding table,
// each sharded over the ps tasks, and a small dense part, learning a hidden ground-truth model from
// the examples it generates, with a worker that dies in the middle of a step and comes back.
//
//   distribute-launch --ps 2 --workers 3 --restart-workers 1 --
//       recommender [--users U] [--items I] [--dim D] [--examples N] [--batch B] [--lr LR]
//                   [--kill-worker I --kill-at-step K] [--data DIR] ...        (--help: all of them)
//   recommender --write-data DIR [--users U] [--items I] [--dim D] [--examples N] [--eval-examples E]
//
// The model: prediction = sum_k user[u][k] * item[i][k] * w[k] + b (Keras: Dense(1) on the product
// of the two looked-up rows), trained on the sum of squared errors over each batch (Keras's
// MeanSquaredError with reduction "sum": each row's gradient has the size of one example's, which
// Adagrad's accumulator, starting at 0.1, is scaled for; a batch mean would divide the rows'
// gradients by the batch size and leave the tables all but still), Adagrad on every variable. The hidden model that
// makes the labels has the same form plus noise of standard deviation --noise, so the best loss a
// model can reach is known: the noise's, measured on the held-out examples ("truth loss").
//
// Every task runs this program; TF_CONFIG (set by the launcher) says which part it plays:
//   ps      a ds::Server holding shards of the tables (each table split over all ps tasks) with
//           their Adagrad accumulators beside them, and the dense part. It fills its shards itself
//           (ds::Initializer): a table of 10 million rows is never built or sent.
//   worker  a ds::Server running the steps the coordinator schedules. A step takes the next batch
//           of this worker's examples, looks up the distinct rows it names (only those travel),
//           computes the gradients, and applies Adagrad to the rows it touched and to the dense
//           part: the ps tasks update the rows and their accumulators, once, when the step commits.
//   chief   the coordinator: it schedules --examples / --batch steps, prints progress (train loss,
//           examples/s), then measures the loss on held-out examples and compares it with the
//           truth loss.
//
// Data: generated on each worker from the hidden model (the default; worker w draws its own stream of
// examples), or read from --data DIR (train.bin and eval.bin: 20-byte little-endian records int64
// user, int64 item, float32 label; meta.json), which --write-data makes: the same examples for
// another trainer (bench/recommender_tf.py trains TensorFlow on them).
//
// Exit status (chief): 0 when the held-out loss is within --target (default 5%) of the truth loss,
// 1 when it is not, 2 for a usage error, 3 for any other error. With --report-json (benchmarks) no
// target is checked and a line "RESULT {json}" gives the figures.
#define DISTRIBUTE_WITH_PS
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <distribute/distribute.hpp>

#include "common/cli.hpp"
#include "common/ps_tasks.hpp"

namespace ds = distribute;

namespace {

using cli::parse_number;
using cli::UsageError;

constexpr const char* kUsage =
    "usage: distribute-launch --ps 2 --workers 3 --restart-workers 1 -- recommender [options]\n"
    "       recommender --write-data DIR [data options]\n"
    "data (generated from the hidden model, or written by --write-data):\n"
    "  --users U            rows of the user table (default 1000)\n"
    "  --items I            rows of the item table (default 1000)\n"
    "  --dim D              embedding width (default 8)\n"
    "  --examples N         training examples: N / B steps (default 10000000)\n"
    "  --eval-examples E    held-out examples (default 20000)\n"
    "  --noise S            standard deviation of the labels' noise (default 0.5)\n"
    "  --seed S             the hidden model, the examples and the initial weights (default 1)\n"
    "  --data DIR           train on DIR's train.bin / eval.bin / meta.json instead of generated examples\n"
    "  --write-data DIR     write train.bin (N examples), eval.bin (E) and meta.json to DIR, and exit\n"
    "training:\n"
    "  --batch B            examples per step (default 256)\n"
    "  --lr LR              Adagrad's learning rate (default 0.2)\n"
    "  --init-scale A       the tables start uniform in (-A, A) (default 0.5; Keras's Embedding: 0.05)\n"
    "  --warmup-steps W     steps before the timed ones (default 50)\n"
    "  --progress-every P   a progress line every P steps (default 1000)\n"
    "  --target T           pass when the held-out loss is within T of the truth loss (default 0.05: 5%)\n"
    "  --kill-worker I      worker I SIGKILLs itself in its K-th step (--kill-at-step K), on its first start only\n"
    "  --wait-for-workers S at the end, wait up to S seconds for a lost worker to come back (default 0)\n"
    "  --report-json        print RESULT {json} (examples/s, losses, bytes through the ps per step); no target\n";

struct Options {
  std::int64_t users = 1000, items = 1000, dim = 8;
  std::int64_t examples = 10'000'000, eval_examples = 20'000;
  double noise = 0.5;
  std::uint64_t seed = 1;
  std::string data, write_data;
  std::int64_t batch = 256;
  double lr = 0.2, init_scale = 0.5, target = 0.05;
  std::int64_t warmup_steps = 50, progress_every = 1000;
  int kill_worker = -1;
  std::int64_t kill_at_step = 0;
  double wait_for_workers = 0;
  bool report_json = false;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (flag == "--users") o.users = parse_number<std::int64_t>(flag, value());
    else if (flag == "--items") o.items = parse_number<std::int64_t>(flag, value());
    else if (flag == "--dim") o.dim = parse_number<std::int64_t>(flag, value());
    else if (flag == "--examples") o.examples = parse_number<std::int64_t>(flag, value());
    else if (flag == "--eval-examples") o.eval_examples = parse_number<std::int64_t>(flag, value());
    else if (flag == "--noise") o.noise = parse_number<double>(flag, value());
    else if (flag == "--seed") o.seed = parse_number<std::uint64_t>(flag, value());
    else if (flag == "--data") o.data = value();
    else if (flag == "--write-data") o.write_data = value();
    else if (flag == "--batch") o.batch = parse_number<std::int64_t>(flag, value());
    else if (flag == "--lr") o.lr = parse_number<double>(flag, value());
    else if (flag == "--init-scale") o.init_scale = parse_number<double>(flag, value());
    else if (flag == "--warmup-steps") o.warmup_steps = parse_number<std::int64_t>(flag, value());
    else if (flag == "--progress-every") o.progress_every = parse_number<std::int64_t>(flag, value());
    else if (flag == "--target") o.target = parse_number<double>(flag, value());
    else if (flag == "--kill-worker") o.kill_worker = parse_number<int>(flag, value());
    else if (flag == "--kill-at-step") o.kill_at_step = parse_number<std::int64_t>(flag, value());
    else if (flag == "--wait-for-workers") o.wait_for_workers = parse_number<double>(flag, value());
    else if (flag == "--report-json") o.report_json = true;
    else if (flag == "--help" || flag == "-h") throw UsageError("");
    else throw UsageError(fmt::format("unknown argument '{}'", flag));
  }
  auto positive = [](std::string_view flag, auto v) {
    if (!(v > 0)) throw UsageError(fmt::format("{}: {} must be positive", flag, v));
  };
  positive("--users", o.users);
  positive("--items", o.items);
  positive("--dim", o.dim);
  positive("--examples", o.examples);
  positive("--eval-examples", o.eval_examples);
  positive("--batch", o.batch);
  positive("--lr", o.lr);
  positive("--init-scale", o.init_scale);
  positive("--progress-every", o.progress_every);
  positive("--target", o.target);
  if (!(o.noise >= 0)) throw UsageError(fmt::format("--noise: {} is negative", o.noise));
  if (o.warmup_steps < 0) throw UsageError(fmt::format("--warmup-steps: {} is negative", o.warmup_steps));
  if (o.examples / o.batch <= o.warmup_steps) {
    throw UsageError(fmt::format("--examples {} gives {} steps of {}: not more than the {} warm-up steps", o.examples,
                                 o.examples / o.batch, o.batch, o.warmup_steps));
  }
  if (!(o.wait_for_workers >= 0)) throw UsageError(fmt::format("--wait-for-workers: {} is negative", o.wait_for_workers));
  if ((o.kill_worker >= 0) != (o.kill_at_step > 0)) {
    throw UsageError("--kill-worker and --kill-at-step go together (a worker index and a step count >= 1)");
  }
  if (!o.data.empty() && !o.write_data.empty()) throw UsageError("--data and --write-data exclude each other");
  return o;
}

// ---------------------------------------------------------------------------------------------
// The hidden model and its examples: a function of (seed, what, index), the same in every process.

std::uint64_t mix(std::uint64_t seed, std::uint64_t what, std::uint64_t index) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL ^ what * 0xc2b2ae3d27d4eb4fULL ^ index * 0x165667b19e3779f9ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double unit(std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
double normal(std::uint64_t seed, std::uint64_t what, std::uint64_t index) {
  return std::sqrt(-2.0 * std::log(unit(mix(seed, what, 2 * index)))) * std::cos(6.283185307179586 * unit(mix(seed, what, 2 * index + 1)));
}

/// Labels come from: sum_k u*[user][k] * v*[item][k] * w*[k] + 0.5 + noise over the first quarter
/// of the D components (a model of width D has room to spare: a hidden model as wide as the model, or
/// half as wide, left it local minima that miss a component, 2-8% above the truth run to run), with
/// u* and v* standard normal and w* normal of variance 1 / (D / 4): the signal's variance is about 1
/// for any D.
struct HiddenModel {
  std::uint64_t seed;
  std::int64_t dim;
  double noise;
  enum Stream : std::uint64_t { kUser = 1, kItem, kWeight, kTrainPick, kEvalPick, kTrainNoise, kEvalNoise };

  std::int64_t rank() const { return std::max<std::int64_t>(1, dim / 4); }
  double truth(std::int64_t user, std::int64_t item) const {
    double s = 0.5;
    for (std::int64_t k = 0; k < rank(); ++k) {
      const auto u = static_cast<std::uint64_t>(user * dim + k), v = static_cast<std::uint64_t>(item * dim + k);
      s += normal(seed, kUser, u) * normal(seed, kItem, v) * normal(seed, kWeight, static_cast<std::uint64_t>(k)) /
           std::sqrt(static_cast<double>(rank()));
    }
    return s;
  }
};

struct Record {
  std::int64_t user, item;
  float label;
};

/// Example `index` of the training (or held-out) stream.
Record example(const HiddenModel& m, const Options& o, bool eval, std::uint64_t index) {
  const auto pick = mix(m.seed, eval ? HiddenModel::kEvalPick : HiddenModel::kTrainPick, index);
  const auto user = static_cast<std::int64_t>(pick % static_cast<std::uint64_t>(o.users));
  const auto item = static_cast<std::int64_t>((pick >> 32) % static_cast<std::uint64_t>(o.items));
  const double noise = o.noise * normal(m.seed, eval ? HiddenModel::kEvalNoise : HiddenModel::kTrainNoise, index);
  return {user, item, static_cast<float>(m.truth(user, item) + noise)};
}

constexpr std::size_t kRecordBytes = 20;  // int64, int64, float32, packed little-endian

void put_record(std::vector<char>& out, const Record& r) {
  char b[kRecordBytes];
  std::memcpy(b, &r.user, 8);
  std::memcpy(b + 8, &r.item, 8);
  std::memcpy(b + 16, &r.label, 4);
  out.insert(out.end(), b, b + kRecordBytes);
}
Record get_record(const char* b) {
  Record r{};
  std::memcpy(&r.user, b, 8);
  std::memcpy(&r.item, b + 8, 8);
  std::memcpy(&r.label, b + 16, 4);
  return r;
}

std::vector<char> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot open {}", path.string()));
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

/// --write-data: train.bin, eval.bin and meta.json from the hidden model.
int write_data(const Options& o) {
  const HiddenModel m{o.seed, o.dim, o.noise};
  std::filesystem::create_directories(o.write_data);
  double truth_loss = 0;
  for (const bool eval : {false, true}) {
    const std::int64_t n = eval ? o.eval_examples : o.examples;
    std::ofstream out(std::filesystem::path(o.write_data) / (eval ? "eval.bin" : "train.bin"), std::ios::binary);
    std::vector<char> chunk;
    for (std::int64_t i = 0; i < n; ++i) {
      const Record r = example(m, o, eval, static_cast<std::uint64_t>(i));
      if (eval) truth_loss += std::pow(r.label - m.truth(r.user, r.item), 2);
      put_record(chunk, r);
      if (chunk.size() >= (std::size_t{1} << 22) || i + 1 == n) {
        out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        chunk.clear();
      }
    }
    if (!out) throw std::runtime_error(fmt::format("cannot write to {}", o.write_data));
  }
  truth_loss /= static_cast<double>(o.eval_examples);
  std::ofstream(std::filesystem::path(o.write_data) / "meta.json")
      << boost::json::serialize(boost::json::object{{"users", o.users},
                                                    {"items", o.items},
                                                    {"dim", o.dim},
                                                    {"train_examples", o.examples},
                                                    {"eval_examples", o.eval_examples},
                                                    {"noise_std", o.noise},
                                                    {"truth_eval_loss", truth_loss}});
  fmt::print("wrote {} training and {} held-out examples ({} users x {} items, D {}, noise {}) to {}; truth loss {:.5f}\n",
             o.examples, o.eval_examples, o.users, o.items, o.dim, o.noise, o.write_data, truth_loss);
  return 0;
}

/// What meta.json says of --data.
struct DataInfo {
  std::int64_t users, items, dim, train_examples, eval_examples;
  double truth_loss;
};
DataInfo read_meta(const std::string& dir) {
  const auto text = read_file(std::filesystem::path(dir) / "meta.json");
  const auto meta = boost::json::parse(std::string_view(text.data(), text.size())).as_object();
  return {meta.at("users").to_number<std::int64_t>(),          meta.at("items").to_number<std::int64_t>(),
          meta.at("dim").to_number<std::int64_t>(),            meta.at("train_examples").to_number<std::int64_t>(),
          meta.at("eval_examples").to_number<std::int64_t>(), meta.at("truth_eval_loss").to_number<double>()};
}

// ---------------------------------------------------------------------------------------------
// What runs on the workers. Every task parses the same command line (the launcher passes it to
// all), so a worker knows the data and the batch size without being sent them.

Options g_options;  // set in main() before any Server starts

struct Batch {
  std::vector<std::int64_t> users, items;
  std::vector<float> labels;
};

/// This worker's examples from --data: records w, w + workers, w + 2 workers, ... of train.bin.
const std::vector<Record>& file_shard(int workers, int worker) {
  static std::once_flag once;
  static std::vector<Record> shard;
  std::call_once(once, [&] {
    const auto bytes = read_file(std::filesystem::path(g_options.data) / "train.bin");
    for (std::size_t at = static_cast<std::size_t>(worker) * kRecordBytes; at + kRecordBytes <= bytes.size();
         at += static_cast<std::size_t>(workers) * kRecordBytes) {
      shard.push_back(get_record(bytes.data() + at));
    }
  });
  return shard;
}

/// Each worker's input pipeline (TF: dataset_fn for create_per_worker_dataset): batches of its own
/// examples, forever (the coordinator decides how many steps run).
ds::data::Dataset<Batch> training_batches(const ds::InputContext& ctx) {
  const auto batch = g_options.batch;
  const int workers = ctx.num_input_pipelines, worker = ctx.input_pipeline_id;
  auto fill = [batch](auto&& record_at) {
    Batch b;
    for (std::int64_t j = 0; j < batch; ++j) {
      const Record r = record_at(j);
      b.users.push_back(r.user);
      b.items.push_back(r.item);
      b.labels.push_back(r.label);
    }
    return b;
  };
  if (!g_options.data.empty()) {
    const std::int64_t per_pass = static_cast<std::int64_t>(file_shard(workers, worker).size()) / batch;
    if (per_pass == 0) throw std::runtime_error(fmt::format("worker {}: fewer examples in its shard than a batch", worker));
    return ds::data::range(0, per_pass).repeat().map([fill, batch, workers, worker](std::int64_t step) {
      const auto& shard = file_shard(workers, worker);
      return fill([&](std::int64_t j) { return shard[static_cast<std::size_t>(step * batch + j)]; });
    });
  }
  const HiddenModel model{g_options.seed, g_options.dim, g_options.noise};
  return ds::data::range(0, std::numeric_limits<std::int64_t>::max()).map([=](std::int64_t step) {
    return fill([&](std::int64_t j) {  // the training stream dealt out to the workers in turn
      return example(model, g_options, false, static_cast<std::uint64_t>((step * batch + j) * workers + worker));
    });
  });
}
DISTRIBUTE_REMOTE_FUNCTION(training_batches);

using Table = ds::ShardedVariable<ds::Tensor<float>>;
using Dense = ds::Variable<ds::Tensor<float>>;  // w (D) then b

/// The predictions of `dense` on the looked-up rows (B x D each), and the gradients of the batch's
/// sum of squared errors: d/du, d/dv (B x D) and d/ddense (D + 1). Returns the mean squared error.
double forward_backward(const ds::Tensor<float>& u, const ds::Tensor<float>& v, const ds::Tensor<float>& dense,
                        const std::vector<float>& labels, ds::Tensor<float>* gu, ds::Tensor<float>* gv,
                        ds::Tensor<float>* gdense) {
  const auto n = static_cast<std::int64_t>(labels.size()), d = u.shape()[1];
  double loss = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* ui = u.data() + i * d;
    const float* vi = v.data() + i * d;
    float s = dense[static_cast<std::size_t>(d)];
    for (std::int64_t k = 0; k < d; ++k) s += ui[k] * vi[k] * dense[static_cast<std::size_t>(k)];
    const float e = s - labels[static_cast<std::size_t>(i)];
    loss += static_cast<double>(e) * e;
    if (!gu) continue;
    const float g = 2.0f * e;  // d e^2 / d s
    float* gui = gu->data() + i * d;
    float* gvi = gv->data() + i * d;
    for (std::int64_t k = 0; k < d; ++k) {
      const float w = dense[static_cast<std::size_t>(k)];
      gui[k] = g * vi[k] * w;
      gvi[k] = g * ui[k] * w;
      (*gdense)[static_cast<std::size_t>(k)] += g * ui[k] * vi[k];
    }
    (*gdense)[static_cast<std::size_t>(d)] += g;
  }
  return loss / static_cast<double>(n);
}

/// One asynchronous step on the next batch of this worker's examples; returns its mean squared error.
float train_step(ds::PerWorkerIterator<Batch> batches, Table users, Table items, Dense dense, ds::optimizers::Adagrad opt) {
  const Batch b = batches.get_next();
  const auto n = static_cast<std::int64_t>(b.labels.size()), d = users.shape()[1];
  const ds::Tensor<float> u = users.embedding_lookup(b.users), v = items.embedding_lookup(b.items);
  const ds::Tensor<float> w = dense.read_value();
  ds::Tensor<float> gu = ds::Tensor<float>::zeros({n, d}), gv = ds::Tensor<float>::zeros({n, d});
  ds::Tensor<float> gw = ds::Tensor<float>::zeros({d + 1});
  const double loss = forward_backward(u, v, w, b.labels, &gu, &gv, &gw);
  // Recorded by the worker and committed to the ps tasks when the step returns: the rows (summed
  // per distinct id) and the dense gradient, each applied by the ps task that holds it.
  opt.apply_gradients(users, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(b.users, std::move(gu), users.shape()));
  opt.apply_gradients(items, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(b.items, std::move(gv), items.shape()));
  opt.apply_gradients(dense, gw);
  ps_tasks::maybe_die_in_step(g_options.kill_worker, g_options.kill_at_step);
  return static_cast<float>(loss);
}
DISTRIBUTE_REMOTE_FUNCTION(train_step);

// ---------------------------------------------------------------------------------------------
// The coordinator

/// The sum of a counter over a task's /metrics (Prometheus text): how an operator scrapes it.
double scrape_counter(const std::string& address, std::string_view name) {
  namespace http = boost::beast::http;
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  boost::asio::ip::tcp::socket socket(io);
  const auto colon = address.rfind(':');
  boost::asio::connect(socket, resolver.resolve(address.substr(0, colon), address.substr(colon + 1)));
  http::request<http::empty_body> req{http::verb::get, "/metrics", 11};
  req.set(http::field::host, address);
  http::write(socket, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  double total = 0;
  std::string_view text = res.body();
  for (std::size_t at = 0; (at = text.find(name, at)) != std::string_view::npos; at += name.size()) {
    if ((at > 0 && text[at - 1] != '\n') || text.substr(at + name.size(), 1) != "{") continue;
    const auto end = text.find('\n', at);
    const auto line = text.substr(at, end - at);
    total += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
  }
  return total;
}

/// Bytes the ps tasks have sent and received on their connections, all together.
double ps_traffic(const ds::ClusterSpec& spec) {
  double total = 0;
  for (int t = 0; t < spec.num_tasks("ps"); ++t) {
    total += scrape_counter(spec.task_address("ps", t), "distribute_wire_bytes_sent_total") +
             scrape_counter(spec.task_address("ps", t), "distribute_wire_bytes_received_total");
  }
  return total;
}

/// The mean squared error of the model the ps tasks hold now on `records`, looked up in chunks.
double held_out_loss(const std::vector<Record>& records, Table& users, Table& items, Dense& dense) {
  const ds::Tensor<float> w = dense.read_value();
  double total = 0;
  constexpr std::size_t kChunk = 8192;
  for (std::size_t at = 0; at < records.size(); at += kChunk) {
    const std::size_t n = std::min(kChunk, records.size() - at);
    std::vector<std::int64_t> u(n), v(n);
    std::vector<float> labels(n);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = records[at + i].user;
      v[i] = records[at + i].item;
      labels[i] = records[at + i].label;
    }
    total += forward_backward(users.embedding_lookup(u), items.embedding_lookup(v), w, labels, nullptr, nullptr, nullptr) *
             static_cast<double>(n);
  }
  return total / static_cast<double>(records.size());
}

int coordinate(Options o, std::shared_ptr<ds::ClusterResolver> resolver) {
  // The held-out examples and what the hidden model loses on them.
  std::vector<Record> held_out;
  double truth_loss = 0;
  if (!o.data.empty()) {
    const DataInfo info = read_meta(o.data);
    o.users = info.users, o.items = info.items, o.dim = info.dim, truth_loss = info.truth_loss;
    const auto bytes = read_file(std::filesystem::path(o.data) / "eval.bin");
    for (std::size_t at = 0; at + kRecordBytes <= bytes.size(); at += kRecordBytes) held_out.push_back(get_record(bytes.data() + at));
  } else {
    const HiddenModel m{o.seed, o.dim, o.noise};
    for (std::int64_t i = 0; i < o.eval_examples; ++i) {
      held_out.push_back(example(m, o, true, static_cast<std::uint64_t>(i)));
      truth_loss += std::pow(held_out.back().label - m.truth(held_out.back().user, held_out.back().item), 2);
    }
    truth_loss /= static_cast<double>(held_out.size());
  }

  // Each table split in as many shards as there are ps tasks; the dense part is not split.
  ds::ParameterServerStrategy strategy(resolver, ds::FixedShardsPartitioner(resolver->cluster_spec().num_tasks("ps")));
  ds::CoordinatorOptions coordinator_options;
  coordinator_options.log = [](std::string_view line) { fmt::print("coordinator: {}\n", line); };
  ds::ClusterCoordinator coordinator(strategy, coordinator_options);
  const ds::optimizers::Adagrad opt{.learning_rate = o.lr, .initial_accumulator_value = 0.1, .epsilon = 1e-7};
  auto scope = strategy.scope();
  const auto start_tables = std::chrono::steady_clock::now();
  Table users({o.users, o.dim}, ds::Initializer::random_uniform(-o.init_scale, o.init_scale, o.seed), {.name = "user_embedding"});
  Table items({o.items, o.dim}, ds::Initializer::random_uniform(-o.init_scale, o.init_scale, o.seed + 1),
              {.name = "item_embedding"});
  // w as Keras's Dense(1) starts (Glorot uniform), b = 0.
  ds::Tensor<float> w0 = ds::Tensor<float>::zeros({o.dim + 1});
  const double glorot = std::sqrt(6.0 / static_cast<double>(o.dim + 1));
  ds::Initializer::random_uniform(-glorot, glorot, o.seed + 2)
      .fill(ds::DType::F32, std::as_writable_bytes(std::span(w0.data(), static_cast<std::size_t>(o.dim))));
  Dense dense(w0, {.name = "dense"});
  opt.build(users);
  opt.build(items);
  opt.build(dense);
  const double tables_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_tables).count();
  const std::int64_t steps = o.examples / o.batch;
  fmt::print("recommender: {} ps, {} workers; {} users x {} items, D {}: tables {} and {} in {} shards each on {}, "
             "made by the ps tasks in {:.1f} s\n",
             strategy.num_ps(), strategy.num_workers(), o.users, o.items, o.dim, users.name(), items.name(),
             users.num_shards(), fmt::join(users.devices(), ", "), tables_s);
  fmt::print("training: {} steps of {} examples ({}), Adagrad lr {}; held-out loss before {:.4f}, truth loss {:.4f}\n",
             steps, o.batch, o.data.empty() ? "generated on the workers" : "from " + o.data, o.lr,
             held_out_loss(held_out, users, items, dense), truth_loss);

  const auto batches = ds::iter(coordinator.create_per_worker_dataset(&training_batches));
  std::vector<ds::RemoteValue<float>> losses;
  losses.reserve(static_cast<std::size_t>(steps));
  auto schedule = [&](std::int64_t n) {
    for (std::int64_t s = 0; s < n; ++s) losses.push_back(coordinator.schedule(&train_step, batches, users, items, dense, opt));
  };
  schedule(o.warmup_steps);
  coordinator.join();
  const double bytes_before = o.report_json ? ps_traffic(resolver->cluster_spec()) : 0;
  const auto start = std::chrono::steady_clock::now();
  auto steps_completed = [&] {
    const auto per_worker = coordinator.closures_completed_per_worker();
    return std::accumulate(per_worker.begin(), per_worker.end(), std::uint64_t{0});
  };
  auto last = start;
  std::uint64_t last_completed = steps_completed();
  std::int64_t last_step = o.warmup_steps;
  for (std::int64_t s = o.warmup_steps; s < steps; s += o.progress_every) {
    schedule(std::min(o.progress_every, steps - s));
    // The steps of the chunk before this one are done or nearly: report them, and the rate at
    // which steps completed since the last report.
    const std::int64_t done = s;
    if (done - last_step < o.progress_every) continue;
    double sum = 0;
    for (std::int64_t k = last_step; k < done; ++k) sum += losses[static_cast<std::size_t>(k)].get();
    const auto now = std::chrono::steady_clock::now();
    const std::uint64_t now_completed = steps_completed();
    fmt::print("step {:>8}/{}  train loss {:.4f}  {:>9.0f} examples/s  workers up {}/{}  steps retried {}\n", done, steps,
               sum / static_cast<double>(done - last_step),
               static_cast<double>((now_completed - last_completed) * static_cast<std::uint64_t>(o.batch)) /
                   std::chrono::duration<double>(now - last).count(),
               coordinator.num_workers_up(), coordinator.num_workers(), coordinator.closures_retried());
    last = now;
    last_completed = now_completed;
    last_step = done;
  }
  coordinator.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes_per_step =
      o.report_json ? (ps_traffic(resolver->cluster_spec()) - bytes_before) / static_cast<double>(steps - o.warmup_steps) : 0;
  if (o.wait_for_workers > 0 && coordinator.num_workers_up() < coordinator.num_workers()) {
    ps_tasks::wait_for_workers(coordinator, o.wait_for_workers);
  }
  double tail = 0;
  const std::int64_t tail_steps = std::min<std::int64_t>(steps - last_step, o.progress_every);
  for (std::int64_t k = steps - tail_steps; k < steps; ++k) tail += losses[static_cast<std::size_t>(k)].get();
  const double loss = held_out_loss(held_out, users, items, dense);
  const double examples_per_s = static_cast<double>((steps - o.warmup_steps) * o.batch) / seconds;
  fmt::print("done: {} steps in {:.1f} s, {:.0f} examples/s; last steps' train loss {:.4f}; held-out loss {:.4f}, truth "
             "loss {:.4f} ({:+.1f}%); steps retried {}\n",
             steps, seconds, examples_per_s, tail / static_cast<double>(tail_steps), loss, truth_loss,
             100.0 * (loss / truth_loss - 1.0), coordinator.closures_retried());
  const auto completed = coordinator.closures_completed_per_worker();
  fmt::print("steps per worker: {}\n", fmt::join(completed, " "));
  coordinator.shutdown_cluster();  // the ps and worker tasks' Server::join() return
  if (o.report_json) {
    fmt::print("RESULT {}\n", boost::json::serialize(boost::json::object{
                                  {"examples", (steps - o.warmup_steps) * o.batch},
                                  {"seconds", seconds},
                                  {"examples_per_s", examples_per_s},
                                  {"eval_loss", loss},
                                  {"bytes_per_step", bytes_per_step},
                                  {"truth_eval_loss", truth_loss}}));
    return 0;
  }
  if (!(loss <= truth_loss * (1.0 + o.target))) {
    fmt::print(stderr, "recommender: held-out loss {:.4f} is not within {}% of the truth loss {:.4f}\n", loss,
               100.0 * o.target, truth_loss);
    return cli::kExitBelowTarget;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_main("recommender", kUsage, [&] {
    g_options = parse_args(argc, argv);
    if (!g_options.write_data.empty()) return write_data(g_options);
    return ps_tasks::run_task([](std::shared_ptr<ds::TFConfigClusterResolver> resolver) {
      return coordinate(g_options, std::move(resolver));
    });
  });
}
