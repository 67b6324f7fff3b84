// libFuzzer target: record files (data/record_file.hpp: TFRecord framing, both CRC-32Cs) and the
// TensorBoard event files made of them (summary/event.hpp). The input is the file.
// Oracles: only typed errors; nothing allocated for more than the file holds (fuzz.sh's malloc
// limit: a length field claiming gigabytes is a crash); a file read whole writes back, record by
// record, to the same bytes.
#include <distribute/data/record_file.hpp>
#include <distribute/summary/event.hpp>

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_common.hpp"

namespace ds = distribute;

namespace {

// The reader takes a path: each input goes through one file of this process.
const std::string& scratch() {
  static const std::string path = "/tmp/fuzz_record." + std::to_string(::getpid());
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::ofstream(scratch(), std::ios::binary | std::ios::trunc) << input;
  fuzz::expect_typed_errors([&] {
    ds::data::RecordReader reader(scratch(), "fuzz");
    std::vector<std::string> records;
    while (auto r = reader.next()) records.push_back(std::move(*r));
    const std::string again = scratch() + ".again";
    ds::data::write_record_file(again, records);
    fuzz::require(read_all(again) == input, "a file read whole writes back to the same bytes");
  });
  fuzz::expect_typed_errors([&] { (void)ds::summary::read_event_file(scratch()); });
  return 0;
}
