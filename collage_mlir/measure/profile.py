"""Costs in context: what each StableHLO op costs *inside* a graph engine's whole-model region, from the
engine's own per-node profile of the built program (OpenVINO's performance counters, ONNX Runtime's
profiler), as ``studies/headroom`` reads them. One profiled run prices every sub-region of the engine's
maximal regions without extracting or building any of them (``search.measured`` uses it).

``profile_artifact`` is a worker task (``Worker.call(f"{PROFILE}:profile_artifact", ...)``): it loads a
built artifact whose regions all run on one engine with the engine's profiler on (the executors'
``PROFILED`` hook), runs ``@main`` a few times, and charges each engine node's median time to the ops it
came from. Which ops an ONNX node computes is in its ``doc_string`` (``collage_mlir.onnx.op_ids``); an engine
node names the ONNX nodes it came from:

- OpenVINO: ``originalLayersNames`` of the runtime node (a convolution with its fused bias and relu names
  all three; a name may carry a ``/WithoutBiases``-like suffix).
- ONNX Runtime: the node's name (``<onnx node>`` or ``<onnx node or output>_nchwc`` after its layout
  transform). A node it fused away has no event of its own: it is charged, with its ops, to its producer
  where that was profiled and it is the producer's only user (``FusedConv`` named after the convolution
  took the relu), else to the first profiled node downstream (``max_23_nchwc`` took the convolution
  before the relu whose name it kept).

An engine node that names no ONNX node (layout reorders the engine inserted) is *unattributed*: it is in
``unattributed_s``, charged to no op. A node's time goes to its *anchor* op (a convolution or matmul among
its ops, else its first op); ``NodeTime.ops`` keeps the ops fused together, so a caller can refuse to
price a region that splits them.
"""

from __future__ import annotations

import collections
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from .tasks import INPUT, load_arrays

#: How workers name this module's task: ``f"{PROFILE}:profile_artifact"``.
PROFILE = __name__

#: What the cost DB's ``derived`` table files in-context profiles under.
IN_CONTEXT = "in-context"

#: The executor module whose ``PROFILED`` hook profiles each engine.
_HOOKS = {"ort": "collage_runtime.executors.onnxruntime_session",
          "openvino": "collage_runtime.executors.openvino_model"}

#: Backends whose whole-model regions can be profiled per node.
PROFILED_BACKENDS = frozenset(_HOOKS)


@dataclass(frozen=True)
class NodeTime:
    """One engine node of the profiled program: its name and kind in the engine, its median time per call
    inside the whole graph, the ``collage.id`` of the ops it computes (empty: unattributed) and the op
    its time is charged to."""

    name: str
    kind: str
    seconds: float
    ops: tuple[int, ...] = ()
    anchor: int | None = None
    #: The engine's counter exceeded the whole call in some round: there its time is what the other
    #: nodes left of the call (an upper bound).
    residual: bool = False

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "seconds": self.seconds, "ops": list(self.ops),
                "anchor": self.anchor, "residual": self.residual}

    @classmethod
    def from_json(cls, d: dict) -> "NodeTime":
        return cls(d["name"], d["kind"], float(d["seconds"]), tuple(int(i) for i in d["ops"]), d["anchor"],
                   bool(d.get("residual", False)))


@dataclass(frozen=True)
class InContextCosts:
    """An engine's per-node profile of one program (a model's single-engine plan): ``whole_s`` the median
    wall time of a call with the profiler on, ``nodes`` every engine node that ran."""

    backend: str
    version: str
    whole_s: float
    rounds: int
    nodes: tuple[NodeTime, ...]

    @property
    def attributed_s(self) -> float:
        return sum(n.seconds for n in self.nodes if n.anchor is not None)

    @property
    def unattributed_s(self) -> float:
        return sum(n.seconds for n in self.nodes if n.anchor is None)

    def op_seconds(self) -> dict[int, float]:
        """Per op, the time charged to it (its nodes' times, where it is their anchor)."""
        out: dict[int, float] = collections.defaultdict(float)
        for n in self.nodes:
            if n.anchor is not None:
                out[n.anchor] += n.seconds
        return dict(out)

    def fused(self) -> tuple[frozenset[int], ...]:
        """The op sets the engine ran as one node (more than one op each)."""
        return tuple(frozenset(n.ops) for n in self.nodes if len(n.ops) > 1)

    def covered(self) -> frozenset[int]:
        """Every op some engine node computes."""
        return frozenset(i for n in self.nodes for i in n.ops)

    def to_json(self) -> dict:
        return {"backend": self.backend, "version": self.version, "whole_s": self.whole_s, "rounds": self.rounds,
                "nodes": [n.to_json() for n in self.nodes]}

    @classmethod
    def from_json(cls, d: dict) -> "InContextCosts":
        return cls(d["backend"], d["version"], float(d["whole_s"]), int(d["rounds"]),
                   tuple(NodeTime.from_json(n) for n in d["nodes"]))


# -- the ONNX side: which ops each exported node computes ------------------------------------------


@dataclass(frozen=True)
class _OnnxOps:
    """An exported region's ONNX graph as the attribution needs it: ops per node name and per output
    name, and each node's consumers (by node name)."""

    by_name: dict[str, tuple[int, ...]]
    by_output: dict[str, str]  # output tensor -> node name
    users: dict[str, list[str]]  # node name -> names of the nodes that read its outputs
    producer: dict[str, str]  # node name -> the node that computes its first input
    kinds: dict[str, str]  # node name -> op type
    order: list[str]

    @classmethod
    def read(cls, path: Path) -> "_OnnxOps":
        import onnx

        from ..onnx import op_ids

        graph = onnx.load(str(path), load_external_data=False).graph
        by_name, by_output, readers = {}, {}, collections.defaultdict(list)
        for node in graph.node:
            by_name[node.name] = op_ids(node)
            for o in node.output:
                by_output[o] = node.name
            for i in node.input:
                readers[i].append(node.name)
        users = {n.name: [u for o in n.output for u in readers.get(o, [])] for n in graph.node}
        producer = {n.name: by_output[n.input[0]] for n in graph.node if n.input and n.input[0] in by_output}
        return cls(by_name, by_output, users, producer, {n.name: n.op_type for n in graph.node},
                   [n.name for n in graph.node])

    def lookup(self, name: str) -> str | None:
        """The ONNX node an engine calls ``name`` (its name or an output's, maybe with a suffix)."""
        for candidate in (name, name.split("/")[0], name.removesuffix("_nchwc")):
            if candidate in self.by_name:
                return candidate
            if candidate in self.by_output:
                return self.by_output[candidate]
        return None


#: ONNX op types an engine fuses into the node before them (activations, bias and residual adds).
_POST_OPS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "Add", "Sum", "Mul"})


def _anchor(ops: Sequence[int], heavy: frozenset[int]) -> int | None:
    if not ops:
        return None
    return min((i for i in ops if i in heavy), default=min(ops))


def _attribute(raw: list[tuple[str, str, float, list[str]]], onnx_ops: _OnnxOps, heavy: frozenset[int]
               ) -> list[NodeTime]:
    """Engine nodes (name, kind, seconds, ONNX node names they name) to ``NodeTime``: an ONNX node with ops
    that no engine node names is charged to the first named node downstream of it (fused into it)."""
    named: dict[str, int] = {}
    for k, (_, _, _, origins) in enumerate(raw):
        for o in origins:
            named.setdefault(o, k)
    extra: dict[int, set[int]] = collections.defaultdict(set)
    for node in onnx_ops.order:
        if node in named or not onnx_ops.by_name[node]:
            continue
        up = onnx_ops.producer.get(node)
        if onnx_ops.kinds[node] in _POST_OPS and up in named and onnx_ops.users.get(up) == [node]:
            # a post-op fused into the node before it (conv + relu)
            extra[named[up]].update(onnx_ops.by_name[node])
            continue
        seen, todo = {node}, list(onnx_ops.users.get(node, []))
        while todo:
            u = todo.pop(0)
            if u in seen:
                continue
            seen.add(u)
            if u in named:
                extra[named[u]].update(onnx_ops.by_name[node])
                break
            todo.extend(onnx_ops.users.get(u, []))
    out = []
    for k, (name, kind, seconds, origins) in enumerate(raw):
        ops = sorted({i for o in origins for i in onnx_ops.by_name[o]} | extra.get(k, set()))
        out.append(NodeTime(name, kind, seconds, tuple(ops), _anchor(ops, heavy)))
    return out


# -- the task --------------------------------------------------------------------------------------


def profile_artifact(artifact_dir: str, data_file: str, backend: str, version: str, heavy: list[int],
                     rounds: int = 20, warmup: int = 3) -> InContextCosts:
    """Runs ``@main`` of the artifact (every region on ``backend``: ``ort`` or ``openvino``) on the data
    file's inputs ``warmup`` times, then ``rounds`` times with the engine's profiler on; per engine node
    its median time, charged to the ops it came from (``heavy``: the convolutions and matmuls, preferred
    as a fused node's anchor)."""
    import importlib

    import collage_runtime

    if backend not in _HOOKS:
        raise ValueError(f"no per-node profile for backend {backend}")
    hook = importlib.import_module(_HOOKS[backend])
    inputs = load_arrays(data_file, INPUT)
    with tempfile.TemporaryDirectory(prefix="collage-profile-") as tmp:
        hook.PROFILED = []
        if backend == "ort":
            hook.PROFILE_DIR = tmp
        try:
            program = collage_runtime.load(artifact_dir)
            handles = list(hook.PROFILED)
        finally:
            hook.PROFILED = None
        try:
            fn = program.device_function("main")
            args = [program.to_device(a) for a in inputs]
            for _ in range(warmup):
                fn(*args)
            walls: list[float] = []
            per_round: list[dict[tuple[int, str], float]] = []
            kinds: dict[tuple[int, str], str] = {}
            for _ in range(rounds):
                t0 = time.perf_counter()
                fn(*args)
                walls.append(time.perf_counter() - t0)
                if backend == "openvino":
                    now = {}
                    for k, (_, _, request) in enumerate(handles):
                        for info in request.profiling_info:
                            if info.status.name == "EXECUTED":
                                now[(k, info.node_name)] = info.real_time.total_seconds()
                                kinds[(k, info.node_name)] = info.node_type
                    per_round.append(now)
            if backend == "ort":
                per_round = [{} for _ in range(rounds)]
                for k, (_, session) in enumerate(handles):
                    for (name, kind), times in _ort_node_times(Path(session.end_profiling())).items():
                        kinds[(k, name)] = kind
                        for r, t in enumerate(times[-rounds:][::-1]):  # the last call's last
                            per_round[rounds - 1 - r][(k, name)] = t
        finally:
            program.close()
    samples: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    residual: set[tuple[int, str]] = set()
    for wall, now in zip(walls, per_round):
        # A counter above the whole call cannot be the node's time (OpenVINO's FullyConnected read 0.5-1.2
        # ms in calls of 0.16-0.36 ms): such nodes share what the others leave of the call.
        bad = [n for n, t in now.items() if t > wall]
        rest = max(0.0, wall - sum(t for n, t in now.items() if n not in bad))
        for n, t in now.items():
            samples[n].append(rest / len(bad) if n in bad else t)
        residual.update(bad)
    nodes: list[NodeTime] = []
    for k, handle in enumerate(handles):
        onnx_ops = _OnnxOps.read(Path(handle[0]))
        origins = _ov_origins(handle[1]) if backend == "openvino" else {}
        raw = []
        for (kk, name), times in samples.items():
            if kk != k:
                continue
            names = origins.get(name, [name]) if backend == "openvino" else [name]
            found = [n for n in (onnx_ops.lookup(x) for x in names) if n is not None]
            raw.append((name, kinds[(k, name)], statistics.median(times), list(dict.fromkeys(found))))
        nodes += [replace(n, residual=(k, n.name) in residual) for n in _attribute(raw, onnx_ops, frozenset(heavy))]
    return InContextCosts(backend, version, statistics.median(walls), rounds, tuple(nodes))


def _ov_origins(compiled) -> dict[str, list[str]]:
    """Per node of OpenVINO's runtime graph, the names of the original (ONNX) layers fused into it."""
    out = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        names = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
        out[op.get_friendly_name()] = [n for n in names.split(",") if n]
    return out


def _ort_node_times(trace: Path) -> dict[tuple[str, str], list[float]]:
    """ONNX Runtime's trace: per node (name, op type) its kernel times in seconds, in call order."""
    times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    try:
        events = json.loads(trace.read_text())
    finally:
        trace.unlink(missing_ok=True)
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "Node" and name.endswith("_kernel_time"):
            times[(name.removesuffix("_kernel_time"), e.get("args", {}).get("op_name", ""))].append(e["dur"] * 1e-6)
    return dict(times)


def profile_key(model_digest: str, backend: str, version: str, device: str, harness: int, plan: dict) -> str:
    """What an in-context profile is kept under in the cost DB: the model (module and inputs), the engine
    and its version, the device, the harness version and the plan profiled."""
    import hashlib

    text = json.dumps({"model": model_digest, "backend": backend, "version": version, "device": device,
                       "harness": harness, "plan": plan}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = ["IN_CONTEXT", "PROFILE", "PROFILED_BACKENDS", "InContextCosts", "NodeTime", "profile_artifact",
           "profile_key"]
