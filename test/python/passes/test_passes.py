"""The pass base (collage_mlir/passes/base.py): frozen passes, options parsed by their fields' types,
failures collected per pipeline run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from collage_mlir.errors import CollageError
from collage_mlir.ir import ir, new_context, parse_module
from collage_mlir.passes import PartitionPipeline, PassPipeline, registry
from collage_mlir.passes.assign import AssignPass
from collage_mlir.passes.base import ModulePass, parse_options
from collage_mlir.passes.lower import LowerPass
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.passes.place_devices import DEFAULT_FLAGS, PlaceDevicesPass

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`

NEG = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


@dataclass(frozen=True)
class Typed(ModulePass):
    name = "test-typed"
    count: int = 1
    scale: float = 1.0
    strict: bool = False
    label: str = "x"
    names: tuple[str, ...] = ("a",)
    sizes: tuple[int, ...] = ()
    out: Path | None = None
    limit: int | None = None

    def run(self, module) -> None:
        pass


@dataclass(frozen=True)
class FailIfMarked(ModulePass):
    """Fails on a module carrying the unit attribute ``test.fail``."""

    name = "test-fail-if-marked"

    def run(self, module) -> None:
        if "test.fail" in module.operation.attributes:
            raise CollageError("marked to fail")


def test_options_parse_by_field_type():
    p = Typed.from_options("count=3 scale=0.5 strict=true label=hi names=p,q,r sizes=1,2 out=/tmp/o limit=7")
    assert p == Typed(3, 0.5, True, "hi", ("p", "q", "r"), (1, 2), Path("/tmp/o"), 7)
    assert Typed.from_options("") == Typed()
    assert Typed.from_options("strict") == Typed(strict=True)  # a bool option alone means true
    assert Typed.from_options("strict=0 names= out= limit=") == Typed(strict=False, names=())
    assert Typed.from_options("strict=False").strict is False


def test_the_passes_options_are_typed():
    assert PlaceDevicesPass.from_options("default-flags=--a=1,--b").default_flags == ("--a=1", "--b")
    assert PlaceDevicesPass.from_options("").default_flags == DEFAULT_FLAGS
    assert LowerPass.from_options("artifact-dir=/tmp/x").artifact_dir == Path("/tmp/x")
    assert LowerPass.from_options("artifact_dir=").artifact_dir is None
    assert AssignPass.from_options("plan=p.json").plan == Path("p.json")
    assert AssignPass().plan is None
    part = PartitionPipeline.from_options("plan=p.json artifact-dir=out default-flags=--x,--y")
    assert part == PartitionPipeline(Path("p.json"), Path("out"), ("--x", "--y"))
    assert [type(p) for p in part.passes()] == list(registry().values())
    assert part.passes()[-1].default_flags == ("--x", "--y")


@pytest.mark.parametrize("text, message", [
    ("count=three", "collage-opt: option 'count' of --test-typed: expected int, got 'three'"),
    ("count=1.5", "collage-opt: option 'count' of --test-typed: expected int, got '1.5'"),
    ("strict=maybe", "collage-opt: option 'strict' of --test-typed: expected true or false, got 'maybe'"),
    ("scale=big", "collage-opt: option 'scale' of --test-typed: expected float, got 'big'"),
    ("sizes=1,x", "collage-opt: option 'sizes' of --test-typed: expected comma-separated int, got '1,x'"),
    ("limit=lots", "collage-opt: option 'limit' of --test-typed: expected int or none, got 'lots'"),
    ("colour=red", "collage-opt: unknown option 'colour=red' for --test-typed (options: count, scale, strict, "
                   "label, names, sizes, out, limit)"),
    ("count", "collage-opt: unknown option 'count' for --test-typed"),
])
def test_a_bad_option_is_one_line_naming_pass_option_and_type(text, message):
    with pytest.raises(CollageError) as err:
        Typed.from_options(text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_bad_partition_option():
    with pytest.raises(CollageError, match=r"^collage-opt: unknown option 'plans=x' for --collage-partition "
                                           r"\(options: plan, artifact-dir, default-flags, kernel-arch\)$"):
        PartitionPipeline.from_options("plans=x")


def test_parse_options_takes_any_dataclass():
    @dataclass(frozen=True)
    class Opts:
        n: int = 0

    assert parse_options(Opts, "n=4", name="x") == Opts(4)


def test_passes_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PlaceDevicesPass().default_flags = ("--x",)
    with pytest.raises(TypeError):  # a pass must be a frozen dataclass too
        @dataclass
        class Mutable(ModulePass):
            name = "test-mutable"
            x: int = 0

            def run(self, module) -> None:
                pass
    with pytest.raises(TypeError):  # run() is abstract
        ModulePass()


def _module(ctx: ir.Context, marked: bool) -> ir.Module:
    text = ("module attributes {test.fail} {" if marked else "module {") + NEG + "}"
    return parse_module(text, ctx)


def test_a_pipeline_run_reports_only_its_own_failures():
    ctx = new_context()
    pipeline = PassPipeline(ctx)
    pipeline.add(NumberOpsPass())
    pipeline.add(FailIfMarked())
    pipeline.add("canonicalize")
    with pytest.raises(CollageError, match="^marked to fail$"):
        pipeline.run(_module(ctx, marked=True))
    pipeline.run(_module(ctx, marked=False))  # nothing stale from the failing run
    other = PassPipeline(ctx)
    other.add(NumberOpsPass())
    other.run(_module(ctx, marked=True))  # another pipeline: no pass failed, no failure


def test_a_failure_in_a_nested_run_stays_there():
    """A pass that runs a pipeline of its own and handles its failure: the outer run still succeeds (with
    one module-global list of failures, the inner run's failure was reported by the outer run)."""
    seen = []

    @dataclass(frozen=True)
    class Nested(ModulePass):
        name = "test-nested"

        def run(self, module) -> None:
            inner_ctx = new_context()
            inner = PassPipeline(inner_ctx)
            inner.add(FailIfMarked())
            try:
                inner.run(_module(inner_ctx, marked=True))
            except CollageError as exc:
                seen.append(str(exc))

    ctx = new_context()
    outer = PassPipeline(ctx)
    outer.add(Nested())
    outer.run(_module(ctx, marked=False))
    assert seen == ["marked to fail"]
    outer.add(FailIfMarked())
    with pytest.raises(CollageError, match="^marked to fail$"):
        outer.run(_module(ctx, marked=True))
    assert seen == ["marked to fail"] * 2


def test_a_pass_failure_is_a_diagnostic_on_its_op():
    ctx = new_context()
    diagnostics = []

    def handler(d):
        diagnostics.append((str(d.location), d.message))
        return True

    ctx.emit_error_diagnostics = True  # errors go to handlers, as collage-opt --verify-diagnostics has them
    ctx.attach_diagnostic_handler(handler)
    pipeline = PassPipeline(ctx)
    pipeline.add(NumberOpsPass())
    pipeline.add(AssignPass())  # no plan option and no collage.plan attribute
    module = _module(ctx, marked=False)
    with pytest.raises(CollageError, match="--collage-assign needs a plan"):
        pipeline.run(module)
    on = [loc for loc, message in diagnostics if "--collage-assign needs a plan" in message]
    assert on == [str(module.operation.location)]  # no op named: on the module


def test_a_failure_nobody_collected_is_one_error_with_the_diagnostics():
    ctx = new_context()
    pipeline = PassPipeline(ctx)
    with pytest.raises(ValueError):
        pipeline.add("no-such-pass")
    FailIfMarked().add_to(pipeline.pm)  # added behind the pipeline's back: no report
    with pytest.raises(CollageError, match="^pass pipeline failed: .*marked to fail"):
        pipeline.run(_module(ctx, marked=True))
