#!/usr/bin/env python3
"""Check a Core ML package written by decision-export, with coremltools only.

Core ML itself runs on Apple platforms only; this checks everything that can be checked elsewhere:

  manifest             Manifest.json: format version, root model item, weights item
  load_spec            coremltools.utils.load_spec reads the package: specificationVersion 9, an ML
                       Program, program version 1, one function `main` with opset CoreML8
  mlmodel              coremltools.models.MLModel(path, skip_model_load=True) accepts it
  interface            the contract's inputs (int32 [1, n], batch fixed to 1, n a range) and outputs
                       (fp32), by name and in order
  weights              weight.bin: storage header (version 2, blob count), and for every blobFileValue
                       an aligned metadata record with sentinel 0xDEADBEEF, dtype and size matching
                       the declared tensor type; the program reads exactly the blobs the header counts
  milproto             coremltools' milproto frontend rebuilds the program with type inference:
                       unknown parameters, wrong declared output types and unreadable blobs fail here
  explicit_parameters  every op binds every parameter of its iOS 18 definition, optional ones too
  values               each sample state (as given, and again left-padded) is evaluated op by op with
                       coremltools' value inference (numpy only for ops that have none, and for large
                       linear / matmul products, in fp32: see --products); each value must have its
                       declared type. With --budget, a large model evaluates fewer states (see there)
  parity               option_probs match the reference's within the tolerance, with the same pick

Samples: JSON Lines with input_ids, option_token_ids, probs (and optionally attention_mask,
option_logits, temperature), as `decision score --emit-tokens` writes them. When a sample's
temperature differs from the one the model applies, its reference probabilities are recomputed
from its option_logits at the model's temperature.

Several packages can be checked in one run (coremltools takes seconds to import); the report is
then a list, one entry per package, in order.

Exit status 0 when every step passed for every package, 1 when one failed (the report names the
step), 2 on bad usage.

Example:
  python scripts/check_coreml.py bundle/model.mlpackage --samples scores.jsonl --report report.json
"""

import argparse
import json
import mmap
import os
import struct
import sys
import time
import warnings

SPEC_VERSION = 9
OPSET = "CoreML8"
INPUTS = ["input_ids", "attention_mask", "option_token_ids"]
OUTPUTS = ["option_logits", "option_probs"]
BLOB_DTYPES = {"fp16": (1, 2), "fp32": (2, 4)}  # MIL dtype -> (blob dtype code, bytes per element)


class CheckFailed(Exception):
    def __init__(self, step, message):
        super().__init__(message)
        self.step = step


def require(cond, step, message):
    if not cond:
        raise CheckFailed(step, message)


def check_manifest(pkg):
    path = os.path.join(pkg, "Manifest.json")
    require(os.path.isfile(path), "manifest", f"{path} is missing")
    with open(path) as f:
        m = json.load(f)
    require(m.get("fileFormatVersion") == "1.0.0", "manifest", "fileFormatVersion is not 1.0.0")
    entries = m.get("itemInfoEntries") or {}
    root = entries.get(m.get("rootModelIdentifier"))
    require(root is not None, "manifest", "rootModelIdentifier names no itemInfoEntries entry")
    require(root.get("path") == "com.apple.CoreML/model.mlmodel", "manifest",
            f"the root item's path is {root.get('path')!r}")
    paths = {e.get("path"): e for e in entries.values()}
    require("com.apple.CoreML/weights" in paths, "manifest", "no item for com.apple.CoreML/weights")
    for e in entries.values():
        require(e.get("author") == "com.apple.CoreML", "manifest", f"item {e.get('path')}: author {e.get('author')!r}")
        require(os.path.exists(os.path.join(pkg, "Data", e["path"])), "manifest", f"item {e['path']} is missing")


def check_spec(spec):
    require(spec.specificationVersion == SPEC_VERSION, "load_spec",
            f"specificationVersion {spec.specificationVersion}, expected {SPEC_VERSION}")
    require(spec.WhichOneof("Type") == "mlProgram", "load_spec", f"model type {spec.WhichOneof('Type')}, expected mlProgram")
    prog = spec.mlProgram
    require(prog.version == 1, "load_spec", f"program version {prog.version}, expected 1")
    require(list(prog.functions.keys()) == ["main"], "load_spec", f"functions {list(prog.functions.keys())}, expected ['main']")
    main = prog.functions["main"]
    require(main.opset == OPSET, "load_spec", f"opset {main.opset}, expected {OPSET}")
    require(OPSET in main.block_specializations, "load_spec", f"no block for {OPSET}")


def check_interface(spec):
    from coremltools.proto import FeatureTypes_pb2 as ft

    desc = spec.description
    names = [i.name for i in desc.input]
    require(names == INPUTS, "interface", f"inputs {names}, expected {INPUTS}")
    for i in desc.input:
        a = i.type.multiArrayType
        require(i.type.WhichOneof("Type") == "multiArrayType" and a.dataType == ft.ArrayFeatureType.INT32,
                "interface", f"input {i.name} is not an int32 multi-array")
        require(len(a.shape) == 2 and a.shape[0] == 1, "interface", f"input {i.name}: default shape {list(a.shape)}")
        ranges = [(r.lowerBound, r.upperBound) for r in a.shapeRange.sizeRanges]
        require(len(ranges) == 2 and ranges[0] == (1, 1), "interface", f"input {i.name}: shape ranges {ranges}")
        require(ranges[1][0] <= a.shape[1] and (ranges[1][1] < 0 or a.shape[1] <= ranges[1][1]), "interface",
                f"input {i.name}: default {a.shape[1]} outside its range {ranges[1]}")
    require(desc.input[0].type.multiArrayType.shapeRange == desc.input[1].type.multiArrayType.shapeRange,
            "interface", "input_ids and attention_mask have different ranges")
    names = [o.name for o in desc.output]
    require(names == OUTPUTS, "interface", f"outputs {names}, expected {OUTPUTS}")
    for o in desc.output:
        require(o.type.multiArrayType.dataType == ft.ArrayFeatureType.FLOAT32, "interface", f"output {o.name} is not fp32")
    block = spec.mlProgram.functions["main"].block_specializations[OPSET]
    require(list(block.outputs) == OUTPUTS, "interface", f"the program returns {list(block.outputs)}, expected {OUTPUTS}")
    fin = [i.name for i in spec.mlProgram.functions["main"].inputs]
    require(fin == INPUTS, "interface", f"the program takes {fin}, expected {INPUTS}")


def tensor_info(value_type):
    from coremltools.proto import MIL_pb2

    t = value_type.tensorType
    dtype = {MIL_pb2.FLOAT16: "fp16", MIL_pb2.FLOAT32: "fp32"}.get(t.dataType, MIL_pb2.DataType.Name(t.dataType))
    dims = []
    for d in t.dimensions:
        dims.append(d.constant.size if d.WhichOneof("dimension") == "constant" else None)
    return dtype, dims


def check_weights(spec, weights_dir):
    path = os.path.join(weights_dir, "weight.bin")
    require(os.path.isfile(path), "weights", f"{path} is missing")
    with open(path, "rb") as f:
        # Mapped, not read: a 4B model's weight.bin is 8 GB, and only the records are looked at.
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
    require(len(data) >= 64, "weights", "weight.bin is shorter than its 64-byte header")
    count, version = struct.unpack_from("<II", data, 0)
    require(version == 2, "weights", f"storage version {version}, expected 2")
    require(data[8:64] == bytes(56), "weights", "reserved header bytes are not zero")
    seen = {}
    block = spec.mlProgram.functions["main"].block_specializations[OPSET]
    for op in block.operations:
        for key, value in op.attributes.items():
            if value.WhichOneof("value") != "blobFileValue":
                continue
            name = op.outputs[0].name
            b = value.blobFileValue
            require(b.fileName == "@model_path/weights/weight.bin", "weights", f"const {name} reads {b.fileName}")
            off = b.offset
            require(off % 64 == 0, "weights", f"const {name}: offset {off} is not 64-aligned")
            require(off + 64 <= len(data), "weights", f"const {name}: offset {off} is past the end of weight.bin")
            sentinel, code, size, data_off = struct.unpack_from("<IIQQ", data, off)
            require(sentinel == 0xDEADBEEF, "weights",
                    f"const {name}: metadata at offset {off} has sentinel {sentinel:#010x}, expected 0xdeadbeef")
            require(data[off + 24:off + 64] == bytes(40), "weights", f"const {name}: reserved metadata bytes are not zero")
            dtype, dims = tensor_info(value.type)
            require(dtype in BLOB_DTYPES and None not in dims, "weights", f"const {name}: blob of type {dtype} {dims}")
            want_code, width = BLOB_DTYPES[dtype]
            numel = 1
            for d in dims:
                numel *= d
            require(code == want_code, "weights", f"const {name}: blob dtype code {code}, the program declares {dtype}")
            require(size == numel * width, "weights", f"const {name}: blob holds {size} bytes, {dtype}{dims} needs {numel * width}")
            require(data_off >= off + 64 and data_off % 64 == 0 and data_off + size <= len(data), "weights",
                    f"const {name}: data at {data_off} ({size} bytes) is misplaced")
            seen[off] = size
    require(len(seen) == count, "weights", f"the header counts {count} blobs, the program reads {len(seen)}")
    return len(seen)


def check_explicit_parameters(spec):
    from coremltools.converters.mil._deployment_compatibility import AvailableTarget
    from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry

    block = spec.mlProgram.functions["main"].block_specializations[OPSET]
    count = 0
    for op in block.operations:
        if op.type == "const":
            continue
        count += 1
        variants = SSAOpRegistry.core_ops.get(op.type)
        require(variants is not None, "explicit_parameters", f"op {op.outputs[0].name}: unknown op type {op.type!r}")
        cls = variants[AvailableTarget.iOS18]
        want = set(cls.input_spec.input_types.keys())
        have = set(op.inputs.keys())
        unknown = sorted(have - want)
        require(not unknown, "explicit_parameters", f"op {op.outputs[0].name} ({op.type}): unknown parameter(s) {unknown}")
        missing = sorted(want - have)
        require(not missing, "explicit_parameters",
                f"op {op.outputs[0].name} ({op.type}): parameter(s) {missing} left implicit")
    return count


def load_program(spec, weights_dir):
    from coremltools.converters.mil.frontend.milproto import load as milproto
    from coremltools.converters.mil.mil import types

    original = milproto._load_operation

    def load_operation(context, op_spec):
        # The frontend's messages do not say which op they reject; name it, with the declared and
        # the inferred type when they disagree.
        try:
            return original(context, op_spec)
        except Exception as e:
            name = op_spec.outputs[0].name if op_spec.outputs else "?"
            detail = ""
            var = context.name_to_var.get(name)
            if var is not None and op_spec.outputs:
                declared = milproto.proto_to_types(op_spec.outputs[0].type)
                detail = (f" (declared {types.builtin_to_string(declared.get_primitive())}{list(declared.get_shape())}, "
                          f"inferred {types.builtin_to_string(var.dtype)}{list(var.shape)})")
            raise CheckFailed("milproto", f"op {name} ({op_spec.type}): {type(e).__name__}: {e}{detail}")

    milproto._load_operation = load_operation
    try:
        return milproto.load(spec, specification_version=spec.specificationVersion, file_weights_dir=weights_dir)
    except CheckFailed:
        raise
    except Exception as e:  # the frontend's own message says what it rejected
        raise CheckFailed("milproto", f"{type(e).__name__}: {e}")
    finally:
        milproto._load_operation = original


def numpy_fallback(op_type, kwargs):
    import numpy as np

    if op_type == "silu":
        x = kwargs["x"]
        y = x.astype(np.float32) / (1.0 + np.exp(-x.astype(np.float32)))
        return y.astype(x.dtype)
    return None


# Products at least this large (multiply-adds) are computed by numpy in fp32 under `--products
# auto`: coremltools' value inference multiplies fp16 arrays in numpy's fp16 loops, which have no
# BLAS and run at about 1 GFLOPS, so a 0.6B model's check took hours. Below it, coremltools'.
F32_PRODUCTS_ABOVE = 1 << 22


def f32_product(op_type, kwargs):
    """linear / matmul as iOS 18 defines them, in fp32 (BLAS), rounded to the input's dtype."""
    import numpy as np

    if op_type == "linear":
        x, w, b = kwargs["x"], kwargs["weight"], kwargs.get("bias")
        y = np.matmul(x.astype(np.float32), w.astype(np.float32).T)
        if b is not None:
            y += b.astype(np.float32)
        return y.astype(x.dtype)
    x, y = kwargs["x"], kwargs["y"]
    a, b = x.astype(np.float32), y.astype(np.float32)
    if bool(kwargs.get("transpose_x", False)):
        a = np.swapaxes(a, -1, -2)
    if bool(kwargs.get("transpose_y", False)):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b).astype(np.result_type(x.dtype, y.dtype))


def product_size(op_type, kwargs):
    """Multiply-adds of a linear / matmul (0 for any other op)."""
    import numpy as np

    if op_type == "linear":
        return int(np.prod(kwargs["x"].shape[:-1])) * int(kwargs["weight"].size)
    if op_type == "matmul":
        x, y = kwargs["x"], kwargs["y"]
        k = x.shape[-2] if bool(kwargs.get("transpose_x", False)) else x.shape[-1]
        return int(x.size) * int(y.size) // max(1, k * int(np.prod(y.shape[:-2])))
    return 0


class Evaluator:
    """Evaluates a program's main function with coremltools' value inference, op by op (large
    products in numpy fp32, see F32_PRODUCTS_ABOVE)."""

    def __init__(self, prog, products="auto"):
        self.func = prog.functions["main"]
        self.products = products
        self.fallbacks = set()
        self.f32_products = 0
        self.other_ops = 0

    def evaluate_op(self, op, env):
        import numpy as np
        from coremltools.converters.mil.mil import Builder as mb
        from coremltools.converters.mil.mil import Function
        from coremltools.converters.mil._deployment_compatibility import AvailableTarget

        kwargs = {}
        for param, var in op.inputs.items():
            if isinstance(var, (list, tuple)):
                kwargs[param] = [env[v.name] for v in var]
            else:
                kwargs[param] = env[var.name]
        if op.op_type in ("linear", "matmul") and self.products != "coremltools" and (
                self.products == "f32" or product_size(op.op_type, kwargs) >= F32_PRODUCTS_ABOVE):
            self.f32_products += 1
            return [np.asarray(f32_product(op.op_type, kwargs))]
        self.other_ops += 1
        with Function({}, opset_version=AvailableTarget.iOS18):
            out = getattr(mb, op.op_type)(**kwargs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        vals = [o.val for o in outs]
        if any(v is None for v in vals):
            v = numpy_fallback(op.op_type, kwargs)
            require(v is not None, "values", f"op {op.name} ({op.op_type}) has no value inference and no fallback")
            self.fallbacks.add(op.op_type)
            vals = [v]
        return [np.asarray(v) for v in vals]

    def run(self, feeds):
        import numpy as np
        from coremltools.converters.mil.mil import types

        env = dict(feeds)
        for op in self.func.operations:
            if op.op_type == "const":
                env[op.outputs[0].name] = op.outputs[0].val
                continue
            vals = self.evaluate_op(op, env)
            for var, v in zip(op.outputs, vals):
                shape = var.sym_type.get_shape() if types.is_tensor(var.sym_type) else ()
                require(len(v.shape) == len(shape), "values",
                        f"{var.name}: value of rank {len(v.shape)}, declared rank {len(shape)}")
                for got, want in zip(v.shape, shape):
                    require(not isinstance(want, int) or got == want, "values",
                            f"{var.name}: value of shape {v.shape}, declared {shape}")
                want_dtype = types.nptype_from_builtin(var.dtype)
                require(v.dtype == want_dtype, "values", f"{var.name}: value of type {v.dtype}, declared {want_dtype.__name__}")
                require(np.all(np.isfinite(v)) if v.dtype.kind == "f" else True, "values", f"{var.name}: non-finite values")
                env[var.name] = v
        return [env[v.name] for v in self.func.outputs]


def softmax(x):
    import numpy as np

    e = np.exp(x - np.max(x))
    return e / e.sum()


def read_samples(path, model_temperature):
    import numpy as np

    samples = []
    with open(path) as f:
        for row, line in enumerate(f, 1):
            if not line.strip():
                continue
            s = json.loads(line)
            for field in ("input_ids", "option_token_ids", "probs"):
                if field not in s:
                    raise CheckFailed("samples", f"{path}: row {row}: field {field!r} missing")
            ids = np.asarray(s["input_ids"], dtype=np.int32)
            mask = np.asarray(s.get("attention_mask") or [1] * len(ids), dtype=np.int32)
            opts = np.asarray(s["option_token_ids"], dtype=np.int32)
            probs = np.asarray(s["probs"], dtype=np.float64)
            logits = s.get("option_logits")
            logits = None if logits is None else np.asarray(logits, dtype=np.float64)
            t = s.get("temperature")
            if t is not None and model_temperature is not None and abs(t - model_temperature) > 1e-9 * max(1.0, t):
                if logits is None:
                    raise CheckFailed("samples", f"{path}: row {row}: temperature {t} differs from the model's "
                                      f"{model_temperature} and there are no option_logits to rescale")
                logits = logits * t / model_temperature
                probs = softmax(logits)
            if len(ids) != len(mask) or len(probs) != len(opts):
                raise CheckFailed("samples", f"{path}: row {row}: field lengths disagree")
            samples.append({"id": s.get("id", f"row {row}"), "ids": ids, "mask": mask, "options": opts,
                            "probs": probs, "logits": logits})
    if not samples:
        raise CheckFailed("samples", f"{path}: no samples")
    return samples


def weights_per_token(prog):
    """Multiply-adds per token of the program's linear layers (their weights' element count)."""
    total = 0
    for op in prog.functions["main"].operations:
        if op.op_type == "linear":
            w = op.inputs["weight"].val
            total += 0 if w is None else int(w.size)
    return total


def plan_evaluations(samples, pad, per_token, budget):
    """Which samples to evaluate, and which of them again left-padded: all of them, twice, when
    that costs at most `budget` multiply-adds (0: no limit). Otherwise the first sample twice, then
    the others as given, in order, each that still fits (at least two samples in all)."""
    cost = [per_token * len(s["ids"]) for s in samples]
    twice = 2 if pad > 0 else 1
    if budget <= 0 or sum(cost) * twice <= budget:
        return [(i, pad > 0) for i in range(len(samples))], False
    plan, spent = [(0, pad > 0)], cost[0] * twice
    for i in range(1, len(samples)):
        if spent + cost[i] <= budget or len(plan) < 2:
            plan.append((i, False))
            spent += cost[i]
    return plan, True


def check_values(prog, samples, tolerance, pad, pad_id, products="auto", budget=0):
    import numpy as np

    started = time.time()
    ev = Evaluator(prog, products)
    per_token = weights_per_token(prog)
    plan, limited = plan_evaluations(samples, pad, per_token, budget)
    max_dp, max_dl, runs, mismatches, ties = 0.0, 0.0, 0, 0, 0
    worst = None
    lengths = []
    for i, padded in plan:
        s = samples[i]
        lengths.append(len(s["ids"]))
        variants = [("as given", s["ids"], s["mask"])]
        if padded:
            variants.append((f"left-padded by {pad}", np.concatenate([np.full(pad, pad_id, np.int32), s["ids"]]),
                             np.concatenate([np.zeros(pad, np.int32), s["mask"]])))
        for label, ids, mask in variants:
            feeds = {"input_ids": ids[None, :], "attention_mask": mask[None, :], "option_token_ids": s["options"][None, :]}
            logits, probs = ev.run(feeds)
            require(probs.shape == (1, len(s["options"])), "values", f"{s['id']}: option_probs has shape {probs.shape}")
            runs += 1
            dp = float(np.max(np.abs(probs[0].astype(np.float64) - s["probs"])))
            if dp > max_dp:
                max_dp, worst = dp, f"{s['id']} ({label})"
            if s["logits"] is not None:
                max_dl = max(max_dl, float(np.max(np.abs(logits[0].astype(np.float64) - s["logits"]))))
            ref = np.sort(s["probs"])[::-1]
            if len(ref) > 1 and ref[0] - ref[1] <= tolerance:
                ties += 1
            elif int(np.argmax(probs[0])) != int(np.argmax(s["probs"])):
                mismatches += 1
    return {"samples": runs, "max_abs_dp": max_dp, "max_abs_dlogit": max_dl, "worst": worst,
            "pick_mismatches": mismatches, "near_ties": ties, "numpy_fallbacks": sorted(ev.fallbacks),
            "states_given": len(samples), "states_checked": len(plan),
            "padded": sum(1 for _, p in plan if p), "tokens": [min(lengths), max(lengths)],
            "budget_limited": limited, "budget": budget, "macs_per_token": per_token,
            "products": products, "f32_products": ev.f32_products, "other_ops": ev.other_ops,
            "values_seconds": time.time() - started}


def check_package(pkg, args):
    """Run every step on one package; returns its report (never raises CheckFailed)."""
    report = {"package": pkg, "passed": False, "steps": []}
    try:
        import coremltools as ct
        import numpy as np

        report["runtime"] = (f"coremltools {ct.__version__} (milproto load + MIL value inference), "
                             f"numpy {np.__version__}")
        pkg = pkg.rstrip("/")
        weights_dir = os.path.join(pkg, "Data", "com.apple.CoreML", "weights")
        check_manifest(pkg)
        report["steps"].append("manifest")
        try:
            spec = ct.utils.load_spec(pkg)
        except Exception as e:
            raise CheckFailed("load_spec", f"{type(e).__name__}: {e}")
        check_spec(spec)
        report["steps"].append("load_spec")
        try:
            ct.models.MLModel(pkg, skip_model_load=True)
        except Exception as e:
            raise CheckFailed("mlmodel", f"{type(e).__name__}: {e}")
        report["steps"].append("mlmodel")
        check_interface(spec)
        report["steps"].append("interface")
        report["weight_blobs"] = check_weights(spec, weights_dir)
        report["steps"].append("weights")
        prog = load_program(spec, weights_dir)
        report["steps"].append("milproto")
        report["operations"] = check_explicit_parameters(spec)
        report["steps"].append("explicit_parameters")

        meta = dict(spec.description.metadata.userDefined)
        dtype = meta.get("dtype", "f16")
        tolerance = args.tolerance if args.tolerance is not None else (2e-3 if dtype == "f16" else 1e-4)
        report["tolerance"] = tolerance
        temperature = float(meta["temperature"]) if "temperature" in meta else None
        samples = read_samples(args.samples, temperature)
        figures = check_values(prog, samples, tolerance, args.pad, args.pad_id, args.products, args.budget)
        report.update(figures)
        report["steps"].append("values")
        require(figures["max_abs_dp"] <= tolerance and figures["pick_mismatches"] == 0, "parity",
                f"max |Δp| = {figures['max_abs_dp']:.3e} on {figures['worst']} (tolerance {tolerance:.0e}), "
                f"{figures['pick_mismatches']} of {figures['samples']} picks differ")
        report["steps"].append("parity")
        report["passed"] = True
    except CheckFailed as e:
        report["failed_step"] = e.step
        report["error"] = str(e)
    except ImportError as e:
        report["failed_step"] = "import"
        report["error"] = f"{e} (pip install -r scripts/requirements-coreml.txt)"
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages", nargs="+", metavar="package",
                    help="model.mlpackage folder(s); several are checked in one run (coremltools loads once)")
    ap.add_argument("--samples", required=True, help="JSON Lines of sample states with reference probs")
    ap.add_argument("--tolerance", type=float, help="max |Δp| allowed (default: 2e-3 for fp16 weights, 1e-4 for fp32)")
    ap.add_argument("--pad", type=int, default=3, help="also run each sample left-padded by this many tokens (0: off)")
    ap.add_argument("--pad-id", type=int, default=0, help="token id used for the padding")
    ap.add_argument("--products", choices=["auto", "f32", "coremltools"], default="auto",
                    help="how linear / matmul ops are evaluated: coremltools' value inference (numpy in the "
                         "ops' own dtype), numpy in fp32 rounded to the ops' dtype, or auto: fp32 for products "
                         f"of at least {F32_PRODUCTS_ABOVE} multiply-adds (default)")
    ap.add_argument("--budget", type=float, default=0,
                    help="at most about this many multiply-adds of linear layers over all evaluations (0: no "
                         "limit): past it, only the first sample is also run left-padded and later samples are "
                         "skipped while they do not fit (two at least)")
    ap.add_argument("--report", help="write the report (JSON; a list when several packages) here; it is always printed too")
    args = ap.parse_args()
    if not args.budget >= 0:  # also refuses nan
        ap.error(f"--budget must be 0 (no limit) or a positive number of multiply-adds, not {args.budget}")

    warnings.filterwarnings("ignore")
    reports = [check_package(pkg, args) for pkg in args.packages]
    out = reports[0] if len(reports) == 1 else reports
    text = json.dumps(out, indent=1, default=float)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    print(text)
    for report in reports:
        if report["passed"]:
            print(f"check_coreml: {report['package']}: passed ({', '.join(report['steps'])}); "
                  f"max |Δp| {report['max_abs_dp']:.2e} over {report['samples']} evaluations", file=sys.stderr)
        else:
            print(f"check_coreml: {report['package']}: FAILED at {report['failed_step']}: {report['error']}",
                  file=sys.stderr)
    return 0 if all(r["passed"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
