// How a variable asks to be kept in sync and aggregated (TF's tf.VariableSynchronization and
// tf.VariableAggregation), and the options it is created with. Apart from variable.hpp so that
// the storage classes under core/detail/ can read them without the Variable façade.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

enum class VariableSynchronization { Auto, OnWrite, OnRead, None };
enum class VariableAggregation { None, Sum, Mean, OnlyFirstReplica };

constexpr std::string_view to_string(VariableSynchronization s) noexcept {
  switch (s) {
    case VariableSynchronization::Auto: return "AUTO";
    case VariableSynchronization::OnWrite: return "ON_WRITE";
    case VariableSynchronization::OnRead: return "ON_READ";
    case VariableSynchronization::None: return "NONE";
  }
  return "?";
}
constexpr std::string_view to_string(VariableAggregation a) noexcept {
  switch (a) {
    case VariableAggregation::None: return "NONE";
    case VariableAggregation::Sum: return "SUM";
    case VariableAggregation::Mean: return "MEAN";
    case VariableAggregation::OnlyFirstReplica: return "ONLY_FIRST_REPLICA";
  }
  return "?";
}

struct VariableOptions {
  std::string name = "Variable";
  /// Unset means TF's default: true, except for ON_READ variables (false).
  std::optional<bool> trainable = std::nullopt;
  VariableSynchronization synchronization = VariableSynchronization::Auto;
  VariableAggregation aggregation = VariableAggregation::None;
};

DISTRIBUTE_END_NAMESPACE
