// The remote functions of the parameter-server tests, registered in the test (the coordinator) and
// in every ps_helper process (ps tasks and workers), as one binary's processes would.
#pragma once

#define DISTRIBUTE_WITH_PS
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <distribute/distribute.hpp>

#include "support/tensor_types.hpp"

namespace ds = distribute;

namespace ps_test {

inline void add_one(ds::Variable<float> counter) { counter.assign_add(1.0f); }

/// Adds 1 after `sleep_ms`: closures that take time, so that a worker dies with some in flight.
inline void slow_add_one(ds::Variable<float> counter, int sleep_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  counter.assign_add(1.0f);
}

/// Adds `delta` to both variables and returns what the closure then reads back: its own writes.
inline std::vector<float> add_and_read(ds::Variable<std::vector<float>> v, ds::Variable<float> s, float delta) {
  v.assign_add(std::vector<float>(v.shape()[0], delta));
  s.assign_sub(delta);
  std::vector<float> seen = v.read_value();
  seen.push_back(s.read_value());
  return seen;
}

inline int twice_unless_13(int x) {
  if (x == 13) throw std::runtime_error("closure 13 fails on purpose");
  return 2 * x;
}

inline ds::Tensor<float> lookup(ds::ShardedVariable<ds::Tensor<float>> table, std::vector<std::int64_t> ids) {
  return table.embedding_lookup(ids);
}

inline ds::Tensor<double> scale(ds::Tensor<double> t, double factor) {
  for (auto& x : t) x *= factor;
  return t;
}

/// Each worker's dataset: 0..99 (its input context says which worker built it).
inline ds::data::Dataset<std::int64_t> numbers(const ds::InputContext& ctx) {
  (void)ctx;
  return ds::data::range(0, 100);
}

inline std::int64_t take_next(ds::PerWorkerIterator<std::int64_t> it) { return it.get_next(); }

inline void empty_closure() {}

/// 16-bit floats through the ps: adds `delta` (float16) to a bfloat16 variable, returns what it reads back.
inline std::vector<ds::bfloat16> add_half(ds::Variable<std::vector<ds::bfloat16>> v, ds::Tensor<ds::float16> delta) {
  std::vector<ds::bfloat16> d;
  for (auto x : delta) d.push_back(ds::bfloat16(float(x)));
  v.assign_add(d);
  return v.read_value();
}

/// A run-time-dtype argument and result: every element times `factor`, in the argument's dtype.
inline test_types::DynTensor scale_any(test_types::DynTensor t, double factor) {
  test_types::DynTensor out = ds::clone_value(t);  // row-major, its own elements
  ds::visit_dtype(out.dtype, [&](auto zero) {
    using T = decltype(zero);
    auto* p = reinterpret_cast<T*>(out.data());
    for (std::size_t i = 0; i < ds::element_count(out); ++i) p[i] = static_cast<T>(static_cast<double>(p[i]) * factor);
  });
  return out;
}

/// A column-major argument and result (a type cereal cannot save): the transpose, times `factor`.
inline test_types::ColMajor transpose_scaled(test_types::ColMajor m, float factor) {
  test_types::ColMajor t;
  t.rows = m.cols;
  t.cols = m.rows;
  t.data.resize(m.data.size());
  for (std::int64_t r = 0; r < t.rows; ++r) {
    for (std::int64_t c = 0; c < t.cols; ++c) t.data[static_cast<std::size_t>(c * t.rows + r)] = m.at(c, r) * factor;
  }
  return t;
}

/// A ps variable of run-time dtype: adds `delta`, returns what it reads back.
inline test_types::DynTensor add_to_any(ds::Variable<test_types::DynTensor> v, test_types::DynTensor delta) {
  v.assign_add(delta);
  return v.read_value();
}

// ---- embeddings (tests/test_ps_embeddings.cpp) ------------------------------------------------

/// The rows closure `k` adds into a table of `rows` rows: 8 rows from k on, some of them the same
/// row twice (duplicates add up), overlapping the rows of the closures before and after it.
inline std::vector<std::int64_t> rows_of_closure(std::int64_t k, std::int64_t rows) {
  std::vector<std::int64_t> ids;
  for (std::int64_t j = 0; j < 8; ++j) ids.push_back((k * 7 + (j % 6) * 5) % rows);
  return ids;
}
/// The integer row that closure `k` adds at its j-th row: column c holds k * 1000 + j * 10 + c + 1.
inline std::int64_t value_of_closure(std::int64_t k, std::int64_t j, std::int64_t c) { return k * 1000 + j * 10 + c + 1; }

/// Closure k's scatter_add into `table` (int64 rows), after `sleep_ms`: its rows travel, the ps
/// tasks add them in the closure's commit.
inline void scatter_closure(ds::ShardedVariable<ds::Tensor<std::int64_t>> table, std::int64_t k, int sleep_ms) {
  const std::int64_t width = table.shape()[1];
  const auto ids = rows_of_closure(k, table.shape()[0]);
  std::vector<std::int64_t> values;
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(ids.size()); ++j) {
    for (std::int64_t c = 0; c < width; ++c) values.push_back(value_of_closure(k, j, c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  table.scatter_add(ds::IndexedSlices(ids, ds::Tensor<std::int64_t>({static_cast<std::int64_t>(ids.size()), width}, values),
                                      table.shape()));
}

/// One scatter of `kind` ("add", "sub", "update", "min", "max") in a closure, then a sparse_read
/// of `read` in the same closure (it sees its own rows).
inline ds::Tensor<float> scatter_then_read(ds::ShardedVariable<ds::Tensor<float>> table, std::string kind,
                                           std::vector<std::int64_t> ids, ds::Tensor<float> values,
                                           std::vector<std::int64_t> read) {
  const ds::IndexedSlices<ds::Tensor<float>> slices(ids, values, table.shape());
  if (kind == "add") table.scatter_add(slices);
  else if (kind == "sub") table.scatter_sub(slices);
  else if (kind == "update") table.scatter_update(slices);
  else if (kind == "min") table.scatter_min(slices);
  else table.scatter_max(slices);
  return table.sparse_read(read);
}

/// One optimizer step on `table` with the gradient rows `grad` at `ids` (an embedding gradient),
/// in a closure.
inline void adagrad_step(ds::ShardedVariable<ds::Tensor<float>> table, ds::optimizers::Adagrad opt,
                         std::vector<std::int64_t> ids, ds::Tensor<float> grad) {
  opt.apply_gradients(table, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(ids, grad, table.shape()));
}
inline void sgd_step(ds::ShardedVariable<ds::Tensor<float>> table, ds::optimizers::SGD opt, std::vector<std::int64_t> ids,
                     ds::Tensor<float> grad) {
  opt.apply_gradients(table, ds::IndexedSlices<ds::Tensor<float>>::from_lookup(ids, grad, table.shape()));
}

/// Applies a step and then reads the table in the same closure: refused (the step is applied when
/// the closure commits).
inline ds::Tensor<float> step_then_read(ds::ShardedVariable<ds::Tensor<float>> table, ds::optimizers::Adagrad opt,
                                        std::vector<std::int64_t> ids, ds::Tensor<float> grad) {
  adagrad_step(table, opt, ids, grad);
  return table.sparse_read(ids);
}

DISTRIBUTE_REMOTE_FUNCTION(scatter_closure);
DISTRIBUTE_REMOTE_FUNCTION(scatter_then_read);
DISTRIBUTE_REMOTE_FUNCTION(adagrad_step);
DISTRIBUTE_REMOTE_FUNCTION(sgd_step);
DISTRIBUTE_REMOTE_FUNCTION(step_then_read);
DISTRIBUTE_REMOTE_FUNCTION(add_one);
DISTRIBUTE_REMOTE_FUNCTION(slow_add_one);
DISTRIBUTE_REMOTE_FUNCTION(add_and_read);
DISTRIBUTE_REMOTE_FUNCTION(twice_unless_13);
DISTRIBUTE_REMOTE_FUNCTION(lookup);
DISTRIBUTE_REMOTE_FUNCTION(scale);
DISTRIBUTE_REMOTE_FUNCTION(numbers);
DISTRIBUTE_REMOTE_FUNCTION(take_next);
DISTRIBUTE_REMOTE_FUNCTION(empty_closure);
DISTRIBUTE_REMOTE_FUNCTION(add_half);
DISTRIBUTE_REMOTE_FUNCTION(scale_any);
DISTRIBUTE_REMOTE_FUNCTION(add_to_any);
DISTRIBUTE_REMOTE_FUNCTION(transpose_scaled);

}  // namespace ps_test
