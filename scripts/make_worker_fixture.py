#!/usr/bin/env python3
"""Make tests/fixtures/worker: a bundle exported from the tiny test model, keel requests, and
`decision score`'s answers for the same states (what decision-worker's integration test holds
the worker to).

    cargo build -p decision && python3 scripts/make_worker_fixture.py [--decision target/debug/decision]

Steps: copy tests/fixtures/export/tiny with a decision.json (16 options, 128 tokens, per-point
temperatures); generate 100 requests in keel's shape (1-16 candidates, keel's preStep focus
set for some, a few too long for the model) and the decision states they render as; score the
states with `decision score --emit-tokens`; put each point's threshold at the median of its
picks' probabilities, so about half escalate; export the bundle with those thresholds.
"""

import argparse
import json
import random
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/worker"
FOCUS = ["inspect", "implement", "verify", "answer"]
FOCUS_TEXT = {
    "inspect": "Read the relevant files before changing anything",
    "implement": "Make the change the task asks for",
    "verify": "Run the tests and check the result",
    "answer": "Reply to the user without further tools",
}
WORDS = ("the user asks to cancel order refund lookup_order agent called search_docs and got "
         "results a for tool route stop build failing test module config").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def point_of(ids):
    return "pre_step" if sorted(ids) == sorted(FOCUS) else "intake"


def requests(rng):
    out = []
    for i in range(100):
        if i % 4 == 0:
            ids = FOCUS[:]
            rng.shuffle(ids)
            cands = [[c, FOCUS_TEXT[c]] for c in ids]
            context = f"Coding turn {i}, step {i % 7}. Tools: read, edit, test. Choose focus only."
        else:
            k = 1 if i % 25 == 1 else rng.randint(2, 16)
            ids = rng.sample(range(1000), k)
            cands = [[f"route_{n}", f"0G: model {words(rng, rng.randint(1, 2))}"] for n in ids]
            context = f"Choose a 0G model. Sandbox on; {i % 3} attachments. Host enforces permissions."
        task = words(rng, rng.randint(2, 8))
        if i % 20 == 7:
            task = words(rng, 150)  # longer than the model's 128 tokens: capacity
        state = f"task: {task}\ncontext: {context}"
        out.append({"state": state, "criteria": cands + [["escalate", "None of these steps helps the task"]]})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decision", default=str(ROOT / "target/debug/decision"))
    args = ap.parse_args()
    rng = random.Random(16)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "model"
        shutil.copytree(ROOT / "tests/fixtures/export/tiny", model)
        labels = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
        spec = {
            "schema": "decision-config/1",
            "template": {
                "text": "Decision: {point}\nContext:\n{context}\nOptions:\n{options}\nAnswer:\n",
                "option": "{label}. {text}",
                "option_separator": "\n",
            },
            "labels": labels,
            "max_options": 16,
            "max_tokens": 128,
            "temperature": 1.3,
            "temperatures": {"pre_step": 0.8, "intake": 1.6},
            "points": ["intake", "pre_step"],
        }
        (model / "decision.json").write_text(json.dumps(spec, indent=2))
        reqs = requests(rng)
        states = []
        for i, r in enumerate(reqs):
            cands = [c for c in r["criteria"] if c[0] != "escalate"]
            if len(cands) < 2:
                continue
            states.append({
                "id": f"r{i}", "task_id": f"t{i}", "point": point_of([c[0] for c in cands]),
                "context": r["state"], "candidates": [{"id": c[0], "label": c[1]} for c in cands],
            })
        states_path = tmp / "states.jsonl"
        states_path.write_text("".join(json.dumps(s) + "\n" for s in states))
        scores_path = tmp / "expected.jsonl"
        subprocess.run([args.decision, "score", "--model", str(model), "--data", str(states_path),
                        "--emit-tokens", "--out", str(scores_path)], check=True)
        scores = [json.loads(l) for l in scores_path.read_text().splitlines()]
        by_point = {}
        for s, sc in zip(states, scores):
            if not sc["truncated"]:
                by_point.setdefault(s["point"], []).append(sc["confidence"])
        thresholds = {
            "schema": "decision-thresholds/1",
            "fitted_at": "2026-12-01T00:00:00Z",
            "source": {"files": ["tests/fixtures/worker (median of the picks)"], "sha256": "0",
                       "records": len(scores), "bad": 0, "quarantine": None},
            "points": {
                p: {"status": "fitted", "threshold": round(statistics.median(v), 4), "judged": len(v)}
                for p, v in sorted(by_point.items())
            },
        }
        th_path = tmp / "thresholds.json"
        th_path.write_text(json.dumps(thresholds, indent=2))
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run([args.decision, "export", "--model", str(model), "--thresholds", str(th_path),
                        "--formats", "onnx", "--out", str(OUT / "bundle"), "--force"], check=True)
        (OUT / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
        lines = []
        for s, sc in zip(states, scores):
            lines.append(json.dumps({"request": int(s["id"][1:]), "point": s["point"],
                                     "probs": sc["probs"], "pick": sc["pick"],
                                     "confidence": sc["confidence"],
                                     "truncated": sc["truncated"]}) + "\n")
        (OUT / "expected.jsonl").write_text("".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
