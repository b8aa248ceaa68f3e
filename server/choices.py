"""n > 1: the request's n choices, one seed each (seed, seed + 1, ...), run one after another on one worker.

`Choices` has TextStream's interface (steps, result, close, prompt_tokens), so the worker pool runs
it like one generation; each piece is a `ChoicePiece`, a str that knows its choice's index, so a
stream can label its chunks, and the tokens committed when it was made (`tokens`, read on the thread
that runs the generation, so a chunk carries the logprobs of its own tokens). n = 1 is the same with one stream.
"""

from __future__ import annotations

from collections.abc import Iterator

from jacobi_rt.runtime import GenerationResult, TextStream, TokenLogprob


class ChoicePiece(str):
    """A text piece of choice `index`; `tokens`: the choice's tokens committed up to it; `logprobs`: the
    choice's logprobs (None when not asked for), of which the first `tokens` belong to this piece or before."""

    index: int
    tokens: int
    logprobs: list[TokenLogprob] | None

    @classmethod
    def of(cls, text: str, index: int, tokens: int = 0, logprobs: list[TokenLogprob] | None = None) -> ChoicePiece:
        piece = cls(text)
        piece.index, piece.tokens, piece.logprobs = index, tokens, logprobs
        return piece


class Choices:
    def __init__(self, streams: list[TextStream]):
        self.streams = streams
        self.prompt_tokens = streams[0].prompt_tokens
        self.results: list[GenerationResult] = []  # filled as each choice ends

    @property
    def result(self) -> GenerationResult | None:
        """The first choice's result once every choice has ended (what the metrics record)."""
        return self.results[0] if len(self.results) == len(self.streams) else None

    def steps(self) -> Iterator[ChoicePiece]:
        for index, stream in enumerate(self.streams):
            committed = stream.committed
            for piece in stream.steps():
                yield ChoicePiece.of(piece, index, len(committed.ids), committed.logprobs)
            self.results.append(stream.result)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
