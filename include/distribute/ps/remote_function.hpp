// Remote functions: what a ClusterCoordinator schedules on workers. Every process of the cluster
// runs the same binary and registers the same functions by name at start-up; the coordinator sends
// the name, a signature and the serialised arguments, and the worker calls its own copy.
//
//   float train_step(ds::Variable<float> w, ds::PerWorkerIterator<Batch> it) { ... }
//   DISTRIBUTE_REMOTE_FUNCTION(train_step);          // at namespace scope, in every process
//
// Arguments and results are serialised with cereal (scalars, strings, std::vector, std::array,
// std::pair/tuple, std::optional, ...); ds::Tensor travels as shape + raw bytes, another tensor type
// (torch::Tensor, DLPack, Eigen, xtensor) as dtype + shape + row-major bytes; a ds::Variable or
// ds::ShardedVariable placed on ps tasks travels as a handle (the worker reads and updates the ps
// copy); a ds::PerWorkerIterator travels as its dataset's id and reads the worker's own iterator.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <fmt/format.h>

#include <distribute/core/host_operands.hpp>
#include <distribute/core/type_name.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/tensor_traits.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/core/variable.hpp>
#include <distribute/data/dataset.hpp>
#include <distribute/data/input_context.hpp>
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/sharded_variable.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <class T>
class PerWorkerIterator;

namespace half_bits {
// cereal: the library's own 16-bit floats (in a std::vector, a std::array, ...) as their bits.
template <class Archive, class Traits>
void save(Archive& a, const float16_storage<Traits>& h) {
  a(h.bits());
}
template <class Archive, class Traits>
void load(Archive& a, float16_storage<Traits>& h) {
  std::uint16_t b = 0;
  a(b);
  h = float16_storage<Traits>::from_bits(b);
}
}  // namespace half_bits

namespace ps::detail {

using WireOut = cereal::BinaryOutputArchive;
using WireIn = WireReader;  // checks every length read against the bytes left

/// One element of a per-worker dataset, pulled by the closures that run on this worker.
template <class T>
class WorkerIteratorState {
 public:
  explicit WorkerIteratorState(data::Dataset<T> dataset) : dataset_(std::move(dataset)) {}
  std::optional<T> next() {
    std::lock_guard lock(mutex_);
    if (!it_) it_.emplace(dataset_.begin());
    if (*it_ == dataset_.end()) return std::nullopt;
    T v = std::move(**it_);
    ++*it_;
    return v;
  }

 private:
  data::Dataset<T> dataset_;
  std::optional<typename data::Dataset<T>::iterator> it_;
  std::mutex mutex_;
};

/// What a worker turns handles back into: its ps client and its per-worker datasets. Set on the
/// thread that runs a closure.
/// The ps variable handles a worker decoded before, by variable and type. Closures name the same
/// variables again and again, and a handle holds a value of its variable's dtype and shape: built
/// once, not allocated and zero-filled for every closure. Thread-safe.
class HandleCache {
 public:
  template <class H, class Make>
  H get(const std::string& key, Make&& make) {
    std::lock_guard lock(mutex_);
    if (auto it = handles_.find(key); it != handles_.end()) return *std::static_pointer_cast<H>(it->second);
    auto h = std::make_shared<H>(make());
    if (handles_.size() < kMaxHandles) handles_.emplace(key, h);
    return *h;
  }

 private:
  static constexpr std::size_t kMaxHandles = 4096;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<void>> handles_;
};

struct WorkerEnvironment {
  std::shared_ptr<core::RemoteVariableStore> store;
  std::function<std::shared_ptr<void>(std::uint64_t dataset_id)> dataset_iterator;
  std::string worker_name;
  HandleCache* handles = nullptr;  // the worker's, when it keeps them
};

inline WorkerEnvironment*& current_worker_environment() {
  thread_local WorkerEnvironment* env = nullptr;
  return env;
}

template <class T>
struct is_dataset : std::false_type {};
template <class T>
struct is_dataset<data::Dataset<T>> : std::true_type {};

/// How a value crosses the wire; cereal unless specialised below.
template <class T>
struct wire {
  static void save(WireOut& a, const T& v) { a(v); }
  static T load(WireIn& a) {
    T v{};
    a(v);
    return v;
  }
};

/// A tensor's elements as raw bytes (any element type, 16-bit floats included), after their length.
inline void save_elements(WireOut& a, const void* data, std::size_t bytes) {
  a(static_cast<std::uint64_t>(bytes));
  if (bytes) a(cereal::binary_data(data, bytes));
}
/// Reads the length that precedes a tensor's elements and checks it, before anything is allocated:
/// it must be what the shape holds, and that many bytes must be there.
inline void expect_elements(WireIn& a, std::size_t bytes, const char* what) {
  std::uint64_t sent = 0;
  a(sent);
  if (sent != bytes) {
    throw InvalidArgument(fmt::format("{}: {} bytes of elements arrived for a shape that holds {}", what, sent, bytes));
  }
  if (bytes > a.remaining()) {
    throw InvalidArgument(fmt::format("{}: {} bytes of elements claimed, {} left in the message", what, bytes, a.remaining()));
  }
}
inline void load_elements(WireIn& a, void* data, std::size_t bytes) {
  if (bytes) a(cereal::binary_data(data, bytes));
}

template <class E>
struct wire<Tensor<E>> {
  static void save(WireOut& a, const Tensor<E>& t) {
    a(t.shape());
    save_elements(a, t.data(), t.size() * sizeof(E));
  }
  static Tensor<E> load(WireIn& a) {
    Shape shape;
    a(shape);
    const std::size_t bytes = checked_byte_size(shape, sizeof(E), "a ds::Tensor argument");
    expect_elements(a, bytes, "a ds::Tensor argument");
    Tensor<E> t = Tensor<E>::zeros(std::move(shape));
    load_elements(a, t.data(), bytes);
    return t;
  }
};

template <class T>
inline constexpr bool is_library_tensor_v = false;
template <class E>
inline constexpr bool is_library_tensor_v<Tensor<E>> = true;

/// Tensor values that travel as dtype, shape and row-major bytes: those whose dtype is known at
/// run time (torch::Tensor, DLPack), and host values of other libraries that cereal cannot save
/// (Eigen, xtensor; strided layouts included). std::vector, std::array and scalars keep cereal's form.
template <class T>
concept WireTensor = !is_library_tensor_v<T> && !is_view_v<T> &&
                     (DynamicTensorLike<T> ||
                      (StaticTensorLike<T> && memory_space_v<T> == MemorySpace::host &&
                       !cereal::traits::is_output_serializable<T, WireOut>::value));

template <WireTensor T>
struct wire<T> {
  static void save(WireOut& a, const T& v) {
    core::HostOperands in("a remote function's argument");
    in.add(view_of(v), true);
    a(static_cast<std::uint8_t>(in[0].dtype), in[0].shape);
    save_elements(a, in[0].data, in[0].bytes());
  }
  static T load(WireIn& a) {
    std::uint8_t code = 0;
    Shape shape;
    a(code, shape);
    if (!is_dtype_code(code)) throw InvalidArgument(fmt::format("a tensor argument has an unknown dtype code {}", code));
    const auto dtype = static_cast<DType>(code);
    const std::size_t bytes = checked_byte_size(shape, size_of(dtype), "a tensor argument");
    expect_elements(a, bytes, "a tensor argument");
    core::RowMajorResult<T> out;
    load_elements(a, out.allocate(dtype, shape), bytes);
    return out.take();
  }
};

template <class T>
struct wire<Variable<T>> {
  static void save(WireOut& a, const Variable<T>& v) {
    const core::RemoteHandle* h = v.remote_handle();
    if (!h) {
      throw InvalidArgument(fmt::format("variable '{}' is not on a ps task: only variables created inside "
                                        "ParameterServerStrategy::scope() can be passed to a scheduled function",
                                        v.name()));
    }
    a(v.name(), v.shape(), static_cast<std::uint8_t>(v.dtype()), h->task, h->key);
  }
  static Variable<T> load(WireIn& a) {
    std::string name, key;
    Shape shape;
    std::uint8_t code = 0;
    int task = 0;
    a(name, shape, code, task, key);
    if (!is_dtype_code(code)) {
      throw InvalidArgument(fmt::format("variable '{}' arrived with an unknown dtype code {}", name, code));
    }
    WorkerEnvironment* env = current_worker_environment();
    if (!env || !env->store) {
      throw InvalidArgument(fmt::format("variable '{}' arrived outside a worker: ps variable handles are read by the "
                                        "worker that runs a scheduled function",
                                        name));
    }
    checked_byte_size(shape, size_of(static_cast<DType>(code)), "a ps variable handle");
    if constexpr (StaticTensorLike<T>) {
      if (static_cast<DType>(code) != dtype_of<element_t<T>>()) {
        throw InvalidArgument(fmt::format("variable '{}' arrived as {}, but the function takes it as a variable of {}",
                                          name, to_string(static_cast<DType>(code)), to_string(dtype_of<element_t<T>>())));
      }
    }
    auto make = [&] {
      return Variable<T>::attach_remote(name, static_cast<DType>(code), shape, core::RemoteHandle{env->store, task, key});
    };
    if (!env->handles) return make();
    return env->handles->get<Variable<T>>(
        fmt::format("{}\n{}\n{}\n{}\n{}\n{}", typeid(T).name(), task, key, code, shape_string(shape), name), make);
  }
};

template <class T>
struct wire<ShardedVariable<T>> {
  static void save(WireOut& a, const ShardedVariable<T>& v) {
    a(v.name(), static_cast<std::uint64_t>(v.num_shards()));
    for (const auto& shard : v.variables()) wire<Variable<T>>::save(a, shard);
  }
  static ShardedVariable<T> load(WireIn& a) {
    std::string name;
    std::uint64_t n = 0;
    a(name, n);
    if (n == 0 || n > (1u << 20)) throw InvalidArgument(fmt::format("sharded variable '{}' arrived with {} shards", name, n));
    std::vector<Variable<T>> shards;
    for (std::uint64_t i = 0; i < n; ++i) shards.push_back(wire<Variable<T>>::load(a));
    return ShardedVariable<T>(std::move(shards), std::move(name));
  }
};

template <class T>
struct wire<PerWorkerIterator<T>> {
  static void save(WireOut& a, const PerWorkerIterator<T>& it) { a(it.dataset_id()); }
  static PerWorkerIterator<T> load(WireIn& a) {
    std::uint64_t id = 0;
    a(id);
    WorkerEnvironment* env = current_worker_environment();
    if (!env || !env->dataset_iterator) {
      throw InvalidArgument("a per-worker iterator arrived outside a worker: it is read by the worker that runs a "
                            "scheduled function");
    }
    auto state = std::static_pointer_cast<WorkerIteratorState<T>>(env->dataset_iterator(id));
    return PerWorkerIterator<T>(id, std::move(state));
  }
};

/// cereal writes a stream: this one appends to a string, or only counts (sizing a value first).
class StringSink : public std::streambuf {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  std::size_t size() const noexcept { return size_; }

 protected:
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      ++size_;
      if (out_) out_->push_back(traits_type::to_char_type(c));
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    size_ += static_cast<std::size_t>(n);
    if (out_) out_->append(s, static_cast<std::size_t>(n));
    return n;
  }

 private:
  std::string* out_;
  std::size_t size_ = 0;
};

/// An argument as its parameter type P: itself when it is one (no copy), else converted.
template <class P, class A>
decltype(auto) as_parameter(A&& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, P>) {
    return static_cast<const P&>(a);
  } else {
    return P(std::forward<A>(a));
  }
}

/// The bytes save_values writes for `values`, counted without writing them.
template <class... Ts>
std::size_t saved_size(const Ts&... values) {
  StringSink count(nullptr);
  {
    std::ostream out(&count);
    WireOut a(out);
    (wire<Ts>::save(a, values), ...);
  }
  return count.size();
}

/// Appends the values' wire form to `out`.
template <class... Ts>
void save_values_into(std::string& out, const Ts&... values) {
  StringSink sink(&out);
  std::ostream stream(&sink);
  WireOut a(stream);
  (wire<Ts>::save(a, values), ...);
}

template <class... Ts>
std::string save_values(const Ts&... values) {
  std::string out;
  save_values_into(out, values...);
  return out;
}

/// Loads a tuple in order (braced initialisation evaluates left to right).
template <class... Ts>
std::tuple<Ts...> load_values(std::string_view bytes, const char* what) {
  SpanReadBuffer buffer({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
  std::istream in(&buffer);
  try {
    WireIn a(in);
    return std::tuple<Ts...>{wire<Ts>::load(a)...};
  } catch (const cereal::Exception& e) {
    throw InvalidArgument(fmt::format("malformed {}: {}", what, e.what()));
  } catch (const std::bad_alloc&) {  // a user type's own load that allocates on a length
    throw InvalidArgument(fmt::format("malformed {}: a size beyond memory", what));
  } catch (const std::length_error& e) {
    throw InvalidArgument(fmt::format("malformed {}: a length beyond what a container holds ({})", what, e.what()));
  }
}

/// "(float, int)" from the type of std::tuple<float, int>.
inline std::string parameter_list(const std::type_info& tuple_type) {
  const std::string t = core::type_name(tuple_type);
  const auto open = t.find('<');
  const auto close = t.rfind('>');
  if (open == std::string::npos || close == std::string::npos || close < open) return "(" + t + ")";
  return "(" + t.substr(open + 1, close - open - 1) + ")";
}

struct RemoteFunctionEntry {
  std::string name;
  const void* address = nullptr;
  const std::type_info* params = nullptr;  // std::tuple<decayed parameter types...>
  const std::type_info* result = nullptr;
  std::string signature;                   // the same in every process of one binary
  std::function<std::string(std::string_view args)> invoke;
  std::function<std::shared_ptr<void>(const InputContext&)> make_iterator;  // dataset functions
  std::string describe() const { return fmt::format("{} {}{}", core::type_name(*result), name, parameter_list(*params)); }
};

class RemoteFunctionRegistry {
 public:
  static RemoteFunctionRegistry& instance() {
    static RemoteFunctionRegistry r;
    return r;
  }

  void add(RemoteFunctionEntry e) {
    std::lock_guard lock(mutex_);
    if (e.name.empty()) throw InvalidArgument("register_remote_function: the name is empty");
    if (auto it = by_name_.find(e.name); it != by_name_.end()) {
      if (it->second.address == e.address) return;  // the same function twice: harmless
      throw InvalidArgument(fmt::format("register_remote_function: the name '{}' is already registered for another "
                                        "function ({})",
                                        e.name, it->second.describe()));
    }
    by_address_[e.address] = e.name;
    by_name_.emplace(e.name, std::move(e));
  }

  const RemoteFunctionEntry* find(std::string_view name) const {
    std::lock_guard lock(mutex_);
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : &it->second;
  }

  const RemoteFunctionEntry* find_by_address(const void* address) const {
    std::lock_guard lock(mutex_);
    auto it = by_address_.find(address);
    return it == by_address_.end() ? nullptr : &by_name_.at(it->second);
  }

  std::vector<std::string> names() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [name, e] : by_name_) out.push_back(name);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, RemoteFunctionEntry> by_name_;  // node-based: entries never move
  std::map<const void*, std::string> by_address_;
};

template <class R, class... P>
RemoteFunctionEntry make_remote_entry(std::string name, R (*fn)(P...)) {
  RemoteFunctionEntry e;
  e.name = std::move(name);
  e.address = reinterpret_cast<const void*>(fn);
  e.params = &typeid(std::tuple<std::decay_t<P>...>);
  e.result = &typeid(R);
  e.signature = typeid(R(P...)).name();
  if constexpr (!is_dataset<R>::value) {
    e.invoke = [fn](std::string_view bytes) -> std::string {
      auto args = load_values<std::decay_t<P>...>(bytes, "arguments");
      if constexpr (std::is_void_v<R>) {
        std::apply(fn, args);
        return {};
      } else {
        return save_values<R>(std::apply(fn, args));
      }
    };
  } else {
    e.invoke = [](std::string_view) -> std::string {
      throw InvalidArgument("a dataset function is not scheduled: pass it to create_per_worker_dataset");
    };
    using T = typename R::element_type;
    e.make_iterator = [fn](const InputContext& ctx) -> std::shared_ptr<void> {
      if constexpr (sizeof...(P) == 0) {
        return std::make_shared<WorkerIteratorState<T>>(fn());
      } else if constexpr (sizeof...(P) == 1 && (std::is_same_v<std::decay_t<P>, InputContext> && ...)) {
        return std::make_shared<WorkerIteratorState<T>>(fn(ctx));
      } else {
        throw InvalidArgument("a per-worker dataset function takes no argument or one ds::InputContext");
      }
    };
  }
  return e;
}

}  // namespace ps::detail

/// Registers `fn` under `name` in this process. Every process of the cluster must register the
/// same functions (the same binary does it at start-up). Registering a name twice for different
/// functions is InvalidArgument. Capture-less lambdas work through `+[](...) {...}`.
template <class R, class... P>
void register_remote_function(std::string name, R (*fn)(P...)) {
  ps::detail::RemoteFunctionRegistry::instance().add(ps::detail::make_remote_entry(std::move(name), fn));
}

/// A worker's own iterator over its per-worker dataset, passed to scheduled functions
/// (TF's per-worker iterator). On the coordinator it is only a handle.
template <class T>
class PerWorkerIterator {
 public:
  PerWorkerIterator() = default;
  PerWorkerIterator(std::uint64_t dataset_id, std::shared_ptr<ps::detail::WorkerIteratorState<T>> state)
      : id_(dataset_id), state_(std::move(state)) {}

  /// The next element of this worker's dataset, or nullopt at its end. Only on a worker.
  std::optional<T> next() {
    if (!state_) {
      throw InvalidArgument("PerWorkerIterator::next: the iterator is read inside a scheduled function on a worker");
    }
    return state_->next();
  }
  /// The next element; OutOfRange at the end of the dataset (TF's get_next()).
  T get_next() {
    auto v = next();
    if (!v) throw OutOfRange(fmt::format("per-worker dataset #{}: end of the dataset", id_));
    return std::move(*v);
  }
  std::uint64_t dataset_id() const noexcept { return id_; }

 private:
  std::uint64_t id_ = 0;
  std::shared_ptr<ps::detail::WorkerIteratorState<T>> state_;
};

/// A dataset that every worker builds for itself (ClusterCoordinator::create_per_worker_dataset).
template <class T>
class PerWorkerDataset {
 public:
  explicit PerWorkerDataset(std::uint64_t id) : id_(id) {}
  /// The handle to pass to scheduled functions (TF: iter(per_worker_dataset)).
  PerWorkerIterator<T> iterator() const { return PerWorkerIterator<T>(id_, nullptr); }
  std::uint64_t id() const noexcept { return id_; }

 private:
  std::uint64_t id_;
};

/// TF's `iter(per_worker_dataset)`.
template <class T>
PerWorkerIterator<T> iter(const PerWorkerDataset<T>& d) {
  return d.iterator();
}

DISTRIBUTE_END_NAMESPACE

#define DISTRIBUTE_REMOTE_CONCAT_(a, b) a##b
#define DISTRIBUTE_REMOTE_CONCAT(a, b) DISTRIBUTE_REMOTE_CONCAT_(a, b)
/// Registers a function under its own name at start-up: DISTRIBUTE_REMOTE_FUNCTION(train_step);
#undef DISTRIBUTE_REMOTE_FUNCTION  // the umbrella's stand-in, when it was included before without DISTRIBUTE_WITH_PS
#define DISTRIBUTE_REMOTE_FUNCTION(fn)                                                               \
  [[maybe_unused]] static const bool DISTRIBUTE_REMOTE_CONCAT(distribute_remote_registered_, __LINE__) = \
      (::distribute::register_remote_function(#fn, &fn), true)
