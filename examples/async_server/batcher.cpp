#include "batcher.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>

#include "use_tuple.hpp"

namespace {
using clock_type = std::chrono::steady_clock;
}  // namespace

mlp_batcher::mlp_batcher(asio::io_context& io, lane_pool& lanes, const gpu_wait::source& wait,
                         const mlp::shape& shape, options opts, server_metrics& metrics)
    : io_(io),
      lanes_(lanes),
      shape_(shape),
      opts_(opts),
      metrics_(metrics),
      wait_(io.get_executor(), wait),
      timer_strand_(asio::make_strand(io)),
      timer_(timer_strand_) {}

asio::awaitable<mlp_batcher::result> mlp_batcher::run(const mlp::request& req, float* outputs,
                                                      mailbox& box,
                                                      asio::cancellation_slot cancel) {
  result r;
  submit(entry{req.inputs.data(), req.rows, outputs, &box, &r});
  // Cleared here, on the caller's executor where the signal is emitted, once the answer is in.
  if (cancel.is_connected()) cancel.template emplace<withdrawal>(withdrawal{this, &box});
  // The batch writes `r` and the outputs before try_send; the channel's lock orders those writes
  // before this coroutine resumes.
  auto [ec, rows] = co_await box.async_receive(use_tuple);
  if (cancel.is_connected()) cancel.clear();
  if (ec && !r.ec) {
    r.ec = ec;
    r.what = "waiting for the batch: " + ec.message();
  }
  co_return r;
}

std::unique_ptr<mlp_batcher::batch> mlp_batcher::close_locked() {
  if (open_ && open_->rows == 0) open_.reset();  // every request withdrawn: nothing to run
  if (open_) {
    ++running_;
    waiting_lane_.push_back(open_.get());
  }
  return std::move(open_);
}

void mlp_batcher::submit(const entry& e) {
  std::unique_ptr<batch> full, closed;
  std::uint64_t arm = 0;
  {
    std::lock_guard lock(mutex_);
    if (open_ && open_->rows + e.rows > opts_.max_rows) full = close_locked();
    if (!open_) {
      open_ = std::make_unique<batch>();
      open_->id = next_id_++;
      open_->entries.reserve(16);
      arm = open_->id;
    }
    open_->entries.push_back(e);
    open_->rows += e.rows;
    if (open_->rows >= opts_.max_rows || opts_.window.count() == 0 || running_ < opts_.inflight) {
      closed = close_locked();
      arm = 0;
    }
  }
  if (arm != 0) asio::post(timer_strand_, [this, arm] { arm_window(arm); });
  if (full) launch(std::move(full));
  if (closed) launch(std::move(closed));
}

void mlp_batcher::withdraw(mailbox* box) {
  auto take_out = [box](batch& b) {
    for (entry& e : b.entries) {
      if (e.box != box || e.withdrawn) continue;
      e.withdrawn = true;
      b.rows -= e.rows;
      return true;
    }
    return false;
  };
  {
    std::lock_guard lock(mutex_);
    bool found = open_ && take_out(*open_);
    for (std::size_t i = 0; !found && i < waiting_lane_.size(); ++i)
      found = take_out(*waiting_lane_[i]);
    if (!found) return;  // its batch has started: the request waits for it
  }
  if (!box->try_send(std::error_code(asio::error::operation_aborted), std::size_t{0}))
    std::fprintf(stderr, "evr-async-server: internal error: an mlp mailbox was full\n");
}

void mlp_batcher::start(batch& b) {
  std::lock_guard lock(mutex_);
  waiting_lane_.erase(std::find(waiting_lane_.begin(), waiting_lane_.end(), &b));
  std::erase_if(b.entries, [](const entry& e) { return e.withdrawn; });
}

void mlp_batcher::arm_window(std::uint64_t id) {
  {
    std::lock_guard lock(mutex_);
    if (!open_ || open_->id != id) return;  // closed before its window was armed
  }
  // Re-arming cancels the wait of an earlier batch's window: that batch is closed already.
  timer_.expires_after(opts_.window);
  timer_.async_wait([this, id](std::error_code ec) {
    if (ec) return;
    std::unique_ptr<batch> b;
    {
      std::lock_guard lock(mutex_);
      if (open_ && open_->id == id) b = close_locked();
    }
    if (b) launch(std::move(b));
  });
}

void mlp_batcher::finished() {
  std::unique_ptr<batch> next;
  {
    std::lock_guard lock(mutex_);
    --running_;
    next = close_locked();  // what gathered while the GPU was busy
  }
  if (next) launch(std::move(next));
}

void mlp_batcher::launch(std::unique_ptr<batch> b) {
  asio::co_spawn(io_.get_executor(), execute(std::move(b)), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "evr-async-server: mlp batch ended by an exception: %s\n", ex.what());
    }
  });
}

asio::awaitable<void> mlp_batcher::execute(std::unique_ptr<batch> b) {
  const std::size_t in = static_cast<std::size_t>(shape_.in);
  const std::size_t out = static_cast<std::size_t>(shape_.out);
  std::error_code ec;
  std::string what;
  clock_type::duration waited{};
  {
    // Waits (suspended) while every lane is taken, like any request.
    lane_pool::lease lease = co_await lanes_.acquire();
    start(*b);
    if (b->entries.empty()) {  // every request of the batch was withdrawn
      lease = {};
      finished();
      co_return;
    }
    lane& l = *lease;
    try {
      l.reserve_rows(b->rows);
      float* dst = l.mlp_input();
      for (const entry& e : b->entries) {
        std::memcpy(dst, e.inputs, e.rows * in * sizeof(float));
        dst += e.rows * in;
      }
      lease.mark_busy();
      l.enqueue_mlp(b->rows);
    } catch (const std::exception& ex) {
      ec = std::make_error_code(std::errc::io_error);
      what = std::string("launching the batch failed: ") + ex.what();
    }
    if (!ec) {
      const auto t0 = clock_type::now();
      // One wait for the whole batch: this coroutine, not a thread, waits.
      auto [wec] = co_await wait_.async_wait(l, nullptr, use_tuple);
      waited = clock_type::now() - t0;
      ec = wec;
      if (ec) {
        what = "waiting for the GPU failed: " + ec.message();
      } else {
        lease.mark_idle();
        const float* src = l.mlp_output();
        for (const entry& e : b->entries) {
          std::memcpy(e.outputs, src, e.rows * out * sizeof(float));
          src += e.rows * out;
        }
      }
    }
  }  // the lane goes back before the requests are told: the next batch may take it at once
  finished();
  metrics_.record_batch(b->rows);
  for (const entry& e : b->entries) {
    if (!ec) metrics_.record_gpu_wait("/mlp", waited);
    e.out->ec = ec;
    e.out->what = what;
    e.out->batch_rows = b->rows;
    if (!e.box->try_send(std::error_code{}, b->rows))
      std::fprintf(stderr, "evr-async-server: internal error: an mlp mailbox was full\n");
  }
}
