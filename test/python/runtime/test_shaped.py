"""One artifact for a range of shapes (``collage compile --dim``): each bucket's shape runs its own static
program, a shape between buckets is padded (a declared batch) or runs on ONNX Runtime's dynamic model, a
shape outside the range is one error line, and every result equals the source model's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import collage_runtime
from collage_mlir.tools.cli import main as collage
from collage_mlir.frontends.dims import DimPlan, parse_dim
from collage_mlir.shaped import choose_fallback, dynamic_ratio
from collage_runtime.manifest import ArtifactError
from collage_runtime.shapes import Fallback
from collage_runtime.weights import MIN_BYTES, WEIGHTS

from models import onnx_cnn, torch_mlp

RTOL = ATOL = 1e-5  # f32, the same kernels per bucket: within rounding


@pytest.fixture(scope="module")
def dynamic_cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("dyn") / "cnn.onnx"
    onnx_cnn(path, batch="batch")
    return path


def reference(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_buckets_padding_and_the_fallback(dynamic_cnn, tmp_path, capsys):
    padded, dynamic = tmp_path / "padded.collage", tmp_path / "dynamic"
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=1:2:6", "--bucket", "batch=1,4,6", "--pad", "batch",
                    "-o", str(padded)]) == 0
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=1:2:6", "--bucket", "batch=1,4,6",
                    "--plan", "prefer:ort", "--fallback", "openvino", "-o", str(dynamic)]) == 0
    rng = np.random.default_rng(0)
    want = {"padded": {1: "bucket batch=1", 3: "padded to batch=4", 4: "bucket batch=4", 5: "padded to batch=6"},
            "dynamic": {1: "bucket batch=1", 3: "openvino fallback", 4: "bucket batch=4", 5: "openvino fallback"}}
    for name, art in (("padded", padded), ("dynamic", dynamic)):
        with collage_runtime.load(art) as program:
            assert isinstance(program, collage_runtime.ShapedProgram)
            kept = []
            for batch, served in want[name].items():
                x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
                before = x.copy()
                (y,) = program.invoke("main", x)
                assert program.served(x) == served
                np.testing.assert_allclose(y, reference(dynamic_cnn, x), rtol=RTOL, atol=ATOL)
                assert np.array_equal(x, before)  # padding copies; the caller's data stays untouched
                kept.append((y.copy(), y))
            for copy, y in kept:  # a padded result (a slice of the bucket's) holds its buffer through later calls
                np.testing.assert_array_equal(y, copy)
            with pytest.raises(collage_runtime.program.InputError,
                               match=r"input 0 axis 0 \(dim 'batch'\) is 7, outside the declared range 1..6"):
                program.invoke("main", np.zeros((7, 3, 8, 8), np.float32))
            # Checked before any engine sees them, the fallback's included: one line, not ORT's exception.
            with pytest.raises(collage_runtime.program.InputError, match="input 0: expected float32, got float64"):
                program.invoke("main", np.zeros((3, 3, 8, 8)))
            with pytest.raises(collage_runtime.program.InputError, match="input 0 axis 2 is 7, the model's is 8"):
                program.invoke("main", np.zeros((3, 3, 7, 8), np.float32))
    with collage_runtime.load(dynamic) as program:
        table = program.table
        assert table.fallback is Fallback.OPENVINO and table.outputs == (("batch", None),)
        # Each bucket is placed by the plan given: prefer:ort puts every region on ONNX Runtime.
        assert all({r.backend for r in program.program(b).manifest.regions} == {"ort"} for b in table.buckets)
    capsys.readouterr()  # IREE takes StableHLO: an ONNX model's fallback is ORT or OpenVINO, one line
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=1:2:6", "--fallback", "iree", "-o",
                    str(tmp_path / "no")]) == 2
    assert capsys.readouterr().err == ("collage: error: --fallback: iree does not run this model with its dynamic "
                                       "dims; ort or openvino does\n")
    # `collage report` reports one program: it names the buckets' directories, and reports one of them with
    # its graph (the source model drawn at the bucket's shape) and its regions' measured times.
    assert collage(["report", str(dynamic), "--no-run", "-o", str(tmp_path / "r.html")]) == 2
    assert f"report a bucket: {dynamic / table.buckets[0].path} (batch=1)" in capsys.readouterr().err
    assert collage(["report", str(dynamic / table.buckets[0].path), "-o", str(tmp_path / "b.html")]) == 0
    assert "no graph drawn" not in capsys.readouterr().out and "<svg" in (tmp_path / "b.html").read_text()


def test_the_fallback_is_the_faster_engine_on_the_dynamic_model(dynamic_cnn):
    plan = DimPlan.of([parse_dim("batch=1:2:16")], {"batch": (1, 16)})
    choice = choose_fallback(dynamic_cnn, plan, (("batch", None, None, None),), [Fallback.ORT, Fallback.OPENVINO])
    chosen, times = choice.chosen, choice.times
    assert set(times) == {Fallback.ORT, Fallback.OPENVINO} and times[chosen] == min(times.values())
    assert not choice.failed and choice.line().startswith("between buckets: ort ")
    # The fallback's slowdown against a static program, as --shapes weighs buckets by it.
    ratio = dynamic_ratio(dynamic_cnn, plan, (("batch", None, None, None),), chosen)
    assert 0.2 < ratio < 5 and dynamic_ratio(dynamic_cnn, plan, (), Fallback.NONE) == float("inf")


def test_cli_run_refuses_a_shape_out_of_range_in_one_line(dynamic_cnn, tmp_path):
    art = tmp_path / "art"
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=2:2:3", "--bucket", "batch=2", "--fallback", "ort",
                    "-o", str(art)]) == 0
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 8, 8), np.float32))
    run = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "run", str(art), "--input",
                          str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "dim 'batch') is 4, outside the declared range 2..3" in run.stderr
    # The fallback model is checked like every file of an artifact.
    (art / "fallback" / "model.onnx").write_bytes(b"not the model")
    with pytest.raises(ArtifactError, match="fallback model does not match its SHA-256"):
        collage_runtime.load(art)


@pytest.mark.fast
def test_an_engines_error_keeps_its_reason():
    """OpenVINO's reason comes after a chain of its source locations, which a cut at the front kept alone
    ("openvino: Exception from src/inference/src/cpp/core.cpp:117: Exception from src/inference/src/dev/plugin.cpp:54:
    Exception from sr"); ONNX Runtime's comes last."""
    from collage_runtime.engines import engine_message

    chain = RuntimeError("Exception from src/inference/src/cpp/core.cpp:117:\nException from "
                         "src/inference/src/dev/plugin.cpp:54:\nCheck 'index < m_inputs.size()' failed")
    assert engine_message(chain) == "Check 'index < m_inputs.size()' failed"
    long = RuntimeError("[ONNXRuntimeError] : 1 : FAIL : " + "x" * 300 + " Unsupported model IR version: 14")
    assert engine_message(long, 60).endswith("Unsupported model IR version: 14") and len(engine_message(long, 60)) == 63
    assert engine_message(ValueError()) == "ValueError"


def test_an_engine_error_in_the_fallback_is_one_line(tmp_path, capsys):
    """An embedding lookup with a dynamic batch: ids out of the table's range make the fallback engine (ONNX
    Runtime) raise; `collage run` says so in one line naming the fallback (it was a traceback). A fallback
    its engine cannot load (an ONNX IR version newer than ONNX Runtime's) is refused at compile time (it was
    written, and failed at every call between buckets)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "embed",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 99
    onnx.save(model, tmp_path / "embed.onnx")
    art = tmp_path / "art"
    assert collage(["compile", str(tmp_path / "embed.onnx"), "--dim", "batch=1:1:4", "--bucket", "batch=1,4",
                    "--fallback", "ort", "-o", str(art)]) == 1
    assert "the fallback engine cannot load the model: fallback/model.onnx: ort cannot load" in capsys.readouterr().err
    assert not art.exists()
    model.ir_version = 8
    onnx.save(model, tmp_path / "embed.onnx")
    assert collage(["compile", str(tmp_path / "embed.onnx"), "--dim", "batch=1:1:4", "--bucket", "batch=1,4",
                    "--fallback", "ort", "-o", str(art)]) == 0
    np.save(tmp_path / "ids.npy", np.array([0, 99], np.int64))
    run = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "run", str(art), "--input",
                          str(tmp_path / "ids.npy")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "region 'fallback' (ort) failed: " in run.stderr and "idx=99" in run.stderr


def test_dynamic_onnx_needs_its_dims_declared_or_an_input(dynamic_cnn, tmp_path, capsys):
    assert collage(["compile", str(dynamic_cnn), "-o", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dynamic dims: batch (x axis 0)" in err and "--dim batch=" in err
    assert collage(["compile", str(dynamic_cnn), "--dim", "seq=1:2:4", "-o", str(tmp_path / "a")]) == 2
    assert "'seq' is not a dynamic dim of the model (it has: batch)" in capsys.readouterr().err
    # Example inputs fix the shape: a static artifact for it.
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert collage(["compile", str(dynamic_cnn), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "s")]) == 0
    with collage_runtime.load(tmp_path / "s") as program:
        np.testing.assert_allclose(program.invoke("main", x)[0], reference(dynamic_cnn, x), rtol=RTOL, atol=ATOL)


def test_torch_factory_axes_named_by_argument_and_axis(tmp_path, capsys):
    art = tmp_path / "mlp"
    assert collage(["compile", "models:torch_mlp", "--dim", "0.0=1:2:8", "--bucket", "0.0=2,8", "--pad", "0.0",
                    "-o", str(art)]) == 0
    model, _ = torch_mlp()
    import torch

    x = np.random.default_rng(2).standard_normal((5, 32)).astype(np.float32)
    with collage_runtime.load(art) as program, torch.no_grad():
        assert program.served(x) == "padded to 0.0=8"
        np.testing.assert_allclose(program.invoke("main", x)[0], model(torch.from_numpy(x)).numpy(), rtol=1e-5,
                                   atol=1e-5)
    # Without padding, nothing serves batch 3: refused before anything is built.
    assert collage(["compile", "models:torch_mlp", "--dim", "0.0=1:2:8", "-o", str(tmp_path / "b")]) == 2
    assert "nothing would serve 0.0=3" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    # An axis the model cannot vary is the model's own error, in one line.
    assert collage(["compile", "models:torch_mlp", "--dim", "0.1=16", "-o", str(tmp_path / "c")]) == 2
    assert "does not run at 0.1=16" in capsys.readouterr().err


def test_buckets_chosen_for_a_request_trace(dynamic_cnn, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{"batch": 3}] * 5 + [{"batch": 7}]))
    art = tmp_path / "art"
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=1:3:8", "--shapes", str(trace), "--pad", "batch",
                    "-o", str(art)]) == 0
    err = capsys.readouterr().err
    assert "6 requests;" in err and "a static program; buckets:" in err
    with collage_runtime.load(art) as program:
        values = [b.values["batch"] for b in program.table.buckets]
        # No fallback where padding serves every shape: the top bucket, then what the trace is worth.
        assert 8 in values and program.table.fallback is Fallback.NONE
        x = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(program.invoke("main", x)[0], reference(dynamic_cnn, x), rtol=RTOL, atol=ATOL)
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=1:3:8", "--shapes", str(trace), "--bucket",
                    "batch=1", "-o", str(tmp_path / "b")]) == 2
    assert "--shapes chooses the buckets" in capsys.readouterr().err


def test_each_bucket_tuned_and_its_plan_compiled(dynamic_cnn, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLLAGE_DB", str(tmp_path / "costs.sqlite"))
    flags = ["--dim", "batch=1:4:4", "--bucket", "batch=1,4"]
    assert collage(["tune", str(dynamic_cnn), *flags, "--budget", "40s", "--backends", "ort", "-o",
                    str(tmp_path / "plans")]) == 0
    plans = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "plans").glob("*.json")}
    assert set(plans) == {"batch=1", "batch=4"}
    assert collage(["compile", str(dynamic_cnn), *flags, "--plan", "tuned", "-o", str(tmp_path / "art")]) == 0
    assert "no tuned plan" not in capsys.readouterr().err
    x = np.random.default_rng(4).standard_normal((4, 3, 8, 8)).astype(np.float32)
    with collage_runtime.load(tmp_path / "art") as program:
        for bucket in program.table.buckets:  # each bucket compiled with the plan tuned for its shape
            tuned = plans[bucket.label]
            built = program.program(bucket).manifest
            placed = lambda regions: [(r["backend"], r["ops"]) for r in regions]  # noqa: E731
            assert placed(built.plan["regions"]) == placed(tuned["regions"]) and built.provenance["plan"] == "tuned"
        np.testing.assert_allclose(program.invoke("main", x)[0], reference(dynamic_cnn, x), rtol=RTOL, atol=ATOL)
    # With -o a .json file, a tune of several buckets is refused in one line.
    assert collage(["tune", str(dynamic_cnn), *flags, "-o", str(tmp_path / "plan.json")]) == 2


def test_compile_tune_carries_each_buckets_plan_to_the_next(dynamic_cnn, tmp_path, monkeypatch):
    """`collage compile --dim ... --tune`: the second bucket's search is seeded with the first bucket's plan,
    moved to its module, though the first bucket's module was compiled in between (holding its graph then
    segfaulted). The search itself is a stand-in that returns ORT's whole-model plan and records what it was
    given; the artifact equals ONNX Runtime on the source at a padded shape."""
    from types import SimpleNamespace

    import collage_mlir.entry
    from collage_mlir.graph import Graph
    from collage_mlir.search import resolve_plan
    from collage_mlir.tools import tune_cmd

    given = []

    def search(module, examples, backends, budget, seed, db, carried=()):
        given.append(list(carried))
        return SimpleNamespace(plan=resolve_plan("whole:ort", Graph(module)), tuned=SimpleNamespace(record=None))

    monkeypatch.setattr(tune_cmd, "tune_model", search)
    monkeypatch.setattr(tune_cmd, "print_summary", lambda *a: None)
    monkeypatch.setattr(collage_mlir.entry, "plan_provenance", lambda *a: {"plan": "tune"})
    assert collage(["compile", str(dynamic_cnn), "--dim", "batch=1:4:4", "--bucket", "batch=1,4", "--pad", "batch",
                    "--tune", "-o", str(tmp_path / "art")]) == 0
    assert [len(c) for c in given] == [0, 1]
    assert [r.backend for r in given[1][0].regions] == ["ort"] and given[1][0].source.startswith("carried from")
    x = np.random.default_rng(5).standard_normal((3, 3, 8, 8)).astype(np.float32)
    with collage_runtime.load(tmp_path / "art") as program:
        assert program.served(x) == "padded to batch=4"
        np.testing.assert_allclose(program.invoke("main", x)[0], reference(dynamic_cnn, x), rtol=RTOL, atol=ATOL)


def test_buckets_and_the_fallback_share_one_copy_of_each_weight(tmp_path):
    """The buckets' ONNX regions and the fallback model take their weights from the artifact's one weight
    store, each distinct tensor once; results equal the source model's on every engine; a changed store is
    refused."""
    import onnx

    model = tmp_path / "cnn.onnx"
    onnx_cnn(model, batch="batch", channels=32)  # the conv weight: 3,456 bytes, shared; the rest stays inline
    conv = 32 * 3 * 3 * 3 * 4
    rng = np.random.default_rng(2)
    for plan, fallback in (("prefer:ort", "openvino"), ("whole:openvino", "ort")):
        art = tmp_path / plan.replace(":", "_")
        assert collage(["compile", str(model), "--dim", "batch=1:2:6", "--bucket", "batch=1,4", "--plan", plan,
                        "--fallback", fallback, "-o", str(art)]) == 0
        assert conv <= (art / WEIGHTS).stat().st_size < 2 * conv  # three files read it: one copy
        files = [onnx.load(str(p), load_external_data=False) for p in art.rglob("*.onnx")]
        assert len(files) >= 3
        for f in files:
            assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in f.graph.initializer
                       if len(t.raw_data) >= MIN_BYTES or t.name == "w")
        with collage_runtime.load(art) as program:
            for batch in (1, 3, 4):
                x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
                np.testing.assert_allclose(program.invoke("main", x)[0], reference(model, x), rtol=RTOL, atol=ATOL)
            assert program.served(x[:3]) == f"{fallback} fallback"
            bucket = art / program.table.buckets[-1].path
        with collage_runtime.load(bucket) as alone:  # one bucket's directory (`collage report` takes one)
            np.testing.assert_allclose(alone.invoke("main", x)[0], reference(model, x), rtol=RTOL, atol=ATOL)
        assert collage(["report", str(bucket), "-o", str(tmp_path / f"{art.name}.html")]) == 0  # profiles it
    store = bytearray((art / WEIGHTS).read_bytes())
    store[-1] ^= 1
    (art / WEIGHTS).write_bytes(bytes(store))
    with pytest.raises(ArtifactError, match="weight store does not match its SHA-256"):
        collage_runtime.load(art)


def test_a_fallback_whose_initializers_are_also_inputs_reads_the_store(tmp_path):
    """Older exporters list every initializer among the graph's inputs too: OpenVINO's fallback still takes
    them from the weight store."""
    import onnx

    model = tmp_path / "cnn.onnx"
    onnx_cnn(model, batch="batch", channels=32)
    proto = onnx.load(str(model))
    proto.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in proto.graph.initializer)
    onnx.save(proto, str(model))
    art = tmp_path / "art"
    assert collage(["compile", str(model), "--dim", "batch=1:2:4", "--bucket", "batch=2", "--fallback", "openvino",
                    "-o", str(art)]) == 0
    x = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)
    with collage_runtime.load(art) as program:
        assert program.served(x) == "openvino fallback" and program.table.weights_sha256 is not None
        np.testing.assert_allclose(program.invoke("main", x)[0], reference(model, x), rtol=RTOL, atol=ATOL)


def test_a_model_with_external_data_gets_a_self_contained_fallback(tmp_path):
    """torch's dynamo exporter writes the weights beside the model (model.onnx.data): the artifact's
    fallback is one file with them inside, and runs."""
    import onnx

    onnx_cnn(tmp_path / "plain.onnx", batch="batch")
    onnx.save(onnx.load(str(tmp_path / "plain.onnx")), str(tmp_path / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    assert (tmp_path / "m.onnx.data").is_file()
    art = tmp_path / "art"
    assert collage(["compile", str(tmp_path / "m.onnx"), "--dim", "batch=1:2:4", "--bucket", "batch=2", "--fallback",
                    "ort", "-o", str(art)]) == 0
    assert sorted(p.name for p in (art / "fallback").iterdir()) == ["model.onnx"]
    x = np.random.default_rng(5).standard_normal((3, 3, 8, 8)).astype(np.float32)
    with collage_runtime.load(art) as program:
        assert program.served(x) == "ort fallback"
        np.testing.assert_allclose(program.invoke("main", x)[0], reference(tmp_path / "plain.onnx", x), rtol=RTOL,
                                   atol=ATOL)
