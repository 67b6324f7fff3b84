// TensorBoard's event files: a record file (TFRecord framing, data/record_file.hpp) of `Event`
// messages (tensorflow/core/util/event.proto, summary.proto). The part of them that scalars use:
//
//   message Event   { double wall_time = 1; int64 step = 2;
//                     oneof what { string file_version = 3; Summary summary = 5; ... } }
//   message Summary { repeated Value value = 1; }
//   message Summary.Value { string tag = 1; oneof value { float simple_value = 2; ... } }
//
// Scalars are written as `simple_value`, which TensorBoard's scalar dashboard and its
// EventAccumulator.Scalars(tag) read (TF 2 writes a tensor with scalars-plugin metadata, which
// TensorBoard converts to the same). Reading (read_event_file, TF's summary_iterator) skips the
// fields it does not know, so it reads files that TensorFlow or TensorBoard wrote.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/data/record_file.hpp>
#include <distribute/summary/detail/protobuf_wire.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace summary {

/// The first event of every file: which format the rest is in.
inline constexpr std::string_view kFileVersion = "brain.Event:2";

/// A Summary.Value holding a scalar. `simple_value` is absent for values of other kinds
/// (images, histograms, tensors) that a file may hold.
struct ScalarValue {
  std::string tag;
  std::optional<float> simple_value;
};

/// One Event: its time (seconds since the epoch), its step, and either the file version (the
/// first event of a file) or summary values.
struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<ScalarValue> values;
};

/// The Event message's bytes. A step of 0 is left out, as proto3 leaves default values out; a
/// simple_value is always written, 0 included (it is a member of a oneof, whose presence counts).
inline std::string encode_event(const Event& event) {
  detail::WireWriter w;
  w.double_field(1, event.wall_time);
  if (event.step != 0) w.int64_field(2, event.step);
  if (!event.file_version.empty()) w.bytes_field(3, event.file_version);
  if (!event.values.empty()) {
    detail::WireWriter summary;
    for (const ScalarValue& v : event.values) {
      detail::WireWriter value;
      value.bytes_field(1, v.tag);
      if (v.simple_value) value.float_field(2, *v.simple_value);
      summary.bytes_field(1, value.bytes());
    }
    w.bytes_field(5, summary.bytes());
  }
  return std::move(w).bytes();
}

namespace detail {

/// Reads `message` field by field with `on_field`; DataLossError (naming `what`) when it is malformed.
template <class OnField>
void read_message(std::string_view message, std::string_view what, OnField&& on_field) {
  WireReader reader(message);
  while (auto f = reader.next()) on_field(*f);
  if (!reader.error().empty()) throw data::DataLossError(fmt::format("malformed {} message: {}", what, reader.error()));
}

inline void expect_type(const WireField& f, WireType type, std::string_view what) {
  if (f.type != type) {
    throw data::DataLossError(fmt::format("malformed {} message: field {} has wire type {}, expected {}", what, f.field,
                                          static_cast<int>(f.type), static_cast<int>(type)));
  }
}

}  // namespace detail

/// Parses an Event message; DataLossError when the bytes are not one.
inline Event decode_event(std::string_view bytes) {
  using detail::WireType;
  Event event;
  detail::read_message(bytes, "Event", [&](const detail::WireField& f) {
    switch (f.field) {
      case 1: detail::expect_type(f, WireType::Fixed64, "Event"); event.wall_time = f.as_double(); break;
      case 2: detail::expect_type(f, WireType::Varint, "Event"); event.step = static_cast<std::int64_t>(f.number); break;
      case 3: detail::expect_type(f, WireType::LengthDelimited, "Event"); event.file_version = f.bytes; break;
      case 5:
        detail::expect_type(f, WireType::LengthDelimited, "Event");
        detail::read_message(f.bytes, "Summary", [&](const detail::WireField& s) {
          if (s.field != 1) return;
          detail::expect_type(s, WireType::LengthDelimited, "Summary");
          ScalarValue value;
          detail::read_message(s.bytes, "Summary.Value", [&](const detail::WireField& v) {
            if (v.field == 1) {
              detail::expect_type(v, WireType::LengthDelimited, "Summary.Value");
              value.tag = v.bytes;
            } else if (v.field == 2) {
              detail::expect_type(v, WireType::Fixed32, "Summary.Value");
              value.simple_value = v.as_float();
            }
          });
          event.values.push_back(std::move(value));
        });
        break;
      default: break;  // graph_def, log_message, session_log...: not ours to read
    }
  });
  return event;
}

/// Every event of an event file, in order (TF's tf.compat.v1.train.summary_iterator), with both
/// CRCs of every record checked. data::DataLossError for a truncated or corrupted record (naming
/// the file and the byte offset of the record) or a record that is not an Event.
inline std::vector<Event> read_event_file(const std::string& path) {
  data::RecordReader reader(path, "read_event_file");
  std::vector<Event> events;
  while (auto record = reader.next()) {
    try {
      events.push_back(decode_event(*record));
    } catch (const data::DataLossError& e) {
      throw data::DataLossError(fmt::format("event file '{}': record {}: {}", path, events.size(), e.what()));
    }
  }
  return events;
}

}  // namespace summary
DISTRIBUTE_END_NAMESPACE
