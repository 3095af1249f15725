// evr/reactor/detail/deferred_posts.hpp — lets a front end hold its posts back until the end of
// the reactor's delivery batch. Not public: the Asio front end (callbacks/) uses it so that the
// completions of one batch bound for one io_context cost one post (one lock of the context's
// queue, at most one wake-up of its threads) instead of one each.
//
// Protocol (all on the reactor thread):
//   * While the reactor delivers a batch, it runs each posted completion (wait_op::how_ ==
//     delivery::post) with this thread marked "inside a batch". A front end that wants to hold
//     its post back calls hold_until_batch_end(d): true registers `d` (once per batch, however
//     often it is called) and the front end keeps the post in `d`; false means "post now".
//   * The reactor calls d.flush() at the end of the batch and before it runs any inline
//     completion (user code, which may destroy an execution context whose posts are held, or
//     expect every earlier completion to have been posted). flush() must post everything held and
//     forget every execution context it saw: a context may be destroyed between batches.
//   * Outside a batch (a wait refused on the submitting thread, user code inside an inline
//     handler) the answer is always false: those posts are never held.
// A front end keeps the batch's order among the posts it holds for one execution context.
#pragma once

namespace evr::detail {

/// What a front end keeps held back on the reactor thread until flush().
class deferred_posts {
 public:
  /// Posts everything held back. Must not throw or run user code.
  virtual void flush() noexcept = 0;

 protected:
  deferred_posts() = default;
  ~deferred_posts() = default;
  deferred_posts(const deferred_posts&) = delete;
  deferred_posts& operator=(const deferred_posts&) = delete;
};

/// True when the calling thread is a reactor thread delivering a posted completion: `d` is then
/// flushed before the reactor runs any user code and at the end of the batch. False otherwise
/// (the caller posts at once), also when too many different front ends hold posts already.
bool hold_until_batch_end(deferred_posts& d) noexcept;

}  // namespace evr::detail
