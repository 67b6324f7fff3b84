// The C++ side of the conformance suite: reads one case per line (JSON) on stdin, runs it through
// distribute and writes one result per line: {"id", "ok": true, "value"} or {"id", "ok": false,
// "error"}. driver.py runs the same cases through TensorFlow and compares. Built against the
// single header (single_include/), as a user would.
#define DISTRIBUTE_WITH_ALL
#include <distribute/distribute.hpp>

#include <boost/json.hpp>
#include <iostream>
#include <string>

#include "runner_areas.hpp"

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    boost::json::object result;
    boost::json::value parsed = boost::json::parse(line);
    const auto& c = parsed.as_object();
    result["id"] = c.at("id");
    try {
      result["value"] = conformance::run_case(std::string(c.at("area").as_string()), c.at("input"));
      result["ok"] = true;
    } catch (const distribute::Error& e) {
      result["ok"] = false;
      result["error"] = e.what();
    }
    std::cout << boost::json::serialize(result) << '\n';
  }
  std::cout.flush();
  return 0;
}
