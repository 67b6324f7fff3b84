// Element types that cross a replica or process boundary, named as in TF/safetensors.
#pragma once

#include <cstddef>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <distribute/core/half.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

// The numbering is part of the wire formats (collective descriptors, the parameter server's
// messages): new types go at the end.
enum class DType : std::uint8_t { F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, Bool, F16, BF16 };

inline constexpr std::uint8_t kNumDTypes = static_cast<std::uint8_t>(DType::BF16) + 1;

/// Whether a byte read from the wire or a file names a DType.
constexpr bool is_dtype_code(std::uint8_t code) noexcept { return code < kNumDTypes; }

constexpr std::string_view to_string(DType d) noexcept {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I8: return "int8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::U16: return "uint16";
    case DType::U32: return "uint32";
    case DType::U64: return "uint64";
    case DType::Bool: return "bool";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}

constexpr std::size_t size_of(DType d) noexcept {
  switch (d) {
    case DType::I8: case DType::U8: case DType::Bool: return 1;
    case DType::I16: case DType::U16: case DType::F16: case DType::BF16: return 2;
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F64: case DType::I64: case DType::U64: return 8;
  }
  return 0;
}

constexpr bool is_floating(DType d) noexcept {
  return d == DType::F32 || d == DType::F64 || d == DType::F16 || d == DType::BF16;
}

/// The DType of an element type: the customisation point for another library's 16-bit floats
/// (the adapters specialise it for Eigen::half, c10::BFloat16, ...). A specialisation names a
/// type with the same size and bit layout as the DType's own C++ type (visit_dtype's).
template <class T>
struct element_dtype {};

namespace core::detail {
template <class T>
concept plain_arithmetic_element = std::is_arithmetic_v<T> && !std::is_const_v<T> && !std::is_volatile_v<T> &&
                                   (sizeof(T) <= 8) && !std::is_same_v<T, char> && !std::is_same_v<T, wchar_t> &&
                                   !std::is_same_v<T, long double> && !std::is_same_v<T, float16> &&
                                   !std::is_same_v<T, bfloat16>;

template <class T>
constexpr DType arithmetic_dtype() noexcept {
  if constexpr (std::is_same_v<T, bool>) return DType::Bool;
  else if constexpr (std::is_floating_point_v<T>) return sizeof(T) == 4 ? DType::F32 : DType::F64;
  else if constexpr (std::is_signed_v<T>) {
    if constexpr (sizeof(T) == 1) return DType::I8;
    else if constexpr (sizeof(T) == 2) return DType::I16;
    else if constexpr (sizeof(T) == 4) return DType::I32;
    else return DType::I64;
  } else {
    if constexpr (sizeof(T) == 1) return DType::U8;
    else if constexpr (sizeof(T) == 2) return DType::U16;
    else if constexpr (sizeof(T) == 4) return DType::U32;
    else return DType::U64;
  }
}
}  // namespace core::detail

template <class T>
  requires core::detail::plain_arithmetic_element<T>
struct element_dtype<T> {
  static constexpr DType value = core::detail::arithmetic_dtype<T>();
};
template <>
struct element_dtype<float16> {
  static constexpr DType value = DType::F16;
};
template <>
struct element_dtype<bfloat16> {
  static constexpr DType value = DType::BF16;
};

/// Element types the collectives know how to combine: the arithmetic types (not char, wchar_t
/// or long double), ds::float16, ds::bfloat16, and types registered through element_dtype.
template <class T>
concept Element = requires {
  { element_dtype<T>::value } -> std::convertible_to<DType>;
  requires sizeof(T) == size_of(element_dtype<T>::value);
  requires std::is_trivially_copyable_v<T>;
};

template <Element T>
constexpr DType dtype_of() noexcept {
  return element_dtype<T>::value;
}

/// The library's C++ type of a DType (ds::float16 and ds::bfloat16 for the 16-bit floats).
template <DType D>
struct dtype_type;
template <> struct dtype_type<DType::F32> { using type = float; };
template <> struct dtype_type<DType::F64> { using type = double; };
template <> struct dtype_type<DType::I8> { using type = std::int8_t; };
template <> struct dtype_type<DType::I16> { using type = std::int16_t; };
template <> struct dtype_type<DType::I32> { using type = std::int32_t; };
template <> struct dtype_type<DType::I64> { using type = std::int64_t; };
template <> struct dtype_type<DType::U8> { using type = std::uint8_t; };
template <> struct dtype_type<DType::U16> { using type = std::uint16_t; };
template <> struct dtype_type<DType::U32> { using type = std::uint32_t; };
template <> struct dtype_type<DType::U64> { using type = std::uint64_t; };
template <> struct dtype_type<DType::Bool> { using type = bool; };
template <> struct dtype_type<DType::F16> { using type = float16; };
template <> struct dtype_type<DType::BF16> { using type = bfloat16; };
template <DType D>
using dtype_type_t = typename dtype_type<D>::type;

/// Calls f(T{}) with the C++ type of a runtime DType.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::I8: return f(std::int8_t{});
    case DType::I16: return f(std::int16_t{});
    case DType::I32: return f(std::int32_t{});
    case DType::I64: return f(std::int64_t{});
    case DType::U8: return f(std::uint8_t{});
    case DType::U16: return f(std::uint16_t{});
    case DType::U32: return f(std::uint32_t{});
    case DType::U64: return f(std::uint64_t{});
    case DType::Bool: return f(bool{});
    case DType::F16: return f(float16{});
    case DType::BF16: return f(bfloat16{});
  }
  return f(float{});
}

DISTRIBUTE_END_NAMESPACE
