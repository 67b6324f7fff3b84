// The library's error hierarchy: every error derives from ds::Error.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// `input` in single quotes for an error message: whole up to `max` bytes, else its first `max`
/// bytes and its length ("'abc...' (1048576 bytes)"), so that no message carries the megabytes a
/// caller or a stranger sent.
inline std::string quote_input(std::string_view input, std::size_t max = 64) {
  if (input.size() <= max) return "'" + std::string(input) + "'";
  return "'" + std::string(input.substr(0, max)) + "...' (" + std::to_string(input.size()) + " bytes)";
}

/// Base of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed a value the library cannot work with (bad shape, axis, name, nesting).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// The cluster configuration (TF_CONFIG, Slurm, launcher environment) is malformed.
class ClusterConfigError : public Error {
 public:
  using Error::Error;
};

/// A peer (another replica, worker or parameter server) failed or went away.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

/// A collective did not complete within its timeout.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

/// A checkpoint file is missing, truncated, corrupted or does not match what it restores.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A resource the caller asked for does not exist on this machine (e.g. no GPU visible).
class Unavailable : public Error {
 public:
  using Error::Error;
};

/// The end of a sequence was reached (TF's OutOfRangeError): a per-worker iterator read past the
/// end of its dataset inside a scheduled function.
class OutOfRange : public Error {
 public:
  using Error::Error;
};

/// A replica was released from a collective because another replica of the same step failed.
/// `run` never rethrows this one when the original error is known; it rethrows the original.
class Cancelled : public Error {
 public:
  using Error::Error;
};

DISTRIBUTE_END_NAMESPACE
