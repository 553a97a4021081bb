"""Write a tiny, randomly initialised Llama checkpoint with a locally trained tokenizer.

    python -m frontier_runtime.tiny --out DIR [--seed 0] [--tie-word-embeddings] [--shards N]

The same seed and shape always give the same bytes: the training corpus is generated from the seed
(pseudo-words with a Zipf distribution, some English and multi-byte words), the byte-level BPE
tokenizer is trained on it with `tokenizers`, and the weights come from a seeded generator. Weights
use a large ``initializer_range`` so greedy decoding has clear top-1 margins (random models with
the usual 0.02 have near-uniform logits, and argmax would flip on rounding noise).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

SPECIAL_TOKENS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role must be system, user or assistant, got ' + message['role']) }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEFAULT_SHAPE = {
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 8,
    "num_kv_heads": 4,
    "intermediate_size": 688,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "dtype": "float32",
    "initializer_range": 0.1,
    "rope_theta": 10000.0,
    "rope_scaling": None,
}
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "be",
    "are",
    "or",
    "an",
    "not",
    "have",
    "which",
    "one",
    "all",
    "model",
    "token",
    "cache",
    "batch",
    "stream",
    "server",
    "request",
    "engine",
    "block",
    "layer",
    "weight",
    "tensor",
    "prefill",
    "decode",
    "cluster",
    "node",
    "deploy",
    "rollback",
    "canary",
    "drain",
    "health",
    "latency",
    "throughput",
    "memory",
    "kernel",
    "attention",
    "river",
    "mountain",
    "garden",
    "window",
    "morning",
    "evening",
    "winter",
    "summer",
    "coffee",
    "bread",
    "music",
    "letter",
    "story",
    "café",
    "naïve",
    "über",
    "façade",
    "jalapeño",
    "smörgåsbord",
    "Zürich",
    "São",
    "Paulo",
    "東京",
    "日本語",
    "数据",
    "模型",
    "привет",
    "мир",
    "καλημέρα",
    "שלום",
    "مرحبا",
    "🙂",
    "🚀",
    "✓",
    "€",
    "£",
    "¥",
    "—",
    "…",
    "«quoted»",
    "「括弧」",
]


def _corpus(seed: int, lines: int = 6000) -> list[str]:
    rng = random.Random(seed)
    onsets = [
        "",
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "z",
        "st",
        "tr",
        "ch",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "s", "l", "t", "nd", "ck"]
    pseudo = sorted(
        {
            "".join(
                rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 4))
            )
            for _ in range(9000)
        }
    )
    rng.shuffle(pseudo)
    vocab = list(_WORDS) + pseudo
    weights = [1.0 / (rank + 1) ** 0.9 for rank in range(len(vocab))]
    out = []
    for _ in range(lines):
        words = rng.choices(vocab, weights=weights, k=rng.randint(4, 18))
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        sentence = " ".join(words)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ",", ";"]))
    return out


@functools.lru_cache(maxsize=4)
def train_tokenizer_json(seed: int = 0, vocab_size: int = 4096) -> str:
    """A byte-level BPE tokenizer (as tokenizer.json text) trained on the seeded corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok.to_str()


def _hf_config(shape: dict[str, Any], bos: int, eos: list[int]) -> dict[str, Any]:
    heads = shape["num_heads"]
    rope = {"rope_type": "default", "rope_theta": shape["rope_theta"]}
    if shape["rope_scaling"]:
        rope.update(shape["rope_scaling"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape["vocab_size"],
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": shape["num_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": shape["num_kv_heads"],
        "head_dim": shape["hidden_size"] // heads,
        "hidden_act": "silu",
        "max_position_embeddings": shape["max_position_embeddings"],
        "initializer_range": shape["initializer_range"],
        "rms_norm_eps": 1e-5,
        "rope_parameters": rope,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": shape["tie_word_embeddings"],
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": eos[0],
        "dtype": shape["dtype"],
    }


def _weights(shape: dict[str, Any], seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    std: float = shape["initializer_range"]
    h, inter, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    hd = h // shape["num_heads"]
    kv = shape["num_kv_heads"] * hd

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, device=device) * std

    def norm() -> torch.Tensor:  # not all ones, so a norm weight loaded in the wrong place shows
        return 1.0 + 0.1 * torch.randn(h, generator=g, device=device)

    w = {"model.embed_tokens.weight": normal(v, h)}
    for i in range(shape["num_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = normal(h, h)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, h)
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.gate_proj.weight"] = normal(inter, h)
        w[p + "mlp.up_proj.weight"] = normal(inter, h)
        w[p + "mlp.down_proj.weight"] = normal(h, inter)
    w["model.norm.weight"] = norm()
    if not shape["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, h)
    dtype = getattr(torch, shape["dtype"])
    return {k: t.to(dtype).contiguous().cpu() for k, t in w.items()}


def _save_weights(weights: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    meta = {"format": "pt"}
    if shards <= 1:
        save_file(weights, str(out / "model.safetensors"), metadata=meta)
        return
    names = list(weights)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[i * per : (i + 1) * per]}
        save_file(part, str(out / fname), metadata=meta)
        for n, t in part.items():
            weight_map[n] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def make_tiny_checkpoint(
    out_dir: str | Path,
    seed: int = 0,
    shards: int = 1,
    tokenizer_seed: int = 0,
    device: str = "cpu",
    **shape: Any,
) -> Path:
    """Write config.json, weights, tokenizer.json, tokenizer_config.json and generation_config.json.

    ``seed`` draws the weights; ``tokenizer_seed`` the tokenizer's training corpus (kept apart so
    models of different seeds can share one tokenizer). ``device`` is where the weights are drawn:
    a GPU draws a billion of them in a second, where one CPU core takes minutes (same seed, other
    numbers than the CPU's).
    """
    unknown = set(shape) - set(DEFAULT_SHAPE)
    if unknown:
        raise TypeError(f"unknown shape fields {sorted(unknown)}; allowed: {sorted(DEFAULT_SHAPE)}")
    full = {**DEFAULT_SHAPE, **shape}
    if full["hidden_size"] % full["num_heads"] or full["num_heads"] % full["num_kv_heads"]:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok_json = train_tokenizer_json(tokenizer_seed, min(full["vocab_size"], 4096))
    ids = {t["content"]: t["id"] for t in json.loads(tok_json)["added_tokens"]}
    bos, eos = ids["<s>"], [ids["</s>"], ids["<|im_end|>"]]
    (out / "tokenizer.json").write_text(tok_json)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "</s>",
        "model_max_length": full["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen_cfg = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos[0]}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(_hf_config(full, bos, eos), indent=2) + "\n")
    _save_weights(_weights(full, seed, device), out, shards)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights")
    parser.add_argument(
        "--tokenizer-seed", type=int, default=0, help="seed of the tokenizer's training corpus"
    )
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    parser.add_argument("--tie-word-embeddings", action="store_true")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    path = make_tiny_checkpoint(
        args.out,
        seed=args.seed,
        tokenizer_seed=args.tokenizer_seed,
        shards=args.shards,
        tie_word_embeddings=args.tie_word_embeddings,
        dtype=args.dtype,
    )
    print(path)


if __name__ == "__main__":
    main()
