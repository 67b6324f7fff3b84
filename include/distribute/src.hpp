// The library's compiled part, for programs built with DISTRIBUTE_SEPARATE_COMPILATION: exactly one
// translation unit of the program includes this header, first, and compiles the library's
// non-template code and the instantiations its headers declare `extern template` (see version.hpp).
// The parts the program asks for elsewhere (DISTRIBUTE_WITH_MULTI_WORKER, ...) are asked for here
// too, before the include:
//
//   // distribute.cpp
//   #define DISTRIBUTE_SEPARATE_COMPILATION   // or -DDISTRIBUTE_SEPARATE_COMPILATION for every file
//   #include <distribute/src.hpp>
//
// The CMake target distribute::compiled and meson's distribute_compiled_dep build this file.
#pragma once

#if !defined(DISTRIBUTE_SEPARATE_COMPILATION)
#error "<distribute/src.hpp> is for programs compiled with DISTRIBUTE_SEPARATE_COMPILATION (define it for every file)"
#endif
#if defined(DISTRIBUTE_VERSION_MAJOR)
#error "<distribute/src.hpp> must be the first distribute header of its translation unit"
#endif

#define DISTRIBUTE_DETAIL_SOURCE 1
#include <distribute/distribute.hpp>
