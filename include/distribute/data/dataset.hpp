// Dataset<T>: a lazy, composable, re-iterable input pipeline, as tf.data.Dataset.
//
//   auto ds = data::from_text_files(files)                       // sources
//                 .map([](const std::string& line) { ... })      // transformations
//                 .shuffle(1024, 42).batch(64).prefetch(2);
//   for (const auto& batch : ds) { ... }                         // each loop is a fresh pass
//
// A Dataset is a small value (a shared pointer to an immutable node); a transformation returns
// a new dataset whose node refers to the old one. Nothing runs until the dataset is iterated:
// every range-for builds a fresh chain of iterators from the nodes (see detail/iterator.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/data/detail/batching.hpp>
#include <distribute/data/detail/file_source.hpp>
#include <distribute/data/detail/iterator.hpp>
#include <distribute/data/detail/prefetch.hpp>
#include <distribute/data/options.hpp>
#include <distribute/data/record_file.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data {

template <class T>
class Dataset;

namespace detail {

/// What a dataset knows about itself besides how to iterate it.
struct Metadata {
  Options options;
  /// Set when the pipeline's source reads files: how many (AutoShardPolicy::File shards them).
  std::optional<std::size_t> num_files;
  /// Set by batch(n, drop_remainder=true): every batch has n rows (TF: a static batch dimension).
  /// distribute_datasets_from_function on one worker then drops a final step that would be partial.
  bool static_batch = false;
};

template <class T>
struct Node {
  IteratorFactory<T> factory;
  Metadata metadata;
};

/// The way into a Dataset's node for the sources below and for DistributedDataset.
struct DatasetAccess {
  template <class T>
  static Dataset<T> make(IteratorFactory<T> factory, Metadata metadata) {
    return Dataset<T>(std::make_shared<const Node<T>>(Node<T>{std::move(factory), std::move(metadata)}));
  }
  template <class T>
  static IteratorPtr<T> make_iterator(const Dataset<T>& d, const PipelineContext& ctx) {
    return d.factory()(ctx);
  }
  template <class T>
  static Metadata metadata(const Dataset<T>& d) {
    return d.node_ ? d.node_->metadata : Metadata{};
  }
};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
struct is_tuple_like : std::false_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class... C>
struct is_tuple_like<std::tuple<C...>> : std::true_type {};

template <class F, class T>
constexpr bool map_takes_element = std::is_invocable_v<F&, T&&>;
template <class F, class T>
constexpr bool map_takes_components = [] {
  if constexpr (is_tuple_like<T>::value) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return std::is_invocable_v<F&, std::tuple_element_t<I, T>&&...>;
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else {
    return false;
  }
}();

/// map's function takes the element, or (for pairs and tuples) its components, as TF unpacks them.
template <class F, class T>
decltype(auto) invoke_map(F& fn, T&& element) {
  if constexpr (map_takes_element<F, T>) return fn(std::move(element));
  else return std::apply(fn, std::move(element));
}

// Not std::uniform_int_distribution: its output differs between standard libraries, and a
// seeded shuffle must give the same order on every worker whatever it was built with.
inline std::size_t uniform_index(std::mt19937_64& rng, std::size_t n) { return static_cast<std::size_t>(rng() % n); }

inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct ShuffleState {
  std::uint64_t seed;
  bool reshuffle_each_iteration;
  std::atomic<std::uint64_t> iterations{0};
};

inline std::size_t reserve_hint(std::int64_t n) { return static_cast<std::size_t>(std::min<std::int64_t>(n, 4096)); }

}  // namespace detail

/// A lazy sequence of elements of type T; see the top of this file.
template <class T>
class Dataset {
 public:
  using element_type = T;
  /// What batch() makes of n elements (see detail/batching.hpp).
  using batch_type = detail::batch_t<T>;

  /// An input iterator over one pass of the dataset. An element is pulled from the pipeline when
  /// it is first looked at (compared with end() or dereferenced), not when the iterator is made.
  struct PassSource {
    static constexpr const char* past_the_end = "Dataset iterator: dereferenced past the end of the dataset";
    detail::IteratorPtr<T> stages;
    std::optional<T> next() { return stages->next(); }
  };
  using iterator = detail::PullIterator<T, PassSource>;

  /// An empty dataset.
  Dataset() = default;

  /// A fresh pass over the dataset: sources reopen, shuffles reshuffle, prefetch threads start.
  iterator begin() const { return iterator(PassSource{detail::DatasetAccess::make_iterator(*this, {})}); }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// All elements of one pass (for small datasets and tests).
  std::vector<T> to_vector() const {
    std::vector<T> out;
    for (auto& e : *this) out.push_back(std::move(e));
    return out;
  }

  /// Stacks `batch_size` consecutive elements into one batch (a new axis 0; tuples and pairs
  /// component-wise). The last batch may be smaller, unless `drop_remainder` drops it. Elements
  /// of different shapes in one batch are an InvalidArgument naming both shapes.
  Dataset<batch_type> batch(std::int64_t batch_size, bool drop_remainder = false) const {
    if (batch_size < 1) throw InvalidArgument(fmt::format("batch: batch_size must be at least 1, got {}", batch_size));
    Dataset<batch_type> out = derive<batch_type>([batch_size, drop_remainder](detail::IteratorPtr<T> up) {
      return [up = std::move(up), batch_size, drop_remainder]() mutable -> std::optional<batch_type> {
        std::vector<T> items;
        items.reserve(detail::reserve_hint(batch_size));
        while (static_cast<std::int64_t>(items.size()) < batch_size) {
          auto v = up->next();
          if (!v) break;
          items.push_back(std::move(*v));
        }
        if (items.empty() || (drop_remainder && static_cast<std::int64_t>(items.size()) < batch_size)) {
          return std::nullopt;
        }
        return detail::batch_traits<T>::stack(std::move(items), "batch");
      };
    });
    detail::Metadata m = detail::DatasetAccess::metadata(out);
    m.static_batch = drop_remainder;
    return detail::DatasetAccess::make<batch_type>(out.factory(), std::move(m));
  }

  /// Every `num_shards`-th element, starting at element `index` (TF's shard).
  Dataset shard(std::int64_t num_shards, std::int64_t index) const {
    if (num_shards < 1) throw InvalidArgument(fmt::format("shard: num_shards must be at least 1, got {}", num_shards));
    if (index < 0 || index >= num_shards) {
      throw InvalidArgument(fmt::format("shard: index {} is out of range for {} shards (valid: [0, {}))", index,
                                        num_shards, num_shards));
    }
    return derive<T>([num_shards, index](detail::IteratorPtr<T> up) {
      return [up = std::move(up), num_shards, index, position = std::int64_t{0}]() mutable -> std::optional<T> {
        while (auto v = up->next()) {
          if (position++ % num_shards == index) return v;
        }
        return std::nullopt;
      };
    });
  }

  /// The dataset `count` times over (count < 0: forever). Each repetition is a fresh pass, so a
  /// shuffle before it reshuffles. A pass that yields nothing ends the repetition, so an empty
  /// dataset repeated forever is empty instead of a hang.
  Dataset repeat(std::int64_t count = -1) const {
    auto parent = factory();
    return with_factory<T>([parent, count](const detail::PipelineContext& ctx) {
      return detail::make_iterator<T>([parent, ctx, count, pass = std::int64_t{0}, up = detail::IteratorPtr<T>{},
                                       pass_had_elements = false, done = false]() mutable -> std::optional<T> {
        while (!done) {
          if (!up) {
            if (count >= 0 && pass >= count) break;
            up = parent(ctx);
            pass_had_elements = false;
          }
          if (auto v = up->next()) {
            pass_had_elements = true;
            return v;
          }
          up.reset();
          ++pass;
          if (!pass_had_elements) break;
        }
        done = true;
        return std::nullopt;
      });
    });
  }

  /// Shuffles with a buffer of `buffer_size` elements: each output is drawn uniformly from the
  /// next `buffer_size` inputs (buffer_size ≥ the dataset's size gives a uniform permutation).
  /// The order is a function of `seed` alone (the same on every machine and standard library);
  /// with `reshuffle_each_iteration` each pass of the dataset (each repeat, each range-for) uses
  /// the next order of the seed's sequence. Without a seed, a random one. A multi-worker
  /// distribute_dataset with AutoShardPolicy::Data needs a seed, so that every worker draws the
  /// same order (as in TF).
  Dataset shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const {
    if (buffer_size < 1) {
      throw InvalidArgument(fmt::format("shuffle: buffer_size must be at least 1, got {}", buffer_size));
    }
    auto state = std::make_shared<detail::ShuffleState>();
    state->seed = seed ? *seed : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    state->reshuffle_each_iteration = reshuffle_each_iteration;
    return derive<T>([state, buffer_size](detail::IteratorPtr<T> up) {
      const std::uint64_t pass = state->reshuffle_each_iteration ? state->iterations.fetch_add(1) : 0;
      std::mt19937_64 rng(detail::splitmix64(state->seed ^ detail::splitmix64(pass)));
      std::vector<T> buffer;
      buffer.reserve(detail::reserve_hint(buffer_size));
      return [up = std::move(up), buffer_size, rng, buffer = std::move(buffer),
              upstream_done = false]() mutable -> std::optional<T> {
        while (!upstream_done && static_cast<std::int64_t>(buffer.size()) < buffer_size) {
          auto v = up->next();
          if (!v) {
            upstream_done = true;
            break;
          }
          buffer.push_back(std::move(*v));
        }
        if (buffer.empty()) return std::nullopt;
        std::swap(buffer[detail::uniform_index(rng, buffer.size())], buffer.back());
        std::optional<T> out(std::move(buffer.back()));
        buffer.pop_back();
        return out;
      };
    });
  }

  /// fn(element) for each element; for a pair or tuple element, fn may take its components
  /// (fn(features, label)) as TF unpacks them. Each pass works on its own copy of fn.
  template <class F>
  auto map(F fn) const {
    constexpr bool callable = detail::map_takes_element<F, T> || detail::map_takes_components<F, T>;
    static_assert(callable, "Dataset::map(fn): fn is not callable with the element (or, for a pair or tuple, with "
                            "its components)");
    if constexpr (callable) {
      using R = std::decay_t<decltype(detail::invoke_map(fn, std::declval<T>()))>;
      static_assert(!std::is_void_v<R>, "Dataset::map(fn): fn must return the new element");
      return derive<R>([fn](detail::IteratorPtr<T> up) {
        return [up = std::move(up), fn]() mutable -> std::optional<R> {
          auto v = up->next();
          if (!v) return std::nullopt;
          return std::optional<R>(detail::invoke_map(fn, std::move(*v)));
        };
      });
    }
  }

  /// The first `count` elements (count < 0: all of them).
  Dataset take(std::int64_t count) const {
    return derive<T>([count](detail::IteratorPtr<T> up) {
      return [up = std::move(up), count, taken = std::int64_t{0}]() mutable -> std::optional<T> {
        if (count >= 0 && taken >= count) return std::nullopt;
        auto v = up->next();
        if (v) ++taken;
        return v;
      };
    });
  }

  /// Runs the pipeline so far on a background thread that keeps up to `buffer_size` elements
  /// ready. An exception in the pipeline reaches the consumer after the elements before it;
  /// destroying the iterator (or leaving the loop) stops the thread.
  Dataset prefetch(std::int64_t buffer_size) const {
    if (buffer_size < 1) {
      throw InvalidArgument(fmt::format("prefetch: buffer_size must be at least 1, got {}", buffer_size));
    }
    auto parent = factory();
    return with_factory<T>([parent, buffer_size](const detail::PipelineContext& ctx) -> detail::IteratorPtr<T> {
      return std::make_unique<detail::PrefetchIterator<T>>(parent(ctx), static_cast<std::size_t>(buffer_size));
    });
  }

  /// The same dataset carrying `options` (e.g. the AutoShardPolicy distribute_dataset uses).
  Dataset with_options(Options options) const {
    detail::Metadata m = detail::DatasetAccess::metadata(*this);
    m.options = options;
    return detail::DatasetAccess::make<T>(factory(), std::move(m));
  }

  Options options() const { return detail::DatasetAccess::metadata(*this).options; }

 private:
  friend struct detail::DatasetAccess;
  template <class U>
  friend class Dataset;

  explicit Dataset(std::shared_ptr<const detail::Node<T>> node) : node_(std::move(node)) {}

  /// Makes this dataset's iterator chain (an empty one for the default-constructed dataset).
  detail::IteratorFactory<T> factory() const {
    if (node_) return node_->factory;
    return [](const detail::PipelineContext&) { return detail::make_iterator<T>([] { return std::optional<T>(); }); };
  }

  /// A dataset with this one's metadata and another factory.
  template <class U, class F>
  Dataset<U> with_factory(F factory) const {
    return detail::DatasetAccess::make<U>(detail::IteratorFactory<U>(std::move(factory)),
                                          detail::DatasetAccess::metadata(*this));
  }

  /// A one-input stage: `stage(upstream)` returns the next() of the new stage as a lambda.
  template <class U, class Stage>
  Dataset<U> derive(Stage stage) const {
    auto parent = factory();
    return with_factory<U>([parent, stage](const detail::PipelineContext& ctx) {
      return detail::make_iterator<U>(stage(parent(ctx)));
    });
  }

  std::shared_ptr<const detail::Node<T>> node_;
};

// ---- sources ---------------------------------------------------------------------------------

/// The elements of `values`, in order.
template <class T>
Dataset<T> from_vector(std::vector<T> values) {
  auto shared = std::make_shared<const std::vector<T>>(std::move(values));
  return detail::DatasetAccess::make<T>(
      [shared](const detail::PipelineContext&) {
        return detail::make_iterator<T>([shared, i = std::size_t{0}]() mutable -> std::optional<T> {
          if (i >= shared->size()) return std::nullopt;
          return (*shared)[i++];
        });
      },
      {});
}

/// start, start + step, ... up to (not including) stop, as int64 like TF's range.
DISTRIBUTE_DECL Dataset<std::int64_t> range(std::int64_t start, std::int64_t stop, std::int64_t step = 1);

/// 0, 1, ..., stop - 1.
inline Dataset<std::int64_t> range(std::int64_t stop) { return range(0, stop, 1); }

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL Dataset<std::int64_t> range(std::int64_t start, std::int64_t stop, std::int64_t step) {
  if (step == 0) throw InvalidArgument("range: step must not be 0");
  return detail::DatasetAccess::make<std::int64_t>(
      [start, stop, step](const detail::PipelineContext&) {
        return detail::make_iterator<std::int64_t>([i = start, stop, step]() mutable -> std::optional<std::int64_t> {
          if (step > 0 ? i >= stop : i <= stop) return std::nullopt;
          const std::int64_t v = i;
          i += step;
          return v;
        });
      },
      {});
}
#endif

/// The rows of `value` along axis 0: a Tensor<T> of shape (n, s...) gives n tensors of shape s;
/// a std::vector<T> its elements; a pair or tuple of those the pairs / tuples of their rows (every
/// component must have the same number of rows).
template <class C>
  requires requires { typename detail::unstack_traits<std::decay_t<C>>::element_type; }
auto from_tensor_slices(C&& value) {
  using V = std::decay_t<C>;
  using E = typename detail::unstack_traits<V>::element_type;
  auto shared = std::make_shared<const V>(std::forward<C>(value));
  std::int64_t rows = 0;
  if constexpr (detail::is_tuple_like<V>::value) {
    rows = detail::common_rows(*shared, "from_tensor_slices", std::make_index_sequence<std::tuple_size_v<V>>{});
  } else {
    rows = detail::slice_traits<V>::rows(*shared, "from_tensor_slices");
  }
  return detail::DatasetAccess::make<E>(
      [shared, rows](const detail::PipelineContext&) {
        return detail::make_iterator<E>([shared, rows, i = std::int64_t{0}]() mutable -> std::optional<E> {
          if (i >= rows) return std::nullopt;
          return detail::unstack_traits<V>::row(*shared, i++);
        });
      },
      {});
}

/// The elements a generator yields: `gen` is called until it returns std::nullopt. Each pass
/// calls its own copy of `gen`, so keep the generator's state in its captures to make the
/// dataset re-iterable.
template <class G>
auto from_generator(G gen) {
  using R = std::remove_cvref_t<std::invoke_result_t<G&>>;
  static_assert(detail::is_optional<R>::value,
                "from_generator(gen): gen() must return std::optional<T> (std::nullopt ends the dataset)");
  using T = typename R::value_type;
  return detail::DatasetAccess::make<T>(
      [gen](const detail::PipelineContext&) {
        return detail::make_iterator<T>([g = gen, done = false]() mutable -> std::optional<T> {
          if (done) return std::nullopt;
          std::optional<T> v = g();
          done = !v;
          return v;
        });
      },
      {});
}

namespace detail {

/// A dataset of the units `Reader` reads from `files`, file after file; a file source, so
/// AutoShardPolicy::File can give each worker its files.
template <class Reader>
Dataset<std::string> file_source(std::vector<std::string> files) {
  auto shared = std::make_shared<const std::vector<std::string>>(std::move(files));
  return DatasetAccess::make<std::string>(
      [shared](const PipelineContext& ctx) -> IteratorPtr<std::string> {
        return std::make_unique<FileSourceIterator<Reader>>(shared, ctx);
      },
      {.options = {}, .num_files = shared->size()});
}

}  // namespace detail

/// The lines of text files (CSV, JSON lines, ...) without their line ends, file after file
/// (TF's TextLineDataset). A file source: AutoShardPolicy::File can give each worker its files.
DISTRIBUTE_DECL Dataset<std::string> from_text_files(std::vector<std::string> files);

/// The records of record files (TFRecord format, see record_file.hpp), file after file (TF's
/// TFRecordDataset). A truncated or corrupted record is a DataLossError. A file source.
DISTRIBUTE_DECL Dataset<std::string> from_record_files(std::vector<std::string> files);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL Dataset<std::string> from_text_files(std::vector<std::string> files) {
  return detail::file_source<detail::TextLineReader>(std::move(files));
}

DISTRIBUTE_DECL Dataset<std::string> from_record_files(std::vector<std::string> files) {
  return detail::file_source<RecordReader>(std::move(files));
}
#endif

}  // namespace data
DISTRIBUTE_END_NAMESPACE
