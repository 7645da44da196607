"""A hand-made mixed plan for a transformer: its linear layers (a dot_general with a constant weight, with
the scaling and bias additions after it) on one engine, everything else on OpenVINO. studies/headroom/headroom.py
found ORT's matmul faster than OpenVINO's fully connected layer on BERT-base and GPT-2's linear layers;
this plan tests whether that survives the program's boundaries.

    python -m studies.mixed_linear.mixed_linear gpt2_small --engine ort --which ffn -o /tmp/gpt2_ffn_ort.plan.json
    collage bench gpt2_small --plan /tmp/gpt2_ffn_ort.plan.json --vs openvino-rt,ort-rt --seconds 30

``--which``: ``ffn`` (the two feed-forward matmuls of each layer, 768→3072→768), ``all`` (every linear layer).
"""

from __future__ import annotations

import argparse

from collage_mlir import zoo
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context
from collage_mlir.plan import Plan, Region
from collage_mlir.search.index import SearchGraph

EPILOGUE = {"stablehlo.multiply", "stablehlo.add"}


def linear_islands(graph: Graph, sg: SearchGraph, which: str) -> list[frozenset[int]]:
    """Each linear layer's ops: the dot_general whose rhs is a constant, then the chain of elementwise
    multiplies/adds by constant expressions that follows it (the bias)."""
    islands = []
    for oid, node in graph.nodes.items():
        if node.name != "stablehlo.dot_general":
            continue
        weight = [p for p in graph.producers(oid) if p in sg.constant]
        if not weight:
            continue
        shape = node.op.operands[1].type.shape
        if which == "ffn" and sorted(shape) != [768, 3072]:
            continue
        ops, last = {oid}, oid
        while len(users := graph.users(last)) == 1 and graph.nodes[users[0]].name in EPILOGUE:
            other = [p for p in graph.producers(users[0]) if p != last]
            if not all(p in sg.constant for p in other):
                break
            last = users[0]
            ops.add(last)
        islands.append(frozenset(ops))
    return islands


def staged_plan(sg: SearchGraph, islands: list[frozenset[int]], engine: str, source: str) -> Plan:
    """The islands on ``engine``; every other op (constant expressions aside: each region gets its own
    copy) on OpenVINO, grouped by its stage, the most islands on any path to it. Stage only grows along
    an edge and grows past every island, so each stage's ops are convex and the regions are acyclic."""
    island_of = {op: k for k, ops in enumerate(islands) for op in ops}
    stage: dict[int, int] = {}
    for op in sg.order:
        if op in sg.constant:
            continue
        stage[op] = max((stage[p] + (p in island_of and op not in islands[island_of[p]])
                         for p in sg.producers[op] if p in stage), default=0)
    groups: dict[int, set[int]] = {}
    for op, k in stage.items():
        if op not in island_of:
            groups.setdefault(k, set()).add(op)
    regions = [(engine, ops) for ops in islands] + [("openvino", frozenset(ops)) for ops in groups.values()]
    regions.sort(key=lambda r: min(sg.pos[i] for i in r[1]))
    return Plan([Region(f"region_{k}", b, ops) for k, (b, ops) in enumerate(regions)], source=source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--engine", default="ort")
    parser.add_argument("--which", choices=["ffn", "all"], default="ffn")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    with new_context() as ctx:
        module = zoo.import_stablehlo(args.model, ctx)
        number_ops(module)
        graph = Graph(module)
        sg = SearchGraph.from_graph(graph)
        islands = linear_islands(graph, sg, args.which)
        plan = staged_plan(sg, islands, args.engine, f"linear:{args.which}:{args.engine}")
        counts = {b: sum(1 for r in plan.regions if r.backend == b) for b in {r.backend for r in plan.regions}}
        print(f"{len(islands)} linear layers; plan: {len(plan.regions)} regions {counts}")
        plan.save(args.output)


if __name__ == "__main__":
    main()
