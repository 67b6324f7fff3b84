// One function per conformance area: the case's input (JSON, as driver.py wrote it) in, the
// result (JSON, in the same form as the TensorFlow side's, tf_side.py) out; a distribute::Error
// for a case that distribute refuses.
#pragma once

#define DISTRIBUTE_WITH_ALL
#include <distribute/distribute.hpp>

#include <boost/json.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace conformance {
namespace ds = distribute;
namespace json = boost::json;
using Mirrored = ds::MirroredStrategy<>;

template <class T>
json::value opt(const std::optional<T>& v) {
  return v ? json::value(*v) : json::value(nullptr);
}

// ---- device strings ---------------------------------------------------------------------------

/// tf.DeviceSpec.from_string(s): the five fields and to_string().
inline json::value device_case(const json::value& in) {
  const auto spec = ds::DeviceSpec::parse(std::string(in.as_string()));
  return json::object{{"job", opt(spec.job)},
                      {"replica", opt(spec.replica)},
                      {"task", opt(spec.task)},
                      {"device_type", opt(spec.device_type)},
                      {"device_index", opt(spec.device_index)},
                      {"string", spec.to_string()}};
}

// ---- TF_CONFIG --------------------------------------------------------------------------------

/// TFConfigClusterResolver(): the cluster ({job: {index: address}}), task, RPC layer, master().
inline json::value tf_config_case(const json::value& in) {
  const ds::TFConfigClusterResolver r{std::string_view(in.as_string())};
  json::object cluster;
  const auto& spec = r.cluster_spec();
  for (const auto& job : spec.jobs()) {
    json::object tasks;
    for (int i : spec.task_indices(job)) tasks[std::to_string(i)] = spec.task_address(job, i);
    cluster[job] = std::move(tasks);
  }
  return json::object{{"cluster", std::move(cluster)},
                      {"task_type", r.task_type()},
                      {"task_id", r.task_id()},
                      {"rpc_layer", r.rpc_layer()},
                      {"master", r.master()}};
}

// ---- partitioners -----------------------------------------------------------------------------

inline ds::DType dtype_named(const json::value& v) {
  for (std::uint8_t code = 0; code < ds::kNumDTypes; ++code) {
    if (ds::to_string(static_cast<ds::DType>(code)) == v.as_string()) return static_cast<ds::DType>(code);
  }
  throw ds::InvalidArgument("case_runner: unknown dtype");
}

inline std::vector<std::int64_t> int_list(const json::value& v) {
  std::vector<std::int64_t> out;
  for (const auto& x : v.as_array()) out.push_back(x.to_number<std::int64_t>());
  return out;
}

/// FixedShardsPartitioner / MinSizePartitioner / MaxSizePartitioner(args...)(shape, dtype).
inline json::value partitioner_case(const json::value& in) {
  const auto& c = in.as_object();
  const std::string kind(c.at("kind").as_string());
  const auto args = int_list(c.at("args"));
  const ds::Shape shape = int_list(c.at("shape"));
  const ds::DType dtype = dtype_named(c.at("dtype"));
  ds::Partitions p;
  if (kind == "fixed") p = ds::FixedShardsPartitioner(args.at(0))(shape, dtype);
  else if (kind == "min") p = ds::MinSizePartitioner(args.at(0), args.at(1), args.at(2))(shape, dtype);
  else p = ds::MaxSizePartitioner(args.at(0), args.at(1), args.at(2))(shape, dtype);
  return json::value_from(p);
}

// ---- tensors ----------------------------------------------------------------------------------

/// Numbers, and for floats the string "nan" (JSON has no NaN).
template <class T>
std::vector<T> values_from(const json::value& v) {
  std::vector<T> values;
  for (const auto& x : v.as_array()) {
    if constexpr (std::is_floating_point_v<T>) {
      if (x.is_string()) {
        values.push_back(std::numeric_limits<T>::quiet_NaN());
        continue;
      }
    }
    values.push_back(x.to_number<T>());
  }
  return values;
}

template <class T>
ds::Tensor<T> tensor_from(const json::value& v) {
  const auto& o = v.as_object();
  return ds::Tensor<T>(int_list(o.at("shape")), values_from<T>(o.at("values")));
}

/// {"dtype", "shape", "values"}; non-finite floats as the strings "nan", "inf", "-inf" (JSON has none).
template <class T>
json::value tensor_json(const ds::Tensor<T>& t) {
  json::array values;
  for (const T& x : t.values()) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x)) values.emplace_back("nan");
      else if (std::isinf(x)) values.emplace_back(x > 0 ? "inf" : "-inf");
      else values.emplace_back(static_cast<double>(x));
    } else {
      values.emplace_back(static_cast<std::int64_t>(x));
    }
  }
  return json::object{{"dtype", ds::to_string(ds::dtype_of<T>())}, {"shape", json::value_from(t.shape())},
                      {"values", std::move(values)}};
}

template <class T>
json::value tensors_json(const std::vector<ds::Tensor<T>>& ts) {
  json::array out;
  for (const auto& t : ts) out.push_back(tensor_json(t));
  return out;
}

/// One strategy per replica count, made once (a strategy starts its replica threads).
inline Mirrored& strategy(int replicas) {
  static std::unique_ptr<Mirrored> made[9];
  if (replicas < 1 || replicas > 8) throw ds::InvalidArgument("case_runner: 1 to 8 replicas");
  auto& s = made[replicas];
  if (!s) s = std::make_unique<Mirrored>(replicas);
  return *s;
}

/// A case on a PerReplica of tensors: strategy.reduce / gather / local_results, or the replica
/// context's all_reduce / all_gather inside run().
template <class T>
json::value values_case(const json::object& c) {
  Mirrored& s = strategy(static_cast<int>(c.at("replicas").to_number<std::int64_t>()));
  const auto& components = c.at("components").as_array();
  if (components.size() != static_cast<std::size_t>(s.num_replicas_in_sync())) {
    throw ds::InvalidArgument("case_runner: one component per replica");
  }
  auto v = s.distribute_values_from_function([&](const ds::ValueContext& ctx) {
    return tensor_from<T>(components.at(static_cast<std::size_t>(ctx.replica_id_in_sync_group)));
  });
  const std::string what(c.at("what").as_string());
  const json::value& axis = c.at("axis");
  if (what == "reduce") {
    const std::string op(c.at("op").as_string());
    if (axis.is_null()) return tensor_json(s.reduce(op, v));
    if (axis.is_array()) return tensor_json(s.reduce(op, v, int_list(axis)));
    return tensor_json(s.reduce(op, v, axis.to_number<std::int64_t>()));
  }
  if (what == "gather") return tensor_json(s.gather(v, axis.to_number<std::int64_t>()));
  if (what == "local_results") return tensors_json(s.local_results(v));
  if (what == "from_function") {  // what each replica's function sees, and its value there
    auto seen = s.distribute_values_from_function([&](const ds::ValueContext& ctx) {
      const auto& mine = tensor_from<T>(components.at(static_cast<std::size_t>(ctx.replica_id_in_sync_group)));
      return std::make_pair(ds::Tensor<std::int32_t>{ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync}, mine);
    });
    json::array out;
    for (const auto& [ids, value] : s.local_results(seen)) out.push_back(json::array{tensor_json(ids), tensor_json(value)});
    return out;
  }
  if (what == "all_reduce") {
    const std::string op(c.at("op").as_string());
    return tensors_json(s.run([&](ds::ReplicaContext& ctx, const ds::Tensor<T>& x) { return ctx.all_reduce(op, x); }, v)
                            .values());
  }
  if (what == "all_gather") {
    const int a = static_cast<int>(axis.to_number<std::int64_t>());
    return tensors_json(s.run([&](ds::ReplicaContext& ctx, const ds::Tensor<T>& x) { return ctx.all_gather(x, a); }, v)
                            .values());
  }
  throw ds::InvalidArgument("case_runner: unknown values case '" + what + "'");
}

inline json::value values_case(const json::value& in) {
  const auto& c = in.as_object();
  const std::string dtype(c.at("dtype").as_string());
  if (dtype == "float32") return values_case<float>(c);
  if (dtype == "float64") return values_case<double>(c);
  if (dtype == "int32") return values_case<std::int32_t>(c);
  if (dtype == "int64") return values_case<std::int64_t>(c);
  throw ds::InvalidArgument("case_runner: unknown dtype '" + dtype + "'");
}

// ---- datasets ---------------------------------------------------------------------------------

/// distribute_dataset(range(n).batch(b, drop)) or distribute_datasets_from_function(fn returning
/// range(n).batch(b, drop)): the elements each replica gets, step after step.
inline json::value dataset_case(const json::value& in) {
  const auto& c = in.as_object();
  Mirrored& s = strategy(static_cast<int>(c.at("replicas").to_number<std::int64_t>()));
  const auto n = c.at("n").to_number<std::int64_t>(), b = c.at("batch").to_number<std::int64_t>();
  const bool drop = c.at("drop_remainder").as_bool();
  json::array steps;
  auto record = [&](const auto& dist) {
    for (const auto& step : dist) {
      json::array replicas;
      for (const auto& batch : step.values()) replicas.push_back(json::value_from(batch.values()));
      steps.push_back(std::move(replicas));
    }
  };
  if (c.at("how").as_string() == "from_function") {
    record(s.distribute_datasets_from_function(
        [&](const ds::InputContext&) { return ds::data::range(n).batch(b, drop); }));
  } else {
    record(s.distribute_dataset(ds::data::range(n).batch(b, drop)));
  }
  return steps;
}

// ---- sharded variables --------------------------------------------------------------------------

inline ds::VariablePartitioner partitioner_of(const json::object& c) {
  const std::string kind(c.at("kind").as_string());
  const auto args = int_list(c.at("args"));
  if (kind == "fixed") return ds::FixedShardsPartitioner(args.at(0));
  if (kind == "min") return ds::MinSizePartitioner(args.at(0), args.at(1), args.at(2));
  return ds::MaxSizePartitioner(args.at(0), args.at(1), args.at(2));
}

/// A variable of `shape` made with `partitioner` by a ParameterServerStrategy of num_ps ps tasks
/// (TF's rules, ps/partitioner.hpp): its shards' shapes (a ShardedVariable's, when it has more than
/// one) and their devices, round-robin over the ps tasks continuing from the previous case's.
inline ds::RoundRobinPlacement& ps_placement(int num_ps) {
  static std::map<int, std::unique_ptr<ds::RoundRobinPlacement>> placements;  // one per cluster, whatever T
  auto& placement = placements[num_ps];
  if (!placement) placement = std::make_unique<ds::RoundRobinPlacement>(num_ps);
  return *placement;
}

template <class T>
json::value sharded_case(const json::object& c) {
  ds::RoundRobinPlacement* placement = &ps_placement(static_cast<int>(c.at("num_ps").to_number<std::int64_t>()));
  const ds::Shape shape = int_list(c.at("shape"));
  const ds::Tensor<T> value(shape, std::vector<T>(static_cast<std::size_t>(ds::num_elements(shape))));
  const auto shards = shape.empty() ? 1 : ds::shards_along_first_axis(partitioner_of(c.at("partitioner").as_object())(shape, ds::dtype_of<T>()), shape);
  json::array shapes, devices;
  if (shards == 1) {
    shapes.push_back(json::value_from(shape));
    devices.push_back(json::value(placement->next_device()));
  } else {
    const ds::ShardedVariable<ds::Tensor<T>> v(value, shards);
    for (const auto& shard : v.variables()) {
      shapes.push_back(json::value_from(shard.shape()));
      devices.push_back(json::value(placement->next_device()));
    }
  }
  return json::object{{"shapes", std::move(shapes)}, {"devices", std::move(devices)}};
}

inline json::value sharded_case(const json::value& in) {
  const auto& c = in.as_object();
  const std::string dtype(c.at("dtype").as_string());
  if (dtype == "float32") return sharded_case<float>(c);
  if (dtype == "float64") return sharded_case<double>(c);
  if (dtype == "int32") return sharded_case<std::int32_t>(c);
  throw ds::InvalidArgument("case_runner: unknown dtype '" + dtype + "'");
}

// ---- safetensors ------------------------------------------------------------------------------

/// Calls fn(T{}) with the element type named (the dtypes numpy and safetensors share).
template <class F>
decltype(auto) with_dtype(std::string_view name, F&& fn) {
  if (name == "float32") return fn(float{});
  if (name == "float64") return fn(double{});
  if (name == "float16") return fn(ds::float16{});
  if (name == "int8") return fn(std::int8_t{});
  if (name == "int16") return fn(std::int16_t{});
  if (name == "int32") return fn(std::int32_t{});
  if (name == "int64") return fn(std::int64_t{});
  if (name == "uint8") return fn(std::uint8_t{});
  if (name == "bool") return fn(bool{});
  throw ds::InvalidArgument("case_runner: unknown dtype '" + std::string(name) + "'");
}

/// A safetensors file's tensors ({name: {"dtype", "shape", "values"}}) and metadata (without
/// the keys distribute adds for itself), as safetensors.numpy reads it.
inline json::value safetensors_json(const ds::safetensors::File& file) {
  json::object tensors;
  for (const auto& t : file.tensors) {
    json::array values;
    with_dtype(ds::to_string(t.dtype), [&](auto tag) {
      using T = decltype(tag);
      for (const auto& x : t.template values<T>()) {
        if constexpr (std::is_same_v<T, bool>) values.emplace_back(static_cast<bool>(x));
        else if constexpr (std::is_integral_v<T>) values.emplace_back(static_cast<std::int64_t>(x));
        else if constexpr (std::is_same_v<T, ds::float16>) values.emplace_back(static_cast<double>(static_cast<float>(x)));
        else values.emplace_back(static_cast<double>(x));
      }
    });
    tensors[t.name] = json::object{{"dtype", ds::to_string(t.dtype)}, {"shape", json::value_from(t.shape)},
                                   {"values", std::move(values)}};
  }
  json::object metadata;
  for (const auto& [k, v] : file.metadata) {
    if (k.rfind("distribute.", 0) != 0) metadata[k] = v;
  }
  return json::object{{"tensors", std::move(tensors)}, {"metadata", std::move(metadata)}};
}

/// "read": the file Python wrote at `path`, as we read it. "write": we write the case's tensors
/// and metadata to `path` (driver.py then reads it with safetensors.numpy) and report what we wrote.
inline json::value safetensors_case(const json::value& in) {
  const auto& c = in.as_object();
  const std::string path(c.at("path").as_string());
  if (c.at("how").as_string() == "read") return safetensors_json(ds::safetensors::read(path));
  std::vector<std::shared_ptr<void>> keep;  // the values the views point into
  ds::safetensors::TensorMap tensors;
  for (const auto& [name, t] : c.at("tensors").as_object()) {
    const auto& o = t.as_object();
    with_dtype(std::string(o.at("dtype").as_string()), [&](auto tag) {
      using T = decltype(tag);
      auto data = std::make_shared<std::vector<T>>();
      for (const auto& x : o.at("values").as_array()) {
        if constexpr (std::is_same_v<T, bool>) data->push_back(x.as_bool());
        else if constexpr (std::is_integral_v<T>) data->push_back(static_cast<T>(x.to_number<std::int64_t>()));
        else data->push_back(T(x.to_number<double>()));
      }
      if constexpr (std::is_same_v<T, bool>) {
        auto bytes = std::make_shared<std::vector<std::uint8_t>>(data->begin(), data->end());
        tensors.emplace(std::string(name), ds::safetensors::TensorView{ds::DType::Bool, int_list(o.at("shape")),
                                                                       std::as_bytes(std::span(*bytes))});
        keep.push_back(bytes);
      } else {
        tensors.emplace(std::string(name), ds::safetensors::TensorView::of(int_list(o.at("shape")),
                                                                           std::span<const T>(*data)));
        keep.push_back(data);
      }
    });
  }
  ds::safetensors::Metadata metadata;
  for (const auto& [k, v] : c.at("metadata").as_object()) metadata[std::string(k)] = std::string(v.as_string());
  ds::safetensors::write(path, tensors, metadata);
  return safetensors_json(ds::safetensors::read(path));
}

// ---- IndexedSlices across replicas --------------------------------------------------------------

/// Calls fn(T{}) with the element type named (the dtypes of the embedding areas).
template <class F>
decltype(auto) with_row_dtype(std::string_view name, F&& fn) {
  if (name == "float32") return fn(float{});
  if (name == "float64") return fn(double{});
  if (name == "int32") return fn(std::int32_t{});
  throw ds::InvalidArgument("case_runner: unknown dtype '" + std::string(name) + "'");
}

/// {"indices", "values" (flat), "dense_shape"}: the values' shape is [indices] + dense_shape[1:].
template <class T>
ds::IndexedSlices<ds::Tensor<T>> slices_from(const json::object& o) {
  auto indices = int_list(o.at("indices"));
  ds::Shape dense = int_list(o.at("dense_shape"));
  ds::Shape rows = dense;
  if (!rows.empty()) rows[0] = static_cast<std::int64_t>(indices.size());
  return {std::move(indices), ds::Tensor<T>(rows, values_from<T>(o.at("values"))), std::move(dense)};
}

template <class T>
json::value slices_json(const ds::IndexedSlices<ds::Tensor<T>>& s) {
  return json::object{{"indices", json::value_from(s.indices())}, {"values", tensor_json(s.values())},
                      {"dense_shape", json::value_from(s.dense_shape())}};
}

/// Per-replica IndexedSlices of T: strategy.reduce (no axis), or the replica context's all_reduce
/// inside run(), alone or with a dense value (every replica's result).
template <class T>
json::value sparse_reduce_case(const json::object& c) {
  Mirrored& s = strategy(static_cast<int>(c.at("replicas").to_number<std::int64_t>()));
  const auto& slices = c.at("slices").as_array();
  const auto n = static_cast<std::size_t>(s.num_replicas_in_sync());
  if (slices.size() != n) throw ds::InvalidArgument("case_runner: one IndexedSlices per replica");
  auto mine = [&](const ds::ReplicaContext& ctx) {
    return slices_from<T>(slices.at(static_cast<std::size_t>(ctx.replica_id_in_sync_group())).as_object());
  };
  const std::string op(c.at("op").as_string());
  if (c.at("how").as_string() == "reduce") {
    return slices_json(s.reduce(op, s.run([&](ds::ReplicaContext& ctx) { return mine(ctx); })));
  }
  std::vector<json::value> out(n);  // each replica writes its own
  const json::value& dense = c.at("dense");
  if (dense.is_null()) {
    s.run([&](ds::ReplicaContext& ctx) {
      out[static_cast<std::size_t>(ctx.replica_id_in_sync_group())] = slices_json(ctx.all_reduce(op, mine(ctx)));
    });
  } else {
    with_row_dtype(dense.at("dtype").as_string(), [&](auto tag) {
      using D = decltype(tag);
      const auto& components = dense.at("components").as_array();
      s.run([&](ds::ReplicaContext& ctx) {
        const auto id = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
        auto [rows, value] = ctx.all_reduce(op, mine(ctx), tensor_from<D>(components.at(id)));
        out[id] = json::array{slices_json(rows), tensor_json(value)};
      });
    });
  }
  return json::array(out.begin(), out.end());
}

inline json::value sparse_reduce_case(const json::value& in) {
  const auto& c = in.as_object();
  return with_row_dtype(c.at("dtype").as_string(), [&](auto tag) { return sparse_reduce_case<decltype(tag)>(c); });
}

// ---- plain variables: scatter_* and sparse_read ---------------------------------------------------

template <class T, class U>
void scatter(ds::Variable<ds::Tensor<T>>& v, std::string_view op, const ds::IndexedSlices<ds::Tensor<U>>& rows) {
  if (op == "scatter_add") v.scatter_add(rows);
  else if (op == "scatter_sub") v.scatter_sub(rows);
  else if (op == "scatter_update") v.scatter_update(rows);
  else if (op == "scatter_min") v.scatter_min(rows);
  else if (op == "scatter_max") v.scatter_max(rows);
  else throw ds::InvalidArgument("case_runner: unknown scatter '" + std::string(op) + "'");
}

/// A variable of T made from "shape" and "initial", then "ops" in order: scatters of IndexedSlices
/// (of their own dtype) and sparse_reads (indices of "index_shape"). What each read gave, and the
/// value at the end.
template <class T>
json::value scatter_case(const json::object& c) {
  ds::Variable<ds::Tensor<T>> v(ds::Tensor<T>(int_list(c.at("shape")), values_from<T>(c.at("initial"))), {.name = "v"});
  json::array reads;
  for (const auto& item : c.at("ops").as_array()) {
    const auto& o = item.as_object();
    const std::string op(o.at("op").as_string());
    if (op == "sparse_read") {
      const ds::Tensor<std::int64_t> ids(int_list(o.at("index_shape")), int_list(o.at("indices")));
      reads.push_back(tensor_json(v.sparse_read(ids)));
    } else {
      with_row_dtype(o.at("dtype").as_string(), [&](auto tag) { scatter(v, op, slices_from<decltype(tag)>(o)); });
    }
  }
  return json::object{{"reads", std::move(reads)}, {"final", tensor_json(v.read_value())}};
}

inline json::value scatter_case(const json::value& in) {
  const auto& c = in.as_object();
  return with_row_dtype(c.at("dtype").as_string(), [&](auto tag) { return scatter_case<decltype(tag)>(c); });
}

inline json::value run_case(const std::string& area, const json::value& in) {
  if (area == "sparse_reduce") return sparse_reduce_case(in);
  if (area == "scatter") return scatter_case(in);
  if (area == "safetensors") return safetensors_case(in);
  if (area == "sharded") return sharded_case(in);
  if (area == "device") return device_case(in);
  if (area == "tf_config") return tf_config_case(in);
  if (area == "partitioner") return partitioner_case(in);
  if (area == "values") return values_case(in);
  if (area == "dataset") return dataset_case(in);
  throw ds::InvalidArgument("case_runner: unknown area '" + area + "'");
}

}  // namespace conformance
