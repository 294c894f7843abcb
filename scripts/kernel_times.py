#!/usr/bin/env python3
"""Where a GPU run's kernel time goes, from cubecl's profiling log (issue 30).

cubecl writes a line per kernel launch, `| 1.758685ms | NAME | ...`, when the run starts in a
folder whose cubecl.toml has `[profiling.logger] level = "basic"` and a `file` (scripts/gpu-check.sh
writes one for its profiled run). This sums those times by kernel kind (the name without its hash;
matmuls by their family, e.g. `MatmulEntry SimpleMatmulFamily`) and prints a table, most time first:
launches, total ms, share, mean µs. With --steps N it also divides launches and time by N, for a
run of N training steps whose other work (load, evaluation) is small beside them.

    python3 scripts/kernel_times.py PROFILE_LOG [--steps N] [--top K]

Standard library only; the log may be cut short (a killed run): partial lines are skipped.
"""
import argparse
import collections
import re
import sys

UNITS = {"s": 1e3, "ms": 1.0, "µs": 1e-3, "us": 1e-3, "ns": 1e-6}
DURATION = re.compile(r"^([0-9.]+)(s|ms|µs|us|ns)$")
HASH = re.compile(r"_[0-9a-f]{8}$")


def kind(fields):
    """The kernel's kind: its first name without the hash, and a matmul's family."""
    name = HASH.sub("", fields[0])
    family = next((f for f in fields[1:] if f.endswith("MatmulFamily")), None)
    return f"{name} {family}" if family else name


def read(lines):
    """(kind, ms) for each measured launch; the count of launches without a measurement."""
    times, unmeasured = [], 0
    for line in lines:
        if not line.startswith("|"):
            continue
        fields = [f.strip() for f in line.strip().strip("|").split("|")]
        if len(fields) < 2:
            continue
        m = DURATION.match(fields[0])
        if m is None:
            unmeasured += fields[0] == "not measured"
            continue
        times.append((kind(fields[1:]), float(m.group(1)) * UNITS[m.group(2)]))
    return times, unmeasured


def table(times, steps=None, top=25):
    by = collections.defaultdict(lambda: [0, 0.0])
    for k, ms in times:
        by[k][0] += 1
        by[k][1] += ms
    total = sum(ms for _, ms in times) or 1.0
    per = f"  {'per step: launches':>19} {'ms':>9}" if steps else ""
    out = [f"{'kernel kind':<48} {'launches':>9} {'ms':>10} {'share':>6} {'mean µs':>9}{per}"]
    rows = sorted(by.items(), key=lambda kv: -kv[1][1])
    for k, (n, ms) in rows[:top]:
        extra = f"  {n / steps:>19.1f} {ms / steps:>9.2f}" if steps else ""
        out.append(f"{k[:48]:<48} {n:>9} {ms:>10.2f} {ms / total:>6.1%} {1000 * ms / n:>9.1f}{extra}")
    if len(rows) > top:
        n = sum(v[0] for _, v in rows[top:])
        ms = sum(v[1] for _, v in rows[top:])
        out.append(f"{f'({len(rows) - top} other kinds)':<48} {n:>9} {ms:>10.2f} {ms / total:>6.1%}")
    n = len(times)
    extra = f"  {n / steps:>19.1f} {total / steps:>9.2f}" if steps else ""
    out.append(f"{'all':<48} {n:>9} {total:>10.2f} {1:>6.0%} {1000 * total / max(n, 1):>9.1f}{extra}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--steps", type=int, help="divide by this many training steps")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with open(args.log, encoding="utf-8", errors="replace") as f:
        times, unmeasured = read(f)
    if not times:
        sys.exit(f"{args.log}: no timed kernel launches (is [profiling.logger] level = \"basic\"?)")
    print(table(times, args.steps, args.top))
    if unmeasured:
        print(f"{unmeasured} launches not measured by the runtime (left out)")


if __name__ == "__main__":
    main()
