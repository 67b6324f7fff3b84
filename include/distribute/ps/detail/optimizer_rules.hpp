// The optimizer steps a ps task applies to the rows it holds (core::RemoteUpdate::Apply*): the
// update rules of TF's training ops, element by element, in the variable's dtype. One step reads a
// gradient row and updates the variable's row and its slot's row (the slot variable lives beside
// the variable, on the same ps task, under slot_key()):
//   SGD       var -= lr * g
//   momentum  m = momentum * m - lr * g;  var += m   (nesterov: var += momentum * m - lr * g)
//             (Keras's SGD; TF's ResourceApplyKerasMomentum)
//   Adagrad   acc += g * g;  var -= lr * g / (sqrt(acc) + epsilon)   (TF's ResourceApplyAdagradV2)
// Each row is a function of its own elements only, so a sparse step touches the gradient's rows
// and nothing else (a row the gradient does not name keeps its value and its slot's).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/remote_store.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

using core::RemoteUpdate;

/// The optimizer whose step `kind` is, for messages.
constexpr std::string_view optimizer_name(RemoteUpdate kind) noexcept {
  switch (kind) {
    case RemoteUpdate::ApplySgd: return "SGD";
    case RemoteUpdate::ApplyMomentum: return "SGD with momentum";
    case RemoteUpdate::ApplyAdagrad: return "Adagrad";
    default: return "?";
  }
}

/// The slot variable a step updates beside the variable ("" for none).
constexpr std::string_view slot_name(RemoteUpdate kind) noexcept {
  switch (kind) {
    case RemoteUpdate::ApplyMomentum: return "momentum";
    case RemoteUpdate::ApplyAdagrad: return "accumulator";
    default: return "";
  }
}

/// Where the slot `slot` of the variable stored under `key` is stored, on the same ps task.
inline std::string slot_key(std::string_view key, std::string_view slot) { return fmt::format("{}/{}", key, slot); }

/// Checks a step's hyperparameters (RowsUpdate::params: SGD {lr}, momentum {lr, momentum,
/// nesterov 0|1}, Adagrad {lr, epsilon}), which may come from the wire: InvalidArgument naming
/// the bad one and `what`.
inline void check_step_params(RemoteUpdate kind, const std::array<double, 3>& p, std::string_view what) {
  const std::string_view name = optimizer_name(kind);
  auto fail = [&](std::string_view param, double v, std::string_view rule) {
    throw InvalidArgument(fmt::format("{} on {}: {} must be {}, got {}", name, what, param, rule, v));
  };
  if (!std::isfinite(p[0]) || p[0] < 0) fail("learning_rate", p[0], "a finite number >= 0");
  if (kind == RemoteUpdate::ApplyMomentum) {
    if (!(p[1] >= 0 && p[1] <= 1)) fail("momentum", p[1], "in [0, 1]");
    if (p[2] != 0 && p[2] != 1) fail("nesterov", p[2], "0 or 1");
  }
  if (kind == RemoteUpdate::ApplyAdagrad && (!std::isfinite(p[1]) || p[1] < 0)) fail("epsilon", p[1], "a finite number >= 0");
}

/// Whether optimizer steps apply to variables of `dtype` (float32 and float64, as the rules are
/// written; TF's kernels also take 16-bit floats, which lose most of a small step).
constexpr bool steps_apply_to(DType dtype) noexcept { return dtype == DType::F32 || dtype == DType::F64; }

namespace rules {
template <class E>
void sgd(E* v, const E* g, std::size_t n, E lr) noexcept {
  for (std::size_t i = 0; i < n; ++i) v[i] = v[i] - lr * g[i];
}
template <class E>
void momentum(E* v, E* m, const E* g, std::size_t n, E lr, E mu, bool nesterov) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = mu * m[i] - lr * g[i];
    v[i] = nesterov ? v[i] + (mu * m[i] - lr * g[i]) : v[i] + m[i];
  }
}
template <class E>
void adagrad(E* v, E* acc, const E* g, std::size_t n, E lr, E eps) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    acc[i] = acc[i] + g[i] * g[i];
    v[i] = v[i] - lr * g[i] / (std::sqrt(acc[i]) + eps);
  }
}
}  // namespace rules

/// One step of `kind` on `count` elements: `var` and `slot` (nullptr for SGD) updated in place,
/// `grad` read; any alignment (blocks are copied into aligned locals). dtype: steps_apply_to().
inline void apply_step(DType dtype, RemoteUpdate kind, std::byte* var, std::byte* slot, const std::byte* grad,
                       std::size_t count, const std::array<double, 3>& p) noexcept {
  auto run = [&](auto zero) {
    using E = decltype(zero);
    constexpr std::size_t kBlock = 64;
    E v[kBlock], s[kBlock], g[kBlock];
    const E lr = static_cast<E>(p[0]), second = static_cast<E>(p[1]);
    for (std::size_t at = 0; at < count; at += kBlock) {
      const std::size_t n = count - at < kBlock ? count - at : kBlock;
      const std::size_t off = at * sizeof(E), bytes = n * sizeof(E);
      std::memcpy(v, var + off, bytes);
      std::memcpy(g, grad + off, bytes);
      if (slot) std::memcpy(s, slot + off, bytes);
      switch (kind) {
        case RemoteUpdate::ApplySgd: rules::sgd(v, g, n, lr); break;
        case RemoteUpdate::ApplyMomentum: rules::momentum(v, s, g, n, lr, second, p[2] != 0); break;
        case RemoteUpdate::ApplyAdagrad: rules::adagrad(v, s, g, n, lr, second); break;
        default: break;
      }
      std::memcpy(var + off, v, bytes);
      if (slot) std::memcpy(slot + off, s, bytes);
    }
  };
  if (dtype == DType::F64) run(double{});
  else run(float{});
}

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE
