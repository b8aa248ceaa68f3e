"""Tiny random-weight models of each supported family, saved as Hugging Face folders.

Each folder has config.json, safetensors weights, and a small byte-level BPE tokenizer trained
here on a built-in text, with an EOS token and a chat template. Needs torch + transformers.
"""

from __future__ import annotations

import re
from pathlib import Path

CORPUS = (
    "The quick brown fox jumps over the lazy dog. def add(a, b): return a + b\n"
    "Jacobi decoding guesses a window of tokens and verifies them in one pass. "
    'Numbers 0 1 2 3 4 5 6 7 8 9 and JSON {"key": [1, 2, 3]} and unicode: café, naïve, 東京, 🙂.\n'
) * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VOCAB = 384


def tiny_config(family: str):
    """The tiny config of `family`; "<family>-<n>layers" is that family with n layers of the first one's kind
    (past stitch.TRACED layers, the export traces 3 and writes the rest as copies)."""
    deeper = re.fullmatch(r"(.+)-(\d+)layers", family)
    if deeper:
        config = tiny_config(deeper[1])
        config.num_hidden_layers = int(deeper[2])
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
        return config
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=0,
        bos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if family == "llama-mha-tied":  # one KV head per head, tied embeddings (SmolLM-like)
        return LlamaConfig(**{**common, "num_key_value_heads": 4, "tie_word_embeddings": True})
    if family == "llama-mqa":  # one KV head for every head (multi-query); not in FAMILIES: the in-place tests export it
        return LlamaConfig(**{**common, "num_key_value_heads": 1}, rope_theta=10000.0)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=16)
    if family == "gpt2":
        return GPT2Config(
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            eos_token_id=0,
            bos_token_id=0,
            pad_token_id=0,
        )
    if family in MORE_FAMILIES:
        return more_config(family, common)
    raise ValueError(family)


FAMILIES = ["llama", "llama-mha-tied", "mistral", "qwen2", "qwen3", "gpt2"]
# 5-layer models whose export is stitched (Llama, and GPT-2's Conv1D), shared by the streamed export's, the
# layer check's and the weight pass's tests (tests/make_artifacts.py exports them once for every worker).
STITCHED = ["llama-5layers", "gpt2-5layers"]

# Families beyond the first six, each shrunk from a real checkpoint's config.json: the structural
# fields kept (norms, biases, rotary share and scaling, multipliers, capping, layer types), the
# sizes cut to 2 layers of hidden 64. Exported once each by tests/exporter/test_export_families.py.
MORE_FAMILIES = {
    "phi3": "microsoft/Phi-4-mini-instruct",  # fused qkv and gate_up, partial rotary 0.75, longrope, tied
    # attention and final logit soft-capping, alternating sliding-window layers, pre/post norms
    "gemma2": "google/gemma-2-2b-it",
    "granite": "ibm-granite/granite-3.3-2b-instruct",  # embedding, attention, residual and logit multipliers
    "olmo2": "allenai/OLMo-2-0425-1B",  # post-norms, q/k norms over all heads
    "gpt_neox": "EleutherAI/pythia-160m",  # parallel residual, rotary on 25% of the head, fused qkv with bias
    "stablelm": "stabilityai/stablelm-2-1_6b",  # LayerNorm, rotary on 25%, qkv bias
    "phi": "microsoft/phi-2",  # parallel attention/MLP, rotary on 40%, dense bias, gelu_new
    "gemma": "google/gemma-2b",  # multi-query, scaled embeddings, (1 + w) RMSNorm, gelu_pytorch_tanh
    "gemma3_text": "google/gemma-3-1b-it",  # local/global layers with their own rope bases, q/k norms, windows
    "smollm3": "HuggingFaceTB/SmolLM3-3B",  # layers without rope
    "starcoder2": "bigcode/starcoder2-3b",  # LayerNorm with bias, biased projections, GQA, a sliding window
    "gptj": "EleutherAI/gpt-j-6b",  # interleaved (rotate-every-two) rotary on part of the head, parallel attention/MLP
    "nemotron": "nvidia/Minitron-4B-Base",  # LayerNorm1P, squared-ReLU MLP, rotary on half the head
    "olmo": "allenai/OLMo-1B-hf",  # non-parametric LayerNorm, q/k/v clipping
    "cohere": "CohereForAI/c4ai-command-r-v01",  # interleaved rotary, parallel attention/MLP, logit scale
    "falcon": "tiiuae/falcon-40b",  # new decoder architecture: grouped KV in one fused qkv, two parallel layer norms
}


def more_config(family: str, common: dict):
    """The tiny config of a MORE_FAMILIES family (see the checkpoint named there). Gemma's and
    Granite's checkpoints tie their embeddings; their tiny models do not, because with tied random
    embeddings they only repeat the prompt's last token, which would hide a wrong one."""
    from transformers import AutoConfig

    sizes = {
        k: common[k]
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
            "eos_token_id",
            "bos_token_id",
            "pad_token_id",
        )
    }
    if family == "phi3":
        # Phi3Config reads original_max_position_embeddings at the top level (4096 in the checkpoint, of 131072)
        fields = dict(
            num_key_value_heads=2,
            partial_rotary_factor=0.75,
            tie_word_embeddings=True,
            hidden_act="silu",
            original_max_position_embeddings=128,
            rope_scaling={
                "rope_type": "longrope",
                "original_max_position_embeddings": 128,
                "short_factor": [1.0, 1.1, 1.25, 1.5, 2.0, 3.0],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            },
        )
    elif family == "gemma2":  # capping at 2 and 5 (the checkpoint: 50 and 30) so that it changes these tiny scores
        fields = dict(
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=32,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
            sliding_window=96,
            layer_types=["sliding_attention", "full_attention"],
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=False,
        )
    elif family == "granite":
        fields = dict(
            num_key_value_heads=2,
            embedding_multiplier=12.0,
            attention_multiplier=0.015625,
            residual_multiplier=0.22,
            logits_scaling=8.0,
            tie_word_embeddings=False,
            rope_theta=10000000.0,
        )
    elif family == "olmo2":
        fields = dict(num_key_value_heads=4, rope_theta=500000.0, tie_word_embeddings=False)
    elif family == "gpt_neox":
        fields = dict(
            num_key_value_heads=4,
            rotary_pct=0.25,
            use_parallel_residual=True,
            hidden_act="gelu",
            tie_word_embeddings=False,
            attention_bias=True,
        )
    elif family == "stablelm":
        fields = dict(
            num_key_value_heads=4,
            partial_rotary_factor=0.25,
            use_qkv_bias=True,
            qk_layernorm=False,
            use_parallel_residual=False,
            tie_word_embeddings=False,
            hidden_act="silu",
        )
    elif family == "phi":
        fields = dict(
            num_key_value_heads=4,
            partial_rotary_factor=0.4,
            hidden_act="gelu_new",
            qk_layernorm=False,
            tie_word_embeddings=False,
        )
    elif family == "gemma":
        fields = dict(
            num_key_value_heads=1,
            head_dim=16,
            hidden_act="gelu_pytorch_tanh",
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=False,
        )
    elif family == "gemma3_text":
        fields = dict(
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=96,
            layer_types=["sliding_attention", "full_attention"],
            rope_local_base_freq=10000.0,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            hidden_activation="gelu_pytorch_tanh",
        )
    elif family == "starcoder2":
        fields = dict(
            num_key_value_heads=2,
            sliding_window=128,
            use_bias=True,
            hidden_act="gelu_pytorch_tanh",
            norm_epsilon=1e-5,
            rope_theta=999999.0,
            tie_word_embeddings=False,
        )
    elif family == "gptj":
        fields = dict(
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            rotary_dim=8,
            activation_function="gelu_new",
            tie_word_embeddings=False,
        )
    elif family == "nemotron":
        fields = dict(num_key_value_heads=2, partial_rotary_factor=0.5, hidden_act="relu2", tie_word_embeddings=False)
    elif family == "olmo":
        fields = dict(num_key_value_heads=4, clip_qkv=8.0, tie_word_embeddings=False)
    elif family == "cohere":
        fields = dict(num_key_value_heads=2, logit_scale=0.0625, use_qk_norm=False, tie_word_embeddings=True)
    elif family == "falcon":
        fields = dict(
            num_kv_heads=2,
            new_decoder_architecture=True,
            multi_query=True,
            parallel_attn=True,
            bias=False,
            alibi=False,
            tie_word_embeddings=False,
        )
    elif family == "smollm3":
        fields = dict(
            num_key_value_heads=2,
            no_rope_layers=[1, 0],
            rope_theta=5000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
        )
    return AutoConfig.for_model(family, **sizes, **fields)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|im_end|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def other_tokenizer():
    """A byte-level BPE trained on another text: same special tokens, another vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|im_end|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 50], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")


def make_tiny_model(family: str, folder: Path, seed: int = 0) -> Path:
    """Write a tiny random `family` model folder (weights scaled up so greedy output varies)."""
    return save_tiny_model(tiny_config(family), folder, seed)


def save_tiny_model(config, folder: Path, seed: int = 0, dtype=None, max_shard_size: str | None = None) -> Path:
    """Write a tiny random model of `config` with the tiny tokenizer (weights scaled up so greedy output varies);
    dtype: the saved weights' torch dtype (default float32); max_shard_size: write shards of that size."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger weights -> peaked, varied logits instead of near-uniform ones
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    folder = Path(folder)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    tiny_tokenizer().save_pretrained(folder)
    return folder
