#!/usr/bin/env python3
"""`make bench-fit`: `decision fit` against one DuckDB query of the same rule and against the
pandas / pyarrow reference (scripts/fit_reference.py), on 10 M and 100 M synthetic receipts
(`decision gen receipts`, generated once into bench-out/, git-ignored), side by side in one
invocation, each tool a separate process: wall time (start to exit; the best of 3 runs at 10 M,
one run at 100 M) and peak RSS (the process's own, from wait4).

Checks that the peers agree with `decision fit`: DuckDB's judged and successful counts per point
and bucket equal thresholds.json's, the reference's statuses and thresholds equal ours.

    python scripts/bench_fit.py --decision target/debug/decision --sizes 10000000,100000000
    python scripts/bench_fit.py --sizes 100000000 --threads 1,2        # and the scaling curve at 100 M
    python scripts/bench_fit.py duckdb --receipts R.parquet --config configs/fit.toml   # the peer alone

The DuckDB query checks what the pandas reference checks (required fields, RFC 3339 `at`, the
point's name, known enum values, a confidence in [0, 1], a pick among the candidates, outcome
fields) and counts per point and confidence bucket. It does not look for repeated ids unless
`--dedup` (then each id counts once, first in file order, like `decision fit`): both are timed.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATIONS = ["accepted", "rejected-out-of-set", "rejected-stale", "rejected-expired", "rejected-unauthorized"]
BUILTIN = dict(policy="bucket", target=0.95, bound="wilson", level=0.95, min_count=30, bucket_width=0.1)


def edges_of(width):
    import math
    count = max(1, math.ceil(1.0 / width - 1e-9))
    return [round(k * width, 12) for k in range(count)]


def sql_quote(s):
    return "'" + s.replace("'", "''") + "'"


def bucket_sql(points, default_width):
    """The bucket index of `conf` for its point: the last edge at or below it."""
    def case(width):
        edges = edges_of(width)
        whens = " ".join(f"WHEN conf >= {e!r} THEN {i}" for i, e in reversed(list(enumerate(edges))) if i)
        return f"(CASE {whens} ELSE 0 END)"
    per = {name: p.get("bucket_width", default_width) for name, p in points.items()}
    special = {n: w for n, w in per.items() if w != default_width}
    if not special:
        return case(default_width)
    arms = " ".join(f"WHEN point = {sql_quote(n)} THEN {case(w)}" for n, w in special.items())
    return f"(CASE {arms} ELSE {case(default_width)} END)"


def duckdb_fit(receipts, config, dedup, threads=None):
    import duckdb
    with open(config, "rb") as f:
        raw = tomllib.load(f)
    defaults = {**BUILTIN, **raw.get("defaults", {})}
    points = {n: {**defaults, **p} for n, p in raw.get("points", {}).items()}
    outcome = raw.get("outcome", {})
    succ, fail = outcome.get("success", []), outcome.get("failure", [])
    con = duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    t0 = time.perf_counter()
    any_of = lambda pats: " OR ".join(f"regexp_matches(observed_outcome, {sql_quote(p)})" for p in pats) or "false"
    source = f"read_parquet({sql_quote(receipts)}, file_row_number = true)"
    valid = f"""
      SELECT *,
        (result_kind = 'pick') AS pick,
        confidence AS conf,
        -- a free-text outcome stands for failure / success by the configured patterns
        CASE WHEN outcome_status IS NOT NULL THEN outcome_status
             WHEN observed_outcome IS NULL THEN NULL
             WHEN {any_of(fail)} THEN 'failure'
             WHEN {any_of(succ)} THEN 'success'
             ELSE NULL END AS status
      FROM {source}
      WHERE id IS NOT NULL AND id <> '' AND "at" IS NOT NULL AND try_cast("at" AS TIMESTAMPTZ) IS NOT NULL
        AND point IS NOT NULL AND regexp_full_match(point, '[a-z][a-z0-9_]*')
        AND candidates IS NOT NULL AND NOT list_contains(list_transform(candidates, lambda x: x IS NULL), true)
        AND result_kind IN ('pick', 'abstain')
        AND validation IN ({", ".join(map(sql_quote, VALIDATIONS))})
        AND (result_kind = 'abstain' OR (result_id IS NOT NULL AND confidence IS NOT NULL
             AND NOT isnan(confidence) AND confidence BETWEEN 0 AND 1))
        AND (outcome_status IS NULL OR outcome_status IN ('success', 'failure', 'abandoned'))
        AND (outcome_status IS NOT NULL OR (outcome_duration_ms IS NULL AND outcome_retries IS NULL))
        AND coalesce(outcome_duration_ms, 0) >= 0 AND coalesce(outcome_retries, 0) BETWEEN 0 AND 4294967295
        AND (result_kind = 'abstain' OR validation = 'rejected-out-of-set' OR list_contains(candidates, result_id))
    """
    if dedup:
        # each id once, the first in file order (conflicting copies are not told apart here)
        valid = f"SELECT * FROM ({valid}) QUALIFY row_number() OVER (PARTITION BY id ORDER BY file_row_number) = 1"
    query = f"""
      WITH v AS ({valid}),
      c AS (
        SELECT point, {bucket_sql(points, defaults['bucket_width'])} AS bucket,
          pick AND validation = 'accepted' AS accepted,
          pick AND validation = 'accepted' AND NOT coalesce(fallback_used, false)
            AND (shadow_reference IS NOT NULL OR status IN ('success', 'failure')) AS judged,
          CASE WHEN shadow_reference IS NOT NULL THEN result_id = shadow_reference
               ELSE status = 'success' END AS success
        FROM v
      )
      SELECT point, bucket, count(*) AS valid, count(*) FILTER (judged) AS n,
             count(*) FILTER (judged AND success) AS s, count(*) FILTER (accepted) AS accepted
      FROM c GROUP BY point, bucket ORDER BY point, bucket
    """
    rows = con.execute(query).fetchall()
    records = con.execute(f"SELECT count(*) FROM read_parquet({sql_quote(receipts)})").fetchone()[0]
    dt = time.perf_counter() - t0
    out = {}
    for point, bucket, valid_n, n, s, acc in rows:
        p = out.setdefault(point, {"valid": 0, "buckets": {}})
        p["valid"] += valid_n
        if n or acc:
            p["buckets"][int(bucket)] = [int(n), int(s)]
    return {"seconds": dt, "records": records, "points": out}


def run_timed(cmd, stdout=None, repeat=1, env=None, warm=None):
    """Run cmd `repeat` times; return (best wall seconds, largest peak RSS bytes of the process).
    `warm`: a file read through once before each run, so that every tool starts from the page
    cache (the kernel may have dropped the file since the last run; it did on the bench VM)."""
    best, rss = None, 0
    for _ in range(repeat):
        if warm is not None:
            subprocess.run(["cat", warm], stdout=subprocess.DEVNULL, check=True)
        if stdout is not None:
            stdout.seek(0)
            stdout.truncate()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"bench-fit: {' '.join(cmd)} failed")
        best = dt if best is None else min(best, dt)
        rss = max(rss, usage.ru_maxrss * 1024)
    return best, rss


def bench(args):
    sizes = [int(s) for s in args.sizes.split(",")]
    os.makedirs(args.out, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__)]
    rows = []
    for n in sizes:
        data = os.path.join(args.out, f"receipts-{n}.parquet")
        if not os.path.exists(data):
            print(f"bench-fit: generating {n} receipts into {data} (once)", flush=True)
            subprocess.run([args.decision, "gen", "receipts", "--n", str(n), "--seed", "7", "--bad", "0.0001",
                            "--out", data], check=True)
        thr = os.path.join(args.out, f"thresholds-{n}.json")
        k = args.repeat if n <= 10_000_000 else 1
        ours = run_timed([args.decision, "fit", "--receipts", data, "--config", args.config, "--out", thr], repeat=k,
                         warm=data)
        rows.append((n, "decision fit", *ours))
        for dedup in (False, True):
            res = os.path.join(args.out, f"duckdb-{n}{'-dedup' if dedup else ''}.json")
            with open(res, "w") as f:
                t = run_timed(me + ["duckdb", "--receipts", data, "--config", args.config]
                              + (["--dedup"] if dedup else []), stdout=f, repeat=k, warm=data)
            rows.append((n, "DuckDB" + (", ids once" if dedup else ""), *t))
            check_duckdb(thr, res)
        if n <= args.pandas_max:
            res = os.path.join(args.out, f"pandas-{n}.json")
            with open(res, "w") as f:
                t = run_timed([sys.executable, os.path.join(HERE, "fit_reference.py"), "bench", "--receipts", data,
                               "--config", args.config], stdout=f, repeat=k, warm=data)
            rows.append((n, "pandas / pyarrow", *t))
            check_pandas(thr, res)
    print()
    print(f"| receipts | tool | wall s | peak RSS MB | wall / decision fit's | RSS / decision fit's |")
    print(f"| ---: | --- | ---: | ---: | ---: | ---: |")
    base = {}
    for n, tool, dt, rss in rows:
        if tool == "decision fit":
            base[n] = (dt, rss)
        b = base[n]
        print(f"| {n:,} | {tool} | {dt:.2f} | {rss / 1e6:.0f} | {dt / b[0]:.2f} | {rss / b[1]:.2f} |")
    print(f"\n{os.cpu_count()} cores; every peer agreed with decision fit's counts (checked above).")
    ours = {n: dt for n, tool, dt, _ in rows if tool == "decision fit"}
    for n, dt in ours.items():
        print(f"decision fit: {n / dt / 1e6:.2f} M receipts/s on {os.cpu_count()} cores")
    if args.threads:
        scaling(args, max(sizes), me)


def scaling(args, n, me):
    """Wall time of decision fit and of DuckDB's plain query per thread count, at size n."""
    data = os.path.join(args.out, f"receipts-{n}.parquet")
    thr = os.path.join(args.out, f"thresholds-{n}-threads.json")
    counts = sorted({int(t) for t in args.threads.split(",")})
    print(f"\n| threads | decision fit s | M receipts/s | per thread | DuckDB s | DuckDB / ours |")
    print(f"| ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in counts:
        env = dict(os.environ, RAYON_NUM_THREADS=str(t))
        ours, _ = run_timed([args.decision, "fit", "--receipts", data, "--config", args.config, "--out", thr], env=env,
                            warm=data)
        res = os.path.join(args.out, f"duckdb-{n}-threads.json")
        with open(res, "w") as f:
            theirs, _ = run_timed(me + ["duckdb", "--receipts", data, "--config", args.config, "--threads", str(t)],
                                  stdout=f, warm=data)
        check_duckdb(thr, res)
        rate = n / ours / 1e6
        print(f"| {t} | {ours:.2f} | {rate:.2f} | {rate / t:.2f} | {theirs:.2f} | {theirs / ours:.2f} |", flush=True)


def check_duckdb(thr_path, res_path):
    ours = json.load(open(thr_path))
    theirs = json.load(open(res_path))
    assert ours["source"]["duplicates"] == 0, "synthetic receipts repeat no id"
    for name, p in theirs["points"].items():
        mine = ours["points"][name]
        assert mine["records"] == p["valid"], (name, mine["records"], p["valid"])
        mine_b = [[b["n"], b["success"]] for b in mine["buckets"] if b["n"] or b["accepted"]]
        their_b = [v for _, v in sorted(p["buckets"].items(), key=lambda kv: int(kv[0]))]
        assert mine_b == their_b, (name, mine_b, their_b)


def check_pandas(thr_path, res_path):
    ours = json.load(open(thr_path))
    ref = json.load(open(res_path))
    assert ours["source"]["records"] == ref["records"] and ours["source"]["bad"] == ref["bad"], "record counts differ"
    for k, v in ref["points"].items():
        m = ours["points"][k]
        assert (m["status"], m["threshold"], m["judged"]) == (v["status"], v["threshold"], v["judged"]), k


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "duckdb":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("--receipts", required=True)
        ap.add_argument("--config", required=True)
        ap.add_argument("--dedup", action="store_true")
        ap.add_argument("--threads", type=int)
        a = ap.parse_args()
        print(json.dumps(duckdb_fit(a.receipts, a.config, a.dedup, a.threads)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decision", default="target/debug/decision")
    ap.add_argument("--config", default="configs/fit.toml")
    ap.add_argument("--sizes", default="10000000,100000000")
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per tool at 10 M receipts or fewer, the best wall time kept (one above)")
    ap.add_argument("--threads", default="",
                    help="thread counts (e.g. 1,2,4) to time decision fit and DuckDB with at the largest size, "
                         "one run each: the scaling curve")
    ap.add_argument("--pandas-max", type=int, default=10_000_000,
                    help="largest size the pandas reference runs at (it holds the whole table in memory)")
    bench(ap.parse_args())


if __name__ == "__main__":
    main()
