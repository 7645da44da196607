"""A CPU program's ``sync`` functions are called straight through the VM context (``DirectCall``), not
through IREE's ``FunctionInvoker``: the same results, the same errors, the invoker's way for whatever the
direct call does not take."""

from __future__ import annotations

import numpy as np
import pytest

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context, parse_module
from collage_runtime import rt_module
from collage_runtime.program import DirectCall, InputError, ProgramClosed
from collage_runtime.rt_module import RegionFailure

from helpers import LIT_INPUTS

MLP = (LIT_INPUTS / "mlp.mlir").read_text()
PLAN = str(LIT_INPUTS / "mlp-plan.json")  # the first layer on onednn: a served region


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (8, 16), (16,), (16, 4))]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("direct")
    compile_module(parse_module(MLP, new_context()), PLAN, root / "mixed")
    return root / "mixed"


def _invoker_only(prog):
    """``prog`` made to call ``main`` through IREE's invoker (the way before ``DirectCall``)."""
    prog._direct_calls["main"] = None
    return prog


def test_direct_call_equals_the_invoker(mixed):
    with collage_runtime.load(mixed) as direct, _invoker_only(collage_runtime.load(mixed)) as invoker:
        assert isinstance(direct._direct("main", _inputs(0)), DirectCall)
        assert invoker._direct("main", _inputs(0)) is None
        kept = []
        for seed in range(3):  # results stay valid while later calls reuse IREE's freed blocks
            xs = _inputs(seed)
            (y,) = direct.invoke("main", *xs)
            (want,) = invoker.invoke("main", *xs)
            np.testing.assert_array_equal(y, want)
            # a slice alone holds its result's buffer (as a padded result cut back does)
            kept += [(y.copy(), y), (y[1:].copy(), y[1:]), (want[1:].copy(), want[1:])]
            del y, want
        for copy, y in kept:
            np.testing.assert_array_equal(y, copy)
        # device_function: DeviceArrays in and out, as IREE's invoker gives them
        fn = direct.device_function("main")
        out = fn(*(direct.to_device(x) for x in _inputs(1)))
        assert isinstance(out, collage_runtime.program.rt.DeviceArray)
        np.testing.assert_array_equal(direct.to_host(out)[0], invoker.invoke("main", *_inputs(1))[0])


def test_what_the_direct_call_refuses_goes_the_invokers_way(mixed):
    xs = _inputs(0)
    with collage_runtime.load(mixed) as prog:
        direct = prog._direct("main", xs)
        assert direct is not None
        assert not direct.takes(xs[:3])  # count
        assert not direct.takes([xs[0].astype(np.float64), *xs[1:]])  # dtype
        assert not direct.takes([xs[0][:1], *xs[1:]])  # shape
        assert not direct.takes([xs[0].tolist(), *xs[1:]])  # not an array
        with pytest.raises(InputError, match=r"input 0: expected tensor<2x8xf32>, got float32\[1, 8\]"):
            prog.invoke("main", xs[0][:1], *xs[1:])
    with pytest.raises(ProgramClosed):
        prog.invoke("main", *xs)


def test_a_region_failure_through_the_direct_call_is_one_line(mixed, monkeypatch):
    def load(path, engines):
        def run(inputs, outputs):
            raise ValueError("the engine refused this input")
        return run

    monkeypatch.setattr(rt_module, "executor", lambda name: load)
    with collage_runtime.load(mixed) as prog:
        assert prog._direct("main", _inputs(0)) is not None
        with pytest.raises(RegionFailure, match=r"^region '\w+' \(onednn\) failed: ValueError: the engine refused"):
            prog.invoke("main", *_inputs(0))
        with pytest.raises(RegionFailure):
            prog.device_function("main")(*_inputs(0))
