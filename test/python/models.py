"""Small models built in code (random weights) that tests in several folders share: torch modules (``mlp``,
``small_cnn``, ``lstm``, ``branching``), a StableHLO module (``two_blocks``) and an ONNX file (``onnx_cnn``).
Each imports its framework when called, so a compiler-free test can import this module."""

from __future__ import annotations

from collage_mlir.zoo.tiny import mlp, small_cnn  # noqa: F401  (shared with studies/)


def lstm(inputs: int = 8, hidden: int = 16):
    """A one-layer LSTM over the sequence and a linear head (its zero initial state is a splat constant)."""
    import torch
    from torch import nn

    class Lstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(inputs, hidden)
            self.head = nn.Linear(hidden, 4)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.head(y)

    torch.manual_seed(0)
    return Lstm().eval()


def branching():
    """Two branches of matmuls from one input, joined, with a residual: values fan out across regions."""
    import torch
    from torch import nn

    class Branching(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(16, 32)
            self.c = nn.Linear(32, 16)

        def forward(self, x):
            h = torch.tanh(self.a(x)) * torch.sigmoid(self.b(x))
            return self.c(h) + x

    torch.manual_seed(0)
    return Branching().eval()


TWO_BLOCKS = """func.func @main(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %w0 = stablehlo.constant dense<%W0%> : tensor<16x16xf32>
  %w1 = stablehlo.constant dense<%W1%> : tensor<16x16xf32>
  %0 = stablehlo.dot_general %x, %w0, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %1 = stablehlo.tanh %0 : tensor<16x16xf32>
  %2 = stablehlo.dot_general %1, %w1, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %3 = stablehlo.tanh %2 : tensor<16x16xf32>
  return %3 : tensor<16x16xf32>
}
"""


def two_blocks():
    """A model with two matmul+tanh blocks that differ only in their weights (256 elements each, beyond
    the structural hash's small-constant limit): ``(module, graph, [ops of block 0, ops of block 1])``,
    its ops numbered."""
    from collage_mlir.graph import Graph
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.passes.number_ops import NumberOpsPass

    def dense(f) -> str:
        return "[" + ", ".join("[" + ", ".join(f"{f(i, j):.4f}" for j in range(16)) + "]" for i in range(16)) + "]"

    w0, w1 = dense(lambda i, j: (i * 16 + j) / 256), dense(lambda i, j: -(i + j) / 32)
    module = parse_module(TWO_BLOCKS.replace("%W0%", w0).replace("%W1%", w1), new_context())
    NumberOpsPass().run(module)
    graph = Graph(module)
    by_name = lambda name: sorted(i for i, n in graph.nodes.items() if n.name == name)  # noqa: E731
    dots, tanhs = by_name("stablehlo.dot_general"), by_name("stablehlo.tanh")
    return module, graph, [frozenset({d, t}) for d, t in zip(dots, tanhs)]


def onnx_cnn(path, batch: int | str = 2, channels: int = 4) -> None:
    """Writes a small ONNX CNN (conv to ``channels``, relu, global average pool, flatten, gemm; input ``x``:
    2x3x8x8 f32, output ``y``: 2x5) to ``path``; ``batch``: the first axis's size, or its ``dim_param``
    (dynamic)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n) for n, s in
             [("w", (channels, 3, 3, 3)), ("b", (channels,)), ("fc", (channels, 5)), ("fb", (5,))]]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))


def random_search_case(seed: int, n: int, backends: tuple[str, ...], *, first_id: int = 100, density: float = 0.3,
                       candidates_per_op: int = 3, max_grow: int = 4, disconnected: float = 0.0,
                       default_backend: str | None = None):
    """A random placement problem for the search without compilers: a DAG of ``n`` ops (ids from
    ``first_id``, shuffled against topological order; some sources constants, each op reading an earlier
    one with probability ``density``) and ``candidates_per_op * n`` tries at convex candidates grown up to
    ``max_grow`` steps on ``backends``; with ``disconnected``, that share of them adds one op anywhere (two
    convex pieces whose union is convex: what makes cycles possible); with ``default_backend``, candidates of
    several ops may be on it too. Returns (SearchGraph, CandidateIndex)."""
    import random

    from collage_mlir.backends import Candidate
    from collage_mlir.search.index import CandidateIndex, SearchGraph

    rng = random.Random(seed)
    ids = list(range(first_id, first_id + n))
    rng.shuffle(ids)
    producers = {ids[j]: tuple(sorted({ids[i] for i in range(j) if rng.random() < density})) for j in range(n)}
    constant = frozenset(i for i in ids if not producers[i] and rng.random() < 0.4)
    graph = SearchGraph(ids, producers, {i: rng.choice((64, 4096, 1 << 20)) for i in ids}, constant)
    regions = []
    for _ in range(candidates_per_op * n):
        grown = {rng.choice(ids)}
        for _ in range(rng.randrange(max_grow)):
            near = sorted({u for i in grown for u in (*graph.users[i], *graph.producers[i])} - grown)
            if not near:
                break
            grown.add(rng.choice(near))
        if disconnected and rng.random() < disconnected:
            grown.add(rng.choice(ids))
        if graph.is_convex(frozenset(grown)):
            options = (*backends, default_backend) if default_backend and len(grown) > 1 else backends
            regions.append(Candidate(rng.choice(options), "test", frozenset(grown)))
    return graph, CandidateIndex(graph, regions)


def brute_force_cost(index, estimator) -> float:
    """The lowest ``plan_cost`` over every exact cover of the index's ops by candidates whose regions do not
    feed each other in a cycle (small graphs only)."""
    import math

    from collage_mlir.plan import Plan, Region
    from collage_mlir.search.cost import plan_cost

    g = index.graph
    best = math.inf

    def visit(covered: frozenset[int], chosen: list) -> None:
        nonlocal best
        rest = [op for op in g.order if op not in covered]
        if not rest:
            if g.acyclic(c.ops for c in chosen):
                plan = Plan([Region(f"r{k}", c.backend, c.ops) for k, c in enumerate(chosen)
                             if c.backend != index.default_backend])
                best = min(best, plan_cost(plan, g.order, g.producers, g.out_bytes, estimator, g.constant))
            return
        for c in index.candidates_at(rest[0]):
            if not c.ops & covered:
                visit(covered | c.ops, chosen + [c])

    visit(frozenset(), [])
    return best


#: Three elementwise ops over two f32[64] inputs: the harness tests' smallest model of several regions.
ELEMENTWISE = """
func.func @main(%x: tensor<64xf32>, %y: tensor<64xf32>) -> tensor<64xf32> {
  %0 = stablehlo.add %x, %y : tensor<64xf32>
  %1 = stablehlo.multiply %0, %0 : tensor<64xf32>
  %2 = stablehlo.add %1, %x : tensor<64xf32>
  return %2 : tensor<64xf32>
}
"""


def numbered(text: str):
    """``text`` parsed into a new context, its ops numbered (``collage-number-ops``)."""
    from collage_mlir.ir import new_context, parse_module
    from collage_mlir.passes.number_ops import NumberOpsPass

    module = parse_module(text, new_context())
    NumberOpsPass().run(module)
    return module


def negate_matmul_tanh_add(n: int) -> str:
    """``@main(a, b) = tanh(-a @ b) + a`` on f32[n, n]: ops 0 (negate) and 3 (add) around a matmul (1) and
    tanh (2), so a region on ops 1-2 has IREE work on both sides (the GPU program tests' model)."""
    t = f"tensor<{n}x{n}xf32>"
    return (f"func.func @main(%a: {t}, %b: {t}) -> {t} {{\n"
            f"  %n = stablehlo.negate %a : {t}\n"
            f"  %0 = stablehlo.dot_general %n, %b, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}\n"
            f"  %1 = stablehlo.tanh %0 : {t}\n"
            f"  %2 = stablehlo.add %1, %a : {t}\n"
            f"  return %2 : {t}\n}}\n")


def digits_cnn():
    """(CNN in eval mode, images, labels): a small CNN trained (150 full-batch Adam steps, seed 0) on the
    first 1400 of scikit-learn's 1797 digits, images as float32 N x 1 x 8 x 8 in [0, 1]; the rest held out."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1, stride=2),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.tensor(x[:1400])), torch.tensor(y[:1400])).backward()
        opt.step()
    return model.eval(), x, y


def torch_mlp():
    """A torch factory, as ``collage compile package.module:factory`` takes: ``(model, example inputs)``
    (the zoo's tiny MLP on a 2x32 batch)."""
    import torch

    from collage_mlir.zoo.tiny import mlp

    return mlp(), (torch.randn(2, 32, generator=torch.Generator().manual_seed(0)),)


def digits_factory():
    """The CNN trained on digits (``digits_cnn``) as a torch factory, on a batch of 64 images."""
    import torch

    model, x, _ = digits_cnn()
    return model, (torch.tensor(x[:64]),)
