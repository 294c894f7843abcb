#!/usr/bin/env python3
"""Reference implementation of `decision fit` (issue 5) with pandas / pyarrow / statsmodels / scipy.

Never used at run time. Two jobs:

* cross-check: compute, for a receipts Parquet file and one or more fit configs, every number the
  Rust fitter reports per point (buckets, Wilson lower bounds, Clopper-Pearson upper bounds of the
  risk rule, ECE, the three policies' thresholds, coverage, rates) and a grid of bounds, and store
  them as JSON under tests/fixtures/fit/ for the Rust tests to compare against;
* bench: the same rule on a large file, timed, as the peer of `decision fit` in `make bench`.

Written from the rules in the issue, independently of the Rust code.

    python scripts/fit_reference.py fixtures --receipts tests/fixtures/fit/receipts.parquet \
        --config tests/fixtures/fit/bucket.toml --config tests/fixtures/fit/risk.toml \
        --out tests/fixtures/fit/reference.json --bounds-out tests/fixtures/fit/bounds.json
    python scripts/fit_reference.py bench --receipts bench-out/receipts.parquet --config configs/fit.toml
"""

import argparse
import json
import math
import re
import sys
import time
import tomllib

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

VALIDATIONS = ["accepted", "rejected-out-of-set", "rejected-stale", "rejected-expired", "rejected-unauthorized",
               "rejected-gate"]
REJECT_KEYS = {"rejected-out-of-set": "out-of-set", "rejected-stale": "stale",
               "rejected-expired": "expired", "rejected-unauthorized": "unauthorized", "rejected-gate": "gate"}
OUTCOMES = ["success", "failure", "abandoned"]
BUILTIN = dict(policy="bucket", target=0.95, bound="wilson", level=0.95, min_count=30, bucket_width=0.1)


# ----------------------------------------------------------------------------- config

def load_config(path):
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    defaults = {**BUILTIN, **raw.get("defaults", {})}
    points = {name: {**defaults, **p} for name, p in raw.get("points", {}).items()}
    outcome = raw.get("outcome", {})
    return defaults, points, outcome.get("success", []), outcome.get("failure", [])


def target_of(p):
    if p["policy"] == "cost":
        return p["llm_accuracy"] - p["saved_price"] / p["cost_wrong"]
    return p["target"]


# ----------------------------------------------------------------------------- bounds

def wilson(s, n, level):
    lo, hi = proportion_confint(s, n, alpha=1 - level, method="wilson")
    return float(lo), float(hi)


def cp_upper(e, n, level):
    return 1.0 if e == n else float(stats.beta.ppf(level, e + 1, n - e))


def edges_of(width):
    count = max(1, math.ceil(1.0 / width - 1e-9))
    return np.round(np.arange(count) * width, 12)


# ----------------------------------------------------------------------------- reading

COLUMNS = ["id", "at", "point", "model", "candidates", "result_kind", "result_id", "confidence", "validation",
           "fallback_used", "fallback_reason", "outcome_status", "outcome_duration_ms", "outcome_retries", "shadow_reference",
           "observed_outcome"]


def read_receipts(path, success_patterns, failure_patterns):
    """Validate every row as the contract says; return (valid DataFrame, number of rows, bad rows)."""
    t = pq.read_table(path, columns=COLUMNS)
    n = t.num_rows
    col = lambda name: t.column(name).combine_chunks()
    kind = col("result_kind")
    pick = pc.fill_null(pc.equal(kind, "pick"), False).to_numpy(zero_copy_only=False)
    abstain = pc.fill_null(pc.equal(kind, "abstain"), False).to_numpy(zero_copy_only=False)
    conf = pc.fill_null(col("confidence"), np.nan).to_numpy(zero_copy_only=False).astype(np.float64)
    validation = col("validation")
    vcode = np.full(n, -1, dtype=np.int8)
    for i, v in enumerate(VALIDATIONS):
        vcode[pc.fill_null(pc.equal(validation, v), False).to_numpy(zero_copy_only=False)] = i
    rid = col("result_id")
    cands = col("candidates")

    bad = np.zeros(n, dtype=bool)
    for name in ["id", "at", "point", "candidates", "result_kind", "validation"]:
        bad |= col(name).is_null().to_numpy(zero_copy_only=False)
    bad |= pc.fill_null(pc.equal(col("id"), ""), False).to_numpy(zero_copy_only=False)
    at = pd.to_datetime(pd.Series(col("at").to_pandas()), format="ISO8601", utc=True, errors="coerce")
    bad |= at.isna().to_numpy()
    bad |= ~pc.fill_null(pc.match_substring_regex(col("point"), "^[a-z][a-z0-9_]*$"), False).to_numpy(
        zero_copy_only=False)
    bad |= ~(pick | abstain)
    bad |= vcode < 0
    bad |= pick & (rid.is_null().to_numpy(zero_copy_only=False) | ~np.isfinite(conf) | (conf < 0) | (conf > 1))
    status = col("outcome_status")
    scode = np.full(n, -1, dtype=np.int8)
    for i, s in enumerate(OUTCOMES):
        scode[pc.fill_null(pc.equal(status, s), False).to_numpy(zero_copy_only=False)] = i
    status_null = status.is_null().to_numpy(zero_copy_only=False)
    bad |= ~status_null & (scode < 0)
    bad |= status_null & ~(col("outcome_duration_ms").is_null().to_numpy(zero_copy_only=False)
                           & col("outcome_retries").is_null().to_numpy(zero_copy_only=False))
    # a pick must be among the candidates unless the host rejected it as out of set
    parents = pc.list_parent_indices(cands).to_numpy()
    flat = pc.list_flatten(cands)
    same = pc.fill_null(pc.equal(flat, pc.take(rid, pa.array(parents))), False).to_numpy(zero_copy_only=False)
    offered = np.zeros(n, dtype=bool)
    offered[parents[same]] = True
    bad |= pick & ~offered & (vcode != 1)
    bad[parents[pc.is_null(flat).to_numpy(zero_copy_only=False)]] = True

    observed = col("observed_outcome")
    unknown_text = ~observed.is_null().to_numpy(zero_copy_only=False) & status_null
    if unknown_text.any():
        texts = observed.to_pandas()
        fail = np.zeros(n, dtype=bool)
        succ = np.zeros(n, dtype=bool)
        for p in failure_patterns:
            fail |= texts.str.contains(p, regex=True, na=False).to_numpy()
        for p in success_patterns:
            succ |= texts.str.contains(p, regex=True, na=False).to_numpy()
        mapped = np.where(fail, 1, np.where(succ, 0, -1))
        scode = np.where(unknown_text & (mapped >= 0), mapped, scode)
        unknown_text &= mapped < 0

    shadow = col("shadow_reference")
    has_shadow = ~shadow.is_null().to_numpy(zero_copy_only=False)
    shadow_hit = pc.fill_null(pc.equal(rid, shadow), False).to_numpy(zero_copy_only=False)
    fallback = pc.fill_null(col("fallback_used"), False).to_numpy(zero_copy_only=False)
    # the host's own route recorded as a pick (keel-integration.md, "Quirks"): keel's `backend: host`
    # (its constant 0.75), or a fallback saying the selector abstained (a reason counts only where
    # `fallback_used` is set: without it there is no fallback)
    by_host_model = pc.fill_null(pc.equal(col("model"), "host"), False).to_numpy(zero_copy_only=False)
    reasons = pd.Series(col("fallback_reason").to_pandas(), dtype=object)
    said = reasons.map(lambda r: isinstance(r, str)
                       and r.lstrip().replace("_", " ")[:18].lower() == "selector abstained").to_numpy(dtype=bool)
    has_fallback = ~col("fallback_used").is_null().to_numpy(zero_copy_only=False)
    host = pick & (by_host_model | (has_fallback & said))

    keep = ~bad
    df = pd.DataFrame({
        "point": col("point").to_pandas()[keep].reset_index(drop=True),
        "pick": pick[keep], "conf": conf[keep], "vcode": vcode[keep], "fallback": fallback[keep],
        "has_shadow": has_shadow[keep], "shadow_hit": shadow_hit[keep], "scode": scode[keep],
        "unknown": unknown_text[keep], "host": host[keep],
    })
    return df, n, int(bad.sum())


def categorise(df):
    """Each valid record in exactly one category (abstain, rejected, fallback, judged, abandoned,
    unknown, pending), and the success of the judged ones."""
    # the host's routes are fallbacks whatever their validation, and no accepted pick of the selector
    accepted_pick = df["pick"] & ~df["host"] & (df["vcode"] == 0)
    judged_src = df["has_shadow"] | (df["scode"] == 0) | (df["scode"] == 1)
    cat = np.select(
        [~df["pick"], df["host"], df["vcode"] != 0, df["fallback"], judged_src, df["scode"] == 2, df["unknown"]],
        ["abstain", "fallback", "rejected", "fallback", "judged", "abandoned", "unknown"], default="pending")
    success = np.where(df["has_shadow"], df["shadow_hit"], df["scode"] == 0)
    df = df.assign(cat=cat, success=(cat == "judged") & success, accepted=accepted_pick)
    return df


# ----------------------------------------------------------------------------- the rules

def fit_point(g, p):
    edges = edges_of(p["bucket_width"])
    nb = len(edges)
    target = target_of(p)
    level = p["level"]
    valid = len(g)
    counts = g["cat"].value_counts().to_dict() if valid else {}
    rej = g.loc[g["cat"] == "rejected", "vcode"].value_counts().to_dict() if valid else {}
    bucket = np.clip(np.searchsorted(edges, g["conf"].fillna(0).to_numpy(), side="right") - 1, 0, nb - 1)
    judged = (g["cat"] == "judged").to_numpy()
    acc = g["accepted"].to_numpy()
    n = np.bincount(bucket[judged], minlength=nb)
    s = np.bincount(bucket[judged], weights=g["success"].to_numpy()[judged], minlength=nb).astype(np.int64)
    csum = np.bincount(bucket[judged], weights=g["conf"].to_numpy()[judged], minlength=nb)
    accepted = np.bincount(bucket[acc], minlength=nb)

    def lower(si, ni):
        if ni == 0:
            return None
        return wilson(si, ni, level)[0] if p["bound"] == "wilson" else si / ni

    risk_tests = []
    if p["policy"] in ("bucket", "cost"):
        counted, lowest = False, None
        for i in range(nb - 1, -1, -1):
            if n[i] < p["min_count"]:
                continue
            counted = True
            if lower(int(s[i]), int(n[i])) >= target:
                lowest = i
            else:
                break
        status = "insufficient-data" if not counted else ("no-acceptable-bucket" if lowest is None else "fitted")
    else:
        tested, lowest = False, None
        cn, cs = 0, 0
        for i in range(nb - 1, -1, -1):
            cn += int(n[i])
            cs += int(s[i])
            if cn < p["min_count"]:
                continue
            tested = True
            up = cp_upper(cn - cs, cn, level)
            risk_tests.append({"threshold": float(edges[i]), "n": cn, "errors": cn - cs, "upper": up})
            if up <= 1 - target:
                lowest = i
            else:
                break
        status = "insufficient-data" if not tested else ("no-acceptable-bucket" if lowest is None else "fitted")

    threshold = None if lowest is None else float(edges[lowest])
    coverage, sa, sal = 0.0, None, None
    if lowest is not None:
        coverage = float(accepted[lowest:].sum() / valid) if valid else 0.0
        na, sa_ = int(n[lowest:].sum()), int(s[lowest:].sum())
        if na:
            sa = sa_ / na
            sal = wilson(sa_, na, level)[0]
    nj = int(n.sum())
    ece = float(sum((n[i] / nj) * abs(s[i] / n[i] - csum[i] / n[i]) for i in range(nb) if n[i])) if nj else None
    ratio = lambda k: (k / valid) if valid else 0.0
    buckets = []
    for i in range(nb):
        if n[i] == 0 and accepted[i] == 0:
            continue
        hi = float(edges[i + 1]) if i + 1 < nb else 1.0
        buckets.append({
            "lo": float(edges[i]), "hi": hi, "n": int(n[i]), "success": int(s[i]),
            "rate": (s[i] / n[i]) if n[i] else None, "lower": lower(int(s[i]), int(n[i])),
            "mean_confidence": (csum[i] / n[i]) if n[i] else None, "accepted": int(accepted[i]),
        })
    return {
        "status": status, "threshold": threshold, "target": target, "judged": nj, "records": valid,
        "coverage": coverage, "success_above": sa, "success_above_lower": sal,
        "rates": {
            "abstain": ratio(counts.get("abstain", 0)), "rejected": ratio(counts.get("rejected", 0)),
            "rejected_by": {REJECT_KEYS[v]: ratio(rej.get(i, 0)) for i, v in enumerate(VALIDATIONS) if i},
            "fallback": ratio(counts.get("fallback", 0)), "pending": ratio(counts.get("pending", 0)),
            "abandoned": ratio(counts.get("abandoned", 0)), "unknown": ratio(counts.get("unknown", 0)),
        },
        "ece": ece, "buckets": buckets, "risk_tests": risk_tests,
    }


def fit(path, config_path):
    defaults, points, succ, fail = load_config(config_path)
    df, records, bad = read_receipts(path, succ, fail)
    df = categorise(df)
    out = {}
    names = sorted(set(df["point"].unique()) | set(points))
    groups = dict(tuple(df.groupby("point", sort=True))) if len(df) else {}
    for name in names:
        g = groups.get(name, df.iloc[0:0])
        out[name] = fit_point(g, points.get(name, defaults))
    return {"records": records, "bad": bad, "valid": records - bad, "points": out}


def bounds_grid():
    rows = []
    cases = [(0, 1), (1, 1), (0, 30), (30, 30), (29, 30), (1, 2), (7, 10), (950, 1000), (999, 1000),
             (1000, 1000), (12345, 13000), (5, 100000), (99990, 100000), (499_000, 1_000_000),
             (999_999, 1_000_000), (3, 7), (64, 65), (400, 401)]
    for level in (0.9, 0.95, 0.99):
        for s, n in cases:
            lo, hi = wilson(s, n, level)
            rows.append({"s": s, "n": n, "level": level, "wilson_lower": lo, "wilson_upper": hi,
                         "cp_upper_errors": cp_upper(n - s, n, level)})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixtures")
    fx.add_argument("--receipts", required=True)
    fx.add_argument("--config", action="append", required=True)
    fx.add_argument("--out", required=True)
    fx.add_argument("--bounds-out", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--receipts", required=True)
    b.add_argument("--config", required=True)
    args = ap.parse_args()

    if args.cmd == "fixtures":
        ref = {"receipts": args.receipts, "configs": {}}
        for c in args.config:
            name = re.sub(r"\.toml$", "", c.split("/")[-1])
            ref["configs"][name] = fit(args.receipts, c)
        with open(args.out, "w") as f:
            json.dump(ref, f, indent=1, sort_keys=True)
            f.write("\n")
        with open(args.bounds_out, "w") as f:
            json.dump(bounds_grid(), f, indent=1)
            f.write("\n")
    else:
        t0 = time.perf_counter()
        res = fit(args.receipts, args.config)
        dt = time.perf_counter() - t0
        summary = {name: {"status": p["status"], "threshold": p["threshold"], "judged": p["judged"]}
                   for name, p in res["points"].items()}
        print(json.dumps({"seconds": dt, "records": res["records"], "bad": res["bad"], "points": summary}))


if __name__ == "__main__":
    sys.exit(main())
