"""`jacobi-rt build --check`: the engine against onnxruntime (CPU) on random windows.

Both run through the runtime's own backends (TrtBackend and OrtBackend), so what is compared is
what generation will use: a random prompt prefilled in chunks, then a random window after it,
at shapes that reach both optimization profiles.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.backends.tensorrt import TrtBackend
from jacobi_rt.runtime.manifest import EngineRecord, Manifest

CASES = [
    (1, 1, 0),
    (1, 4, 0),
    (1, 1, 9),
    (1, 8, 17),
    (1, 16, 40),
    (1, 32, 100),
    (1, 64, 3),
    (2, 5, 6),
]  # (batch, window, past)


def check_engine(folder: str | Path, manifest: Manifest, record: EngineRecord, seed: int = 0) -> dict:
    """Max |logit diff| and greedy-id agreement of the engine vs onnxruntime, per case and overall."""
    rng = np.random.default_rng(seed)
    vocab = manifest.architecture.vocab_size
    cases = []
    with TrtBackend(folder, manifest, record=record) as engine, OrtBackend(folder, manifest, device="cpu") as reference:
        for batch, window, past in CASES:
            if not any(p.covers(batch, window, past) for p in engine.profiles) or past + window > manifest.max_context:
                continue
            prompt = rng.integers(0, vocab, (batch, past))
            ids = rng.integers(0, vocab, (batch, window))
            chunk = min(32, engine.max_window)
            got = _last_window(engine, prompt, ids, chunk)
            want = _last_window(reference, prompt, ids, chunk)
            cases.append(
                {
                    "batch": batch,
                    "window": window,
                    "past": past,
                    "max_logit_diff": float(np.abs(got.logits - want.logits).max()),
                    "greedy_agreement": float((got.greedy_ids == want.greedy_ids).mean()),
                }
            )
    positions = [c["batch"] * c["window"] for c in cases]
    return {
        "reference": "onnxruntime-cpu",
        "cases": cases,
        "max_logit_diff": max((c["max_logit_diff"] for c in cases), default=0.0),
        "greedy_agreement": float(np.average([c["greedy_agreement"] for c in cases], weights=positions))
        if cases
        else 1.0,
        "positions": int(sum(positions)),
    }


def _last_window(backend, prompt: np.ndarray, ids: np.ndarray, chunk: int):
    batch, past = prompt.shape
    with backend.context(past + ids.shape[1], batch) as ctx:
        for start in range(0, past, chunk):
            piece = prompt[:, start : start + chunk]
            ctx.forward(piece)
            ctx.commit(piece.shape[1])
        return ctx.forward(ids, want_logits=True)
