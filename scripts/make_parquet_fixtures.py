#!/usr/bin/env python3
"""Parquet fixtures in every codec pyarrow writes, for the readers' codec tests (issue 19).

Writes, into tests/fixtures/data/codecs/, a small decision-states file and a small receipts file
(contracts sections 1 and 3, the flattened receipt columns) per codec: uncompressed, snappy (the
pandas / pyarrow default), gzip, brotli, lz4 (pyarrow writes the LZ4_RAW codec for it), zstd,
and lz4_raw when pyarrow tells it apart from lz4. The states files use data page v1, the
receipts files data page v2, and both hold three rows per row group, so every file has several
row groups and compressed pages. `expected.json` holds the rows (as pyarrow reads them back from
every file) and, per file, the codec its column chunks declare and its row groups; the Rust tests
(data/tests/parquet_codecs.rs) read every file and compare.

LZO, the one other codec the format defines, has no writer here (Arrow C++ does not implement
it) and no reader in parquet-rs.

    python3 -m venv /tmp/pqvenv && /tmp/pqvenv/bin/pip install -r scripts/requirements-parquet.txt
    /tmp/pqvenv/bin/python scripts/make_parquet_fixtures.py
"""

import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "data" / "codecs"

CANDIDATE = pa.struct([pa.field("id", pa.string(), nullable=False),
                       pa.field("label", pa.string(), nullable=False)])
STATES_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("point", pa.string(), nullable=False),
    pa.field("context", pa.string(), nullable=False),
    pa.field("candidates", pa.list_(pa.field("item", CANDIDATE, nullable=False)), nullable=False),
    pa.field("answer", pa.string()),
    pa.field("teacher", pa.list_(pa.field("item", pa.float64(), nullable=False))),
    pa.field("after_error", pa.bool_(), nullable=False),
    pa.field("rules", pa.string()),
    pa.field("split", pa.string()),
])

RECEIPTS_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("at", pa.string(), nullable=False),
    pa.field("point", pa.string(), nullable=False),
    pa.field("model", pa.string()),
    pa.field("candidates", pa.list_(pa.string()), nullable=False),
    pa.field("result_kind", pa.string(), nullable=False),
    pa.field("result_id", pa.string()),
    pa.field("confidence", pa.float64()),
    pa.field("validation", pa.string(), nullable=False),
    pa.field("fallback_used", pa.bool_()),
    pa.field("fallback_to", pa.string()),
    pa.field("fallback_reason", pa.string()),
    pa.field("outcome_status", pa.string()),
    pa.field("outcome_duration_ms", pa.int64()),
    pa.field("outcome_retries", pa.int64()),
    pa.field("shadow_reference", pa.string()),
    pa.field("observed_outcome", pa.string()),
])


def cands(*pairs):
    return [{"id": i, "label": l} for i, l in pairs]


# Varied on purpose: unicode, long text (so compression has something to do), nulls in every
# nullable column, teacher vectors, both booleans, every split.
LONG = "Customer: my order #4417 never arrived. " * 12
STATES = [
    dict(id="s1", task_id="t1", point="tool", context="user asks to cancel order 17",
         candidates=cands(("lookup_order", "look up the order"), ("cancel_order", "cancel it")),
         answer="cancel_order", teacher=[0.25, 0.75], after_error=False, rules="v1", split="train"),
    dict(id="s2", task_id="t1", point="args", context=LONG,
         candidates=cands(("a", "order 17"), ("b", "order 71"), ("c", "both")),
         answer="a", teacher=None, after_error=True, rules="v1", split="train"),
    dict(id="s3", task_id="t2", point="stop", context="résumé: tâche terminée ✓ — 完了",
         candidates=cands(("stop", "stop"), ("go_on", "go on")),
         answer=None, teacher=None, after_error=False, rules=None, split="valid"),
    dict(id="s4", task_id="t3", point="route", context="",
         candidates=cands(("x", "X"), ("y", "Y"), ("z", "Z"), ("w", "W")),
         answer="w", teacher=[0.1, 0.2, 0.0, 0.7], after_error=False, rules="2026-11-cancel",
         split="test"),
    dict(id="s5", task_id="t4", point="focus", context=LONG[::-1],
         candidates=cands(("p", "left pane"), ("q", "right pane")),
         answer="q", teacher=[0.5, 0.5], after_error=True, rules=None, split=None),
    dict(id="s6", task_id="t4", point="tool", context="tool results: 3 rows",
         candidates=cands(("grep", "search"), ("read", "read the file")),
         answer="read", teacher=None, after_error=False, rules="v2", split=None),
    dict(id="s7", task_id="t5", point="args", context="x" * 300,
         candidates=cands(("one", "1"), ("two", "2")),
         answer="two", teacher=[0.125, 0.875], after_error=False, rules="v2", split="train"),
]

NONE = dict(model=None, result_id=None, confidence=None, fallback_used=None, fallback_to=None,
            fallback_reason=None, outcome_status=None, outcome_duration_ms=None,
            outcome_retries=None, shadow_reference=None, observed_outcome=None)


def receipt(**kw):
    return {**NONE, **kw}


RECEIPTS = [
    receipt(id="r1", at="2026-11-30T12:00:00Z", point="tool", model="tiny-v1",
            candidates=["lookup_order", "cancel_order"], result_kind="pick",
            result_id="cancel_order", confidence=0.8765432109876543, validation="accepted",
            outcome_status="success", outcome_duration_ms=1200, outcome_retries=0),
    receipt(id="r2", at="2026-11-30T12:00:01.250Z", point="args", candidates=["a", "b", "c"],
            result_kind="abstain", validation="accepted"),
    receipt(id="r3", at="2026-11-30T13:00:00+01:00", point="tool", model="tiny-v1",
            candidates=["a", "b"], result_kind="pick", result_id="b", confidence=0.5,
            validation="rejected-stale"),
    receipt(id="r4", at="2026-11-30T12:00:03Z", point="stop", candidates=["stop", "go_on"],
            result_kind="pick", result_id="stop", confidence=0.99, validation="accepted",
            fallback_used=True, fallback_to="go_on", fallback_reason="provider auth failed",
            outcome_status="success"),
    receipt(id="r5", at="2026-11-30T12:00:04Z", point="route", model="tiny-v2",
            candidates=["x", "y", "z"], result_kind="pick", result_id="z", confidence=0.3,
            validation="accepted", shadow_reference="y"),
    receipt(id="r6", at="2026-11-30T12:00:05Z", point="tool", candidates=["a", "b"],
            result_kind="pick", result_id="a", confidence=0.7, validation="accepted",
            observed_outcome="the user closed the window — ✗"),
    receipt(id="r7", at="2026-11-30T12:00:06Z", point="tool", model="tiny-v2",
            candidates=["a", "b"], result_kind="pick", result_id="a", confidence=1.0,
            validation="accepted", fallback_used=False, outcome_status="failure",
            outcome_duration_ms=98765, outcome_retries=3),
    receipt(id="r8", at="2026-11-30T12:00:07Z", point="args", candidates=["a", "b"],
            result_kind="pick", result_id="a", confidence=0.0, validation="rejected-expired",
            outcome_status="abandoned"),
]

CODECS = ["none", "snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd"]


def codecs_of(path):
    md = pq.ParquetFile(path).metadata
    return sorted({md.row_group(g).column(c).compression
                   for g in range(md.num_row_groups) for c in range(md.num_columns)})


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    states = pa.Table.from_pylist(STATES, schema=STATES_SCHEMA)
    receipts = pa.Table.from_pylist(RECEIPTS, schema=RECEIPTS_SCHEMA)
    expected = {"pyarrow": pa.__version__, "states": states.to_pylist(),
                "receipts": receipts.to_pylist(), "files": {}}
    seen = {}
    for codec in CODECS:
        files = {}
        for kind, table, page in [("states", states, "1.0"), ("receipts", receipts, "2.0")]:
            name = f"{kind}-{codec}.parquet"
            path = OUT / name
            pq.write_table(table, path, compression=codec, row_group_size=3,
                           data_page_version=page)
            files[name] = path.read_bytes()
        key = tuple(files.values())
        if key in seen:
            # pyarrow writes lz4_raw exactly as lz4: keep one copy
            print(f"{codec}: same bytes as {seen[key]}, not kept")
            for name in files:
                (OUT / name).unlink()
            continue
        seen[key] = codec
        for name in files:
            path = OUT / name
            kind = name.split("-")[0]
            back = pq.read_table(path)
            assert back.to_pylist() == expected[kind], name
            expected["files"][name] = {
                "kind": kind,
                "codec": codecs_of(path),
                "row_groups": pq.ParquetFile(path).metadata.num_row_groups,
            }
            print(f"{name}: {path.stat().st_size} bytes, {expected['files'][name]['codec']}")
    with open(OUT / "expected.json", "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
