// Readable C++ type names for error messages (typeid's are mangled).
#pragma once

#include <cstdlib>
#include <string>
#include <typeinfo>

#include <cxxabi.h>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

DISTRIBUTE_DECL std::string type_name(const std::type_info& t);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string type_name(const std::type_info& t) {
  int status = 0;
  char* p = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && p) ? std::string(p) : std::string(t.name());
  std::free(p);
  return out;
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
}  // namespace core
DISTRIBUTE_END_NAMESPACE
