#!/usr/bin/env python3
"""decision-worker latency through the real process over pipes, as keel drives it.

    python3 scripts/bench_worker.py --worker target/release/decision-worker BUNDLE [BUNDLE ...] \
        [--decisions 200] [--requests tests/fixtures/worker/requests.jsonl]

Per bundle: start-up (spawn to the ready line), then N decisions one at a time (keel sends one
request at a time and waits), p50 / p95 / max per decision, measured from writing the request
line to reading its reply line; and, from the worker's own receipts (DECISION_WORKER_LOG), the
p50 prompt length and how the time splits between rendering + tokenizing the prompt and the
model. Requests are keel-shaped: keel's preStep focus set and intake route lists of 2-8
candidates (the fixture's requests when given, cycled). A bundle written `BUNDLE@T` gets its
contexts padded to about T prompt tokens (English, Chinese and emoji text, sized from the
worker's receipts of two probe requests). Prints one table with the published Laya figures and
keel's limits beside it.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "KEEL_LAYA_JSON:"


def read_message(stdout):
    for _ in range(8):
        line = stdout.readline()
        if not line:
            raise RuntimeError("worker closed its stdout")
        line = line.decode().rstrip("\n")
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    raise RuntimeError("no framed message within 8 lines")


def requests(path, n):
    if path:
        base = [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
    else:
        rng = random.Random(3)
        base = []
        for i in range(50):
            if i % 2 == 0:
                focus = ["inspect", "implement", "verify", "answer"]
                rng.shuffle(focus)
                crit = [[f, f"Focus on {f}"] for f in focus]
                ctx = f"Coding turn {i}, step 2. Tools: read, edit, test. Choose focus only."
            else:
                crit = [[f"route_{j}", f"0G: model {j}"] for j in range(rng.randint(2, 8))]
                ctx = "Choose a 0G model. Sandbox on; 0 attachments. Host enforces permissions."
            base.append({"state": f"task: fix the failing build\ncontext: {ctx}",
                         "criteria": crit + [["escalate", "None of these steps helps the task"]]})
    return [base[i % len(base)] for i in range(n)]


PAD = "Order ord_117 left the Leeds warehouse on Monday; 客户在等 📦. "


def receipts(log_dir):
    out = []
    for f in sorted(Path(log_dir).glob("receipts-*.jsonl")):
        out += [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    return out


def padded(r, repeats):
    r = dict(r)
    task, _, ctx = r["state"].partition("\ncontext: ")
    r["state"] = f"{task}\ncontext: {PAD * repeats}{ctx}"
    return r


def bench(worker, bundle, reqs, tokens=None):
    log_dir = tempfile.mkdtemp(prefix="bench-worker-")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               DECISION_WORKER_LOG=log_dir)
    t0 = time.perf_counter()
    p = subprocess.Popen([worker, "--model", bundle], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env)
    ready = read_message(p.stdout)
    startup = time.perf_counter() - t0
    if ready != {"ready": True, "model": "laya-coreml"}:
        raise RuntimeError(f"{bundle}: {ready}")

    def ask(r):
        p.stdin.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
        p.stdin.flush()
        return read_message(p.stdout)

    if tokens:
        # Two probes give the prompt tokens of the request and of one padding sentence.
        base = reqs[0]
        for k in (0, 10):
            ask(padded(base, k))
        seen = [r["worker"]["prompt_tokens"] for r in receipts(log_dir)[-2:]]
        per = (seen[1] - seen[0]) / 10
        reqs = [padded(r, max(0, int((tokens - seen[0] - 40) / per))) for r in reqs]
    skip = len(receipts(log_dir))
    times, kinds = [], {}
    for r in reqs:
        t = time.perf_counter()
        reply = ask(r)
        times.append(time.perf_counter() - t)
        k = reply.get("error") or ("escalate" if reply.get("choice") == "escalate" else "pick")
        kinds[k] = kinds.get(k, 0) + 1
    p.stdin.close()
    code = p.wait()
    scored = [r["worker"] for r in receipts(log_dir)[skip:] if "model_ms" in r["worker"]]
    med = lambda key: statistics.median(w[key] for w in scored) if scored else float("nan")
    times_ms = sorted(x * 1000 for x in times)
    q = statistics.quantiles(times_ms, n=100)
    return {"bundle": bundle + (f"@{tokens}" if tokens else ""), "startup_s": startup,
            "n": len(times_ms), "p50_ms": q[49], "p95_ms": q[94], "max_ms": times_ms[-1],
            "tokens_p50": med("prompt_tokens"), "encode_p50_ms": med("encode_ms"),
            "model_p50_ms": med("model_ms"), "replies": kinds, "exit": code}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--worker", default="target/release/decision-worker")
    ap.add_argument("--decisions", type=int, default=200)
    ap.add_argument("--requests", default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    rows = []
    for b in args.bundles:
        n, tokens = args.decisions, None
        if "@" in b and not os.path.exists(b):
            b, tokens = b.rsplit("@", 1)
            tokens = int(tokens)
        if ":" in b and not os.path.exists(b):
            b, n = b.rsplit(":", 1)
            n = int(n)
        rows.append(bench(args.worker, b, requests(args.requests, n), tokens))
    print(f"decision-worker on {os.cpu_count()} cores, one request at a time over pipes; "
          "tokens, tokenize and model: p50 from the worker's receipts")
    print(f"{'bundle':<40} {'start-up':>9} {'n':>5} {'tokens':>7} {'tokenize':>9} {'model':>9} "
          f"{'p50':>9} {'p95':>9} {'max':>9}  replies")
    for r in rows:
        print(f"{r['bundle']:<40} {r['startup_s']:>8.2f}s {r['n']:>5} {r['tokens_p50']:>7.0f} "
              f"{r['encode_p50_ms']:>7.2f}ms {r['model_p50_ms']:>7.1f}ms {r['p50_ms']:>7.1f}ms "
              f"{r['p95_ms']:>7.1f}ms {r['max_ms']:>7.1f}ms  {r['replies']}")
    print("Laya (published): 32.8 ms per decision on a T4 GPU, 193-464 ms on CPU; "
          "keel's limits: 120 s to the ready line, 25 s per decision")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
