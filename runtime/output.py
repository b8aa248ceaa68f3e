"""Output: a row's committed tokens as text pieces, stop strings, and the result with its stats.

The text side of a generation, after the batcher: `pieces` turns each pass's tokens into text
(held back while it may be the start of a stop string), and `result` builds the GenerationResult
from the request and the finished row's outcome record (runtime.row.RowOutcome).
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from .request import Request
from .row import RowOutcome
from .sampling import TokenLogprob
from .tokenizer import Detokenizer


@dataclass
class Stats:
    strategy: str
    window: int  # the (largest) window of a pass
    adaptive: bool  # window picked per pass by measured speed (runtime.windows.AdaptiveWindow)
    prompt_tokens: int
    new_tokens: int
    finish_reason: str  # "eos", "stop", "length" (max_new_tokens) or "context" (max_context)
    prefill_passes: int
    target_passes: int  # decoding passes after the prefill
    tokens_per_pass: float  # tokens committed per decoding pass (greedy: 1.0); the prefill's token not counted
    wall_seconds: float
    prefill_seconds: float
    session_seconds: float  # time inside onnxruntime's run, prefill included
    overhead_share: float  # (wall - session) / wall: Python, bookkeeping, tokenizer
    decode_tokens_per_second: float  # new tokens / (wall - prefill)
    proposer: dict  # the proposer's counters: guesses proposed and accepted (by source), draft passes and time
    seed: int | None = None  # the sampling seed (drawn when none was given); None when decoding greedily
    exactness: str = (
        ""  # how this CPU keeps windows exact (runtime/backends/exact_rows.py): native, padded, greedy, ...
    )
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache held (not prefilled)
    constraint: dict | None = (
        None  # a constrained output's kind, mask seconds and rows, forced tokens sent and committed
    )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    ids: list[int]  # the new tokens (an EOS that ended generation included; a stop string's last token included)
    text: str  # the new text, special tokens skipped, cut before a stop string
    stats: Stats
    logprobs: list[TokenLogprob] | None = None  # one per id when the request asked for logprobs

    def to_dict(self) -> dict:
        out = {"ids": self.ids, "text": self.text, "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [asdict(lp) for lp in self.logprobs]
        return out


@dataclass
class Committed:
    """A generation's tokens as they are committed (the EOS that ends it included), with their logprobs
    when asked for: what a TextStream's reader can see between pieces (a stream's per-chunk logprobs)."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # grows in step with ids, or ahead of it (the batcher's thread)


class TextStream:
    """Text pieces of one generation as they are committed (Generator.start()).

    `result` is None until the pieces are exhausted, then the GenerationResult. close() stops
    early (from the thread that iterates, between pieces): the backend context is released and
    `result` stays None. Iterating skips empty pieces; steps() does not, so a caller that must
    stop early (a cancelled request, a deadline) gets control after every decoding pass."""

    def __init__(
        self, run: typing.Generator[str, None, GenerationResult], prompt_tokens: int, committed: Committed | None = None
    ):
        self._run = run
        self.prompt_tokens = prompt_tokens
        self.committed = committed or Committed()  # after each piece: the tokens committed up to it
        self.result: GenerationResult | None = None

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        for piece in self.steps():
            if piece:
                return piece
        raise StopIteration

    def steps(self) -> Iterator[str]:
        """One piece per committed token, "" included (text held back for a stop string, special
        tokens): at least one per decoding pass, whatever the text."""
        while True:
            try:
                piece = next(self._run)
            except StopIteration as done:
                self.result = self.result or done.value  # an exhausted generator stops again with None
                return
            yield piece

    def close(self) -> None:
        self._run.close()


class StopText:
    """Accumulates text; finds stop strings; releases only text that cannot be the start of one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, piece: str) -> str:
        if not piece or self.stopped:
            return ""
        begin = max(0, len(self.text) - self.hold)
        self.text += piece
        hits = [i for i in (self.text.find(s, begin) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self.hold)

    def finish(self) -> str:
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : upto], upto
        return piece


def pieces(
    batches: Iterator[list[int]], detok: Detokenizer, eos: set[int], text: StopText, ids: list[int]
) -> Iterator[str]:
    """Each pass's committed tokens (appended to `ids`) as text pieces ("" for a pass without text, so a
    caller can stop between passes); ends at EOS, the tokens' end or a stop string. Closes `batches`."""
    try:
        for batch in batches:
            yield from _pass_texts(batch, ids, eos, text, detok)
            if text.stopped:
                break
    finally:
        batches.close()  # ends the row at once when the caller or a stop string stops early
    if not text.stopped:
        yield text.add(detok.flush())
    yield text.finish()


def _pass_texts(batch: list[int], ids: list[int], eos: set[int], text: StopText, detok: Detokenizer) -> Iterator[str]:
    if not batch:
        yield ""
    for token in batch:
        ids.append(token)
        if token in eos:
            return
        yield text.add(detok.add(token))
        if text.stopped:
            return


def result(request: Request, outcome: RowOutcome, ids: list[int], text: StopText, wall: float) -> GenerationResult:
    """The GenerationResult of a finished generation: its ids and text, and its stats."""
    progress, session = outcome.progress, outcome.session_seconds
    decode_seconds = max(wall - progress.prefill_seconds, 1e-9)
    stats = Stats(
        strategy=request.strategy,
        window=request.window,
        adaptive=request.adaptive,
        prompt_tokens=len(request.prompt_ids),
        new_tokens=len(ids),
        finish_reason="stop" if text.stopped else progress.finish_reason,
        prefill_passes=progress.prefill_passes,
        target_passes=progress.target_passes,
        tokens_per_pass=round(progress.accepted / progress.target_passes, 3) if progress.target_passes else 0.0,
        wall_seconds=round(wall, 4),
        prefill_seconds=round(progress.prefill_seconds, 4),
        session_seconds=round(session, 4),
        overhead_share=round(max(wall - session, 0.0) / wall, 4) if wall > 0 else 0.0,
        decode_tokens_per_second=round(max(len(ids) - 1, 0) / decode_seconds, 2),
        proposer=outcome.proposer,
        seed=outcome.seed,
        exactness=request.exactness,
        cached_tokens=outcome.cached,
        constraint=outcome.constraint,
    )
    logprobs = outcome.logprobs[: len(ids)] if request.sampling.logprobs is not None else None
    return GenerationResult(ids, text.text, stats, logprobs)


def drain(run: Iterator[str]) -> GenerationResult:
    """Run a generation's pieces to the end; its GenerationResult."""
    while True:
        try:
            next(run)
        except StopIteration as done:
            return done.value
