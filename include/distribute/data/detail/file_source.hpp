// The file sources under from_text_files / from_record_files: read the files in order, one
// reader at a time, and only this worker's files when distribute_dataset shards by file.
#pragma once

#include <cstddef>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/data/detail/iterator.hpp>
#include <distribute/data/record_file.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data::detail {

#if DISTRIBUTE_DETAIL_DEFINE  // used by from_text_files (version.hpp: separate compilation)
/// One text file's lines, without their line ends ("\n" or "\r\n").
class TextLineReader {
 public:
  explicit TextLineReader(std::string path) : path_(std::move(path)), in_(path_) {
    if (!in_) throw InvalidArgument(open_error("from_text_files", path_));
  }
  std::optional<std::string> next() {
    std::string line;
    if (!std::getline(in_, line)) {
      if (in_.bad()) throw Error(fmt::format("from_text_files: reading '{}' failed", path_));
      return std::nullopt;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }

 private:
  std::string path_;
  std::ifstream in_;
};
#endif

/// The records of files i with i % file_shards == file_shard_index, file after file. A file is
/// opened when the previous one is finished, so at most one is open at a time.
template <class Reader>
class FileSourceIterator final : public ElementIterator<std::string> {
 public:
  FileSourceIterator(std::shared_ptr<const std::vector<std::string>> files, const PipelineContext& ctx)
      : files_(std::move(files)), step_(ctx.file_shards), next_file_(ctx.file_shard_index) {}

  std::optional<std::string> next() override {
    for (;;) {
      if (!reader_) {
        if (next_file_ >= files_->size()) return std::nullopt;
        reader_.emplace((*files_)[next_file_]);
        next_file_ += step_;
      }
      if (auto record = reader_->next()) return record;
      reader_.reset();
    }
  }

 private:
  std::shared_ptr<const std::vector<std::string>> files_;
  std::size_t step_;
  std::size_t next_file_;
  std::optional<Reader> reader_;
};

}  // namespace data::detail
DISTRIBUTE_END_NAMESPACE
