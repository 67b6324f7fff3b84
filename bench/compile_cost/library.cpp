// The library's own translation unit of a program compiled apart (DISTRIBUTE_SEPARATE_COMPILATION,
// given by compile_cost.py): compiled once per program, not once per file that includes the header.
#include <distribute/src.hpp>
