// The value types whose templates a separately compiled library instantiates once (version.hpp,
// DISTRIBUTE_SEPARATE_COMPILATION): a variable's storage, strategy.reduce of its values. A program
// compiled apart instantiates these for other types itself, as a header-only one does.
#pragma once

#include <cstdint>
#include <vector>

#include <distribute/core/tensor.hpp>

// X(type) for each of them.
#define DISTRIBUTE_DETAIL_FOR_COMMON_VALUE_TYPES(X)                                                      \
  X(float)                                                                                               \
  X(double)                                                                                              \
  X(std::int32_t)                                                                                        \
  X(std::int64_t)                                                                                        \
  X(std::vector<float>)                                                                                  \
  X(std::vector<double>)                                                                                 \
  X(::distribute::Tensor<float>)                                                                         \
  X(::distribute::Tensor<double>)
