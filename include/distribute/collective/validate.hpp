// The shape of every in-process collective: publish my call, barrier, check all calls agree,
// work on everybody's buffers, barrier. Every replica checks the published calls against
// replica 0's, so a mismatch (another op, shape, dtype or collective) fails identically on all
// of them, and no replica leaves (freeing the buffers it published) while others still read them.
#pragma once

#include <cstddef>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include <distribute/collective/detail/scatter.hpp>
#include <distribute/core/concat.hpp>
#include <distribute/core/replica_group.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective {

/// How many replicas an all_to_all spans (num_replicas_in_sync): its call carries it in `root`;
/// 0 where the whole table is checked later, once gathered from every worker (so that every
/// worker reports the same mismatch instead of one worker alone).
inline int all_to_all_replicas(const core::ReplicaGroup& group) { return group.slot(0).root; }

/// all_reduce_into: a replica's output must be its own, apart from every other replica's input
/// and output (each replica writes its slice of every output while the others read the inputs).
inline void check_outputs_apart(const core::ReplicaGroup& group, std::size_t i) {
  auto range = [](const void* p, std::size_t bytes) {
    const auto* b = static_cast<const std::byte*>(p);
    return std::pair{b, b + bytes};
  };
  auto overlaps = [](auto a, auto b) { return a.first < b.second && b.first < a.second; };
  for (int r = 0; r < group.size(); ++r) {
    const core::BufferRef& mine = group.slot(r).buffers[i];
    if (!mine.caller_output || mine.bytes() == 0) continue;
    const auto out = range(mine.data, mine.bytes());
    for (int q = 0; q < group.size(); ++q) {
      if (q == r) continue;
      const core::BufferRef& other = group.slot(q).buffers[i];
      const char* what = overlaps(out, range(other.data, other.bytes()))      ? "output"
                         : overlaps(out, range(other.input(), other.bytes())) ? "input"
                                                                               : nullptr;
      if (what != nullptr) {
        throw InvalidArgument(fmt::format("all_reduce_into: the output of replica {} overlaps the {} of replica {}; "
                                          "every replica needs an output of its own",
                                          r, what, q));
      }
    }
  }
}

DISTRIBUTE_DECL void validate_same_call(const core::ReplicaGroup& group);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL void validate_same_call(const core::ReplicaGroup& group) {
  const core::CollectiveCall& c0 = group.slot(0);
  const core::CollectiveKind kind = c0.kind;
  for (int r = 1; r < group.size(); ++r) {
    const core::CollectiveCall& c = group.slot(r);
    if (c.kind != kind) {
      throw InvalidArgument(fmt::format("replica 0 called {} but replica {} called {}: every replica must issue the "
                                        "same collectives in the same order",
                                        to_string(c0.kind), r, to_string(c.kind)));
    }
  }
  for (int r = 1; r < group.size(); ++r) {
    const core::CollectiveCall& c = group.slot(r);
    switch (kind) {
      case core::CollectiveKind::AllReduce:
        if (c.op != c0.op) {
          throw InvalidArgument(
              fmt::format("all_reduce: replica 0 reduces with {} but replica {} with {}", c0.op, r, c.op));
        }
        if (c.buffers.size() != c0.buffers.size()) {
          throw InvalidArgument(fmt::format("all_reduce: replica 0 passed {} values but replica {} passed {}",
                                            c0.buffers.size(), r, c.buffers.size()));
        }
        for (std::size_t i = 0; i < c.buffers.size(); ++i) {
          const auto& a = c0.buffers[i];
          const auto& b = c.buffers[i];
          if (a.dtype != b.dtype || a.shape != b.shape) {
            throw InvalidArgument(fmt::format(
                "all_reduce: value {} is {} of shape {} on replica 0 but {} of shape {} on replica {}", i,
                to_string(a.dtype), shape_string(a.shape), to_string(b.dtype), shape_string(b.shape), r));
          }
        }
        break;
      case core::CollectiveKind::AllGather: {
        if (c.axis != c0.axis) {
          throw InvalidArgument(
              fmt::format("all_gather: replica 0 gathers along axis {} but replica {} along axis {}", c0.axis, r, c.axis));
        }
        break;
      }
      case core::CollectiveKind::Broadcast: {
        const auto& a = c0.buffers[0];
        const auto& b = c.buffers[0];
        if (c.root != c0.root || a.dtype != b.dtype || a.shape != b.shape) {
          throw InvalidArgument(fmt::format(
              "broadcast: replica 0 passes {} of shape {} from root {} but replica {} passes {} of shape {} from root {}",
              to_string(a.dtype), shape_string(a.shape), c0.root, r, to_string(b.dtype), shape_string(b.shape), c.root));
        }
        break;
      }
      case core::CollectiveKind::ReduceScatter: {
        const auto& a = c0.buffers[0];
        const auto& b = c.buffers[0];
        if (c.op != c0.op) {
          throw InvalidArgument(
              fmt::format("reduce_scatter: replica 0 reduces with {} but replica {} with {}", c0.op, r, c.op));
        }
        if (a.dtype != b.dtype || a.shape != b.shape) {
          throw InvalidArgument(fmt::format("reduce_scatter: replica 0 passes {} of shape {} but replica {} passes {} of shape {}",
                                            to_string(a.dtype), shape_string(a.shape), r, to_string(b.dtype),
                                            shape_string(b.shape)));
        }
        break;
      }
      case core::CollectiveKind::AllToAll: break;  // below, on the whole table
      case core::CollectiveKind::MergeCall:
        if (c.merge_type != c0.merge_type && *c.merge_type != *c0.merge_type) {
          throw InvalidArgument(fmt::format("merge_call: replica {} passed other argument types than replica 0", r));
        }
        break;
    }
  }
  if (kind == core::CollectiveKind::AllReduce) {
    for (std::size_t i = 0; i < c0.buffers.size(); ++i) check_outputs_apart(group, i);
  }
  if (kind == core::CollectiveKind::AllToAll) {
    std::vector<collective::detail::AllToAllSide> sides;
    for (int r = 0; r < group.size(); ++r) sides.push_back(collective::detail::side_of(group.slot(r)));
    if (all_to_all_replicas(group) > 0) collective::detail::check_all_to_all(sides, all_to_all_replicas(group));
  }
  if (kind == core::CollectiveKind::AllGather) {
    std::vector<const core::BufferRef*> parts;
    for (int r = 0; r < group.size(); ++r) parts.push_back(&group.slot(r).buffers[0]);
    core::check_concat(parts, c0.axis, "all_gather");
  }
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
/// Publishes `call`, waits for every replica, checks the calls agree, then runs each phase on
/// every replica with a barrier after each (a phase may read what earlier phases wrote on any
/// replica). The final barrier keeps every published buffer alive until all readers are done.
/// A replica whose phase throws skips its later phases and rethrows after the last barrier;
/// the others then throw Cancelled instead of returning a half-computed result.
template <class... Phases>
void exchange(core::ReplicaGroup& group, int replica, const core::CollectiveCall& call, Phases&&... phases) {
  group.publish(replica, &call);
  group.arrive_and_wait(replica, call.kind);
  std::exception_ptr error;
  try {
    validate_same_call(group);
  } catch (...) {
    error = std::current_exception();  // every replica sees the same mismatch
  }
  auto run_phase = [&](auto& phase) {
    if (!error) {
      try {
        phase();
      } catch (...) {
        error = std::current_exception();
        group.mark_collective_failed(replica);
      }
    }
    group.arrive_and_wait(replica, call.kind);
  };
  (run_phase(phases), ...);
  if (error) std::rethrow_exception(error);
  if (int failed = group.collective_failed_replica(); failed >= 0) {
    throw Cancelled(fmt::format("replica {} left {}: replica {} failed in it", replica, to_string(call.kind), failed));
  }
}

}  // namespace collective
DISTRIBUTE_END_NAMESPACE
