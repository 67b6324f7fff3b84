// Smallest downstream program: used by every consumer check (meson subproject,
// single header, installed headers + pkg-config).
#include <distribute/distribute.hpp>

#include <cstdio>
#include <string>

int main() {
  const distribute::ReduceOp op = distribute::parse_reduce_op("sum");
  if (op != distribute::ReduceOp::Sum) {
    std::fprintf(stderr, "parse_reduce_op(\"sum\") returned the wrong op\n");
    return 1;
  }
  // Goes through libfmt, so a missing -lfmt shows up as a link error.
  const std::string text = fmt::format("{}", op);
  if (text != "SUM") {
    std::fprintf(stderr, "formatting ReduceOp::Sum gave '%s'\n", text.c_str());
    return 1;
  }
  std::printf("distribute %s\n", DISTRIBUTE_VERSION_STRING);
  return 0;
}
