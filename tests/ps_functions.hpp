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
