// One client connection of the server: its socket, what its requests wait with, and the state
// the server's sweeps and limits read (connection_table.hpp, server.hpp).
//
// Thread safety: everything on the connection's executor (evr, hostfunc, poll: its io_context's
// one thread; pool: its strand; thread: its own thread) but the atomics, which the sweep and the
// accept loop read, and the fields marked as the table's (guarded by the server's mutex).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <asio/cancellation_signal.hpp>
#include <asio/ip/tcp.hpp>

#include "batcher.hpp"
#include "gpu_wait.hpp"
#include "http.hpp"
#include "params.hpp"

struct connection {
  /// `gpu`: what its GPU waits use, its io_context's (null in the blocking modes); `device`: the
  /// device it prefers.
  connection(asio::ip::tcp::socket s, const asio::ip::address& peer, gpu_wait* gpu,
             std::size_t device)
      : socket(std::move(s)), peer(peer), device(device), gpu(gpu) {
    body.reserve(256);  // a /busy answer is ~110 bytes, its response ~200: no growing later
    wire.reserve(512);
    if (gpu != nullptr) mailbox.emplace(socket.get_executor(), 1);
  }

  asio::ip::tcp::socket socket;
  const asio::ip::address peer;  // the client's address (connection_table counts per address)
  const std::size_t device;      // its requests take this device's lanes first
  /// When the connection must have made progress (steady_clock, ns), 0: no deadline. Set by the
  /// connection, taken (exchanged with 0) by the sweep that closes it.
  std::atomic<std::int64_t> deadline_ns{0};
  /// True while it waits for a request head (idle keep-alive, or a head still arriving): what
  /// the server closes first when it is full (connection_table::admit).
  std::atomic<bool> reading_head{false};
  /// The number of the request being served (from its head to its response), 0 between requests:
  /// a sweep that sees the same number as the sweep before watches the socket for the client
  /// leaving (server::watch_client).
  std::atomic<std::uint32_t> serving{0};
  std::uint32_t swept = 0;  // `serving` at the last sweep (the table's)
  bool evicted = false;     // chosen to be closed to make room (the table's)

  std::uint32_t requests = 0;  // requests begun on this connection
  bool watching = false;       // an async_wait on the socket is pending (server::watch_client)
  bool gone = false;           // the client left, or the server stopped: nothing more to send
  /// Emitted when the client is gone: cancels what the request waits for (a lane, an admission
  /// slot, its /mlp batch, the evr wait of its GPU work while watched). Bound to those waits.
  asio::cancellation_signal abandon;
  /// The non-blocking modes: the waits of its io_context, shared by its connections (one waiter
  /// a connection would cost every connection made and closed a reactor call).
  gpu_wait* const gpu;
  std::optional<mlp_batcher::mailbox> mailbox;  // the non-blocking modes: /mlp batches answer here
  // Reused from request to request (cleared, their capacity kept): no allocation per request once
  // they have grown to what this connection's requests need.
  std::string in;  // bytes read and not yet consumed: a pipelined request may follow a body
  http::request req;
  params::list query, form;
  std::string body;  // the response's body
  std::string wire;  // the response as sent
};
