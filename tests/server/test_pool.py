"""WorkerPool and Job: places taken before any work, cancellation checked after every pass."""

from __future__ import annotations

import asyncio
import time

import pytest

from jacobi_rt.runtime.generator import TextStream
from jacobi_rt.server.pool import DONE, Job, PoolClosed, QueueFull, WorkerPool

HOLD_EVERYTHING = ["\x00" * 4000]  # a stop string longer than the output: every piece is "" until the end


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()  # not running: the job's events just queue up on it
    yield loop
    loop.close()


def cancelled_after(steps: int, stream: TextStream, job_box: list) -> tuple[TextStream, list[str]]:
    """`stream`, cancelling job_box[0] after its `steps`-th piece; also the pieces the job drew."""
    drawn: list[str] = []

    def run():
        try:
            for piece in stream.steps():
                drawn.append(piece)
                if len(drawn) == steps:
                    job_box[0].cancel()
                yield piece
            return stream.result
        finally:
            stream.close()

    return TextStream(run(), stream.prompt_tokens), drawn


def events(job: Job, loop) -> list:
    loop.run_until_complete(asyncio.sleep(0))  # deliver the call_soon_threadsafe callbacks
    out = []
    while not job._events.empty():
        out.append(job._events.get_nowait())
    return out


def test_a_cancelled_job_stops_after_the_pass_even_when_its_text_is_held_back(generator, loop):
    """Before: the job looked at the cancel flag only between non-empty pieces, so a generation whose
    text was all held back (a long stop string, special tokens) ran to max_tokens after a cancel."""
    inner = generator("llama").start("The quick", max_new_tokens=40, strategy="greedy", stop=HOLD_EVERYTHING)
    box: list = []
    stream, drawn = cancelled_after(3, inner, box)
    job = Job(stream, loop)
    box.append(job)
    job.run()
    assert drawn == ["", "", ""]  # stopped right after the third pass
    assert stream.result is None and all(kind != DONE for kind, _ in events(job, loop))


def test_a_job_past_its_deadline_stops_by_itself(generator, loop):
    stream = generator("llama").start("The quick", max_new_tokens=40, strategy="greedy", stop=HOLD_EVERYTHING)
    job = Job(stream, loop, deadline=time.monotonic() - 1)
    job.run()
    assert stream.result is None and events(job, loop) == []


def test_an_uncancelled_job_ends_with_all_its_text(generator, loop):
    gen = generator("llama")
    job = Job(gen.start("The quick", max_new_tokens=12, strategy="greedy", stop=HOLD_EVERYTHING), loop)
    job.run()
    sent = events(job, loop)
    assert [kind for kind, _ in sent][-1] == DONE
    assert "".join(v for kind, v in sent if kind != DONE) == gen.generate("The quick", 12, strategy="greedy").text


def test_places_are_taken_at_admission_and_given_back():
    pool = WorkerPool(workers=1, queue_size=1)
    first, second = pool.admit(), pool.admit()
    with pytest.raises(QueueFull):
        pool.admit()  # before any job exists: the places are held by requests still being prepared
    assert pool.queued == 2
    first.release()
    first.release()  # idempotent
    third = pool.admit()
    for ticket in (second, third):
        ticket.release()
    assert pool.queued == 0
    pool.shutdown()
    with pytest.raises(PoolClosed):
        pool.admit()


def test_a_job_cancelled_during_a_long_prefill_stops_after_the_chunk(artifact, loop):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("llama"), prefill_chunk=4)
    inner = gen.start(list(range(5, 45)), max_new_tokens=5, strategy="greedy")  # 40 tokens: 10 prefill passes
    box: list = []
    stream, drawn = cancelled_after(1, inner, box)
    job = Job(stream, loop)
    box.append(job)
    job.run()
    assert drawn == [""] and stream.result is None  # stopped after the first of ten prefill passes
