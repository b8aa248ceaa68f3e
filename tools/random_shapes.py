"""The shapes `jacobi-rt random-model` can make: real checkpoints' config.json, SmolLM2's vocabulary.

Each entry is the public config.json of the named checkpoint (structure, norms, rotary), with two
changes: the vocabulary is SmolLM2's 49,152 tokens (the tokenizer every random model ships), and the
token ids follow it (bos 1 `<|im_start|>`, eos and pad 2 `<|im_end|>`). The weights' names and
shapes follow from the config (`tensor_shapes`), in Hugging Face's naming.
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB = 49152  # SmolLM2's tokenizer
TOKEN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}

_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rope_scaling": None,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-05,
    "use_cache": True,
}

CONFIGS: dict[str, dict] = {
    # meta-llama/Meta-Llama-3-8B
    "llama-3-8b": {
        **_LLAMA,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    # Qwen/Qwen2.5-7B-Instruct: biases on q, k and v
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "initializer_range": 0.02,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "use_cache": True,
    },
    # mistralai/Mistral-7B-v0.3: no sliding window
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-05,
        "sliding_window": None,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
    },
    # TinyLlama/TinyLlama-1.1B-Chat-v1.0
    "tinyllama-1.1b": {
        **_LLAMA,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    # HuggingFaceTB/SmolLM2-135M-Instruct: tied embeddings
    "smollm2-135m": {
        **_LLAMA,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "initializer_range": 0.041666666666666664,
    },
}
GGUF_FAMILIES = ("llama", "mistral")  # llama.cpp's `llama` architecture: the q/k rows permuted, no biases


@dataclass(frozen=True)
class TensorSpec:
    name: str  # Hugging Face name: "model.layers.0.self_attn.q_proj.weight"
    shape: tuple[int, ...]
    kind: str  # "linear", "embedding", "norm", "bias": how its random values are drawn
    layer: int | None = None  # the decoder layer, None for the embedding, final norm and head


def config_for(name: str, layers: int | None = None, dtype: str = "bfloat16") -> dict:
    """The config.json of NAME (optionally cut to `layers` decoder layers) with SmolLM2's vocabulary."""
    if name not in CONFIGS:
        raise KeyError(name)
    config = {**CONFIGS[name], "vocab_size": VOCAB, **TOKEN_IDS, "torch_dtype": dtype}
    if layers is not None:
        config["num_hidden_layers"] = layers
        if "max_window_layers" in config:
            config["max_window_layers"] = layers
    return config


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def tensor_shapes(config: dict) -> list[TensorSpec]:
    """Every weight of the model in the order a checkpoint stores them: embedding, layers, norm, head."""
    hidden, ffn, dim = config["hidden_size"], config["intermediate_size"], head_dim(config)
    q_rows, kv_rows = config["num_attention_heads"] * dim, config["num_key_value_heads"] * dim
    bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)
    specs = [TensorSpec("model.embed_tokens.weight", (config["vocab_size"], hidden), "embedding")]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layer = [
            (p + "input_layernorm.weight", (hidden,), "norm"),
            (p + "self_attn.q_proj.weight", (q_rows, hidden), "linear"),
            (p + "self_attn.k_proj.weight", (kv_rows, hidden), "linear"),
            (p + "self_attn.v_proj.weight", (kv_rows, hidden), "linear"),
            (p + "self_attn.o_proj.weight", (hidden, q_rows), "linear"),
            (p + "post_attention_layernorm.weight", (hidden,), "norm"),
            (p + "mlp.gate_proj.weight", (ffn, hidden), "linear"),
            (p + "mlp.up_proj.weight", (ffn, hidden), "linear"),
            (p + "mlp.down_proj.weight", (hidden, ffn), "linear"),
        ]
        if bias:
            layer[4:4] = [
                (p + f"self_attn.{x}_proj.bias", (rows,), "bias")
                for x, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))
            ]
        specs += [TensorSpec(n, s, k, i) for n, s, k in layer]
    specs.append(TensorSpec("model.norm.weight", (hidden,), "norm"))
    if not config.get("tie_word_embeddings"):
        specs.append(TensorSpec("lm_head.weight", (config["vocab_size"], hidden), "linear"))
    return specs


def parameter_count(config: dict) -> int:
    total = 0
    for spec in tensor_shapes(config):
        n = 1
        for d in spec.shape:
            n *= d
        total += n
    return total
