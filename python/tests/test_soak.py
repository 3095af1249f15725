"""A randomized soak of the binding on the simulated device. Each round makes a reactor of a
random strategy and runs two event loops (asyncio's, and uvloop's where installed) in two threads;
their tasks wait on shared streams with work of fixed and of jittered lengths (so that the loops'
polling windows open), on events, on signal tickets and through ``wait_future``, gather some
waits, cancel some (the task, the future, ``wait_for``'s timeout) at random moments, and a third
loop is closed with waits pending. In a quarter of the rounds the device faults (a sticky fault)
at a random point. The reactor is shut down at a random point while waits are in flight. Asserted
for every wait: it ends exactly once, as success (never before the work it waits for: an event
recorded behind that work is done), cancellation, timeout, ReactorStopped (only once the shutdown
has begun) or CudaError (only once the device has faulted), with no other exception; no loop
reports an unhandled error; afterwards every loop and the reactor have nothing in flight and the
reactor's counts add up.

Size: ``EVR_PY_SOAK_ROUNDS`` rounds (default 6, a few seconds). ``EVR_PY_SOAK_SEED=N`` replays a
run's random choices (not the threads' interleavings); the seed is printed."""

import asyncio
import os
import random
import threading
import time

import evr
import evr.sim
from loop_helpers import settled

STRATEGIES = ("adaptive", "fence", "poll", "host_func")
LENGTHS = (0.0, 20e-6, 200e-6, 1e-3)  # seconds of work a stream's kernels take
TASKS_PER_LOOP = 12
WAITS_PER_TASK = 40
OUTCOMES = ("ok", "cancelled", "timeout", "stopped", "fault")


class Ledger:
    """Every wait's outcome, recorded once, from any loop thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes = {}  # wait id -> outcome
        self.repeats = []  # ids recorded twice
        self.errors = []  # what should not have happened
        self.next_id = 0
        self.windows = self.window_hits = 0  # the loops' polling windows (loop_stats)

    def new_id(self):
        with self.lock:
            self.next_id += 1
            return self.next_id

    def record(self, wait_id, outcome):
        with self.lock:
            if wait_id in self.outcomes:
                self.repeats.append((wait_id, self.outcomes[wait_id], outcome))
            self.outcomes[wait_id] = outcome

    def add_windows(self, spins, hits):
        with self.lock:
            self.windows += spins
            self.window_hits += hits

    def error(self, what):
        with self.lock:
            self.errors.append(what)

    def count(self, outcome):
        with self.lock:
            return sum(1 for o in self.outcomes.values() if o == outcome)


class Round:
    """One reactor's life: the device, its streams (each with a work length), the ledger."""

    def __init__(self, rng, uvloop):
        self.uvloop = uvloop
        self.dev = evr.sim.Device()
        self.strategy = rng.choice(STRATEGIES)
        self.reactor = evr.Reactor(self.strategy, device=self.dev,
                                   shutdown_drain=rng.choice((0.0, 0.002, 0.05)))
        self.streams = [(self.dev.stream(), rng.choice(LENGTHS)) for _ in range(6)]
        self.ledger = Ledger()
        self.stopping = threading.Event()  # set just before the reactor's shutdown
        self.faulty = rng.random() < 0.25  # the device faults at a random point of the round
        self.faulted = threading.Event()  # set just before the fault is injected
        self.signals = self.strategy in ("adaptive", "fence")

    def describe(self):
        lengths = [length for _, length in self.streams]
        return (f"strategy {self.strategy}, stream lengths {lengths}"
                f"{', a fault' if self.faulty else ''}")

    # --- one wait, in one of several shapes ------------------------------------------------
    def launch(self, rng, stream, length):
        """Work on `stream`, then an event behind it: done once the work is."""
        jitter = length * rng.uniform(0.5, 1.5) if rng.random() < 0.3 else length
        self.dev.launch_kernel(stream, jitter)
        behind = self.dev.event()
        behind.record(stream)
        return behind

    def start(self, rng, slots):
        """Launches work and starts a wait on it: (the awaitable, the event behind the work)."""
        stream, length = rng.choice(self.streams)
        behind = self.launch(rng, stream, length)
        shape = rng.random()
        if shape < 0.15:
            return evr.wait(behind, reactor=self.reactor), behind
        if shape < 0.25 and self.signals:
            slot = slots.get(id(stream))
            if slot is None:
                slot = slots[id(stream)] = self.reactor.signal_slot()
            slot.enqueue_signal(stream)
            return evr.wait(slot.arm(stream), reactor=self.reactor), behind
        if shape < 0.35:
            return asyncio.wrap_future(evr.wait_future(stream, reactor=self.reactor)), behind
        return evr.wait(stream, reactor=self.reactor), behind

    async def one_wait(self, rng, slots):
        """A wait awaited, timed out, or cancelled at a random moment; its outcome recorded."""
        wait_id = self.ledger.new_id()
        try:
            fut, behind = self.start(rng, slots)
        except evr.ReactorStopped:
            self.expect_stopped(wait_id)
            return
        except evr.CudaError as e:  # the launch, or the wait on a device that had failed
            self.expect_fault(wait_id, e)
            return
        how = rng.random()
        try:
            if how < 0.1:
                await asyncio.wait_for(fut, rng.uniform(0, 300e-6))
            elif how < 0.2:
                task = asyncio.ensure_future(self.awaited(fut))
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                (task if rng.random() < 0.5 else fut).cancel()
                try:
                    await task
                finally:
                    self.settle(fut)
            else:
                await fut
        except asyncio.TimeoutError:
            self.ledger.record(wait_id, "timeout")
        except asyncio.CancelledError:
            self.ledger.record(wait_id, "cancelled")
        except evr.ReactorStopped:
            self.expect_stopped(wait_id)
        except evr.CudaError as e:
            self.expect_fault(wait_id, e)
        except Exception as e:  # noqa: BLE001 - any other outcome is the failure to report
            self.ledger.error(f"wait {wait_id}: {type(e).__name__}: {e}")
            self.ledger.record(wait_id, "error")
        else:
            self.ledger.record(wait_id, "ok")
            self.check_done(wait_id, behind)

    def check_done(self, wait_id, behind):
        """A wait that succeeded: the work before it is done (a faulted device may say so by
        failing the query instead)."""
        try:
            done = behind.query()
        except evr.CudaError:
            done = self.faulted.is_set()
        if not done:
            self.ledger.error(f"wait {wait_id} completed before the work it waits for")

    @staticmethod
    async def awaited(fut):
        await fut

    @staticmethod
    def settle(fut):
        """A task cancelled before its first step never awaited `fut`: cancel the wait, or take
        its exception (else asyncio reports it as never retrieved, as for any future)."""
        if not fut.done():
            fut.cancel()
        elif not fut.cancelled():
            fut.exception()

    def expect_stopped(self, wait_id):
        self.ledger.record(wait_id, "stopped")
        if not self.stopping.is_set():
            self.ledger.error(f"wait {wait_id}: ReactorStopped before the shutdown")

    def expect_fault(self, wait_id, error):
        self.ledger.record(wait_id, "fault")
        if not self.faulted.is_set():
            self.ledger.error(f"wait {wait_id}: {error} before the device faulted")

    # --- the loops ---------------------------------------------------------------------------
    async def task(self, seed):
        rng, slots = random.Random(seed), {}
        try:
            for _ in range(WAITS_PER_TASK):
                if rng.random() < 0.15:  # a few waits at once, gathered: nobody polls for them
                    await asyncio.gather(*(self.one_wait(rng, slots) for _ in range(3)))
                else:
                    await self.one_wait(rng, slots)
        finally:
            for slot in slots.values():
                slot.release()

    async def loop_main(self, seed):
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, ctx: self.ledger.error(f"loop: {ctx.get('message')}"))
        rng = random.Random(seed)
        await asyncio.gather(*(self.task(rng.getrandbits(64)) for _ in range(TASKS_PER_LOOP)))
        # A cancelled wait's aborted completion reaches the loop after the cancellation: the
        # loop drains them all (the stopped reactor pushed what it had), then has none in flight.
        end = loop.time() + 20
        while (evr.loop_stats() or {}).get("in_flight", 0) != 0 and loop.time() < end:
            await asyncio.sleep(0.001)
        stats = evr.loop_stats()
        if stats is not None and stats["in_flight"] != 0:
            self.ledger.error(f"loop ended with {stats['in_flight']} waits in flight")
        if stats is not None:
            self.ledger.add_windows(stats["spins"], stats["spin_hits"])

    def run_loop(self, seed, use_uvloop):
        loop = self.uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
        try:
            loop.run_until_complete(asyncio.wait_for(self.loop_main(seed), 60))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.ledger.error(f"loop thread: {type(e).__name__}: {e}")
        finally:
            loop.close()

    def abandon_a_loop(self):
        """A loop closed while its waits are pending: their completions are dropped."""
        loop = asyncio.new_event_loop()
        stream, _ = self.streams[0]

        async def start_and_leave():
            self.dev.launch_kernel(stream, 0.002)
            return [evr.wait(stream, reactor=self.reactor) for _ in range(4)]

        try:
            loop.run_until_complete(start_and_leave())
        except (evr.ReactorStopped, evr.CudaError):
            pass
        finally:
            loop.close()


def run_round(seed, uvloop):
    rng = random.Random(seed)
    r = Round(rng, uvloop)
    threads = [threading.Thread(target=r.run_loop, args=(rng.getrandbits(64), i == 1 and uvloop))
               for i in range(2)]
    for t in threads:
        t.start()
    if rng.random() < 0.5:
        r.abandon_a_loop()
    # A fault, then the shutdown, each once a random share of the waits has ended (or all have).
    total = 2 * TASKS_PER_LOOP * WAITS_PER_TASK
    fault_after = rng.randrange(total // 8, total // 2)
    stop_after = rng.randrange(total // 4, total * 5 // 4)
    deadline = time.monotonic() + 60

    def until_ended(n):
        while (len(r.ledger.outcomes) < n and any(t.is_alive() for t in threads)
               and time.monotonic() < deadline):
            time.sleep(0.001)

    if r.faulty and fault_after < stop_after:
        until_ended(fault_after)
        r.faulted.set()
        r.dev.inject_fault(0)
    until_ended(stop_after)
    r.stopping.set()
    r.reactor.shutdown()
    for t in threads:
        t.join(90)
    r.hung = [t for t in threads if t.is_alive()]
    r.dev.wait_idle()
    return r


def test_soak_random_waits_cancellation_and_shutdown(spin_default):
    seed = int(os.environ.get("EVR_PY_SOAK_SEED", random.randrange(2**32)))
    rounds = int(os.environ.get("EVR_PY_SOAK_ROUNDS", "6"))
    print(f"python soak: {rounds} rounds, seed {seed} (EVR_PY_SOAK_SEED to replay)")
    try:
        import uvloop
    except ImportError:
        uvloop = None
    totals = dict.fromkeys(OUTCOMES, 0)
    windows = window_hits = 0
    for n in range(rounds):
        rng = random.Random(seed * 1000 + n)
        evr.set_loop_spin(rng.choice((0.0, 50e-6, 200e-6)), rng.choice((1, 4, 64)))
        r = run_round(rng.getrandbits(64), uvloop)
        where = f"round {n} ({r.describe()}), seed {seed}"
        assert not r.hung, f"{where}: a loop thread did not end"
        assert r.ledger.errors == [], f"{where}: {r.ledger.errors[:5]}"
        assert r.ledger.repeats == [], f"{where}: ended twice: {r.ledger.repeats[:5]}"
        assert len(r.ledger.outcomes) == r.ledger.next_id, where
        assert r.ledger.count("ok") > 0, where
        m = settled(r.reactor)
        assert m["in_flight"] == 0, where
        assert m["completed"] + m["cancelled"] + m["failed"] == m["submitted"], (where, m)
        if not r.faulted.is_set():
            assert m["failed"] == 0 and r.ledger.count("fault") == 0, (where, m)
        for outcome in OUTCOMES:
            totals[outcome] += r.ledger.count(outcome)
        windows += r.ledger.windows
        window_hits += r.ledger.window_hits
        r.dev.shutdown()
    print(f"python soak: {sum(totals.values())} waits: " +
          ", ".join(f"{v} {k}" for k, v in totals.items()) +
          f"; {windows} polling windows, {window_hits} of them found their completion")
