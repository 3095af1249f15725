"""The served model's batcher (served_model.py): rows become batches as they arrive, each batch runs
on a free stream of the pool, and its rows are answered once that stream is done, waited for in
one of the three modes:

  evr        await evr.wait(stream)                               the loop serves others meanwhile
  executor   await loop.run_in_executor(None, stream.synchronize) a thread of the default pool waits
  blocking   stream.synchronize()                                 the loop itself waits

How a batch is waited for is the one thing the modes change; everything else here is the same.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal

import numpy as np

import evr

MODES = ("evr", "executor", "blocking")


class Refused(Exception):
    """The server is shutting down: the request was not accepted (503)."""


class Batcher:
    """Gathers rows into batches, launches each on a free stream of the pool and answers the rows
    when the stream is done, waiting in the way `mode` says. Loop thread only.

    submit(row) returns a future of the row's answer (a list of floats); it raises Refused once
    close() has begun. A batch that fails (launch or wait) fails each of its futures with the
    error; a request whose future was cancelled (its client left) is dropped from the batch it had
    not yet joined, or its answer is discarded."""

    def __init__(self, slots, mode, max_batch, window_s, sigterm_after=0):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.loop = asyncio.get_running_loop()
        self.mode, self.max_batch, self.window_s = mode, max_batch, window_s
        self.free = collections.deque(slots)
        self.queue = collections.deque()  # (arrival time, row, future)
        self.closing = False
        self.sigterm_after = sigterm_after
        self.counts = collections.Counter(
            dict.fromkeys(("requests", "batches", "rows", "answered", "refused", "failed"), 0))
        self.batches_in_flight = 0
        self.rows_in_flight = 0
        self._wake = None  # what the batcher task sleeps on
        self._drained = None  # what close() sleeps on
        self._finishing = set()
        self._task = self.loop.create_task(self._run())

    # The request side.
    def submit(self, row):
        if self.closing:
            self.counts["refused"] += 1
            raise Refused()
        fut = self.loop.create_future()
        self.queue.append((self.loop.time(), row, fut))
        self.counts["requests"] += 1
        if len(self.queue) == 1 or len(self.queue) >= self.max_batch:
            self._poke()
        if self.counts["requests"] == self.sigterm_after:
            os.kill(os.getpid(), signal.SIGTERM)  # the self-test's shutdown with requests in flight
        return fut

    def _poke(self):
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    async def _nap(self, timeout=None):
        w = self._wake = self.loop.create_future()
        timer = self.loop.call_later(timeout, self._poke) if timeout is not None else None
        try:
            await w
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    # The batcher task: one batch per turn.
    async def _run(self):
        while True:
            while not self.queue or not self.free:
                await self._nap()
            deadline = self.queue[0][0] + self.window_s
            while len(self.queue) < self.max_batch and not self.closing:
                left = deadline - self.loop.time()
                if left <= 0:
                    break
                await self._nap(left)
            batch = []
            while self.queue and len(batch) < self.max_batch:
                entry = self.queue.popleft()
                if not entry[2].done():  # not cancelled by a client that left
                    batch.append(entry)
            if not batch:
                self._check_drained()
                continue
            slot = self.free.popleft()
            try:
                slot.launch(np.stack([row for _, row, _ in batch]))
            except Exception as e:  # noqa: BLE001 - the batch's requests get the error
                self.free.append(slot)
                self._fail(batch, e)
                continue
            self.counts["batches"] += 1
            self.counts["rows"] += len(batch)
            self.batches_in_flight += 1
            self.rows_in_flight += len(batch)
            task = self.loop.create_task(self._finish(slot, batch))
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)

    async def _finish(self, slot, batch):
        try:
            if self.mode == "evr":
                await evr.wait(slot.stream)
            elif self.mode == "executor":
                await self.loop.run_in_executor(None, slot.stream.synchronize)
            else:
                slot.stream.synchronize()
            answers = slot.result(len(batch)).tolist()
            for (_, _, fut), y in zip(batch, answers):
                if not fut.done():
                    fut.set_result(y)
            self.counts["answered"] += len(batch)
        except BaseException as e:  # noqa: BLE001 - CudaError, or cancelled by close()
            self._fail(batch, Refused() if isinstance(e, asyncio.CancelledError) else e)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.batches_in_flight -= 1
            self.rows_in_flight -= len(batch)
            self.free.append(slot)
            self._poke()
            self._check_drained()

    def _check_drained(self):
        d = self._drained
        if d is not None and not d.done() and not self.queue and not self.batches_in_flight:
            d.set_result(None)

    def _fail(self, batch, error):
        for _, _, fut in batch:
            if not fut.done():
                fut.set_exception(error)
        self.counts["refused" if isinstance(error, Refused) else "failed"] += len(batch)

    def stats(self):
        return dict(self.counts, mode=self.mode, queued=len(self.queue),
                    batches_in_flight=self.batches_in_flight, rows_in_flight=self.rows_in_flight,
                    closing=self.closing)

    async def close(self, timeout):
        """Refuses new requests, launches what is queued at once and waits (at most `timeout`
        seconds) until every accepted request is answered; what is left then is refused. Returns
        what was in flight and what became of it."""
        start = self.loop.time()
        report = {"queued": len(self.queue), "on_gpu": self.rows_in_flight,
                  "batches_on_gpu": self.batches_in_flight}
        report["in_flight"] = report["queued"] + report["on_gpu"]
        before = dict(self.counts)
        self.closing = True
        self._poke()  # a batcher inside its window launches now
        if self.queue or self.batches_in_flight:
            self._drained = self.loop.create_future()
            try:
                await asyncio.wait_for(self._drained, timeout)
            except asyncio.TimeoutError:
                pass
        report["left"] = len(self.queue) + self.rows_in_flight
        self._fail(list(self.queue), Refused())
        self.queue.clear()
        self._task.cancel()
        for t in list(self._finishing):
            t.cancel()
        await asyncio.gather(self._task, *self._finishing, return_exceptions=True)
        for k in ("answered", "failed"):
            report[k] = self.counts[k] - before.get(k, 0)
        report["refused_before"] = before.get("refused", 0)
        report["seconds"] = round(self.loop.time() - start, 4)
        return report
