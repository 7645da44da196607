"""Fuzzing what users hand to collage: MLIR files, plan JSON, artifact manifests, cost-DB imports and .npy
inputs, each mutated from a valid seed (byte edits and JSON-structure edits). Every case must end in one
of two ways: exit 0 with the right answer (compared with IREE alone on the same inputs), or one
``collage...: error:`` line and a non-zero exit. A traceback (an exception escaping the CLI) or a wrong
answer with exit 0 fails the test.

The default suite runs a few cases per target (deterministic: hypothesis' derandomize); the campaign
(``pytest -m bench test/python/tools/test_fuzz.py``, COLLAGE_FUZZ_EXAMPLES cases per target, default 1000) is
recorded in docs/reliability.md.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module
from collage_mlir.tools.cli import main as collage_main
from collage_runtime.program import InputError

from helpers import LIT_INPUTS

MLP = (LIT_INPUTS / "mlp.mlir").read_text()
PLAN = (LIT_INPUTS / "mlp-plan.json").read_text()
SMALL = int(os.environ.get("COLLAGE_FUZZ_SMALL", "8"))
CAMPAIGN = int(os.environ.get("COLLAGE_FUZZ_EXAMPLES", "1000"))

# Tokens that break parsers in interesting ways when spliced in.
TOKENS = [b"-1", b"0", b"1e309", b"NaN", b"-0", b"99999999999999999999", b"[]", b"{}", b"null", b'""', b"true",
          b"\x00", b"\xff\xfe", b"..", b"../", b"/", b"%", b"tensor<?xf32>", b"f64", b"i1", b"complex<f32>",
          b"!quant.uniform<i8:f32, 0.5:3>", b"}", b")", b">", b"<", b",", b"\n", b"\"", b"\\"]


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """``seed`` after 1-4 random edits: flip, delete, duplicate, insert random bytes or a token."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=8))
            continue
        k = draw(st.integers(0, len(data) - 1))
        edit = draw(st.sampled_from(["flip", "delete", "dup", "insert", "token", "truncate"]))
        if edit == "flip":
            data[k] ^= 1 << draw(st.integers(0, 7))
        elif edit == "delete":
            del data[k:k + draw(st.integers(1, 16))]
        elif edit == "dup":
            n = draw(st.integers(1, 32))
            data[k:k] = data[k:k + n]
        elif edit == "insert":
            data[k:k] = draw(st.binary(min_size=1, max_size=8))
        elif edit == "token":
            data[k:k + draw(st.integers(0, 4))] = draw(st.sampled_from(TOKENS))
        else:
            del data[k:]
    return bytes(data)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


@st.composite
def json_mutated(draw, doc) -> bytes:
    """``doc`` with one value somewhere replaced by a random JSON value, or a key deleted; or byte edits."""
    if draw(st.booleans()):
        return draw(mutated(json.dumps(doc).encode()))
    doc = json.loads(json.dumps(doc))
    paths = []

    def walk(node, path):
        paths.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            walk(child, path + [key])

    walk(doc, [])
    path = draw(st.sampled_from(paths[1:] or [[]]))
    if not path:
        return json.dumps(draw(JSON_VALUES)).encode()
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(JSON_VALUES)
    return json.dumps(doc).encode()


def cli(*args: str) -> tuple[int, str]:
    """Runs the collage CLI in-process; an exception escaping it (a traceback for the user) propagates."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            rc = collage_main(list(args))
        except SystemExit as exc:  # argparse's own exit after its one line
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, err.getvalue()


def assert_clean_failure(rc: int, stderr: str) -> None:
    assert rc in (1, 2), (rc, stderr)
    assert stderr.count("\n") == 1 and stderr.startswith("collage"), stderr
    assert "Traceback" not in stderr


def _inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (8, 16), (16,), (16, 4))]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The MLP built IREE-alone (reference) and with its onednn plan; its inputs saved as .npy."""
    root = tmp_path_factory.mktemp("fuzz")
    compile_module(parse_module(MLP, new_context()), "default", root / "alone")
    compile_module(parse_module(MLP, new_context()), str(LIT_INPUTS / "mlp-plan.json"), root / "mixed")
    paths = []
    for k, a in enumerate(_inputs()):
        paths.append(root / f"in{k}.npy")
        np.save(paths[-1], a)
    return root


def _reference(root: Path, arrays: list[np.ndarray]):
    """IREE alone's answer on ``arrays``, or None when IREE alone (with the signature check) refuses them."""
    with collage_runtime.load(root / "alone") as prog:
        try:
            return prog.invoke("main", *arrays)
        except (InputError, ValueError, RuntimeError):
            return None


def _check_run(root: Path, artifact: Path, inputs: list[Path], work: Path) -> None:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    rc, err = cli("run", str(artifact), "--in-process", *[a for p in inputs for a in ("--input", str(p))],
                  "--output-dir", str(out))
    if rc != 0:
        assert_clean_failure(rc, err)
        return
    arrays = [np.load(p, allow_pickle=False) for p in inputs]
    ref = _reference(root, arrays)
    assert ref is not None, "collage ran inputs that IREE alone refuses"
    got = np.load(out / "out_0.npy")
    np.testing.assert_allclose(got, ref[0], rtol=1e-4, atol=1e-5, equal_nan=True)


# --- targets ----------------------------------------------------------------------------------------------

def fuzz_npy(mlp: Path, work: Path, data: bytes, which: int) -> None:
    inputs = [mlp / f"in{k}.npy" for k in range(4)]
    inputs[which] = work / "mut.npy"
    inputs[which].write_bytes(data)
    _check_run(mlp, mlp / "mixed", inputs, work)


def fuzz_manifest(mlp: Path, work: Path, data: bytes) -> None:
    art = work / "art"
    shutil.rmtree(art, ignore_errors=True)
    shutil.copytree(mlp / "mixed", art)
    (art / "manifest.json").write_bytes(data)
    _check_run(mlp, art, [mlp / f"in{k}.npy" for k in range(4)], work)


def fuzz_plan(mlp: Path, work: Path, data: bytes) -> None:
    (work / "mlp.mlir").write_text(MLP)
    (work / "plan.json").write_bytes(data)
    art = work / "art"
    shutil.rmtree(art, ignore_errors=True)
    rc, err = cli("compile", str(work / "mlp.mlir"), "--plan", str(work / "plan.json"), "-o", str(art))
    if rc != 0:
        assert_clean_failure(rc, err)
        return
    _check_run(mlp, art, [mlp / f"in{k}.npy" for k in range(4)], work)


def fuzz_mlir(mlp: Path, work: Path, data: bytes, seed: int) -> None:
    (work / "m.mlir").write_bytes(data)
    art = work / "art"
    shutil.rmtree(art, ignore_errors=True)
    rc, err = cli("compile", str(work / "m.mlir"), "--plan", f"random:{seed}", "-o", str(art))
    if rc != 0:
        assert_clean_failure(rc, err)
        return
    # It compiled: the same module under IREE alone must give the same answer on the same inputs.
    ref_dir = work / "ref"
    shutil.rmtree(ref_dir, ignore_errors=True)
    rc, err = cli("compile", str(work / "m.mlir"), "--plan", "default", "-o", str(ref_dir))
    assert rc == 0, err
    with collage_runtime.load(ref_dir) as ref_prog, collage_runtime.load(art) as prog:
        for name in ref_prog.functions:
            sig = ref_prog._signatures.get(name)
            if sig is None or any(s is None or s.dtype is None or None in s.shape for s in sig.inputs):
                continue
            rng = np.random.default_rng(0)
            args = [rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.kind in "fc"
                    else rng.integers(0, 4, s.shape).astype(s.dtype) for s in sig.inputs]
            try:
                want = ref_prog.invoke(name, *args)
            except (ValueError, RuntimeError):
                continue  # IREE alone cannot run it either
            got = prog.invoke(name, *args)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


def fuzz_db_import(work: Path, data: bytes) -> None:
    db = work / "costs.sqlite"
    (work / "import.json").write_bytes(data)
    rc, err = cli("db", "import", str(work / "import.json"), "--db", str(db))
    if rc != 0:
        assert_clean_failure(rc, err)
    rc, err = cli("db", "stats", "--db", str(db))  # the database stays readable whatever was imported
    assert rc == 0 or "no cost database here" in err, err
    if db.exists():
        with sqlite3.connect(db) as c:
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _db_seed() -> dict:
    row = {"region_hash": "ab" * 32, "backend": "ort", "backend_version": "onnxruntime-1.31.1",
           "device": "cpu-x", "harness_version": 1, "status": "ok", "median_s": 1e-4, "min_s": 9e-5,
           "spread": 0.01, "repeats": 10, "threads": 2, "max_abs_err": 0.0, "max_rel_err": 0.0, "message": "",
           "region": "stablehlo.add", "created": 1.7e9}
    return {"format": "collage-costs", "version": 1, "devices": [{"fingerprint": "cpu-x", "description": "x"}],
            "measurements": [row], "transitions": []}


def _run_campaign(target, examples: int, strategy):
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def case(args):
        target(*args)

    case()


def _targets(mlp: Path, work: Path) -> dict:
    seed_db = _db_seed()
    return {
        "npy": (lambda d, k: fuzz_npy(mlp, work, d, k),
                st.tuples(mutated((mlp / "in0.npy").read_bytes()), st.integers(0, 3))),
        "manifest": (lambda d: fuzz_manifest(mlp, work, d),
                     st.tuples(json_mutated(json.loads((mlp / "mixed" / "manifest.json").read_text())))),
        "plan": (lambda d: fuzz_plan(mlp, work, d), st.tuples(json_mutated(json.loads(PLAN)))),
        "mlir": (lambda d, s: fuzz_mlir(mlp, work, d, s), st.tuples(mutated(MLP.encode()), st.integers(0, 9))),
        "db-import": (lambda d: fuzz_db_import(work, d), st.tuples(json_mutated(seed_db))),
    }


TARGETS = ["npy", "manifest", "plan", "mlir", "db-import"]


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_small(target, mlp, tmp_path):
    fn, strategy = _targets(mlp, tmp_path)[target]
    _run_campaign(fn, SMALL if target != "mlir" else max(3, SMALL // 3), strategy)


@pytest.mark.bench
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_campaign(target, mlp, tmp_path):
    fn, strategy = _targets(mlp, tmp_path)[target]
    _run_campaign(fn, CAMPAIGN, strategy)
