// The server's open connections and its limits on them: at most `total` at once, at most
// `per_address` from one client address. A connection over a limit takes the place of the
// connections that have waited longest for a request head (idle keep-alive connections, heads
// still trickling in) -- its own address's first when it is over its address's share -- which
// are closed to make room; only when none waits for a head is it refused. So idle sockets,
// however many a client holds or keeps opening, never lock others out; a client whose
// connections all have requests in flight holds at most its share; and the descriptors stay
// within the limit the server was given (cli.hpp derives it from RLIMIT_NOFILE).
//
// Not thread-safe: the server's mutex guards every call (the accept loop, connections ending,
// stop(), the sweep). Choosing whom to close scans the table: once per `evict_batch` admissions
// at the limit, not per admission.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <asio/ip/address.hpp>

#include "connection.hpp"

class connection_table {
 public:
  struct limits {
    std::size_t total = 1024;
    std::size_t per_address = 1024;
  };
  enum class verdict { admitted, over_address, over_total };

  explicit connection_table(limits l);

  /// Registers `c` unless a limit forbids it. At the total limit, first marks up to evict_batch()
  /// connections waiting for a request head as evicted and appends them to `evict` (the caller
  /// closes them; they stay registered until erase()), admitting `c` in their place.
  verdict admit(const std::shared_ptr<connection>& c,
                std::vector<std::shared_ptr<connection>>& evict);
  /// Marks up to `n` connections waiting for a request head as evicted, oldest wait first (only
  /// those from `*only` when it is not null), and appends them to `evict`. Also for when the
  /// process runs out of descriptors anyway.
  void evict_idle(std::size_t n, std::vector<std::shared_ptr<connection>>& evict,
                  const asio::ip::address* only = nullptr);
  void erase(const std::shared_ptr<connection>& c);

  /// Registered connections, evicted ones not yet closed included.
  std::size_t size() const noexcept { return open_.size(); }
  const std::unordered_set<std::shared_ptr<connection>>& all() const noexcept { return open_; }
  const limits& limit() const noexcept { return limits_; }
  /// How many connections one admission at the limit evicts.
  std::size_t evict_batch() const noexcept;

 private:
  void forget_address(const asio::ip::address& peer);

  limits limits_;
  std::unordered_set<std::shared_ptr<connection>> open_;
  // Connections not evicted, by address (an address with none has no entry).
  std::unordered_map<asio::ip::address, std::size_t> per_address_;
  std::size_t evicted_ = 0;  // registered, marked evicted
};
