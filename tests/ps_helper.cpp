// One task of a parameter-server test cluster: `ps_helper JOB INDEX CLUSTER_JSON` runs a ds::Server
// for ps or worker task INDEX until the coordinator stops it. The functions below are registered
// in this process and in the test (the coordinator), as every process of a cluster does.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "ps_functions.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: ps_helper ps|worker INDEX CLUSTER_JSON\n");
    return 2;
  }
  try {
    ds::Server server(ds::ClusterSpec::from_json(argv[3]), argv[1], std::atoi(argv[2]));
    std::printf("serving %s at %s\n", argv[1], server.target().c_str());
    std::fflush(stdout);
    server.join();
    std::printf("stopped\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_helper %s %s: %s\n", argv[1], argv[2], e.what());
    return 1;
  }
}
