// The adapters across processes: what tests/adapters_worker_helper (a MultiWorkerMirrored worker,
// or a ps/worker task) and the adapter test files (the parameter-server coordinator) share.
//   WITH_TORCH, WITH_EIGEN, WITH_DLPACK, WITH_XTENSOR: which adapters' parts to compile; define
//   them before including this, which includes their headers (the first adapter test file of a
//   program that has several includes it for all of them).
// The remote functions are registered in every process that includes this, as one program's
// processes would; a process registering more adapters' functions than another is harmless.
#pragma once

#define DISTRIBUTE_WITH_PS
#ifdef WITH_TORCH
#include <distribute/adapters/torch.hpp>
#include <ATen/ATen.h>
#endif
#ifdef WITH_EIGEN
#include <distribute/adapters/eigen.hpp>
#endif
#ifdef WITH_DLPACK
#include <distribute/adapters/dlpack.hpp>
#endif
#ifdef WITH_XTENSOR
#include <distribute/adapters/xtensor.hpp>
#endif
#include <distribute/distribute.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace adapters_mp {

namespace ds = distribute;

/// The elements of any value in logical row-major order, widened to float, read through the
/// value's own strides (written here, not with the library's copy routines, to check them).
template <class T>
std::vector<float> floats(const T& value) {
  const ds::TensorView v = ds::view_of(value);
  const std::size_t rank = v.shape.size();
  ds::Strides strides = v.strides;
  if (strides.empty()) {
    strides.assign(rank, 1);
    for (std::size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * v.shape[d];
  }
  std::int64_t count = 1;
  for (auto d : v.shape) count *= d;
  std::vector<float> out;
  std::vector<std::int64_t> index(rank, 0);
  const auto* base = static_cast<const std::byte*>(v.data);
  const std::size_t size = ds::size_of(v.dtype);
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) offset += index[d] * strides[d];
    const std::byte* p = base + offset * static_cast<std::int64_t>(size);
    switch (v.dtype) {
      case ds::DType::F32: { float x; std::memcpy(&x, p, 4); out.push_back(x); break; }
      case ds::DType::F64: { double x; std::memcpy(&x, p, 8); out.push_back(static_cast<float>(x)); break; }
      case ds::DType::BF16: {
        std::uint16_t bits;
        std::memcpy(&bits, p, 2);
        out.push_back(std::bit_cast<float>(std::uint32_t{bits} << 16));
        break;
      }
      default: out.push_back(-12345.0f); break;  // not used by these tests: shows up as a mismatch
    }
    for (std::size_t d = rank; d-- > 0;) {
      if (++index[d] < v.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

/// The strides a value reports (empty: row-major contiguous).
template <class T>
ds::Strides strides_of(const T& value) {
  return ds::view_of(value).strides;
}

// Per adapter, the values the scenarios use, all of rank 2 (Eigen matrices have no other rank):
//   f32(values, shape), bf16(values, shape): row-major values of float32 / bfloat16 (`values` in
//   row-major order); strided(values, shape): a float32 value of those logical values whose memory
//   is column-major (a transposed view, or a column-major container).

#ifdef WITH_TORCH
struct TorchKit {
  static constexpr const char* name = "torch";
  using F32 = at::Tensor;
  using BF16 = at::Tensor;
  using Strided = at::Tensor;
  static at::Tensor f32(std::vector<float> v, std::vector<std::int64_t> shape) { return at::tensor(v).reshape(shape); }
  static at::Tensor bf16(std::vector<float> v, std::vector<std::int64_t> shape) {
    return f32(std::move(v), std::move(shape)).to(at::kBFloat16);
  }
  /// The transpose (t()) of a row-major tensor holding the transposed elements.
  static at::Tensor strided(std::vector<float> v, std::vector<std::int64_t> shape) {
    return f32(std::move(v), shape).t().contiguous().t();
  }
};
#endif

#ifdef WITH_EIGEN
using RowMajorXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMajorXbf = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct EigenKit {
  static constexpr const char* name = "eigen";
  using F32 = RowMajorXf;
  using BF16 = RowMajorXbf;
  using Strided = Eigen::MatrixXf;  // column-major
  template <class M, class S>
  static M fill(const std::vector<float>& v, const std::vector<std::int64_t>& shape) {
    M m(shape[0], shape[1]);
    for (Eigen::Index i = 0; i < m.rows(); ++i) {
      for (Eigen::Index j = 0; j < m.cols(); ++j) m(i, j) = S(v[static_cast<std::size_t>(i * m.cols() + j)]);
    }
    return m;
  }
  static F32 f32(std::vector<float> v, std::vector<std::int64_t> shape) { return fill<F32, float>(v, shape); }
  static BF16 bf16(std::vector<float> v, std::vector<std::int64_t> shape) { return fill<BF16, Eigen::bfloat16>(v, shape); }
  static Strided strided(std::vector<float> v, std::vector<std::int64_t> shape) { return fill<Strided, float>(v, shape); }
};
#endif

#ifdef WITH_XTENSOR
struct XtensorKit {
  static constexpr const char* name = "xtensor";
  using F32 = xt::xtensor<float, 2>;
  using BF16 = xt::xtensor<ds::bfloat16, 2>;
  using Strided = xt::xtensor<float, 2, xt::layout_type::column_major>;
  template <class C, class S>
  static C fill(const std::vector<float>& v, const std::vector<std::int64_t>& shape) {
    C c = C::from_shape({static_cast<std::size_t>(shape[0]), static_cast<std::size_t>(shape[1])});
    for (std::size_t i = 0; i < c.shape()[0]; ++i) {
      for (std::size_t j = 0; j < c.shape()[1]; ++j) c(i, j) = S(v[i * c.shape()[1] + j]);
    }
    return c;
  }
  static F32 f32(std::vector<float> v, std::vector<std::int64_t> shape) { return fill<F32, float>(v, shape); }
  static BF16 bf16(std::vector<float> v, std::vector<std::int64_t> shape) { return fill<BF16, ds::bfloat16>(v, shape); }
  static Strided strided(std::vector<float> v, std::vector<std::int64_t> shape) { return fill<Strided, float>(v, shape); }
};
#endif

#ifdef WITH_DLPACK
struct DlpackKit {
  static constexpr const char* name = "dlpack";
  using F32 = ds::dlpack::Tensor;
  using BF16 = ds::dlpack::Tensor;
  using Strided = ds::dlpack::Tensor;
  static F32 f32(std::vector<float> v, std::vector<std::int64_t> shape) {
    return ds::dlpack::Tensor::from_values<float>(shape, v);
  }
  static BF16 bf16(std::vector<float> v, std::vector<std::int64_t> shape) {
    std::vector<ds::bfloat16> b;
    for (float x : v) b.push_back(ds::bfloat16(x));
    return ds::dlpack::Tensor::from_values<ds::bfloat16>(shape, b);
  }
  /// A producer's transposed view: shape (r, c), strides (1, r) over a row-major (c, r) tensor
  /// that its manager context keeps alive, as a framework's to_dlpack of `t.t()` hands out.
  static Strided strided(std::vector<float> v, std::vector<std::int64_t> shape) {
    struct Owner {
      ds::dlpack::Tensor storage;
      std::vector<std::int64_t> shape, strides;
    };
    const std::int64_t r = shape[0], c = shape[1];
    std::vector<float> transposed(v.size());
    for (std::int64_t i = 0; i < r; ++i) {
      for (std::int64_t j = 0; j < c; ++j) transposed[static_cast<std::size_t>(j * r + i)] = v[static_cast<std::size_t>(i * c + j)];
    }
    auto* owner = new Owner{ds::dlpack::Tensor::from_values<float>({c, r}, transposed), {r, c}, {1, r}};
    auto* m = new DLManagedTensor{};
    m->dl_tensor = owner->storage.dl_tensor();
    m->dl_tensor.ndim = 2;
    m->dl_tensor.shape = owner->shape.data();
    m->dl_tensor.strides = owner->strides.data();
    m->manager_ctx = owner;
    m->deleter = [](DLManagedTensor* self) {
      delete static_cast<Owner*>(self->manager_ctx);
      delete self;
    };
    return ds::dlpack::from_dlpack(m);
  }
};
#endif

// Parameter-server remote functions: each adds a delta to a ps variable and returns what the
// closure then reads back, or doubles a bfloat16 value (exact). Eigen and xtensor values are not
// serialisable by cereal, so their arguments and results travel as ds::Tensor (row-major), while
// their variables (handles) are the adapter's own types.
#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && __has_include(<boost/json.hpp>) && \
    __has_include(<cereal/cereal.hpp>)
#define ADAPTERS_MP_HAVE_PS 1

#ifdef WITH_TORCH
inline at::Tensor torch_add_and_read(ds::Variable<at::Tensor> w, at::Tensor delta) {
  w.assign_add(delta);
  return w.read_value();
}
inline at::Tensor torch_twice(at::Tensor t) { return t * 2; }
DISTRIBUTE_REMOTE_FUNCTION(torch_add_and_read);
DISTRIBUTE_REMOTE_FUNCTION(torch_twice);
#endif

#ifdef WITH_DLPACK
inline ds::dlpack::Tensor dlpack_add_and_read(ds::Variable<ds::dlpack::Tensor> w, ds::dlpack::Tensor delta) {
  w.assign_add(delta);
  return w.read_value();
}
inline ds::dlpack::Tensor dlpack_twice(ds::dlpack::Tensor t) {
  std::vector<ds::bfloat16> v = t.to_vector<ds::bfloat16>();
  for (auto& x : v) x = ds::bfloat16(2.0f * float(x));
  return ds::dlpack::Tensor::from_values<ds::bfloat16>(t.shape(), v);
}
DISTRIBUTE_REMOTE_FUNCTION(dlpack_add_and_read);
DISTRIBUTE_REMOTE_FUNCTION(dlpack_twice);
#endif

#if defined(WITH_EIGEN) || defined(WITH_XTENSOR)
/// A rank-2 row-major ds::Tensor holding `m`'s logical elements (any rank-2 Eigen or xtensor type).
template <class E, class M>
ds::Tensor<E> to_tensor(const M& m, std::int64_t rows, std::int64_t cols) {
  std::vector<E> v;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) v.push_back(m(i, j));
  }
  return ds::Tensor<E>({rows, cols}, std::move(v));
}
#endif

#ifdef WITH_EIGEN
inline ds::Tensor<float> eigen_add_and_read(ds::Variable<Eigen::MatrixXf> w, ds::Tensor<float> delta) {
  w.assign_add(Eigen::MatrixXf(Eigen::Map<const RowMajorXf>(delta.data(), delta.shape()[0], delta.shape()[1])));
  const Eigen::MatrixXf now = w.read_value();
  return to_tensor<float>(now, now.rows(), now.cols());
}
inline ds::Tensor<ds::bfloat16> eigen_twice(ds::Tensor<ds::bfloat16> t) {
  RowMajorXbf m(t.shape()[0], t.shape()[1]);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = Eigen::bfloat16(float(t.data()[i]));
  m = m + m;  // Eigen's own bfloat16 arithmetic
  ds::Tensor<ds::bfloat16> out = t;
  for (Eigen::Index i = 0; i < m.size(); ++i) out.data()[i] = ds::bfloat16(static_cast<float>(m.data()[i]));
  return out;
}
DISTRIBUTE_REMOTE_FUNCTION(eigen_add_and_read);
DISTRIBUTE_REMOTE_FUNCTION(eigen_twice);
#endif

#ifdef WITH_XTENSOR
using ColumnMajorXt = xt::xtensor<float, 2, xt::layout_type::column_major>;
inline ds::Tensor<float> xtensor_add_and_read(ds::Variable<ColumnMajorXt> w, ds::Tensor<float> delta) {
  ColumnMajorXt d = ColumnMajorXt::from_shape({static_cast<std::size_t>(delta.shape()[0]), static_cast<std::size_t>(delta.shape()[1])});
  for (std::size_t i = 0; i < d.shape()[0]; ++i) {
    for (std::size_t j = 0; j < d.shape()[1]; ++j) d(i, j) = delta.data()[i * d.shape()[1] + j];
  }
  w.assign_add(d);
  const ColumnMajorXt now = w.read_value();
  return to_tensor<float>(now, static_cast<std::int64_t>(now.shape()[0]), static_cast<std::int64_t>(now.shape()[1]));
}
inline ds::Tensor<ds::bfloat16> xtensor_twice(ds::Tensor<ds::bfloat16> t) {
  ds::Tensor<ds::bfloat16> out = t;
  for (std::size_t i = 0; i < out.size(); ++i) out.data()[i] = ds::bfloat16(2.0f * float(t.data()[i]));
  return out;
}
DISTRIBUTE_REMOTE_FUNCTION(xtensor_add_and_read);
DISTRIBUTE_REMOTE_FUNCTION(xtensor_twice);
#endif

#endif  // the ps part

}  // namespace adapters_mp

// The test side (doctest included first): start the helper processes and check what they say.
#ifdef DOCTEST_LIBRARY_INCLUDED
#include <chrono>
#include <cstdlib>
#include <signal.h>

#include "support/processes.hpp"

namespace adapters_mp {

/// The helper's path, or null where it is not built (no Boost/OpenSSL: no multi-process parts).
inline const char* helper_path() { return std::getenv("DISTRIBUTE_ADAPTERS_HELPER"); }

/// Two MultiWorkerMirrored worker processes (1 replica each) run `adapter`'s scenario, which
/// checks its results itself: both must exit 0 and say OK.
inline void run_two_workers(const std::string& adapter) {
  const char* helper = helper_path();
  if (!helper) {
    MESSAGE("skipped: DISTRIBUTE_ADAPTERS_HELPER is not set (the multi-worker parts need Boost and OpenSSL)");
    return;
  }
  const auto ports = test_support::free_ports(2);
  std::vector<test_support::Child> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(test_support::spawn({helper, "mwms", adapter},
                                          {{"TF_CONFIG", test_support::tf_config(ports, i)}, {"TEST_TIMEOUT_SECONDS", "20"}}));
  }
  CHECK(test_support::wait_all(workers, std::chrono::seconds(40)));
  for (std::size_t i = 0; i < workers.size(); ++i) {
    INFO("worker ", i, " output:\n", workers[i].output);
    CHECK(workers[i].status == 0);
    CHECK(workers[i].output.find("MISMATCH") == std::string::npos);
    CHECK(workers[i].output.find("\nOK\n") != std::string::npos);
  }
}

#ifdef ADAPTERS_MP_HAVE_PS
/// A ps task and a worker task (helper processes running ds::Server); this process is the chief.
/// The tasks are killed on destruction unless stop() saw them exit.
struct PsCluster {
  std::vector<int> ports = test_support::free_ports(3);
  ds::ClusterSpec spec;
  std::vector<test_support::Child> tasks;

  explicit PsCluster(const char* helper) {
    auto addr = [&](std::size_t i) { return "127.0.0.1:" + std::to_string(ports[i]); };
    spec = ds::ClusterSpec(ds::ClusterSpec::DenseJobs{{"ps", {addr(0)}}, {"worker", {addr(1)}}, {"chief", {addr(2)}}});
    tasks.push_back(test_support::spawn({helper, "ps", "0", spec.to_json()}, {}));
    tasks.push_back(test_support::spawn({helper, "worker", "0", spec.to_json()}, {}));
  }
  PsCluster(const PsCluster&) = delete;
  ~PsCluster() {
    bool running = false;
    for (auto& t : tasks) {
      if (!t.done) ::kill(t.pid, SIGKILL), running = true;
    }
    if (running) test_support::wait_all(tasks, std::chrono::seconds(5));
  }
  std::shared_ptr<ds::ClusterResolver> resolver() const {
    return std::make_shared<ds::SimpleClusterResolver>(spec, "chief", 0);
  }
  /// After coordinator.shutdown_cluster(): both tasks exit 0.
  void check_stopped() {
    CHECK(test_support::wait_all(tasks, std::chrono::seconds(10)));
    for (auto& t : tasks) {
      INFO("task output:\n", t.output);
      CHECK(t.status == 0);
    }
  }
};

inline ds::CoordinatorOptions quiet_options() {
  ds::CoordinatorOptions o;
  o.connect_timeout = std::chrono::seconds(30);
  o.log = [](std::string_view line) { MESSAGE(std::string(line)); };
  return o;
}
#endif

}  // namespace adapters_mp
#endif
