// expect-ok
// Control for the compile-fail suite: correct use of the same API must compile.
#include <distribute/core/reduce_op.hpp>

int main() {
  distribute::ReduceOp op = distribute::parse_reduce_op("sum");
  return op == distribute::ReduceOp::Sum ? 0 : 1;
}
