#!/usr/bin/env python3
"""Reference fixtures for the exporter (tests in export/tests/).

Builds tiny random Qwen3 checkpoints with Hugging Face `transformers`, a LoRA adapter with `peft`,
runs one fixed left-padded batch through them and stores what the exported model must return:
the logits of the offered labels at the last position divided by T, and their softmax.

  tests/fixtures/export/
    tiny/           tied embeddings, 4 heads / 2 kv heads, head_dim 16 != 32 / 4, word-level
                    tokenizer whose labels A..Z are single tokens
    gqa3/           untied LM head, 6 heads / 2 kv heads (GQA ratio 3), head_dim 12,
                    attention_bias = true (q/k/v/o biases)
    tiny-lora/      a PEFT LoRA adapter for tiny/ (r 4, alpha 8, all seven projections, B drawn
                    random so the merge is not the identity)
    tiny-lora-tokens/  the same kind of adapter with trainable tokens (`trainable_token_indices`):
                    the rows of `cancel_order` (in the prompts) and of label `B` (an option, read
                    through the tied LM head) drawn random
    expected.json   the batch (input_ids, attention_mask, option_token_ids, temperature) and per
                    model the expected option_logits / option_probs (f32, transformers eager)

The batch mixes lengths so left padding and position ids from the mask are exercised; positions
are cumsum(mask) - 1 (clamped at 0), the convention the exporter bakes in. Weights are drawn with
std 0.2 and random norm gains so logits are O(1) and a 1e-4 tolerance tests something.

Run by hand (not in CI), in a venv of scripts/requirements-export.txt (`make
bench-out/venv-export/.ok` makes one): bench-out/venv-export/bin/python scripts/make_export_fixtures.py
Requirements: scripts/requirements-export.txt
"""

import json
import os
import shutil
import sys

import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Qwen3Config, Qwen3ForCausalLM

OUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "export"))
LABELS = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
WORDS = (
    "Decision : tool route stop Context user asks to cancel order lookup_order cancel_order refund_order "
    "ask_user Options . Answer the agent called search_docs and got results a refund for"
).split()
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TEMPERATURE = 1.7


def tokenizer():
    vocab = ["<pad>", "<unk>"] + LABELS
    for w in WORDS:
        if w not in vocab:
            vocab.append(w)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<pad>", "<unk>"])
    return tok


def randomise(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


def batch(tok):
    prompts = [
        "Decision : tool Context : user asks to cancel order Options : A . lookup_order B . cancel_order "
        "C . refund_order D . ask_user Answer :",
        "Decision : stop Options : A . B . C . D . Answer :",
        "the agent called search_docs and got results Options : A . refund_order B . ask_user C . stop "
        "D . route Answer :",
    ]
    ids = [tok.encode(p).ids for p in prompts]
    width = max(len(i) for i in ids)
    pad = tok.token_to_id("<pad>")
    input_ids = [[pad] * (width - len(i)) + i for i in ids]
    mask = [[0] * (width - len(i)) + [1] * len(i) for i in ids]
    labels = [tok.token_to_id(x) for x in "ABCD"]
    option_ids = [labels, labels[::-1], [labels[2], labels[0], labels[3], labels[1]]]
    return {"prompts": prompts, "input_ids": input_ids, "attention_mask": mask,
            "option_token_ids": option_ids, "temperature": TEMPERATURE}


def score(model, b):
    ids = torch.tensor(b["input_ids"])
    mask = torch.tensor(b["attention_mask"])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1, :]
    opt = torch.tensor(b["option_token_ids"])
    scaled = torch.gather(logits, 1, opt) / b["temperature"]
    probs = torch.softmax(scaled, dim=-1)
    # Padding invariance of the reference itself: each row alone, unpadded, gives the same result.
    for r in range(ids.shape[0]):
        keep = mask[r].bool()
        with torch.no_grad():
            alone = model(input_ids=ids[r][keep][None]).logits[0, -1]
        assert torch.allclose(alone[opt[r]] / b["temperature"], scaled[r], atol=1e-5), "padding changed row"
    f = lambda t: [[float(f"{x:.9g}") for x in row] for row in t.tolist()]
    return {"option_logits": f(scaled), "option_probs": f(probs)}


def save(model, tok, name):
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    return folder


def main():
    torch.use_deterministic_algorithms(True)
    tok = tokenizer()
    b = batch(tok)
    common = dict(vocab_size=tok.get_vocab_size(), rms_norm_eps=1e-6, max_position_embeddings=128,
                  attn_implementation="eager")
    tiny_cfg = Qwen3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, **common)
    gqa_cfg = Qwen3Config(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                          num_key_value_heads=2, head_dim=12, tie_word_embeddings=False, attention_bias=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    os.makedirs(OUT, exist_ok=True)
    expected = {"batch": b, "models": {}}

    torch.manual_seed(0)
    tiny = Qwen3ForCausalLM(tiny_cfg).eval()
    randomise(tiny, 1)
    tiny.tie_weights()
    save(tiny, tok, "tiny")
    expected["models"]["tiny"] = score(tiny, b)

    torch.manual_seed(0)
    gqa = Qwen3ForCausalLM(gqa_cfg).eval()
    randomise(gqa, 2)
    save(gqa, tok, "gqa3")
    expected["models"]["gqa3"] = score(gqa, b)

    lora_cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False)
    torch.manual_seed(3)
    peft_model = get_peft_model(tiny, lora_cfg).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn_like(p))
    folder = os.path.join(OUT, "tiny-lora")
    shutil.rmtree(folder, ignore_errors=True)
    peft_model.save_pretrained(folder)
    os.remove(os.path.join(folder, "README.md"))  # peft's model card: not needed by anyone
    expected["models"]["tiny+lora"] = score(peft_model, b)
    merged = peft_model.merge_and_unload()
    check = score(merged, b)
    assert torch.allclose(torch.tensor(check["option_probs"]), torch.tensor(expected["models"]["tiny+lora"]["option_probs"]), atol=1e-5)

    # Trainable tokens beside the adapters, on a fresh copy of tiny/ (the merge above changed
    # `tiny` in place).
    fresh = Qwen3ForCausalLM.from_pretrained(os.path.join(OUT, "tiny"), attn_implementation="eager").eval()
    # PEFT records the base's name in adapter_config.json; the sibling folder's name, not this
    # machine's absolute path, as users record a hub id.
    fresh.name_or_path = "tiny"
    rows = [tok.token_to_id("cancel_order"), tok.token_to_id("B")]
    tokens_cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False,
                            trainable_token_indices=rows)
    torch.manual_seed(4)
    peft_model = get_peft_model(fresh, tokens_cfg).eval()
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name or "trainable_tokens_delta" in name:
                p.copy_(0.2 * torch.randn_like(p))
    folder = os.path.join(OUT, "tiny-lora-tokens")
    shutil.rmtree(folder, ignore_errors=True)
    peft_model.save_pretrained(folder)
    os.remove(os.path.join(folder, "README.md"))
    expected["models"]["tiny+lora-tokens"] = score(peft_model, b)
    base_only = score(Qwen3ForCausalLM.from_pretrained(os.path.join(OUT, "tiny"), attn_implementation="eager").eval(), b)
    assert base_only == expected["models"]["tiny"], "tiny/ reloads as saved"
    merged = peft_model.merge_and_unload()
    check = score(merged, b)
    assert torch.allclose(torch.tensor(check["option_probs"]),
                          torch.tensor(expected["models"]["tiny+lora-tokens"]["option_probs"]), atol=1e-5)

    expected["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                            "peft": __import__("peft").__version__}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)", file=sys.stderr)


if __name__ == "__main__":
    main()
