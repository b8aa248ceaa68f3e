"""WorkerPool: generations on a bounded set of threads behind a bounded queue. Job: one generation,
run on a worker thread, whose text pieces reach the event loop through an asyncio queue.

A request takes a place (WorkerPool.admit: a Ticket) once its body has arrived, before the body
is parsed or the prompt tokenized, so a full server refuses at once (429), the work done before
generating is bounded by workers + queue_size, and a client slow to send holds no place; the
Ticket passes to its Job, or is released.

Cancelling a Job (the client left, the request timed out, the server shuts down) is cooperative:
a queued job is dropped at once; a running one stops after its current decoding pass, whatever
text that pass made (TextStream.steps), which closes the TextStream and so releases its backend
context (KV buffers). A running job also stops by itself at its deadline. So a slot is freed
within one target pass.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor

from jacobi_rt.runtime import GenerationResult, TextStream

PIECE, DONE, FAILED = "piece", "done", "failed"


class QueueFull(Exception):
    """Every worker is busy and the queue is full (the app answers 429)."""


class PoolClosed(Exception):
    """The server is shutting down (the app answers 503)."""


class GenerationTimeout(Exception):
    """The request's deadline passed before its last piece."""


class Ticket:
    """A place in the pool (running or queued), held from a request's arrival; release() is idempotent."""

    def __init__(self, pool: WorkerPool):
        self._pool = pool
        self._held = True

    def release(self) -> None:
        with self._pool._lock:
            self.release_locked()

    def release_locked(self) -> None:
        """release() with the pool's lock already held."""
        if self._held:
            self._held = False
            self._pool._places -= 1


class Job:
    def __init__(self, stream: TextStream, loop: asyncio.AbstractEventLoop, deadline: float = float("inf")):
        self.stream = stream
        self.loop = loop
        self.deadline = deadline  # time.monotonic(); the worker stops by itself after it
        self.result: GenerationResult | None = None  # set when pieces() ends normally
        self.future: Future | None = None
        self.started_at: float | None = None  # time.monotonic() when a worker took it
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()

    # -- the worker thread ------------------------------------------------------------------

    def run(self) -> None:
        """Iterate the stream, sending each piece to the event loop; stop early when cancelled."""
        self.started_at = time.monotonic()
        try:
            if self._stopped():
                return
            for piece in self.stream.steps():  # after every pass, even one whose text is held back or empty
                if self._stopped():
                    return
                if piece:
                    self._emit(PIECE, piece)
            self._emit(DONE, self.stream.result)
        except Exception as exc:  # reported to the request, never lost in the worker
            self._emit(FAILED, exc)
        finally:
            self.stream.close()  # frees the backend context when stopped early; a no-op after the end

    def _stopped(self) -> bool:
        return self._cancelled.is_set() or time.monotonic() > self.deadline

    def _emit(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self._cancelled.set()

    # -- the event loop ---------------------------------------------------------------------

    async def pieces(self, deadline: float) -> AsyncIterator[str]:
        """Text pieces until the end (then `result` is set); GenerationTimeout after `deadline` (time.monotonic)."""
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                kind, value = await asyncio.wait_for(self._events.get(), remaining)
            except TimeoutError:
                raise GenerationTimeout from None
            if kind == PIECE:
                yield value
            elif kind == DONE:
                self.result = value
                return
            else:
                raise value

    def cancel(self) -> None:
        """Stop this job (any thread): dropped if queued, stopped before its next piece if running."""
        self._cancelled.set()
        if self.future is not None:
            self.future.cancel()


class WorkerPool:
    """`workers` generations at once; up to `queue_size` more wait; beyond that submit() raises QueueFull."""

    def __init__(self, workers: int, queue_size: int):
        self.workers = workers
        self.queue_size = queue_size
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="jacobi-rt-worker")
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()  # submitted: queued or running
        self._places = 0  # tickets held: requests being prepared, queued or running
        self._running = 0
        self._closed = False

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        """Requests admitted and not running: being prepared (parsed, tokenized) or waiting for a worker."""
        with self._lock:
            return self._places - self._running

    @property
    def full(self) -> bool:
        """Every place taken (admit() would raise QueueFull now)."""
        with self._lock:
            return self._places >= self.workers + self.queue_size

    def admit(self) -> Ticket:
        """A place for one request, or QueueFull (PoolClosed while shutting down); nothing is parsed before this."""
        with self._lock:
            if self._closed:
                raise PoolClosed
            if self._places >= self.workers + self.queue_size:
                raise QueueFull
            self._places += 1
        return Ticket(self)

    def submit(self, job: Job, ticket: Ticket) -> None:
        """Queue `job` in the place `ticket` holds; the place is released when the job ends or is cancelled."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._jobs.add(job)
        try:
            if closed:
                raise RuntimeError("closed")
            job.future = self._executor.submit(self._work, job, ticket)
        except RuntimeError:  # shutting down (the executor refuses once shut down)
            self._release(job, ticket)
            raise PoolClosed from None
        job.future.add_done_callback(lambda _: self._release(job, ticket))  # runs on completion and on cancel

    def shutdown(self) -> None:
        """Refuse new jobs, cancel the admitted ones, wait for the workers to stop."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _work(self, job: Job, ticket: Ticket) -> None:
        with self._lock:
            self._running += 1
        try:
            job.run()
        finally:
            with self._lock:  # both at once: /health never sees a finished job as queued
                self._running -= 1
                ticket.release_locked()

    def _release(self, job: Job, ticket: Ticket) -> None:
        with self._lock:
            self._jobs.discard(job)
            ticket.release_locked()
