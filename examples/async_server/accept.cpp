// The server's front door (server.hpp): the accept loop, where each connection goes (an io
// thread, the pool's strand, or a thread of its own), admission against the connection limits
// and the drain, refusals, and what is done when descriptors run out.
#include "server.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include "use_tuple.hpp"

struct server::conn_thread {
  asio::io_context io{1};
  std::thread thread;
  std::atomic<bool> done{false};
};

void server::join_connection_threads() {
  std::list<std::shared_ptr<conn_thread>> threads;
  {
    std::lock_guard lock(mutex_);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads)
    if (t->thread.joinable()) t->thread.join();
}

std::shared_ptr<server::conn_thread> server::new_conn_thread() {
  return std::make_shared<conn_thread>();
}

void server::reap_conn_threads() {
  std::list<std::shared_ptr<conn_thread>> finished;
  {
    std::lock_guard lock(mutex_);
    for (auto it = conn_threads_.begin(); it != conn_threads_.end();) {
      if ((*it)->done.load(std::memory_order_acquire)) {
        finished.push_back(std::move(*it));
        it = conn_threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : finished) t->thread.join();  // already past run(): returns at once
}

asio::awaitable<void> server::accept_loop() {
  asio::steady_timer backoff(control_);
  std::error_code ignored;
  acceptor_.non_blocking(true,
                         ignored);  // for the draining accepts below (async ones are unaffected)
  for (;;) {
    placement where = next_placement();
    auto [ec, socket] = co_await acceptor_.async_accept(where.executor, use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (!accept_failed(ec)) {  // nothing shed: retry a little later instead of spinning
        // Out of descriptors with idle connections closing: once they are closed (5 ms).
        // Anything else: 50 ms.
        backoff.expires_after(
            std::chrono::milliseconds(ec == asio::error::no_descriptors ? 5 : 50));
        co_await backoff.async_wait(use_tuple);
      }
      continue;
    }
    admission a = admit(std::move(socket), std::move(where));
    // Then take what else is waiting in the backlog without another trip through the scheduler:
    // when every io thread is busy (pool mode), each trip can take milliseconds, and 256 clients
    // connecting at once would otherwise wait in line for one accept each. Not after an eviction:
    // the connections chosen close on their executors, and their descriptors must be free before
    // more are taken (the reserve holds one batch of them).
    for (int i = 0; i < 256 && a == admission::next; ++i) {
      placement more_where = next_placement();
      asio::ip::tcp::socket more = acceptor_.accept(more_where.executor, ec);
      if (ec) {  // would_block: the backlog is empty
        if (ec != asio::error::would_block && ec != asio::error::try_again) accept_failed(ec);
        break;
      }
      a = admit(std::move(more), std::move(more_where));
    }
    if (a == admission::stopping || a == admission::draining) co_return;
  }
}

bool server::accept_failed(const std::error_code& ec) {
  // (Asio 1.22's system category does not map errno values to std::errc: compare them.)
  const bool out_of_descriptors = ec.category() == asio::error::get_system_category() &&
                                  (ec.value() == EMFILE || ec.value() == ENFILE);
  std::size_t closed = 0;
  bool shed = false;
  if (out_of_descriptors) {
    // The limits keep connections within the descriptor limit, but other descriptors (or a lower
    // limit set from outside) can still run out. Close idle connections to make room (the loop
    // retries once they are closed, on their executors); when none is idle, take the connection
    // waiting in the backlog with the spare descriptor and close it at once (refused), so that
    // the loop neither spins on the same error nor leaves that client hanging.
    std::vector<std::shared_ptr<connection>> idle;
    {
      std::lock_guard lock(mutex_);
      table_.evict_idle(max_evicted_at_once, idle);
    }
    closed = idle.size();
    close_evicted(idle);
    if (closed == 0) shed = shed_one();
  }
  report_accept_error(ec, closed);
  return shed;
}

bool server::shed_one() {
  if (spare_descriptor_ < 0) return false;
  ::close(spare_descriptor_);
  const int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    metrics_.record_connection(connection_event::refused_descriptors);
  }
  spare_descriptor_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0;
}

void server::report_accept_error(const std::error_code& ec, std::size_t closed) {
  // At most once a second: a full server must not also flood its log.
  ++accept_errors_;
  const auto now = clock_type::now();
  if (now - last_accept_report_ < std::chrono::seconds(1)) return;
  std::fprintf(stderr,
               "evr-async-server: accept: %s (%llu times since the last report; %zu idle "
               "connections closed now)\n",
               ec.message().c_str(), static_cast<unsigned long long>(accept_errors_), closed);
  last_accept_report_ = now;
  accept_errors_ = 0;
}

server::placement server::next_placement() {
  // thread: an io_context and thread of its own. pool: a strand of the shared io_context (its
  // socket and coroutine are only ever used from one thread at a time). The others: the next
  // io_context, round-robin (its one thread is the only one to touch the connection).
  if (cfg_.mode == wait_mode::thread) {
    auto t = new_conn_thread();
    return {t->io.get_executor(), t, 0};
  }
  if (cfg_.mode == wait_mode::pool) return {asio::make_strand(*contexts_[0]), nullptr, 0};
  const std::size_t i = next_context_++ % contexts_.size();
  return {contexts_[i]->get_executor(), nullptr, i};
}

server::admission server::admit(asio::ip::tcp::socket socket, placement where) {
  if (cfg_.mode == wait_mode::thread) reap_conn_threads();
  metrics_.record_connection(connection_event::accepted);
  std::error_code ec;
  const asio::ip::tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return admission::next;  // already reset by the client: nothing to serve
  socket.set_option(asio::ip::tcp::no_delay(true), ec);  // small responses, sent at once
  socket.non_blocking(true, ec);  // responses are written at once when the socket takes them
  gpu_wait* gpu = gpu_waits_.empty() ? nullptr : gpu_waits_[where.context].get();
  auto c = std::make_shared<connection>(std::move(socket), peer.address(), gpu,
                                        next_device_ % lanes_.devices());
  std::vector<std::shared_ptr<connection>> evicted;
  connection_table::verdict verdict;
  bool admitted_in_drain = false;
  {
    std::lock_guard lock(mutex_);
    // drain() posts the close of the listening socket, and an accept's completion may run
    // before it: a connection accepted after the drain began. Its client connected in time: it
    // is served as those before it (the drain answers its first request with Connection:
    // close). Only once the drain has ended, or the server stops, is it closed unserved.
    if (stopping_.load(std::memory_order_relaxed) || drain_.ended()) return admission::stopping;
    admitted_in_drain = drain_.draining();
    verdict = table_.admit(c, evicted);
    if (verdict == connection_table::verdict::admitted && where.own)
      conn_threads_.push_back(where.own);
  }
  close_evicted(evicted);
  if (verdict != connection_table::verdict::admitted) {
    refuse(*c, verdict);
  } else {
    ++next_device_;
    start_serving(c, where.own);
  }
  if (admitted_in_drain) return admission::draining;
  return evicted.empty() ? admission::next : admission::yield;
}

void server::refuse(connection& c, connection_table::verdict why) {
  const bool per_address = why == connection_table::verdict::over_address;
  metrics_.record_connection(per_address ? connection_event::refused_per_address
                                         : connection_event::refused_total);
  const connection_table::limits& l = table_.limit();  // (constant: no lock needed)
  const std::string body =
      per_address ? "error 503: too many connections from your address (at most " +
                        std::to_string(l.per_address) + "); retry later\n"
                  : "error 503: the server has all the connections it takes (" +
                        std::to_string(l.total) + ") and none of them is idle; retry later\n";
  // Best effort, without waiting: a fresh socket's buffer takes this at once.
  std::error_code ignored;
  c.socket.write_some(asio::buffer(http::format_response(503, "text/plain; charset=utf-8", body,
                                                         false, "Retry-After: 1\r\n")),
                      ignored);
  c.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  c.socket.close(ignored);
}

void server::close_evicted(const std::vector<std::shared_ptr<connection>>& evicted) {
  for (const auto& c : evicted) {
    metrics_.record_connection(connection_event::evicted);
    asio::post(c->socket.get_executor(), [c] {
      std::error_code ignored;
      c->socket.close(ignored);  // its pending read fails, the coroutine ends
    });
  }
}

void server::start_serving(const std::shared_ptr<connection>& c,
                           const std::shared_ptr<conn_thread>& own) {
  asio::co_spawn(c->socket.get_executor(), serve(c), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "evr-async-server: connection ended by an exception: %s\n", ex.what());
    }
  });
  if (own) {
    // The thread runs this one connection and ends with it. Its io_context (and so the thread's
    // only reference to it) is kept by conn_threads_ until joined.
    own->thread = std::thread([t = own.get()] {
      pthread_setname_np(pthread_self(), "evr-conn");
      try {
        t->io.run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "evr-async-server: connection thread: %s\n", e.what());
      }
      t->done.store(true, std::memory_order_release);
    });
  }
}
