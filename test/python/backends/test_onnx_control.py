"""Control flow and sorting on the ONNX engines: ``stablehlo.while`` as an ONNX ``Loop`` (JAX's ``lax.scan``,
``fori_loop`` and ``while_loop``; the trip count from the loop's counter, else the cond region as the loop's
condition; values the body does not change read from outside it), ``dynamic_slice``/``dynamic_update_slice``
(how a scan reads and writes its steps) and ``stablehlo.sort`` as ``TopK`` (one key, payload operands gathered,
an iota payload being TopK's indices; ties in input order, as JAX's stable sort).

Floats are compared with ``jax.jit`` at the backend's tolerance (rtol 1e-4, atol 5e-4; a loop repeats a step's
rounding, the LSTM's outputs stay well within it: measured max abs error 2.4e-7); sort orders, indices and
integers exactly: TopK moves values without arithmetic, and ties are broken by index, not approximated."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from collage_mlir.backends import get_backend
from collage_mlir.onnx import translate
from collage_mlir.frontends import stablehlo
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context, parse_module

ENGINES = {"ort": "onnxruntime", "openvino": "openvino"}


def _main(module):
    return next(f for f in module.body.operations if str(f.attributes["sym_name"]).strip('"') == "main")


def _run(engine: str, model, feeds: dict) -> list[np.ndarray]:
    if engine == "ort":
        import onnxruntime

        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(feeds)
    return [np.asarray(results[o]) for o in compiled.outputs]


def _on_engine(engine: str, f, *args):
    """``f`` lowered by JAX, every op of it taken by the backend (one region), translated as its build does and
    run on its engine: (engine results, ``jax.jit`` results, the ONNX model)."""
    jax = pytest.importorskip("jax")
    pytest.importorskip(ENGINES[engine])
    backend = get_backend(engine)
    module = stablehlo.parse(jax.jit(f).lower(*args).as_text(), new_context())
    func = _main(module)
    for op in list(func.regions[0].blocks[0].operations)[:-1]:
        assert backend.supports(op.operation) is None, (op.operation.name, backend.supports(op.operation))
    model = translate(func, ties_by_index=backend.topk_ties_by_index)
    got = _run(engine, model, {f"in{k}": np.asarray(a) for k, a in enumerate(args)})
    want = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(f)(*args))]
    return got, want, model


def _assert_matches(engine: str, got, want):
    tol = get_backend(engine).tolerance
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=tol.rtol, atol=tol.atol)
        else:
            np.testing.assert_array_equal(g, w)


def _loops(body_ops):
    return [n for n in body_ops if n.op_type == "Loop"]


# --- while → Loop ----------------------------------------------------------------------------------


def _lstm():
    from collage_mlir.zoo.jax_models import lstm

    return lstm(steps=6, features=5, hidden=8, layers=2, classes=4)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_scan_lstm_is_one_region_matching_jax(engine, tmp_path):
    """A 2-layer LSTM over ``lax.scan`` compiled with ``whole:<engine>``: one region holds both loops, each one
    ONNX ``LSTM`` reading the layer's input sequence (its input projection folded into the ``LSTM``'s W), and
    the program equals ``jax.jit``."""
    jax = pytest.importorskip("jax")
    pytest.importorskip(ENGINES[engine])
    import collage_runtime

    from collage_mlir.iree import compile_file

    f, args = _lstm()
    path = tmp_path / "lstm.mlir"
    path.write_text(jax.jit(f).lower(*args).as_text())
    manifest = compile_file(path, output_dir=tmp_path / "out", plan=f"whole:{engine}", check_import=False)
    assert [r.backend for r in manifest.regions] == [engine]
    with collage_runtime.load(tmp_path / "out", threads=1) as prog:
        got = [np.array(y) for y in prog.invoke("main", *args)]
    _assert_matches(engine, got, [np.asarray(jax.jit(f)(*args))])

    _, _, model = _on_engine(engine, f, *args)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("LSTM") == 2 and "Loop" not in ops and "MatMul" in ops  # the classifier's
    assert ops.index("LSTM") < ops.index("MatMul")


def _scan_lstm(order: str, hoisted: bool, peephole: bool = False, steps: int = 5, features: int = 3, hidden: int = 4):
    """One LSTM layer over ``lax.scan`` with its gates in the column blocks ``order`` (the zoo's ``igfo``;
    flax's ``ifgo``...), the input projection before the loop (``hoisted``) or in each step, a random
    initial state, with ``peephole`` the forget gate reading ``c``; returns (f, args): f gives the last state
    and every step's ``h``."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(len(order) + hoisted)
    wi = (rng.standard_normal((features, 4 * hidden)) * 0.5).astype(np.float32)
    wh = (rng.standard_normal((hidden, 4 * hidden)) * 0.5).astype(np.float32)
    bias = rng.standard_normal(4 * hidden).astype(np.float32)

    def f(x, h0, c0):
        xs = jnp.swapaxes(x, 0, 1)
        if hoisted:
            xs = xs @ wi + bias

        def step(carry, xt):
            c, h = carry
            z = (xt if hoisted else xt @ wi + bias) + h @ wh
            gate = dict(zip(order, jnp.split(z, 4, axis=-1)))
            if peephole:
                gate["f"] = gate["f"] + 0.5 * c
            c = jax.nn.sigmoid(gate["f"]) * c + jax.nn.sigmoid(gate["i"]) * jnp.tanh(gate["g"])
            h = jax.nn.sigmoid(gate["o"]) * jnp.tanh(c)
            return (c, h), h

        (c, h), hs = jax.lax.scan(step, (c0, h0), xs)
        return c, h, hs

    batch = 2
    return f, (rng.standard_normal((batch, steps, features)).astype(np.float32),
               rng.standard_normal((batch, hidden)).astype(np.float32),
               rng.standard_normal((batch, hidden)).astype(np.float32))


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("order,hoisted,peephole", [("igfo", True, False), ("ifgo", True, False), ("ogfi", True, False),
                                                     ("ifgo", False, False), ("ifgo", False, True)])
def test_an_lstm_loop_becomes_an_onnx_lstm_in_any_gate_order(order, hoisted, peephole, engine):
    """An LSTM layer's ``lax.scan`` is one ONNX ``LSTM`` whatever the order of its gate blocks and wherever its
    input projection is computed (before the loop or in each step), with the loop's initial state and its
    last state and outputs as results; a cell ONNX's ``LSTM`` does not compute (a forget gate reading ``c``)
    stays a ``Loop``: all equal ``jax.jit``."""
    f, args = _scan_lstm(order, hoisted, peephole)
    got, want, model = _on_engine(engine, f, *args)
    _assert_matches(engine, got, want)
    ops = [n.op_type for n in model.graph.node]
    assert (ops.count("LSTM"), ops.count("Loop")) == ((0, 1) if peephole else (1, 0))


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("cell,onnx_op", [("OptimizedLSTMCell", "LSTM"), ("LSTMCell", "LSTM"), ("GRUCell", "GRU")])
def test_flax_rnns_become_onnx_recurrent_ops(cell, onnx_op, engine):
    """flax's ``nn.RNN`` over its cells (each gate a dense layer of its own over ``x[t]`` and ``h``, the weights
    carried through the loop and concatenated in each step; the GRU's ``n = tanh(x @ wn + bn + r * (h @ rn +
    rbn))`` is ONNX's ``linear_before_reset``), two layers and a dense head, batch 3: one ONNX ``LSTM`` or
    ``GRU`` per layer, equal to ``jax.jit``."""
    jax = pytest.importorskip("jax")
    nn = pytest.importorskip("flax.linen")
    make = getattr(nn, cell)

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.RNN(make(6))(x)
            x = nn.RNN(make(5))(x)
            return nn.Dense(3)(x[:, -1])

    x = np.random.default_rng(4).standard_normal((3, 7, 4)).astype(np.float32)
    params = Model().init(jax.random.PRNGKey(0), x)
    got, want, model = _on_engine(engine, lambda v: Model().apply(params, v), x)
    _assert_matches(engine, got, want)
    ops = [n.op_type for n in model.graph.node]
    assert (ops.count(onnx_op), ops.count("Loop")) == (2, 0)


def test_an_lstm_node_names_the_projection_it_computes():
    """The ``LSTM`` computes its loop and the input projection before it: its ``collage.id``s name both, so
    an engine's profile charges them together and a region holding the loop without its projection (which
    would be a ``Loop``) is not priced by the ``LSTM``'s time."""
    jax = pytest.importorskip("jax")
    from collage_mlir.onnx import OP_IDS_DOC

    f, args = _scan_lstm("ifgo", True)
    module = stablehlo.parse(jax.jit(f).lower(*args).as_text(), new_context())
    number_ops(module)
    graph = Graph(module)
    model = translate(_main(module))
    (lstm,) = [n for n in model.graph.node if n.op_type == "LSTM"]
    ids = {int(i) for i in lstm.doc_string.removeprefix(OP_IDS_DOC).split()}
    names = {graph.nodes[i].name for i in ids}
    assert names == {"stablehlo.while", "stablehlo.dot_general", "stablehlo.add"}, names


def _fori(x, w):
    """The counter read in the body (as a step's index and a float) and a weight captured from outside."""
    import jax
    import jax.numpy as jnp

    def step(i, v):
        return jnp.tanh(v @ w + i.astype(v.dtype) * 0.1) + jax.lax.dynamic_index_in_dim(v, jnp.minimum(i, 2), 0, keepdims=False)

    return jax.lax.fori_loop(0, 7, step, x)


def _bounded(x, n):
    """A trip count known only at run time: the bound is carried unchanged, the trip count computed."""
    import jax

    return jax.lax.fori_loop(1, n, lambda i, v: v * 0.5 + i, x)


def _until(x):
    """No counter: the cond region (a reduction of the carried value) is the loop's condition."""
    import jax

    return jax.lax.while_loop(lambda v: v.sum() < 50.0, lambda v: v * 1.5 + 0.25, x)


def _nested(x):
    """A loop in a loop body."""
    import jax

    inner = lambda i, v: v + i  # noqa: E731
    return jax.lax.fori_loop(0, 3, lambda j, v: jax.lax.fori_loop(0, j + 2, inner, v) * 0.5, x)


LOOPS = {
    "fori": (_fori, lambda rng: (rng.standard_normal((3, 4)).astype(np.float32),
                                 (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)), "trips"),
    "bounded": (_bounded, lambda rng: (rng.standard_normal(5).astype(np.float32), np.int32(6)), "computed"),
    "until": (_until, lambda rng: (np.abs(rng.standard_normal(6)).astype(np.float32) + 0.1,), "cond"),
    "nested": (_nested, lambda rng: (rng.standard_normal(4).astype(np.float32),), "trips"),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("case", sorted(LOOPS))
def test_loops_match_jax(case, engine):
    """``fori_loop`` (constant and run-time bounds), ``while_loop`` with a data-dependent condition and a
    loop nested in a loop body: one ONNX ``Loop`` each (its trip count a constant, computed from the bound, or
    left to the condition), equal to ``jax.jit``."""
    f, make, trips = LOOPS[case]
    args = make(np.random.default_rng(3))
    got, want, model = _on_engine(engine, f, *args)
    _assert_matches(engine, got, want)
    (loop,) = _loops(model.graph.node)
    consts = {t.name for t in model.graph.initializer}
    if trips == "trips":
        assert loop.input[0] in consts and loop.input[1] == ""
    elif trips == "computed":
        assert loop.input[0] not in consts and loop.input[0] and loop.input[1] == ""
    else:
        assert loop.input[0] == "" and loop.input[1]
    if case == "nested":
        assert len(_loops(loop.attribute[0].g.node)) == 1
    if case == "bounded":  # no iteration at all when the bound is below the start
        got, want, _ = _on_engine(engine, f, args[0], np.int32(-3))
        _assert_matches(engine, got, want)


def _branches(x, p):
    """``lax.cond`` on a run-time predicate, then ``lax.switch`` over three branches (one returning a value
    from outside unchanged), both reading values from outside their branches."""
    import jax
    import jax.numpy as jnp

    y = jax.lax.cond(p > 0, lambda v: jnp.tanh(v) * 2, lambda v: v - 1, x)
    return jax.lax.switch(jnp.clip(p, 0, 2).astype(jnp.int32), [lambda v: v, lambda v: v * 3 + x, jnp.exp], y)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_case_becomes_onnx_ifs_matching_jax(engine):
    """``stablehlo.case`` (JAX's ``lax.cond`` and ``lax.switch``) is a chain of ONNX ``If``s (one per branch
    but the last), equal to ``jax.jit`` for every branch taken."""
    x = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    for p in (-1.0, 0.5, 1.5, 3.0):
        got, want, model = _on_engine(engine, _branches, x, np.float32(p))
        _assert_matches(engine, got, want)
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    nested = [m for n in ifs for a in n.attribute for m in a.g.node if m.op_type == "If"]
    assert (len(ifs), len(nested)) == (2, 1)  # cond: one If; switch: an If whose else branch holds the second


CAPTURING = """
func.func @main(%x: tensor<3xf32>, %w: tensor<3xf32>, %n: tensor<i32>) -> (tensor<3xf32>, tensor<i32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %0:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<3xf32>
  cond {
    %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %j = stablehlo.add %one, %i : tensor<i32>
    %m = stablehlo.multiply %v, %w : tensor<3xf32>
    %a = stablehlo.add %m, %x : tensor<3xf32>
    stablehlo.return %j, %a : tensor<i32>, tensor<3xf32>
  }
  return %0#1, %0#0 : tensor<3xf32>, tensor<i32>
}
"""


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_loop_reading_run_time_values_from_outside(engine):
    """A loop whose body reads function arguments directly (not carried: JAX carries them, hand-written
    StableHLO need not) and whose bound is an argument the cond reads: ``v = v * w + x`` ``n`` times (none for
    ``n <= 0``), the trip count computed at run time."""
    pytest.importorskip(ENGINES[engine])
    module = parse_module(CAPTURING, new_context())
    backend = get_backend(engine)
    assert all(backend.supports(o.operation) is None for o in list(_main(module).regions[0].blocks[0].operations)[:-1])
    model = translate(_main(module), ties_by_index=backend.topk_ties_by_index)
    (loop,) = _loops(model.graph.node)
    assert loop.input[0] and loop.input[1] == ""
    x, w = np.array([1.0, -2.0, 0.5], np.float32), np.array([0.5, 1.5, -1.0], np.float32)
    for n in (-1, 0, 4):
        want = x.copy()
        for _ in range(n):
            want = want * w + x
        got = _run(engine, model, {"in0": x, "in1": w, "in2": np.asarray(n, np.int32)})
        np.testing.assert_allclose(got[0], want, rtol=1e-6)
        assert int(got[1]) == max(n, 0)


DYNAMIC = """
func.func @main(%x: tensor<5x3xf32>, %u: tensor<2x3xf32>, %i: tensor<i32>) -> (tensor<2x2xf32>, tensor<5x3xf32>) {
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %0 = stablehlo.dynamic_slice %x, %i, %c1, sizes = [2, 2] : (tensor<5x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
  %1 = stablehlo.dynamic_update_slice %x, %u, %i, %c1 : (tensor<5x3xf32>, tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<5x3xf32>
  return %0, %1 : tensor<2x2xf32>, tensor<5x3xf32>
}
"""


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_dynamic_slices_clamp_their_starts(engine):
    """``dynamic_slice`` and ``dynamic_update_slice`` at run-time starts, clamped into range as StableHLO
    clamps them (a negative start reads from 0, one past the end from the last fitting position; the column
    start 1 of an update that spans all columns clamps to 0)."""
    pytest.importorskip(ENGINES[engine])
    module = parse_module(DYNAMIC, new_context())
    backend = get_backend(engine)
    assert all(backend.supports(o.operation) is None for o in list(_main(module).regions[0].blocks[0].operations)[:-1])
    model = translate(_main(module), ties_by_index=backend.topk_ties_by_index)
    x, u = np.arange(15, dtype=np.float32).reshape(5, 3), -np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    for i in (-2, 0, 2, 4, 9):
        s = min(max(i, 0), 3)
        want = x.copy()
        want[s:s + 2] = u
        got = _run(engine, model, {"in0": x, "in1": u, "in2": np.asarray(i, np.int32)})
        np.testing.assert_array_equal(got[0], x[s:s + 2, 1:3])
        np.testing.assert_array_equal(got[1], want)


@pytest.mark.fast
def test_a_loop_with_an_untranslatable_op_is_refused():
    """A loop whose body holds an op without ONNX translation is no ONNX op, and the reason names it."""
    module = parse_module("""
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %n = stablehlo.constant dense<3> : tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %0:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<4xf32>
  cond {
    %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %j = stablehlo.add %i, %one : tensor<i32>
    %w = stablehlo.cbrt %v : tensor<4xf32>
    stablehlo.return %j, %w : tensor<i32>, tensor<4xf32>
  }
  return %0#1 : tensor<4xf32>
}
""", new_context())
    number_ops(module)
    graph = Graph(module)
    (loop,) = [i for i, n in graph.nodes.items() if n.name == "stablehlo.while"]
    for engine in ENGINES:
        why = get_backend(engine).supports(graph.nodes[loop].op)
        assert isinstance(why, str) and "stablehlo.cbrt" in why, why
        assert "stablehlo.cbrt" in get_backend(engine).accepts(graph, frozenset(graph.nodes))


# --- sort → TopK -----------------------------------------------------------------------------------


def _sorts():
    import jax
    import jax.numpy as jnp

    return {
        "argsort": lambda x: jnp.argsort(x, axis=-1),
        "sort": lambda x: jnp.sort(x, axis=-1),
        "sort_descending": lambda x: jnp.sort(x, axis=0, descending=True),
        "argsort_descending": lambda x: jnp.argsort(x, axis=0, descending=True),
        "payload": lambda x: jax.lax.sort((x, x * 2 + 1, jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)),
                                          dimension=1, num_keys=1),
    }


#: Keys: unit normal floats; floats with many ties (signed zeros among them: -0.0 and 0.0 are equal keys);
#: small integers (ties everywhere: the order among equal keys is exact, not measure-zero).
KEYS = {
    "random": lambda rng: rng.standard_normal((4, 9)).astype(np.float32),
    "ties": lambda rng: np.where(rng.random((4, 9)) < 0.5, np.float32(-0.0), rng.integers(-2, 3, (4, 9))).astype(np.float32),
    "integers": lambda rng: rng.integers(-3, 3, (4, 9)).astype(np.int32),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("keys", sorted(KEYS))
@pytest.mark.parametrize("case", ["argsort", "sort", "sort_descending", "argsort_descending", "payload"])
def test_sorts_match_jax(case, keys, engine):
    """``jnp.argsort``, ``jnp.sort`` ascending and descending (JAX reverses around an ascending stable sort),
    ``lax.sort`` with payload operands: ``TopK`` (no ``stablehlo.sort`` left), the iota payload being TopK's
    indices (no ``GatherElements`` for it), results exactly ``jax.jit``'s, ties in JAX's stable order."""
    x = KEYS[keys](np.random.default_rng(7))
    got, want, model = _on_engine(engine, _sorts()[case], x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["TopK"] >= 1
    if engine == "ort":  # one TopK; on OpenVINO a second one breaks ties (``_ordered_top_k``)
        # gathered: the float payload, and the iota JAX reverses for a descending argsort (no longer an iota)
        assert ops["TopK"] == 1 and ops["GatherElements"] == (case in ("payload", "argsort_descending")), ops


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_topk_tie_order_per_engine(engine):
    """Equal values come out in index order: ONNX Runtime's ``TopK`` keeps ONNX's rule itself (one node), and
    the translation for OpenVINO, whose ``TopK`` does not (probed: 2026.4 returns ties in no fixed order), sorts
    again by (run of equal values, index); ``chlo.top_k`` too, largest first."""
    pytest.importorskip(ENGINES[engine])
    module = parse_module("""
func.func @main(%x: tensor<3x40xf32>) -> (tensor<3x7xf32>, tensor<3x7xi32>) {
  %v, %i = chlo.top_k(%x, k = 7) : tensor<3x40xf32> -> (tensor<3x7xf32>, tensor<3x7xi32>)
  return %v, %i : tensor<3x7xf32>, tensor<3x7xi32>
}
""", new_context())
    backend = get_backend(engine)
    model = translate(_main(module), ties_by_index=backend.topk_ties_by_index)
    assert (collections.Counter(n.op_type for n in model.graph.node)["TopK"] == 1) == (engine == "ort")
    x = np.random.default_rng(0).integers(0, 3, (3, 40)).astype(np.float32)
    values, indices = _run(engine, model, {"in0": x})
    order = np.argsort(-x, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))


SORT = """
func.func @main(%x: tensor<2x6xf32>, %p: tensor<2x6xi32>) -> (tensor<2x6xf32>, tensor<2x6xi32>) {{
  %0:2 = "stablehlo.sort"(%x, %p) <{{dimension = {dim} : i64, is_stable = true}}> ({{
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    {body}
  }}) : (tensor<2x6xf32>, tensor<2x6xi32>) -> (tensor<2x6xf32>, tensor<2x6xi32>)
  return %0#0, %0#1 : tensor<2x6xf32>, tensor<2x6xi32>
}}
"""


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_greater_than_comparator_sorts_descending(engine):
    """A plain ``GT`` comparator (as other frontends write a descending sort) on dimension -1: ``TopK`` with
    ``largest=1``, the payload gathered, equal to numpy's stable descending order."""
    pytest.importorskip(ENGINES[engine])
    body = ("%r = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>\n"
            "    stablehlo.return %r : tensor<i1>")
    module = parse_module(SORT.format(dim=-1, body=body), new_context())
    backend = get_backend(engine)
    assert backend.supports(list(_main(module).regions[0].blocks[0].operations)[0].operation) is None
    model = translate(_main(module), ties_by_index=backend.topk_ties_by_index)
    assert all(a.i == 1 for n in model.graph.node if n.op_type == "TopK" for a in n.attribute
               if a.name == "largest") or engine == "openvino"
    x = np.array([[3, 1, 3, -0.0, 0.0, 2], [5, 4, 3, 2, 1, 0]], np.float32)
    p = np.arange(12, dtype=np.int32).reshape(2, 6) * 10
    got = _run(engine, model, {"in0": x, "in1": p})
    order = np.argsort(-x, axis=1, kind="stable")
    np.testing.assert_array_equal(got[0], np.take_along_axis(x, order, 1))
    np.testing.assert_array_equal(got[1], np.take_along_axis(p, order, 1))


REFUSED = {
    "two keys": ("%e = stablehlo.compare EQ, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>\n"
                 "    %l = stablehlo.compare LT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>\n"
                 "    %m = stablehlo.compare LT, %c, %d, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>\n"
                 "    %s = stablehlo.and %e, %m : tensor<i1>\n"
                 "    %r = stablehlo.or %l, %s : tensor<i1>", "single-key sort"),
    "by magnitude": ("%m = stablehlo.abs %a : tensor<f32>\n    %n = stablehlo.abs %b : tensor<f32>\n"
                     "    %r = stablehlo.compare LT, %m, %n, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>",
                     "stablehlo.abs is not a comparator op"),
    "not an order": ("%r = stablehlo.compare NE, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>",
                     "neither ascending nor descending"),
}


@pytest.mark.fast
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unrecognised_comparators_are_refused_with_a_reason(case):
    """A sort on two keys, by a function of the key, or by no order at all is no ONNX op: ``supports`` and
    ``accepts`` give the one-line reason."""
    body, why = REFUSED[case]
    module = parse_module(SORT.format(dim=1, body=body + "\n    stablehlo.return %r : tensor<i1>"), new_context())
    number_ops(module)
    graph = Graph(module)
    (sort,) = graph.nodes
    for engine in ENGINES:
        reason = get_backend(engine).supports(graph.nodes[sort].op)
        assert isinstance(reason, str) and why in reason and "\n" not in reason, reason
        assert why in get_backend(engine).accepts(graph, frozenset({sort}))


# --- the JAX zoo -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("name", ["jax_lstm", "jax_detector"])
def test_jax_zoo_loop_and_sort_models_go_whole_to_an_onnx_engine(name, engine, tmp_path):
    """The zoo's LSTM (two ``lax.scan`` loops) and detector (top-k, gathers, an argsort) small variants: with
    ``whole:<engine>`` the engine takes each in one region (before the loop and sort translations: LSTM 3
    regions with both loops and 4 broadcasts on IREE, detector 2 with the sort on IREE), matching ``jax.jit``."""
    jax = pytest.importorskip("jax")
    pytest.importorskip(ENGINES[engine])
    import collage_runtime

    from collage_mlir import zoo
    from collage_mlir.iree import compile_module

    fn, inputs = zoo.build(name, small=True)
    art = compile_module(zoo.import_stablehlo(name, new_context(), small=True), f"whole:{engine}", tmp_path / "out",
                         source=name)
    assert [r.backend for r in art.manifest.regions] == [engine]
    with collage_runtime.load(art.out_dir, threads=1) as prog:
        got = [np.array(y) for y in prog.invoke("main", *zoo.numpy_inputs(name, small=True))]
    _assert_matches(engine, got, [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(*inputs))])
