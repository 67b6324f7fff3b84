// expect-error: could not convert '42' from 'int' to 'std::string_view'|no viable conversion from 'int' to 'std::string_view'
// parse_reduce_op takes text; an integer must not silently convert to a ReduceOp.
#include <distribute/core/reduce_op.hpp>

int main() {
  distribute::ReduceOp op = distribute::parse_reduce_op(42);
  return op == distribute::ReduceOp::Sum ? 0 : 1;
}
