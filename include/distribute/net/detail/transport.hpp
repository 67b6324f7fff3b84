// The TCP transport under the Communicator, by concern:
//   event_loop.hpp   the network thread (Asio), polling while calls are in flight
//   handshake.hpp    the authenticated handshake, both roles (token proofs, deadline, refusals)
//   listener.hpp     accepting connections, bounded while they are in their handshake
//   connector.hpp    reaching a peer, retrying with back-off while it is not up yet
//   connection.hpp   one authenticated socket: framed, bounded reads and writes
//   transfer.hpp     what a call hands to a connection (sends, receives, frames, early buffers)
//   mesh.hpp         Transport: a connection to every rank, matching, heartbeats, failure
//   agreement.hpp    how the ranks check that they called the same collective: over TCP
//                    (tcp_agreement.hpp) or on a shared-memory board (shared_memory_agreement.hpp)
//   call.hpp         Call: one collective or point-to-point call and its state
// The algorithms (collectives.hpp and the rest) take a Transport and run inside a Call.
#pragma once

#include <distribute/net/detail/call.hpp>
#include <distribute/net/detail/mesh.hpp>
