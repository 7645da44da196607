"""The model zoo's small variants import and run under IREE alone (equal to PyTorch eager), and
`collage bench` runs end to end on one small model with two peers, writing its JSON, table and chart."""

from __future__ import annotations

import json

import numpy as np

import pytest

from collage_mlir import zoo
from collage_mlir.measure.validate import compare

# IREE's llvm-cpu codegen against PyTorch eager on the same fp32 weights: sums in another order only.
RTOL = 1e-4


# Every small variant with -m bench. By default, test_onnx_zoo_whole.py checks GPT-2's and DCGAN's under IREE
# alone against PyTorch eager the same way (its engines' reference, compiled once there), and DCGAN runs
# through `collage bench` below.
DEFAULT_ZOO_TESTS: set[str] = set()


@pytest.mark.parametrize("name", [n if n in DEFAULT_ZOO_TESTS else pytest.param(n, marks=pytest.mark.bench)
                                  for n, m in zoo.MODELS.items() if m.framework is zoo.Framework.TORCH])
def test_zoo_small_variant_runs_under_iree_alone(name, torch, tmp_path):
    import collage_runtime

    from collage_mlir.frontends.torch import to_numpy
    from collage_mlir.ir import new_context
    from collage_mlir.iree import compile_module

    model, inputs = zoo.build(name, small=True)
    with torch.inference_mode():
        expected = model(*inputs)
    module = zoo.import_stablehlo(name, new_context(), small=True)
    compile_module(module, "default", tmp_path / "out", source=name)
    with collage_runtime.load(tmp_path / "out") as program:
        got = program.invoke("main", *[to_numpy(x) for x in inputs])
    # A bf16 model: eager rounds every op's result to bf16, IREE fuses and rounds less often; through a
    # ResNet's blocks that differs by up to ~6 % of the logits' scale (torch.compile too: studies/zoo_bench).
    rtol = 0.1 if expected.dtype == torch.bfloat16 else RTOL
    check = compare(got, [to_numpy(expected)], rtol, 0.0)
    assert check.ok, check.message
    with torch.inference_mode():
        other = model(*[torch.randn_like(x) if x.is_floating_point() else torch.randint_like(x, 100) for x in inputs])
    # The output depends on the input (no saturated activations), so a wrong engine cannot pass the check.
    assert compare([to_numpy(other)], [to_numpy(expected)], 1e-2, 0.0).max_rel > 0.1


def test_zoo_build_is_deterministic_and_cached(torch):
    from collage_mlir.frontends.torch import model_key

    (m1, x1), (m2, x2) = zoo.build("dcgan", small=True), zoo.build("dcgan", small=True)
    assert model_key(m1, x1) == model_key(m2, x2)  # so the import cache hits across processes
    assert zoo.flops("dcgan", small=True) > 0


@pytest.mark.fast
def test_unknown_model_is_one_error_line(capsys):
    from collage_mlir.tools.cli import main

    assert main(["bench", "resnet51", "--small"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'resnet51'" in err[0] and "resnet50" in err[0]


def test_bench_end_to_end_two_peers(torch, tmp_path, capsys):
    from collage_mlir.tools.cli import main

    # collage runs the whole model as one XLA region (ORT cannot take its stablehlo.reverse), so its
    # breakdown has a library region to time.
    assert main(["bench", "dcgan", "--small", "--vs", "torch,xla", "--plan", "whole:xla-cpu", "--seconds", "1.5",
                 "--breakdown-repeats", "5", "-o", str(tmp_path), "--name", "ci"]) == 0
    result = json.loads((tmp_path / "ci.json").read_text())
    (model,) = result["models"]
    by_name = {c["name"]: c for c in model["contenders"]}
    assert list(by_name) == ["collage", "torch", "xla"]
    for c in by_name.values():
        assert c["status"] == "ok", c
        assert c["median_ms"] > 0 and c["calls"] >= 5 and c["compile_s"] >= 0
        assert c["max_rel_err"] <= 1e-3
        assert c["peak_rss_mb"] >= c["rss_mb"] > 0
    assert by_name["torch"]["max_rel_err"] == 0.0  # the reference itself
    # Where collage's time went, from runs of its artifact: the one XLA region holds every op.
    breakdown = model["breakdown"]
    (region,) = breakdown["regions"]
    assert region["backend"] == "xla-cpu" and region["ops"] > 10 and breakdown["default_ops"] == 0
    assert breakdown["codegen"] == [] and breakdown["repeats"] >= 3
    assert 0 < region["engine_ms"] and region["boundary_ms"] >= 0
    # One region: the per-run sums are that region's times, and the rest of a run is outside it.
    assert breakdown["engine_ms"] == pytest.approx(region["engine_ms"])
    assert breakdown["boundary_ms"] == pytest.approx(region["boundary_ms"])
    assert 0 < breakdown["outside_ms"] < breakdown["total_ms"]
    best = min(("torch", "xla"), key=lambda n: by_name[n]["median_ms"])
    assert model["best_peer"] == best
    assert model["ratio_to_best_peer"] == pytest.approx(by_name[best]["median_ms"] / by_name["collage"]["median_ms"])
    table = (tmp_path / "ci.md").read_text()
    assert "| dcgan |" in table and "Geomean" in table
    assert "## Where collage's time goes" in table and "| region_0 | xla-cpu |" in table
    assert (tmp_path / "ci.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Results of separate runs merge into one report (here the same run twice: two rows, same ratio).
    assert main(["bench", "--merge", str(tmp_path / "ci.json"), str(tmp_path / "ci.json"), "-o", str(tmp_path),
                 "--name", "merged"]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert [m["model"] for m in merged["models"]] == ["dcgan", "dcgan"]
    assert merged["geomean_ratio_to_best_peer"] == pytest.approx(model["ratio_to_best_peer"])


@pytest.mark.parametrize("engine", ["ort", "openvino"])
def test_runtime_policy_peer_computes_what_the_user_peer_does(engine, torch, tmp_path):
    # The `-rt` peer is the same engine on the same ONNX under collage's runtime settings (no spinning,
    # no pinning): a thread policy, never different numbers.
    from collage_mlir.bench.contenders import CONTENDERS, SetupContext

    outs = {}
    for name in (engine, f"{engine}-rt"):
        work = tmp_path / name
        work.mkdir()
        prepared = CONTENDERS[name].setup(SetupContext("dcgan", True, 1, work))
        prepared.run()
        outs[name] = prepared.outputs()
    (user,), (rt,) = outs.values()
    np.testing.assert_allclose(rt, user, rtol=1e-5, atol=1e-5 * float(np.abs(user).max()))


@pytest.mark.fast
def test_no_contender_always_follows_the_same_one():
    """Interleaved timing's rounds (``bench.round_order``): every contender once per round, the same order for
    the same round, and over six rounds each contender follows at least two others (a rotation kept each one's
    predecessor: the program after Inductor's f32 BERT always paid for Inductor's leftovers)."""
    from collage_mlir.bench import round_order

    labels = ["collage", "static", "ort", "openvino", "openvino static", "inductor"]
    rounds = [round_order(labels, r) for r in range(6)]
    assert all(sorted(o) == sorted(labels) for o in rounds)
    assert round_order(labels, 3) == rounds[3]
    before: dict[str, set[str]] = {k: set() for k in labels}
    for order in rounds:
        for a, b in zip(order, order[1:]):
            before[b].add(a)
    assert all(len(before[k]) >= 2 for k in labels), before


def test_a_bf16_models_exact_arithmetic_is_written_for_the_check(torch, tmp_path):
    """The bench's info task writes a bf16 model's exact arithmetic (its bf16 weights and inputs computed in f32),
    which each contender is also checked against: it equals torch running the same model cast to f32. An f32
    model gets none (the reference alone checks it)."""
    from collage_mlir.bench.tasks import model_info
    from collage_mlir.measure.tasks import load_arrays

    model_info("resnet50_bf16", small=True, stablehlo=False, exact_file=str(tmp_path / "exact.npz"))
    (exact,) = load_arrays(str(tmp_path / "exact.npz"), "out")
    model, (x,) = zoo.build("resnet50_bf16", small=True)
    with torch.no_grad():
        want = model.float()(x.float()).numpy()
    assert compare([exact], [want], RTOL, 0.0).ok
    model_info("dcgan", small=True, stablehlo=False, exact_file=str(tmp_path / "f32.npz"))
    assert not (tmp_path / "f32.npz").exists()
