"""jacobi_rt.runtime: run exported artifacts with Jacobi decoding, without PyTorch; the tokens are
those of decoding one token a pass (greedy, or sampled for a seed).

    from jacobi_rt.runtime import Generator
    gen = Generator.load("build/smollm2-135m")
    result = gen.generate("Write a haiku about autumn", max_new_tokens=64)
    print(result.text, result.stats.tokens_per_pass)
"""

from .batcher import Batcher
from .errors import (
    ArtifactError,
    BackendError,
    ContextLimitError,
    InputError,
    JacobiError,
    MissingDependencyError,
)
from .generator import GenerationResult, Generator, Stats, TextStream
from .params import GenerationParams
from .sampling import SamplingParams

__all__ = [
    "Generator",
    "Batcher",
    "TextStream",
    "GenerationParams",
    "SamplingParams",
    "GenerationResult",
    "Stats",
    "JacobiError",
    "ArtifactError",
    "BackendError",
    "ContextLimitError",
    "InputError",
    "MissingDependencyError",
]
