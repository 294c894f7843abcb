#!/usr/bin/env python3
"""Reference fixtures for the Burn Qwen3 decoder (tests in train/tests/parity.rs).

Builds two tiny random Qwen3 checkpoints with Hugging Face `transformers`, saves them with a
small tokenizer made here with the `tokenizers` library (no network), runs fixed prompts one at a
time (no padding) and stores the expected last-position logits over the whole vocabulary.

  tied/         tied embeddings, 4 heads / 2 kv heads, head_dim = hidden / heads; a byte-level BPE
                tokenizer with Qwen's pre-tokenizer and chat markers; model.safetensors in f32,
                plus model.bf16.safetensors (the same weights in bf16)
  untied-gqa3/  untied LM head, 6 heads / 2 kv heads (GQA ratio 3), head_dim 12 != 48 / 6, a
                word-level tokenizer; weights sharded (model.safetensors.index.json + shards) in
                f32, plus model.f16.safetensors (the same weights in f16)
  expected.json prompts, their token ids, and last-position logits per model and dtype

Weights are drawn larger than transformers' default (std 0.2 rather than 0.02) and the RMSNorm
gains are random, so the logits are O(1) and a 1e-4 tolerance actually tests something.

Run by hand (not in CI), in a venv of scripts/requirements-model.txt (`make
bench-out/venv-model/.ok` makes one): bench-out/venv-model/bin/python scripts/make_qwen3_fixtures.py
Requirements: scripts/requirements-model.txt
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen3Config, Qwen3ForCausalLM

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "model"))
LABELS = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "Decision: tool\nContext:\nuser asks to cancel order ord_117 after lookup_order failed\n",
    "Options:\nA. lookup_order\nB. cancel_order\nC. refund_order\nD. ask_user\nAnswer:\n",
    "the agent called search_docs and got 3 results; the user wants a refund for ord_42",
    "stop when the task is done, route to a human when the policy says so",
]
PROMPTS_CHAT = [
    "Decision: tool",
    "<|im_start|>user\nDecision: tool\n\nContext:\ncancel ord_117\n\nOptions:\nA. lookup_order\n"
    "B. cancel_order<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "the agent called search_docs and got 3 results; the user wants a refund for ord_42. "
    "Options:\nA. refund_order\nB. ask_user\nC. stop\nAnswer:\n",
    "Ünïcode stays whole: café → ☕, 12345",
]
PROMPTS_WORDS = [
    "Decision : tool",
    "Decision : tool Context : user asks to cancel order ord_117 Options : A . lookup_order B . cancel_order Answer :",
    "the agent called search_docs and got 3 results ; the user wants a refund Options : A . refund_order B . ask_user C . stop Answer :",
    "unseen words map to unk : zebra",
]


def bpe_tokenizer():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def word_tokenizer():
    words = ["[PAD]", "[UNK]"] + LABELS
    for text in CORPUS + PROMPTS_WORDS[:3]:
        for w in pre_tokenizers.Whitespace().pre_tokenize_str(text):
            if w[0] not in words:
                words.append(w[0])
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[PAD]", "[UNK]"])
    return tok


def randomise(model, std):
    torch.manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))


def last_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    # f32 values carry 9 significant digits; more would only make the file bigger.
    return [float(f"{x:.9g}") for x in out.logits[0, -1].tolist()]


def build(name, cfg, tok, prompts, shard, half_dtype):
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    randomise(model, 0.2)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    kwargs = {"max_shard_size": "60KB"} if shard else {}
    model.save_pretrained(folder, safe_serialization=True, **kwargs)
    tok.save(os.path.join(folder, "tokenizer.json"))
    for extra in ["generation_config.json"]:
        p = os.path.join(folder, extra)
        if os.path.exists(p):
            os.remove(p)

    ids = [tok.encode(p, add_special_tokens=True).ids for p in prompts]
    result = {"prompts": prompts, "input_ids": ids, "f32": [last_logits(model, i) for i in ids]}

    # The same weights stored in half precision: the reference is the f32 model whose weights were
    # rounded to that dtype (our loader converts to f32 and computes in f32).
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "f16"}[half_dtype]
    state = {k: v.detach().to(half_dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(folder, f"model.{dtype_name}.safetensors"), metadata={"format": "pt"})
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(half_dtype).to(torch.float32))
    result[dtype_name] = [last_logits(model, i) for i in ids]
    return result


def main():
    torch.use_deterministic_algorithms(True)
    bpe = bpe_tokenizer()
    words = word_tokenizer()
    tied = Qwen3Config(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        tie_word_embeddings=True,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    untied = Qwen3Config(
        vocab_size=words.get_vocab_size() + 3,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=12,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    expected = {
        "tied": build("tied", tied, bpe, PROMPTS_CHAT, shard=False, half_dtype=torch.bfloat16),
        "untied-gqa3": build("untied-gqa3", untied, words, PROMPTS_WORDS, shard=True, half_dtype=torch.float16),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)", file=sys.stderr)


if __name__ == "__main__":
    main()
