// The library's compiled part for programs built with DISTRIBUTE_SEPARATE_COMPILATION
// (include/distribute/src.hpp): meson's distribute_compiled_dep and CMake's distribute::compiled
// compile this file, with DISTRIBUTE_SEPARATE_COMPILATION defined, for the programs that link them.
#include <distribute/src.hpp>
