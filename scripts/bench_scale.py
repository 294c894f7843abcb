"""LoRA training at a real size, side by side: `decision train` (Burn, CPU, bf16 base, layer
recomputation) against PyTorch + transformers + peft (CPU, gradient checkpointing, SDPA attention,
bf16 where this CPU computes it), on the same random Qwen3 checkpoint and the same token ids, one
run.

Run by `make bench-scale` (or by hand, after `cargo build -p decision --example random_qwen3`):
    python scripts/bench_scale.py --decision target/debug/decision \
        --make-model target/debug/examples/random_qwen3 --out bench-out/scale

The model: configs/shapes/qwen3-0.6b.json (28 layers, hidden 1024, 16 / 8 heads, head_dim 128,
intermediate 3072, vocabulary 151 936, tied), random bf16 weights written by the
`random_qwen3` example, the word-level tokenizer of tests/fixtures/export/tiny. LoRA r 16,
alpha 32, no dropout, on all seven projections. Two workloads: micro-batches of 2 x 1024 and
1 x 2048 tokens (the states' contexts are padded to those lengths). Each side runs STEPS
optimizer steps; tokens/s is the median over the steps after the first; peak memory is the
process's max RSS (the whole run: loading, training and, for ours, the final evaluation and
save). `decision train --plan` is printed beside our peak. Both sides' sustained GFLOP/s count the
same nominal work (step_flops: dense attention, though ours skips the masked tiles). Then the
forward pass (skip it with --no-forward): `decision score` on the training states, in the batch
size of the workload and the peer's dtype, against the peer's forward on the token ids and batches
ours emitted; tokens/s of the forward passes alone, and the largest gap in option probabilities.
Writes OUT/bench-scale.json.

The peer's dtype: `--torch-dtype bf16` as asked, `f32`, or `auto` (the default): time a
1024 x 1024 x 1024 matmul in both and use bf16 unless it is over 4x slower than f32. CPUs without
native bf16 (AVX2 only, as this project's 2-core machine: 0.4-0.7 GFLOPS in bf16 against 21-55 in
f32) would take over an hour per step in bf16, so there the peer runs f32 (its base then takes
twice the memory of ours, which the RSS ratio shows), and the table says which it ran.
Requirements: scripts/requirements-train.txt.

On a GPU machine (scripts/gpu-check.sh): `--backend wgpu` runs ours on wgpu / Vulkan,
`--peer-device cuda` the peer on CUDA, and peak memory is then the GPU's, polled with nvidia-smi
for both sides alike (torch's own max_memory_allocated is recorded beside it). `--skeleton DIR`
takes DIR/model-TOKENS/ checkpoints without weights (`random_qwen3 --no-weights`) and gives them
random bf16 weights with transformers (on the GPU when there is one), so nothing large is carried.
`--ours-dtype auto` lets our side take the narrowest float the device computes (bf16, else f16);
the table shows what it ran (the run's trainer state records it). Several, comma-separated, are
tried in order until our backend takes one.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time

SHAPE = "configs/shapes/qwen3-0.6b.json"
TOKENIZER = "tests/fixtures/export/tiny/tokenizer.json"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class GpuMemory:
    """Peak device memory in use (MiB, all processes, less what was in use before) while it is
    entered: nvidia-smi polled every 0.1 s, so both sides are measured the same way."""

    def __init__(self, enabled):
        self.enabled, self.peak, self.base = enabled, 0.0, 0.0

    @staticmethod
    def used():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return float(out.split()[0])

    def __enter__(self):
        if self.enabled:
            import threading
            self.base = self.used()
            self.stop = threading.Event()

            def poll():
                while not self.stop.wait(0.1):
                    self.peak = max(self.peak, self.used() - self.base)
            self.thread = threading.Thread(target=poll, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()


def run_measured(cmd, env=None, gpu=False, check=True, timeout=None, done=None):
    """Run `cmd` (its stderr passes through), return (seconds, max RSS in MiB, stdout, peak device
    MiB or None); with check=False a failure returns None for the seconds instead of exiting. A run
    past `timeout` seconds is killed, and counts as a failure. `done`, polled every 0.5 s, says when
    the run has done what is measured: it is then stopped, and counts as finished."""
    import signal
    import threading
    t = time.time()
    stopped = threading.Event()
    with GpuMemory(gpu) as mem:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
        timer = threading.Timer(timeout, p.send_signal, [signal.SIGKILL]) if timeout else None
        if timer:
            timer.start()
        if done:
            def watch():
                while p.poll() is None and not stopped.wait(0.5):
                    if done():
                        stopped.set()
                        p.send_signal(signal.SIGKILL)
            threading.Thread(target=watch, daemon=True).start()
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        if timer:
            timer.cancel()
    if stopped.is_set():
        return time.time() - t, usage.ru_maxrss / 1024.0, out, (mem.peak if gpu else None)
    stopped.set()
    if os.waitstatus_to_exitcode(status) != 0:
        if timeout and time.time() - t >= timeout:
            print(f"killed after {timeout:.0f} s: {' '.join(map(str, cmd[:2]))}", file=sys.stderr)
        if not check:
            return None, usage.ru_maxrss / 1024.0, out, (mem.peak if gpu else None)
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{out}")
    return time.time() - t, usage.ru_maxrss / 1024.0, out, (mem.peak if gpu else None)


RUN_CONFIG = """
name = "bench-scale"
[model]
init = "pretrained"
source = "{model}"
[data]
train = "{states}"
valid = "{valid}"
max_options = 26
max_tokens = {max_tokens}
shuffle_options = false
[loss]
brier_weight = 0.5
teacher_blend = 0.0
[lora]
rank = 16
alpha = 32.0
dropout = 0.0
targets = {targets}
[optim]
lr = 1e-4
warmup_steps = 0
grad_accum = 1
clip = 1.0
weight_decay = 0.0
[train]
mode = "lora"
max_steps = {steps}
batch_size = {batch}
dtype = "{dtype}"
backend = "{backend}"
recompute = true
log_every = 1
eval_every = 0
checkpoint_every = 0
[eval]
batch_size = 1
permutations = 0
"""


def ran_dtype(run_dir, asked):
    """The dtype our run's base computed in: `asked`, or what `auto` resolved to (each `train` line
    of metrics.jsonl records it, as the newest checkpoint's trainer state does)."""
    path = run_dir / "metrics.jsonl"
    for line in reversed(open(path).read().splitlines() if path.exists() else []):
        try:
            m = json.loads(line)
        except ValueError:  # the line a killed run was writing
            continue
        if m.get("kind") == "train" and "dtype" in m:
            return m["dtype"]
    states = sorted(run_dir.glob("checkpoints/step-*/trainer_state.json"))
    return json.load(open(states[-1])).get("dtype", asked) if states else asked


def rust_gpu_reserved_mib(run_dir):
    """The most device memory Burn's GPU runtime held at a logged step (metrics.jsonl's
    gpu_reserved_bytes), MiB; None on the CPU or before a step."""
    path = run_dir / "metrics.jsonl"
    held = []
    for line in open(path) if path.exists() else []:
        try:
            m = json.loads(line)
        except ValueError:  # the line a killed run was writing
            continue
        if m.get("kind") == "train" and "gpu_reserved_bytes" in m:
            held.append(m["gpu_reserved_bytes"] / 2**20)
    return max(held) if held else None


def rust_steps(run_dir):
    """Tokens/s of each training step our run logged (metrics.jsonl), in order."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in open(path):
        try:
            m = json.loads(line)
        except ValueError:  # the line a killed run was writing
            continue
        if m.get("kind") == "train":
            steps.append(m["tokens_per_s"])
    return steps


def encode_states(model_dir, states):
    """Token ids of each state as `decision` renders them (decision.json's template, the
    model's tokenizer.json), in the original candidate order: (input_ids, option ids, answer)."""
    from tokenizers import Tokenizer
    spec = json.load(open(model_dir / "decision.json"))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    t = spec["template"]
    out = []
    for s in states:
        opts = t["option_separator"].join(
            t["option"].replace("{label}", spec["labels"][i]).replace("{text}", c["label"])
            for i, c in enumerate(s["candidates"]))
        text = t["text"].replace("{point}", s["point"]).replace("{context}", s["context"]).replace("{options}", opts)
        ids = tok.encode(text).ids
        answer = [c["id"] for c in s["candidates"]].index(s["answer"])
        out.append((ids, spec["label_token_ids"][:len(s["candidates"])], answer))
    return out


def torch_worker(args):
    import torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model_dir = pathlib.Path(args.model)
    states = [json.loads(l) for l in open(args.states)]
    data = encode_states(model_dir, states)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.torch_dtype]
    dev = torch.device(args.peer_device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(dev)
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules=TARGETS))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    base = model.get_base_model()
    head = base.lm_head.weight
    tps = []
    for step in range(args.steps):
        batch = [data[(step * args.batch + i) % len(data)] for i in range(args.batch)]
        L = max(len(b[0]) for b in batch)
        ids = torch.zeros(len(batch), L, dtype=torch.long)
        mask = torch.zeros(len(batch), L, dtype=torch.long)
        for i, (toks, _, _) in enumerate(batch):
            ids[i, L - len(toks):] = torch.tensor(toks)
            mask[i, L - len(toks):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kmax = max(len(b[1]) for b in batch)
        labels = torch.tensor(next(b[1] for b in batch if len(b[1]) == kmax))
        absent = torch.zeros(len(batch), kmax)
        onehot = torch.zeros(len(batch), kmax)
        for i, (_, opts, ans) in enumerate(batch):
            absent[i, len(opts):] = -1e9
            onehot[i, ans] = 1.0
        tokens = int(mask.sum())
        ids, mask, positions = ids.to(dev), mask.to(dev), positions.to(dev)
        absent, onehot = absent.to(dev), onehot.to(dev)
        labels = labels.to(dev)
        t = time.time()
        hidden = base.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state[:, -1]
        logits = (hidden @ head[labels].T).float() + absent
        logp = torch.log_softmax(logits, -1)
        p = logp.exp()
        loss = (-(onehot * logp).sum(-1) + 0.5 * ((p - onehot) ** 2).sum(-1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        tps.append(tokens / (time.time() - t))
        print(f"torch step {step + 1}: {tps[-1]:.1f} tokens/s", file=sys.stderr)
    result = {"tokens_per_s": statistics.median(tps[1:]), "threads": torch.get_num_threads()}
    if dev.type == "cuda":
        result["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
        result["device_name"] = torch.cuda.get_device_name()
    json.dump(result, open(args.result, "w"))


def step_flops(cfg, batch, seq, lora_rank, train=True):
    """Nominal FLOPs of one micro-batch of `batch` rows of `seq` tokens (padding included), the
    same count for both sides: every projection's product, attention as dense `s x s` products
    (ours skips the tiles the causal mask removes, so it executes less than this), and the LoRA
    adapters. A training step with checkpointing runs the frozen products three times (forward,
    recomputed forward, input gradients; no weight gradients), attention's two products four times
    over (forward, recomputed forward and the four backward products) and the adapters' four times
    (forward, recomputed forward, input and weight gradients). A forward pass runs each once and
    has no adapters. The head (a few option rows) is left out."""
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim") or h // cfg["num_attention_heads"]
    inter = cfg["intermediate_size"]
    shapes = [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h), (h, inter), (h, inter), (inter, h)]
    tokens = batch * seq
    proj = sum(a * b for a, b in shapes) * 2 * tokens
    attn = 2 * 2 * batch * heads * seq * seq * d
    if not train:
        return n * (proj + attn)
    adapters = sum(a + b for a, b in shapes) * lora_rank * 2 * tokens
    return n * (3 * proj + 4 * attn + 4 * adapters)


def torch_forward_worker(args):
    """The peer's forward pass (inference mode, SDPA) on the token ids `decision score
    --emit-tokens` wrote, in the batches it formed (sorted by length, left-padded): one warm-up
    batch, then all of them timed. Writes tokens/s and the option probabilities."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = [json.loads(l) for l in open(args.states)]
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.torch_dtype]
    dev = torch.device(args.peer_device)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa").to(dev).eval()
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["input_ids"]), i))
    batches = [order[b:b + args.batch] for b in range(0, len(order), args.batch)]
    head = model.get_output_embeddings().weight
    probs = [None] * len(rows)

    def run(idx):
        seq = max(len(rows[i]["input_ids"]) for i in idx)
        ids = torch.zeros(len(idx), seq, dtype=torch.long)
        mask = torch.zeros(len(idx), seq, dtype=torch.long)
        for j, i in enumerate(idx):
            n = len(rows[i]["input_ids"])
            ids[j, seq - n:] = torch.tensor(rows[i]["input_ids"])
            mask[j, seq - n:] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = model.model(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                             position_ids=pos.to(dev)).last_hidden_state[:, -1]
        for j, i in enumerate(idx):
            w = head[torch.tensor(rows[i]["option_token_ids"], device=dev)]
            probs[i] = torch.softmax((hidden[j] @ w.T).float(), -1).tolist()

    with torch.inference_mode():
        run(batches[0])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.time()
        for idx in batches:
            run(idx)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        secs = time.time() - t
    tokens = sum(len(r["input_ids"]) for r in rows)
    json.dump({"tokens_per_s": tokens / secs, "seconds": secs, "tokens": tokens, "probs": probs},
              open(args.result, "w"))


def forward_side_by_side(args, model, batch, dtype, out):
    """`decision score` against the peer's forward on the same states and token ids: tokens/s of
    each (forward passes only, loading excluded), their ratio and the largest gap between the two
    sides' option probabilities."""
    w = f"{batch}x{model.name.removeprefix('model-')}"
    scores = out / f"score-{w}.jsonl"
    cmd = [args.decision, "score", "--model", str(model), "--data", str(model / "train.jsonl"), "--out",
           str(scores), "--batch-size", str(batch), "--dtype", dtype, "--backend", args.backend, "--emit-tokens"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"decision score failed:\n{p.stderr}")
    m = re.search(r"scored (\d+) states \((\d+) prompt tokens\) in ([0-9.]+)s", p.stderr)
    if not m:
        sys.exit(f"no timing line in decision score's output:\n{p.stderr}")
    ours = int(m.group(2)) / float(m.group(3))
    res = out / f"torch-forward-{w}.json"
    run_measured([sys.executable, __file__, "--torch-forward-worker", "--model", str(model), "--states",
                  str(scores), "--batch", str(batch), "--result", str(res), "--torch-dtype", args.torch_dtype,
                  "--peer-device", args.peer_device])
    t = json.load(open(res))
    rows = [json.loads(l) for l in open(scores)]
    gap = max(abs(a - b) for r, q in zip(rows, t["probs"]) for a, b in zip(r["probs"], q))
    return {"forward_ours_tokens_per_s": ours, "forward_ours_dtype": dtype,
            "forward_torch_tokens_per_s": t["tokens_per_s"], "forward_ratio": ours / t["tokens_per_s"],
            "forward_max_prob_gap": gap}


def torch_weights(model_dir):
    """Random bf16 weights for the checkpoint in `model_dir` (its config.json), by transformers'
    own initialisation, on the GPU when there is one: model.safetensors, one file."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(model_dir)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size="1000GB")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()


def torch_matmul_gflops():
    """GFLOPS of one 1024^3 matmul in bf16 and in f32 on this CPU (best of three)."""
    import torch
    rates = {}
    for name, dt in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        a, b = torch.randn(1024, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
        best = float("inf")
        for _ in range(3):
            t = time.time()
            a @ b
            best = min(best, time.time() - t)
        rates[name] = 2 * 1024 ** 3 / best / 1e9
    return rates


def plan_total_gib(decision, config):
    _, _, out, _ = run_measured([decision, "train", "--config", str(config), "--plan"])
    line = next(l for l in out.splitlines() if l.strip().startswith("total"))
    return float(line.split()[-2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decision", default="target/debug/decision")
    ap.add_argument("--make-model", default="target/debug/examples/random_qwen3")
    ap.add_argument("--out", default="bench-out/scale")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--shape", default=SHAPE)
    ap.add_argument("--workloads", default="2x1024,1x2048")
    ap.add_argument("--torch-worker", action="store_true")
    ap.add_argument("--torch-forward-worker", action="store_true")
    ap.add_argument("--no-forward", action="store_true",
                    help="skip the forward comparison (`decision score` against the peer's forward pass)")
    ap.add_argument("--model")
    ap.add_argument("--states")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--result")
    ap.add_argument("--torch-dtype", choices=["auto", "bf16", "f32"], default="auto")
    ap.add_argument("--backend", choices=["cpu", "wgpu"], default="cpu", help="our side's backend")
    ap.add_argument("--ours-dtype", default="bf16",
                    help="our base's dtype; several, comma-separated, are tried in order until the backend "
                         "takes one (wgpu has no bf16 on every adapter)")
    ap.add_argument("--peer-device", choices=["cpu", "cuda"], default="cpu",
                    help="the peer's device; with cuda, peak memory is the GPU's (nvidia-smi) on both sides")
    ap.add_argument("--ours-timeout", type=float,
                    help="kill our run after this many seconds; it still counts if it logged two steps or more")
    ap.add_argument("--deadline", type=float,
                    help="a time (seconds since the epoch) at which our run is killed, as --ours-timeout")
    ap.add_argument("--skeleton",
                    help="a folder of model-TOKENS/ checkpoints without weights (random_qwen3 --no-weights): "
                         "copied, and given random bf16 weights by transformers instead of --make-model")
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    if args.torch_forward_worker:
        return torch_forward_worker(args)
    gpu = args.peer_device == "cuda"
    gflops = torch_matmul_gflops() if not gpu else {"bf16": float("nan"), "f32": float("nan")}
    if gpu and args.torch_dtype == "auto":
        args.torch_dtype = "bf16"
    if args.torch_dtype == "auto":
        args.torch_dtype = "bf16" if gflops["bf16"] * 4 >= gflops["f32"] else "f32"
    print(f"torch matmul 1024^3: bf16 {gflops['bf16']:.1f} GFLOPS, f32 {gflops['f32']:.1f} GFLOPS; "
          f"the peer runs {args.torch_dtype}", file=sys.stderr)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for w in args.workloads.split(","):
        batch, tokens = map(int, w.split("x"))
        model = out / f"model-{tokens}"
        if not (model / "model.safetensors").exists():
            if args.skeleton:
                shutil.copytree(pathlib.Path(args.skeleton) / f"model-{tokens}", model, dirs_exist_ok=True)
                t = time.time()
                torch_weights(model)
                print(f"{model}: random bf16 weights by transformers in {time.time() - t:.0f} s", file=sys.stderr)
            else:
                subprocess.run([args.make_model, "--config", args.shape, "--dtype", "bf16", "--out", str(model),
                                "--tokenizer", TOKENIZER, "--states", str(8 * batch + 2), "--tokens", str(tokens)],
                               check=True)
            lines = open(model / "states.jsonl").read().splitlines()
            (model / "train.jsonl").write_text("\n".join(lines[:-2]) + "\n")
            (model / "valid.jsonl").write_text("\n".join(lines[-2:]) + "\n")

        def peer():
            res = out / f"torch-{w}.json"
            secs, rss, _, dev_mib = run_measured([sys.executable, __file__, "--torch-worker", "--model", str(model),
                                                  "--states", str(model / "train.jsonl"), "--steps", str(args.steps),
                                                  "--batch", str(batch), "--result", str(res),
                                                  "--torch-dtype", args.torch_dtype, "--peer-device",
                                                  args.peer_device], gpu=gpu)
            t = json.load(open(res))
            return dict(torch_tokens_per_s=t["tokens_per_s"], torch_peak_rss_mib=rss, torch_wall_s=secs,
                        torch_threads=t["threads"], torch_dtype=args.torch_dtype, torch_matmul_gflops=gflops,
                        torch_device=args.peer_device, torch_peak_device_mib=dev_mib,
                        torch_max_memory_allocated_mib=t.get("max_memory_allocated_mib"),
                        device_name=t.get("device_name"))

        def ours():
            """Our run in the first dtype of --ours-dtype the backend takes. A run killed at
            --ours-timeout still counts when it logged two steps or more (the first is not timed)."""
            dtypes = args.ours_dtype.split(",")
            for dtype in dtypes:
                cfg = out / f"run-{w}.toml"
                cfg.write_text(RUN_CONFIG.format(model=model.resolve(), states=(model / "train.jsonl").resolve(),
                                                 valid=(model / "valid.jsonl").resolve(), max_tokens=tokens + 256,
                                                 targets=json.dumps(TARGETS), steps=args.steps, batch=batch,
                                                 dtype=dtype, backend=args.backend))
                run_dir = out / f"ours-{w}"
                if run_dir.exists():
                    shutil.rmtree(run_dir)
                plan = plan_total_gib(args.decision, cfg)
                timeout = args.ours_timeout
                if args.deadline:
                    timeout = min(timeout or float("inf"), max(1.0, args.deadline - time.time()))
                # On a GPU our run stops once it has logged its last step: the peer's figures are its
                # steps', with no merge of the adapters or 8 GB save after them.
                done = (lambda: len(rust_steps(run_dir)) >= args.steps) if gpu else None
                secs, rss, _, dev_mib = run_measured([args.decision, "train", "--config", str(cfg), "--out",
                                                      str(run_dir)], gpu=gpu, check=False, timeout=timeout,
                                                     done=done)
                steps = rust_steps(run_dir)
                print(f"ours ({args.backend}, {dtype}): steps at {', '.join(f'{x:.1f}' for x in steps) or 'none'} "
                      "tokens/s", file=sys.stderr)
                if secs is not None or len(steps) >= 2:
                    r = {"ours_tokens_per_s": statistics.median(steps[1:]), "ours_steps_tokens_per_s": steps,
                         "ours_peak_rss_mib": rss, "ours_wall_s": secs, "ours_plan_gib": plan,
                         "ours_dtype": ran_dtype(run_dir, dtype), "ours_backend": args.backend,
                         "ours_peak_device_mib": dev_mib,
                         "ours_runtime_reserved_mib": rust_gpu_reserved_mib(run_dir)}
                    if secs is None:
                        r["ours_note"] = f"killed after {timeout:.0f} s (its deadline), {len(steps)} steps logged"
                    return r
                print(f"ours ({args.backend}, {dtype}) failed; "
                      f"{'no dtype left' if dtype == dtypes[-1] else 'trying the next dtype'}", file=sys.stderr)
            return None

        # On a GPU lent for minutes the peer goes first: its figure comes back even when ours fails
        # or runs out the clock.
        if gpu:
            r = {"workload": w}
            r.update(peer())
            results[w] = r
            json.dump(results, open(out / "bench-scale.json", "w"), indent=1)
            o = ours()
        else:
            o = ours()
            r = {"workload": w}
        if o is None:
            r["ours_error"] = f"our side failed with every dtype of --ours-dtype {args.ours_dtype}"
            results[w] = r
            json.dump(results, open(out / "bench-scale.json", "w"), indent=1)
            sys.exit(r["ours_error"])
        r.update(o)
        if not gpu:
            r.update(peer())
        r["tokens_per_s_ratio"] = r["ours_tokens_per_s"] / r["torch_tokens_per_s"]
        r["peak_rss_ratio"] = r["ours_peak_rss_mib"] / r["torch_peak_rss_mib"]
        if gpu:
            r["peak_device_ratio"] = r["ours_peak_device_mib"] / r["torch_peak_device_mib"]
        cfg = json.load(open(model / "config.json"))
        lens = [len(ids) for ids, _, _ in encode_states(model, [json.loads(l) for l in open(model / "train.jsonl")])]
        groups = [lens[i:i + batch] for i in range(0, len(lens), batch)]
        per_token = statistics.mean(step_flops(cfg, len(g), max(g), 16) / sum(g) for g in groups)
        r["ours_gflops"] = per_token * r["ours_tokens_per_s"] / 1e9
        r["torch_gflops"] = per_token * r["torch_tokens_per_s"] / 1e9
        if not args.no_forward:
            r.update(forward_side_by_side(args, model, batch, "bf16" if args.torch_dtype == "bf16" else "f32", out))
            fwd = statistics.mean(step_flops(cfg, len(g), max(g), 16, train=False) / sum(g) for g in groups)
            r["forward_ours_gflops"] = fwd * r["forward_ours_tokens_per_s"] / 1e9
            r["forward_torch_gflops"] = fwd * r["forward_torch_tokens_per_s"] / 1e9
        results[w] = r
        json.dump(results, open(out / "bench-scale.json", "w"), indent=1)
    mem = "device" if gpu else "rss"
    print(f"peer: PyTorch {args.torch_dtype} base on {args.peer_device}"
          + ("" if gpu else f" (matmul bf16 {gflops['bf16']:.1f} / f32 {gflops['f32']:.1f} GFLOPS)")
          + f"; ours: {args.backend}; memory: peak {'GPU memory in use (nvidia-smi)' if gpu else 'RSS'}")
    print("training step; GFLOP/s: the nominal work of step_flops (dense attention) per second, the same count "
          "for both sides")
    print(f"{'micro-batch':<12} {'dtype':>5} {'ours tok/s':>10} {'torch tok/s':>11} {'ratio':>6} {'ours GF/s':>9} "
          f"{'torch GF/s':>10} {'ours MiB':>9} {'torch MiB':>10} {'ratio':>6} {'plan MiB':>9}")
    for w, r in results.items():
        ours_mib, torch_mib = r[f"ours_peak_{mem}_mib"], r[f"torch_peak_{mem}_mib"]
        print(f"{w:<12} {r['ours_dtype']:>5} {r['ours_tokens_per_s']:>10.1f} {r['torch_tokens_per_s']:>11.1f} "
              f"{r['tokens_per_s_ratio']:>6.2f} {r['ours_gflops']:>9.1f} {r['torch_gflops']:>10.1f} "
              f"{ours_mib:>9.0f} {torch_mib:>10.0f} {ours_mib / torch_mib:>6.2f} {r['ours_plan_gib'] * 1024:>9.0f}")
    for w, r in results.items():
        if r.get("ours_runtime_reserved_mib") is not None:
            print(f"{w}: ours as Burn's GPU runtime reports it, most reserved at a step: "
                  f"{r['ours_runtime_reserved_mib']:.0f} MiB (nvidia-smi adds the driver's context)")
    if any("forward_ratio" in r for r in results.values()):
        print("forward (decision score against the peer's forward pass, same token ids and batches)")
        print(f"{'micro-batch':<12} {'dtype':>5} {'ours tok/s':>10} {'torch tok/s':>11} {'ratio':>6} {'ours GF/s':>9} "
              f"{'torch GF/s':>10} {'max |dp|':>9}")
        for w, r in results.items():
            if "forward_ratio" in r:
                print(f"{w:<12} {r['forward_ours_dtype']:>5} {r['forward_ours_tokens_per_s']:>10.1f} "
                      f"{r['forward_torch_tokens_per_s']:>11.1f} {r['forward_ratio']:>6.2f} "
                      f"{r['forward_ours_gflops']:>9.1f} {r['forward_torch_gflops']:>10.1f} "
                      f"{r['forward_max_prob_gap']:>9.1e}")


if __name__ == "__main__":
    main()
