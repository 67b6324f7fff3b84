// distribute 0.1.0: <distribute/adapters/torch.hpp> for the single-header edition.
// SPDX-License-Identifier: Apache-2.0
//
// GENERATED FILE, DO NOT EDIT. It is produced from include/distribute/ by
//   python3 tools/amalgamate.py
// Edit the headers under include/ and regenerate.
// libtorch tensors as values: torch::Tensor (at::Tensor) through every collective and strategy, in
// variables and checkpoints. Include it after libtorch (<torch/torch.h> or <ATen/ATen.h>) or
// instead of it; the umbrella header does not.
//
//   #include <distribute/distribute.hpp>
//   #include <distribute/adapters/torch.hpp>
//   auto grads = ctx.batch_all_reduce(ds::ReduceOp::Mean, std::move(grads));  // std::vector<torch::Tensor>
//
// The element type is the tensor's at run time (float32/64, float16, bfloat16, int8..64, uint8,
// bool). A torch::Tensor is a handle: copies share the elements. The library therefore deep-copies
// (clone) where it needs a value of its own, an lvalue passed to all_reduce is left unchanged, and
// an rvalue handle is reduced in the memory it refers to: `ctx.all_reduce(op, p.grad())` returns a
// new tensor; `ctx.batch_all_reduce(op, std::move(handles))` reduces the gradients in place.
// Strided and non-contiguous views (t.t(), slices) give the logical, row-major result. Writes go
// to the elements directly, outside autograd (as under torch::NoGradGuard): no graph history, and
// the tensors' version counters do not move. CPU tensors only: a CUDA tensor is refused by the host
// collectives with a message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <fmt/format.h>

#include <distribute/distribute.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

template <>
struct element_dtype<c10::Half> {
  static constexpr DType value = DType::F16;
};
template <>
struct element_dtype<c10::BFloat16> {
  static constexpr DType value = DType::BF16;
};

namespace adapters::torch {

inline DType to_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return DType::F32;
    case c10::ScalarType::Double: return DType::F64;
    case c10::ScalarType::Half: return DType::F16;
    case c10::ScalarType::BFloat16: return DType::BF16;
    case c10::ScalarType::Char: return DType::I8;
    case c10::ScalarType::Short: return DType::I16;
    case c10::ScalarType::Int: return DType::I32;
    case c10::ScalarType::Long: return DType::I64;
    case c10::ScalarType::Byte: return DType::U8;
    case c10::ScalarType::Bool: return DType::Bool;
    default:
      throw InvalidArgument(fmt::format("a torch::Tensor of dtype {} cannot be reduced or sent: the library handles "
                                        "float32/64, float16, bfloat16, int8/16/32/64, uint8 and bool",
                                        c10::toString(t)));
  }
}

inline c10::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::F32: return c10::ScalarType::Float;
    case DType::F64: return c10::ScalarType::Double;
    case DType::F16: return c10::ScalarType::Half;
    case DType::BF16: return c10::ScalarType::BFloat16;
    case DType::I8: return c10::ScalarType::Char;
    case DType::I16: return c10::ScalarType::Short;
    case DType::I32: return c10::ScalarType::Int;
    case DType::I64: return c10::ScalarType::Long;
    case DType::U8: return c10::ScalarType::Byte;
    case DType::Bool: return c10::ScalarType::Bool;
    case DType::U16:
    case DType::U32:
    case DType::U64: break;
  }
  throw InvalidArgument(fmt::format("libtorch has no {} tensors", to_string(d)));
}

}  // namespace adapters::torch

template <>
struct tensor_traits<at::Tensor> {
  static TensorView view(const at::Tensor& t) {
    if (!t.defined()) throw InvalidArgument("an undefined torch::Tensor (default-constructed) has no elements to use");
    TensorView v;
    v.dtype = adapters::torch::to_dtype(t.scalar_type());
    v.data = t.data_ptr();  // includes the storage offset
    v.shape.assign(t.sizes().begin(), t.sizes().end());
    if (!t.is_contiguous()) v.strides.assign(t.strides().begin(), t.strides().end());
    v.memory = t.device().is_cpu() ? MemorySpace::host : MemorySpace::device;
    return v;
  }
  static at::Tensor make(DType dtype, const Shape& shape) {
    return at::zeros(shape, at::TensorOptions().dtype(adapters::torch::to_scalar_type(dtype)));
  }
  /// Its own contiguous elements, detached from any autograd graph.
  static at::Tensor clone(const at::Tensor& t) {
    if (!t.defined()) throw InvalidArgument("an undefined torch::Tensor (default-constructed) cannot be copied");
    return t.detach().clone(at::MemoryFormat::Contiguous);
  }
};

DISTRIBUTE_END_NAMESPACE
