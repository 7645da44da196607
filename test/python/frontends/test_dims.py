"""Dynamic dims declared on the command line: ranges, buckets, what serves the shapes between them, a
model's dynamic axes read and specialised, and the shape table's JSON."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from collage_mlir.errors import CollageError
from collage_mlir.frontends.dims import (PYTHON, DimPlan, ShapeTrace, check_declared, choose_buckets, onnx_axes,
                                       parse_bucket, parse_dim, specialise_onnx, undeclared_line)
from collage_mlir.shaped import output_axes
from collage_runtime.manifest import ArtifactError
from collage_runtime.shapes import Bucket, DimRange, Fallback, ShapeTable

from models import onnx_cnn

pytestmark = pytest.mark.fast


def test_parse_dim_and_bucket():
    assert parse_dim("batch=1:8:32") == DimRange("batch", 1, 8, 32)
    assert parse_dim(" seq = 16 ") == DimRange("seq", 16, 16, 16)
    assert parse_dim("0.1=2:2:9") == DimRange("0.1", 2, 2, 9)
    assert parse_bucket("batch=8,1,4,4") == ("batch", (1, 4, 8))
    for bad in ("batch", "batch=1:8", "batch=0:1:2", "batch=8:4:32", "batch=a:b:c"):
        with pytest.raises(CollageError) as err:
            parse_dim(bad)
        assert err.value.exit_code == 2 and "\n" not in str(err.value)


@pytest.mark.fast
def test_errors_name_the_flags_or_the_keywords_the_user_wrote():
    """The command line's dims are refused by their flags, Python's (``DimPlan.declared``, the API entry
    points) by their keywords."""
    for make, words in ((lambda: DimPlan.of([parse_dim("b=1:2:4")], {}, ["q"]), "--pad: "),
                        (lambda: DimPlan.declared({"b": (1, 2, 4)}, pad=["q"]), "pad: "),
                        (lambda: DimPlan.declared({"b": (1, 2, 4)}, {"b": [9]}), "buckets: ")):
        with pytest.raises(CollageError) as err:
            make()
        assert str(err.value).startswith(words)
    with pytest.raises(CollageError, match=r"^dims: dynamic dim 'b' has no range: give dims=\{'b': \(MIN, OPT, MAX\)\}"):
        check_declared((("b", None),), [], PYTHON)
    with pytest.raises(CollageError, match="^--dim: dynamic dim 'b' has no range: give --dim b=MIN:OPT:MAX"):
        check_declared((("b", None),), [])


def test_buckets_are_the_grid_of_each_dims_values():
    plan = DimPlan.of([parse_dim("batch=1:2:8"), parse_dim("seq=16:64:128")], {"seq": (16, 128)})
    assert plan.values == {"batch": (1, 2, 8), "seq": (16, 128)}
    assert len(plan.grid()) == 6 and {"batch": 8, "seq": 128} in plan.grid()
    with pytest.raises(CollageError, match="outside its range"):
        DimPlan.of([parse_dim("batch=1:2:8")], {"batch": (9,)})
    with pytest.raises(CollageError, match="not a declared dim"):
        DimPlan.of([parse_dim("batch=1:2:8")], pad=["seq"])


def test_what_serves_the_shapes_between_buckets():
    batch = [parse_dim("batch=1:4:8")]
    assert DimPlan.of(batch).unserved(fallback=True) is None
    assert DimPlan.of(batch).unserved(fallback=False) == "batch=2"
    assert DimPlan.of(batch, pad=["batch"]).unserved(fallback=False) is None
    # Padding grows a shape, never shrinks it: the range's top must be a bucket.
    assert DimPlan.of(batch, {"batch": (1, 4)}, pad=["batch"]).unserved(fallback=False) == "batch=8"
    assert DimPlan.of(batch, {"batch": range(1, 9)}).unserved(fallback=False) is None


def test_onnx_dynamic_axes_read_and_specialised(tmp_path):
    onnx_cnn(tmp_path / "m.onnx", batch="batch")
    model = onnx.load(str(tmp_path / "m.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[2].ClearField("dim_value")  # an unnamed dynamic axis
    onnx.save(model, str(tmp_path / "m.onnx"))
    inputs, outputs = onnx_axes(model)
    assert inputs == (("batch", None, "x.2", None),) and outputs == (("batch", None),)
    assert undeclared_line(inputs, ["x"]).startswith("the model has dynamic dims: batch (x axis 0), x.2 (x axis 2);")
    static = onnx.load(str(specialise_onnx(tmp_path / "m.onnx", {"batch": 3, "x.2": 8}, tmp_path)))
    assert [d.dim_value for d in static.graph.input[0].type.tensor_type.shape.dim] == [3, 3, 8, 8]
    assert [d.dim_value for d in static.graph.output[0].type.tensor_type.shape.dim] == [3, 5]


def test_output_axes_read_from_the_buckets_shapes():
    plan = DimPlan.of([parse_dim("batch=1:2:4"), parse_dim("seq=8:8:16")], pad=["batch"])
    buckets = plan.grid()
    shapes = [[(b["batch"], b["seq"], 5), (7,)] for b in buckets]
    assert output_axes(plan, buckets, shapes) == (("batch", "seq", None), (None,))
    # An axis that grows twice as fast as the batch cannot be cut back after padding.
    doubled = [[(2 * b["batch"], 5)] for b in buckets]
    with pytest.raises(CollageError, match="padding cannot be undone"):
        output_axes(plan, buckets, doubled)


def test_shape_table_json_round_trip_and_checks():
    table = ShapeTable((DimRange("batch", 1, 2, 4),), (("batch", None),), (("batch",),),
                       (Bucket({"batch": 1}, "buckets/1"), Bucket({"batch": 4}, "buckets/4")), ("batch",),
                       Fallback.ORT, "0" * 64)
    assert ShapeTable.from_json(table.to_json(), "t") == table
    for broken in ({"dims": "x"}, {"inputs": [["seq"]]}, {"buckets": []}, {"fallback": "tensorrt"},
                   {"buckets": [{"values": {}, "path": "b"}]}, {"version": 99}):
        with pytest.raises(ArtifactError):
            ShapeTable.from_json(table.to_json() | broken, "t")
    assert np.int64(3) in DimRange("b", 1, 2, 4)


def test_buckets_chosen_for_a_trace():
    plan = DimPlan.of([parse_dim("batch=1:1:4"), parse_dim("seq=8:64:128")])
    requests = [{"batch": 1, "seq": 64}] * 10 + [{"batch": 1, "seq": 32}] * 3 + [{"batch": 4, "seq": 100}]
    trace = ShapeTrace.from_json(requests, plan.dims, "t")
    # The fallback 10 % slower than a static program: buckets by their share of the trace's work.
    assert choose_buckets(plan, trace, 1.1, 1) == [{"batch": 1, "seq": 64}]
    # seq 32 would cut 0.8 % of what is left: below min_gain (1 %), not worth a compile. The largest request,
    # 4 x 100, comes once: no evidence it recurs, so no bucket; twice, it gets one.
    assert choose_buckets(plan, trace, 1.1, 8) == [{"batch": 1, "seq": 64}]
    twice = ShapeTrace.from_json(requests + [{"batch": 4, "seq": 100}], plan.dims, "t")
    assert choose_buckets(plan, twice, 1.1, 8) == [{"batch": 1, "seq": 64}, {"batch": 4, "seq": 100}]
    assert len(choose_buckets(plan, twice, 1.1, 8, min_gain=0.001)) == 3
    # No gain: the fallback as fast as a static program. Still one bucket (an artifact holds one), at OPT.
    assert choose_buckets(plan, trace, 1.0, 8) == [{"batch": 1, "seq": 64}]
    # Padding along seq: one bucket at seq 64 serves seq 32 too, where padding costs less than the fallback.
    padded = DimPlan.of(plan.dims, pad=["seq"])
    assert {"batch": 1, "seq": 32} not in choose_buckets(padded, twice, 3.0, 2)
    # No fallback: the top bucket first (padding reaches every shape from it).
    both = DimPlan.of(plan.dims, pad=["batch", "seq"])
    chosen = choose_buckets(both, trace, float("inf"), 2)
    assert {"batch": 4, "seq": 128} in chosen and both.with_buckets(chosen).unserved(fallback=False) is None
    assert plan.with_buckets(chosen).unserved(fallback=False) is not None  # seq not paddable: gaps
    for bad in ([], [{"batch": 1}], [{"batch": 9, "seq": 8}], {"batch": 1}):
        with pytest.raises(CollageError):
            ShapeTrace.from_json(bad, plan.dims, "t")
