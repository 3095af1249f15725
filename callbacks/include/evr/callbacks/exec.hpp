// evr/callbacks/exec.hpp — the few names of the P2300 (std::execution) sender protocol that
// evr::gpu_sender (evr/callbacks/sender.hpp) needs, spelled by evr itself.
//
// g++ 12 and clang 14 have no <execution> senders, and evr depends on no implementation of them.
// This header defines the protocol's vocabulary as the standard does (tag types, the
// member-function customisation style, completion signatures, environments and stop tokens), and
// the concepts to check a type against it at compile time. It is not an implementation of
// std::execution: there are no algorithms here (no then, when_all, sync_wait); use stdexec or a
// C++26 library for those.
//
// A protocol names the vocabulary one library uses (evr::exec::protocol: this header's;
// evr::stdexec_protocol in <evr/callbacks/stdexec.hpp>: NVIDIA's stdexec). A sender is recognised
// by a library only through that library's own tag types (stdexec: `sender_concept` must derive
// from stdexec::sender_t, and the completion signatures must be a stdexec::completion_signatures
// specialization), so evr's sender takes the protocol as a template argument
// (evr::basic_gpu_sender<Protocol>) instead of guessing which library is around.
//
// Receivers complete through members, as in P2300R10 and stdexec since 2024:
//   std::move(rcvr).set_value(args...), std::move(rcvr).set_error(e), std::move(rcvr).set_stopped()
// and give their environment through a get_env() member; stop tokens come from the environment's
// query(get_stop_token_t) member.
#pragma once

#include <concepts>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace evr::exec {

/// Tag of senders: a sender declares `using sender_concept = evr::exec::sender_t;`.
struct sender_t {};
/// Tag of receivers: a receiver declares `using receiver_concept = evr::exec::receiver_t;`.
struct receiver_t {};
/// Tag of operation states: `using operation_state_concept = evr::exec::operation_state_t;`.
struct operation_state_t {};

/// Completes a receiver with values: calls `std::move(rcvr).set_value(args...)`.
struct set_value_t {
  /// Calls the receiver's set_value member.
  template <class Receiver, class... Args>
  constexpr void operator()(Receiver&& rcvr, Args&&... args) const noexcept requires requires {
    static_cast<Receiver&&>(rcvr).set_value(static_cast<Args&&>(args)...);
  }
  {
    static_assert(noexcept(static_cast<Receiver&&>(rcvr).set_value(static_cast<Args&&>(args)...)),
                  "set_value members must be noexcept");
    static_cast<Receiver&&>(rcvr).set_value(static_cast<Args&&>(args)...);
  }
};
/// Completes a receiver with an error: calls `std::move(rcvr).set_error(error)`.
struct set_error_t {
  /// Calls the receiver's set_error member.
  template <class Receiver, class Error>
  constexpr void operator()(Receiver&& rcvr, Error&& error) const noexcept requires requires {
    static_cast<Receiver&&>(rcvr).set_error(static_cast<Error&&>(error));
  }
  {
    static_assert(noexcept(static_cast<Receiver&&>(rcvr).set_error(static_cast<Error&&>(error))),
                  "set_error members must be noexcept");
    static_cast<Receiver&&>(rcvr).set_error(static_cast<Error&&>(error));
  }
};
/// Completes a receiver as stopped (cancelled): calls `std::move(rcvr).set_stopped()`.
struct set_stopped_t {
  /// Calls the receiver's set_stopped member.
  template <class Receiver>
  constexpr void operator()(Receiver&& rcvr) const noexcept requires requires {
    static_cast<Receiver&&>(rcvr).set_stopped();
  }
  {
    static_assert(noexcept(static_cast<Receiver&&>(rcvr).set_stopped()),
                  "set_stopped members must be noexcept");
    static_cast<Receiver&&>(rcvr).set_stopped();
  }
};
inline constexpr set_value_t set_value{};      ///< the set_value_t object
inline constexpr set_error_t set_error{};      ///< the set_error_t object
inline constexpr set_stopped_t set_stopped{};  ///< the set_stopped_t object

/// The ways a sender can complete, each a function type `Tag(Args...)`, e.g.
/// `completion_signatures<set_value_t(), set_error_t(std::error_code), set_stopped_t()>`.
template <class... Signatures>
struct completion_signatures {};

/// An environment with no queries (what get_env returns for a type without a get_env member).
struct empty_env {};

/// Returns `t.get_env()`, or an empty_env when `t` has no get_env member.
struct get_env_t {
  /// The environment of `t`.
  template <class T>
  constexpr decltype(auto) operator()(const T& t) const noexcept {
    if constexpr (requires { t.get_env(); }) {
      static_assert(noexcept(t.get_env()), "get_env members must be noexcept");
      return t.get_env();
    } else {
      return empty_env{};
    }
  }
};
inline constexpr get_env_t get_env{};  ///< the get_env_t object

/// A stop token that never asks to stop (what get_stop_token returns for an environment without
/// one). Operations connected to a receiver with this token register no stop callback.
struct never_stop_token {
 private:
  struct callback {
    template <class Fn>
    constexpr explicit callback(never_stop_token, Fn&&) noexcept {}
  };

 public:
  /// The stop callback type for this token: does nothing.
  template <class Fn>
  using callback_type = callback;
  /// Always false.
  static constexpr bool stop_requested() noexcept { return false; }
  /// Always false: stop can never be requested.
  static constexpr bool stop_possible() noexcept { return false; }
  /// All never_stop_tokens are equal.
  friend constexpr bool operator==(never_stop_token, never_stop_token) noexcept { return true; }
};

/// Returns `env.query(get_stop_token_t{})`, or a never_stop_token when the environment has no
/// stop token.
struct get_stop_token_t {
  /// The stop token of `env`.
  template <class Env>
  constexpr auto operator()(const Env& env) const noexcept {
    if constexpr (requires { env.query(get_stop_token_t{}); }) {
      static_assert(noexcept(env.query(get_stop_token_t{})), "query members must be noexcept");
      return env.query(get_stop_token_t{});
    } else {
      return never_stop_token{};
    }
  }
};
inline constexpr get_stop_token_t get_stop_token{};  ///< the get_stop_token_t object

/// Connects a sender to a receiver: `std::forward<S>(sndr).connect(std::forward<R>(rcvr))`.
struct connect_t {
  /// The operation state of `sndr` connected to `rcvr`.
  template <class Sender, class Receiver>
  constexpr auto operator()(Sender&& sndr, Receiver&& rcvr) const
      noexcept(noexcept(static_cast<Sender&&>(sndr).connect(static_cast<Receiver&&>(rcvr))))
          -> decltype(static_cast<Sender&&>(sndr).connect(static_cast<Receiver&&>(rcvr))) {
    return static_cast<Sender&&>(sndr).connect(static_cast<Receiver&&>(rcvr));
  }
};
inline constexpr connect_t connect{};  ///< the connect_t object

/// Starts an operation state: `op.start()`.
struct start_t {
  /// Calls `op.start()` (which must be noexcept).
  template <class Op>
  constexpr void operator()(Op& op) const noexcept requires requires {
    op.start();
  }
  {
    static_assert(noexcept(op.start()), "start members must be noexcept");
    op.start();
  }
};
inline constexpr start_t start{};  ///< the start_t object

/// The operation state type that connecting a `Sender` to a `Receiver` gives.
template <class Sender, class Receiver>
using connect_result_t = decltype(connect(std::declval<Sender>(), std::declval<Receiver>()));

/// The environment type of `T` (`get_env(t)`).
template <class T>
using env_of_t = decltype(get_env(std::declval<const T&>()));

/// The stop token type of an environment.
template <class Env>
using stop_token_of_t = std::remove_cvref_t<decltype(get_stop_token(std::declval<const Env&>()))>;

// ---- concepts -----------------------------------------------------------------------------------

/// A sender of this protocol: tagged with sender_concept, has an environment, movable.
template <class S>
concept sender = std::derived_from<typename std::remove_cvref_t<S>::sender_concept, sender_t> &&
    requires(const std::remove_cvref_t<S>& s) {
  get_env(s);
} && std::move_constructible<std::remove_cvref_t<S>> &&
    std::constructible_from<std::remove_cvref_t<S>, S>;

/// A receiver of this protocol: tagged with receiver_concept, has an environment, nothrow
/// movable.
template <class R>
concept receiver =
    std::derived_from<typename std::remove_cvref_t<R>::receiver_concept, receiver_t> &&
    requires(const std::remove_cvref_t<R>& r) {
  get_env(r);
} && std::is_nothrow_move_constructible_v<std::remove_cvref_t<R>> &&
    std::constructible_from<std::remove_cvref_t<R>, R>;

namespace detail {
template <class R, class Signature>
struct accepts : std::false_type {};
template <class R, class Tag, class... Args>
struct accepts<R, Tag(Args...)> : std::bool_constant<std::is_nothrow_invocable_v<Tag, R, Args...>> {
};
template <class R, class Signatures>
struct accepts_all : std::false_type {};
template <class R, class... Sigs>
struct accepts_all<R, completion_signatures<Sigs...>>
    : std::bool_constant<(accepts<R, Sigs>::value && ...)> {};
}  // namespace detail

/// A receiver that accepts every completion in `Signatures` (a completion_signatures).
template <class R, class Signatures>
concept receiver_of = receiver<R> && detail::accepts_all<std::remove_cvref_t<R>, Signatures>::value;

/// An operation state of this protocol: tagged, an object, `start()` is noexcept.
template <class O>
concept operation_state =
    std::derived_from<typename O::operation_state_concept, operation_state_t> &&
    std::is_object_v<O> && std::destructible<O> && requires(O& o) {
  { o.start() }
  noexcept;
};

/// A sender whose completions `R` accepts and that connects to it.
template <class S, class R>
concept sender_to = sender<S> &&
    receiver_of<R, typename std::remove_cvref_t<S>::completion_signatures> &&
    requires(S&& s, R&& r) {
  { connect(static_cast<S&&>(s), static_cast<R&&>(r)) } -> operation_state;
};

/// A stop token: can be asked whether stop was requested, and takes stop callbacks (a
/// `callback_type` member template, or std::stop_callback for std::stop_token).
template <class T>
concept stoppable_token = std::copyable<T> && std::equality_comparable<T> && requires(const T& t) {
  { t.stop_requested() }
  noexcept->std::convertible_to<bool>;
  { t.stop_possible() }
  noexcept->std::convertible_to<bool>;
};

/// A stop token on which stop can never be requested (known at compile time).
template <class T>
concept unstoppable_token = stoppable_token<T> && requires {
  typename std::bool_constant<T::stop_possible()>;
} &&(!T::stop_possible());

namespace detail {
template <class Token>
struct stop_callback_for {
  template <class Fn>
  using type = typename Token::template callback_type<Fn>;
};
template <>
struct stop_callback_for<std::stop_token> {
  template <class Fn>
  using type = std::stop_callback<Fn>;
};
}  // namespace detail

/// The stop callback type of `Token` for a callable `Fn`: constructed from (token, fn), it calls
/// fn once if stop is requested while it exists; its destructor waits for a call in progress on
/// another thread.
template <class Token, class Fn>
using stop_callback_for_t = typename detail::stop_callback_for<Token>::template type<Fn>;

/// The vocabulary of this header, as a protocol for evr::basic_gpu_sender (the default one).
/// Another library's protocol names the same members with that library's types (see
/// evr::stdexec_protocol).
struct protocol {
  using sender_concept = exec::sender_t;                    ///< the sender tag
  using operation_state_concept = exec::operation_state_t;  ///< the operation state tag
  using set_value_t = exec::set_value_t;                    ///< value completion
  using set_error_t = exec::set_error_t;                    ///< error completion
  using set_stopped_t = exec::set_stopped_t;                ///< stopped completion
  using get_env_t = exec::get_env_t;                        ///< a receiver's environment
  using get_stop_token_t = exec::get_stop_token_t;          ///< an environment's stop token
  /// The completion-signatures template.
  template <class... Signatures>
  using completion_signatures = exec::completion_signatures<Signatures...>;
};

}  // namespace evr::exec
