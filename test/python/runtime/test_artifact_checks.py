"""An artifact is data, checked before it runs; inputs are checked against the compiled signature.

The MLP below has its first layer on onednn, which reads the function's arguments directly: IREE's own
checks never see them, so before these checks a wrong input computed garbage with exit code 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import collage_runtime
from collage_mlir.errors import CollageError
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module
from collage_runtime.manifest import ArtifactError
from collage_runtime.program import InputError

from helpers import FAULTY, LIT_INPUTS, interruptible

MLP = (LIT_INPUTS / "mlp.mlir").read_text()
PLAN = str(LIT_INPUTS / "mlp-plan.json")


def _inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (8, 16), (16,), (16, 4))]


def collage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """The MLP compiled with its onednn region, and IREE alone's result on ``_inputs()``."""
    root = tmp_path_factory.mktemp("mlp")
    compile_module(parse_module(MLP, new_context()), "default", root / "alone")
    with collage_runtime.load(root / "alone") as prog:
        (ref,) = prog.invoke("main", *_inputs())
    compile_module(parse_module(MLP, new_context()), PLAN, root / "mixed")
    return root / "mixed", ref


@pytest.fixture
def artifact(built, tmp_path) -> Path:
    """A private copy of the mixed artifact, free to tamper with."""
    return Path(shutil.copytree(built[0], tmp_path / "a"))


def test_inputs_are_checked_against_the_signature(built):
    art, ref = built
    good = _inputs()
    x = good[0]
    cases = {
        "f64 where f32 is expected": ([x.astype(np.float64), *good[1:]], "input 0: expected tensor<2x8xf32>, got float64[2, 8]"),
        "one row short": ([x[:1], *good[1:]], "input 0: expected tensor<2x8xf32>, got float32[1, 8]"),
        "transposed": ([np.ascontiguousarray(x.T), *good[1:]], "got float32[8, 2]"),
        "a scalar": ([np.array(1.0, np.float32), *good[1:]], "got float32[]"),
        "missing input": (good[:3], "takes 4 input(s), got 3"),
        "a list": ([x.tolist(), *good[1:]], "as a numpy array, got list"),
    }
    with collage_runtime.load(art) as prog:
        for why, (arrays, message) in cases.items():
            with pytest.raises(InputError, match=re.escape(message)):
                prog.invoke("main", *arrays)
        (y,) = prog.invoke("main", *good)  # still fine after refusals
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_cli_names_the_wrong_input_file(built, tmp_path):
    art, _ = built
    paths = []
    for k, a in enumerate(_inputs()):
        paths.append(str(tmp_path / f"in{k}.npy"))
        np.save(paths[-1], a.astype(np.float64) if k == 1 else a)
    args = [a for p in paths for a in ("--input", p)]
    r = collage("run", str(art), *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"collage: error: {paths[1]}: main: input 1: expected tensor<8x16xf32>, got float64")


@pytest.mark.parametrize("tamper, message", [
    (lambda a: _flip_byte(a / "main.vmfb"), "module does not match its SHA-256"),
    (lambda a: (a / "main.vmfb").write_bytes((a / "main.vmfb").read_bytes()[:100]), "module does not match its SHA-256"),
    (lambda a: (a / "main.vmfb").unlink(), "module is missing"),
    (lambda a: _flip_byte(_region_file(a)), "region 'layer1' artifact does not match its SHA-256"),
    (lambda a: _region_file(a).unlink(), "region 'layer1' artifact is missing"),
    (lambda a: _edit(a, lambda m: m["regions"][0].update(artifact="../../../../etc/passwd")), "lies outside the artifact directory"),
    (lambda a: _edit(a, lambda m: m["regions"][0].update(artifact="/etc/passwd")), "lies outside the artifact directory"),
    (lambda a: _edit(a, lambda m: m.update(module="../b/main.vmfb")), "lies outside the artifact directory"),
    (lambda a: _edit(a, lambda m: m["regions"][0].pop("sha256")), "has no SHA-256"),
    (lambda a: _edit(a, lambda m: m["regions"][0].update(outputs=[{"shape": [-1], "dtype": "f32"}])), "region 'layer1' outputs"),
    (lambda a: _edit(a, lambda m: m.update(regions={"x": 1})), "regions: expected a list"),
    (lambda a: _edit(a, lambda m: m["regions"][0].update(outputs=[])), "a region returns at least one tensor"),
    (lambda a: _edit(a, lambda m: m["regions"][0]["inputs"].pop()), "the module does not link with the manifest's regions"),
    (lambda a: _edit(a, lambda m: m.update(version=99)), "artifact version 99 is not supported"),
    (lambda a: _edit(a, lambda m: m.update(tail={"artifact": "main.vmfb", "inputs": [["tail", 0]], "outputs": [],
                                               "sha256": ""})), "tail inputs: expected a list of"),
    (lambda a: _edit(a, lambda m: m.update(tail={"artifact": "../t.onnx", "inputs": [], "outputs": [], "sha256": ""})),
     "lies outside the artifact directory"),
    (lambda a: (a / "manifest.json").write_text((a / "manifest.json").read_text()[:50]), "cannot read artifact manifest"),
    (lambda a: (a / "manifest.json").write_bytes(b"\xff\xfe\x00garbage"), "cannot read artifact manifest"),
])
def test_tampered_artifacts_are_refused_in_one_line(artifact, tamper, message):
    tamper(artifact)
    with pytest.raises(ArtifactError, match=message):
        collage_runtime.load(artifact)
    r = collage("run", str(artifact))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _region_file(art: Path) -> Path:
    return art / json.loads((art / "manifest.json").read_text())["regions"][0]["artifact"]


def _edit(art: Path, change) -> None:
    manifest = json.loads((art / "manifest.json").read_text())
    change(manifest)
    (art / "manifest.json").write_text(json.dumps(manifest))


def test_compile_replaces_the_artifact_whole_or_not_at_all(built, tmp_path):
    out = Path(shutil.copytree(built[0], tmp_path / "out"))
    before = (out / "manifest.json").read_text()
    bad = tmp_path / "bad-plan.json"
    bad.write_text(json.dumps({"format": "collage-plan", "version": 1, "regions": [
        {"name": "r", "backend": "onednn", "ops": [99]}]}))
    with pytest.raises(CollageError, match="unknown op id 99"):
        compile_module(parse_module(MLP, new_context()), str(bad), out)
    assert (out / "manifest.json").read_text() == before  # the old artifact, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad-plan.json", "out"]  # no half-built leftovers
    compile_module(parse_module(MLP, new_context()), "default", out)
    assert not (out / "regions").exists() or not any((out / "regions").iterdir())  # no stale region files
    with collage_runtime.load(out) as prog:
        np.testing.assert_allclose(prog.invoke("main", *_inputs())[0], built[1], rtol=1e-6)


@pytest.mark.fast
def test_compile_refuses_a_directory_that_is_not_an_artifact(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CollageError, match="not empty and holds no collage artifact"):
        compile_module(parse_module(MLP, new_context()), "default", tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_default_backend_that_is_no_iree_codegen_is_refused(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"format": "collage-plan", "version": 1, "default_backend": "ort", "regions": []}))
    r = collage("compile", str(LIT_INPUTS / "mlp.mlir"), "--plan", str(plan), "-o", str(tmp_path / "o"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "backend 'ort' cannot be a program's default backend" in r.stderr


SUB_BYTE = """
func.func @main(%x: tensor<4xi8>) -> (tensor<4xi4>, tensor<0x3xf32>, tensor<4xui4>, tensor<4xi2>) {
  %0 = stablehlo.convert %x : (tensor<4xi8>) -> tensor<4xi4>
  %1 = stablehlo.constant dense<> : tensor<0x3xf32>
  %2 = stablehlo.convert %x : (tensor<4xi8>) -> tensor<4xui4>
  %3 = stablehlo.constant dense<[1, -1, 0, 1]> : tensor<4xi2>
  return %0, %1, %2, %3 : tensor<4xi4>, tensor<0x3xf32>, tensor<4xui4>, tensor<4xi2>
}
"""


def test_sub_byte_and_empty_results(tmp_path):
    compile_module(parse_module(SUB_BYTE, new_context()), "default", tmp_path)
    with collage_runtime.load(tmp_path) as prog:
        i4, empty, ui4, i2 = prog.invoke("main", np.array([1, -2, 7, -8], np.int8))
    assert i4.dtype == np.int8 and i4.tolist() == [1, -2, 7, -8]
    assert empty.shape == (0, 3) and empty.dtype == np.float32
    assert ui4.dtype == np.uint8 and ui4.tolist() == [1, 14, 7, 8]  # two's complement bits read unsigned
    assert i2.tolist() == [1, -1, 0, 1]


def test_no_engine_telemetry():
    """Importing the project switches OpenVINO's telemetry off (it contacted an analytics host on import)."""
    code = ("import collage_mlir, sys, openvino\n"
            "import openvino.tools.ovc.telemetry_utils as t\n"
            "assert sys.modules['openvino_telemetry'] is None and t.tm.__name__.endswith('telemetry_stub')\n")
    pytest.importorskip("openvino")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.serial
def test_ctrl_c_during_compile_exits_130_and_keeps_the_old_artifact(built, tmp_path):
    """SIGINT to the whole process group (what Ctrl-C does), mid-compile: one line, exit 130, the earlier
    artifact untouched and no half-built directory left."""
    out = Path(shutil.copytree(built[0], tmp_path / "out"))
    before = (out / "manifest.json").read_bytes()
    chain = ["func.func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<64x64xf32> {"]
    prev = "%x"
    for k in range(150):  # long enough to be mid-compile when interrupted
        chain.append(f"  %a{k} = stablehlo.dot_general {prev}, %w, contracting_dims = [1] x [0] : "
                     "(tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>")
        chain.append(f"  %t{k} = stablehlo.sine %a{k} : tensor<64x64xf32>")
        prev = f"%t{k}"
    (tmp_path / "big.mlir").write_text("\n".join([*chain, f"  return {prev} : tensor<64x64xf32>", "}"]) + "\n")
    p = subprocess.Popen([sys.executable, "-m", "collage_mlir.tools.cli", "compile", str(tmp_path / "big.mlir"),
                          "--plan", "random:1", "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=interruptible)
    # Interrupted once the compile is under way (its staging directory exists), not after a fixed time:
    # on a quiet machine the whole compile took less than the 4 s this test used to wait.
    deadline = time.monotonic() + 120
    while not any(q.name.endswith(".partial") for q in tmp_path.iterdir()) and p.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and err == "collage: interrupted\n", err
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(q.name for q in tmp_path.iterdir()) == ["big.mlir", "out"]


@pytest.mark.parametrize("args, message", [
    (["measure", "m.mlir", "--backends", "ort", "--jobs", "0"], "argument --jobs: expected a positive integer, got 0"),
    (["measure", "m.mlir", "--backends", "ort", "--budget", "-1"], "argument --budget: expected a number > 0, got -1"),
    (["measure", "m.mlir", "--backends", "ort", "--budget", "inf"], "expected a finite number"),
    (["measure", str(LIT_INPUTS / "mlp.mlir"), "--backends", " , "], "--backends: no backend named"),
    (["db", "prune", "--older-than", "-5"], "argument --older-than: expected a number >= 0, got -5"),
    (["compile"], "the following arguments are required"),
])
def test_cli_refuses_meaningless_arguments_in_one_line(args, message, tmp_path):
    r = collage(*args, "--db", str(tmp_path / "costs.sqlite")) if args[0] == "db" else collage(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "costs.sqlite").exists()


def test_db_reading_commands_never_create_a_database(tmp_path):
    missing = tmp_path / "typo" / "costs.sqlite"
    for cmd in (["stats"], ["export", str(tmp_path / "out.json")], ["prune"]):
        r = collage("db", *cmd, "--db", str(missing))
        assert r.returncode == 1 and "no cost database here" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not missing.parent.exists()


ADD = """
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  %1 = stablehlo.tanh %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""


@pytest.mark.parametrize("backend, message", [
    ("faulty-raise", "region 'r' (faulty-raise) failed: ValueError: the engine refused this input"),
    ("faulty-crash", "the program died of SIGABRT while running 'main'"),
])
def test_an_engine_failing_at_run_time_is_one_line(backend, message, tmp_path, monkeypatch):
    """Fault injection: a region's engine raising, or crashing the process, inside a built artifact."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTY), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "m.mlir").write_text(ADD)
    (tmp_path / "plan.json").write_text(json.dumps({"format": "collage-plan", "version": 1, "regions": [
        {"name": "r", "backend": backend, "ops": [0]}]}))
    r = collage("compile", str(tmp_path / "m.mlir"), "--plan", str(tmp_path / "plan.json"), "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    for k in (0, 1):
        np.save(tmp_path / f"x{k}.npy", np.ones(4, np.float32))
    r = collage("run", str(tmp_path / "a"), "--input", str(tmp_path / "x0.npy"), "--input", str(tmp_path / "x1.npy"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and message in r.stderr and not r.stdout, r.stderr


def test_one_deployable_file(built, tmp_path):
    """``-o model.collage`` packs the artifact into one file that loads like the directory; a damaged or
    malicious archive is one line."""
    packed = tmp_path / "model.collage"
    compile_module(parse_module(MLP, new_context()), PLAN, packed)
    assert packed.is_file()
    with collage_runtime.load(packed) as prog:
        unpacked = prog.root
        np.testing.assert_allclose(prog.invoke("main", *_inputs())[0], built[1], rtol=1e-4, atol=1e-5)
    assert not unpacked.exists()  # the private copy goes with the program

    data = packed.read_bytes()
    (tmp_path / "cut.collage").write_bytes(data[: len(data) // 2])
    corrupt = bytearray(data)
    corrupt[200] ^= 0xFF  # inside the first member's compressed data
    (tmp_path / "flip.collage").write_bytes(bytes(corrupt))
    import zipfile

    with zipfile.ZipFile(tmp_path / "slip.collage", "w") as zf:
        zf.writestr("manifest.json", "{}")
        zf.writestr("../../escape.txt", "x")
    for name, message in [("cut", "not a collage artifact"), ("flip", "packed artifact"),
                          ("slip", "would lie outside the artifact")]:
        with pytest.raises(ArtifactError, match=message):
            collage_runtime.load(tmp_path / f"{name}.collage")
    assert not (tmp_path.parent / "escape.txt").exists()


def test_manifest_reads_back_as_written(artifact):
    """``Manifest`` is the one type of ``manifest.json``: what a compile wrote reads back field for field,
    and writes back the same JSON."""
    from collage_runtime.manifest import MANIFEST, Manifest, load_manifest

    on_disk = json.loads((artifact / MANIFEST).read_text())
    manifest = load_manifest(artifact)
    assert manifest.to_json() == on_disk
    assert Manifest.from_json(on_disk, "m") == manifest and manifest.regions and manifest.devices
    assert manifest.region(manifest.regions[0].name) is manifest.regions[0]
