// Version macros and the versioned inline ABI namespace.
#pragma once

#define DISTRIBUTE_VERSION_MAJOR 0
#define DISTRIBUTE_VERSION_MINOR 1
#define DISTRIBUTE_VERSION_PATCH 0
#define DISTRIBUTE_VERSION_STRING "0.1.0"

// Every public name lives in distribute::v0 so that two incompatible builds of the
// library linked into one program fail to link instead of silently mixing layouts.
#define DISTRIBUTE_BEGIN_NAMESPACE \
  namespace distribute {           \
  inline namespace v0 {
#define DISTRIBUTE_END_NAMESPACE \
  }                              \
  }
