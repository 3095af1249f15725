#include "connection_table.hpp"

#include <algorithm>
#include <cstdint>

connection_table::connection_table(limits l) : limits_(l) {}

std::size_t connection_table::evict_batch() const noexcept {
  // Enough that a flood of new connections at the limit pays for one scan per batch, few enough
  // that the descriptors of connections being closed fit the process's reserve (cli.hpp).
  return std::clamp<std::size_t>(limits_.total / 256, 1, 64);
}

connection_table::verdict connection_table::admit(const std::shared_ptr<connection>& c,
                                                  std::vector<std::shared_ptr<connection>>& evict) {
  const auto from_peer = [&] {
    const auto it = per_address_.find(c->peer);
    return it == per_address_.end() ? std::size_t{0} : it->second;
  };
  if (from_peer() >= limits_.per_address) {
    evict_idle(evict_batch(), evict, &c->peer);  // its own idle connections make room first
    if (from_peer() >= limits_.per_address) return verdict::over_address;
  }
  if (open_.size() - evicted_ >= limits_.total) {
    evict_idle(evict_batch(), evict, nullptr);
    if (open_.size() - evicted_ >= limits_.total) return verdict::over_total;
  }
  ++per_address_[c->peer];
  open_.insert(c);
  return verdict::admitted;
}

void connection_table::evict_idle(std::size_t n, std::vector<std::shared_ptr<connection>>& evict,
                                  const asio::ip::address* only) {
  struct candidate {
    std::int64_t waiting_since;  // its head deadline: the earliest began waiting first
    const std::shared_ptr<connection>* c;
  };
  std::vector<candidate> idle;
  for (const auto& c : open_)
    if (!c->evicted && c->reading_head.load(std::memory_order_relaxed) &&
        (only == nullptr || c->peer == *only))
      idle.push_back({c->deadline_ns.load(std::memory_order_relaxed), &c});
  n = std::min(n, idle.size());
  std::nth_element(
      idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(n), idle.end(),
      [](const candidate& a, const candidate& b) { return a.waiting_since < b.waiting_since; });
  for (std::size_t i = 0; i < n; ++i) {
    const std::shared_ptr<connection>& victim = *idle[i].c;
    victim->evicted = true;
    ++evicted_;
    forget_address(victim->peer);
    evict.push_back(victim);
  }
}

void connection_table::forget_address(const asio::ip::address& peer) {
  const auto it = per_address_.find(peer);
  if (it != per_address_.end() && --it->second == 0) per_address_.erase(it);
}

void connection_table::erase(const std::shared_ptr<connection>& c) {
  if (open_.erase(c) == 0) return;
  if (c->evicted)
    --evicted_;  // (its address stopped counting it when it was chosen)
  else
    forget_address(c->peer);
}
