// The yardstick: a nlohmann/json hello world (Debian nlohmann-json3-dev).
#include <iostream>
#include <nlohmann/json.hpp>

int main() {
  nlohmann::json j = {{"hello", "world"}, {"answer", 42}, {"list", {1, 2, 3}}};
  std::cout << j.dump(2) << "\n";
}
