"""n > 1: the request's n choices, one seed each (seed, seed + 1, ...), run one after another on one worker.

`Choices` has TextStream's interface (steps, result, close, prompt_tokens), so the worker pool runs
it like one generation; each piece is a `ChoicePiece`, a str that knows its choice's index, so a
stream can label its chunks. n = 1 is the same with one stream.
"""

from __future__ import annotations

from typing import Iterator

from jacobi_rt.runtime.generator import GenerationResult, TextStream


class ChoicePiece(str):
    """A text piece of choice `index`."""

    index: int

    @classmethod
    def of(cls, text: str, index: int) -> "ChoicePiece":
        piece = cls(text)
        piece.index = index
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
            for piece in stream.steps():
                yield ChoicePiece.of(piece, index)
            self.results.append(stream.result)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()
