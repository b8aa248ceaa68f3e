"""Tiny random-weight models of each supported family, saved as Hugging Face folders.

Each folder has config.json, safetensors weights, and a small byte-level BPE tokenizer trained
here on a built-in text, with an EOS token and a chat template. Needs torch + transformers.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = (
    "The quick brown fox jumps over the lazy dog. def add(a, b): return a + b\n"
    "Jacobi decoding guesses a window of tokens and verifies them in one pass. "
    "Numbers 0 1 2 3 4 5 6 7 8 9 and JSON {\"key\": [1, 2, 3]} and unicode: café, naïve, 東京, 🙂.\n"
) * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VOCAB = 384


def tiny_config(family: str):
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=0, bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
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
        return GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                          eos_token_id=0, bos_token_id=0, pad_token_id=0)
    raise ValueError(family)


FAMILIES = ["llama", "llama-mha-tied", "mistral", "qwen2", "qwen3", "gpt2"]


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|im_end|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
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
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|im_end|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 50], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")


def make_tiny_model(family: str, folder: Path, seed: int = 0) -> Path:
    """Write a tiny random `family` model folder (weights scaled up so greedy output varies)."""
    return save_tiny_model(tiny_config(family), folder, seed)


def save_tiny_model(config, folder: Path, seed: int = 0) -> Path:
    """Write a tiny random model of `config` with the tiny tokenizer (weights scaled up so greedy output varies)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger weights -> peaked, varied logits instead of near-uniform ones
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    folder = Path(folder)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder
