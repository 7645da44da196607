"""Shape buckets: one artifact that serves a range of input shapes.

A model with dynamic dimensions (an ONNX ``dim_param``, a torch input axis named by argument and axis) is
compiled once per *bucket*: a static shape inside each dimension's declared range. Each bucket is an
ordinary artifact in ``buckets/<label>/``, compiled and placed for that shape by the whole static pipeline.
``shapes.json`` at the artifact's root (instead of ``manifest.json``) says which input axes carry which
dimension, the declared ranges, the buckets, and what serves a shape between buckets:

- ``pad``: the dims the user declared paddable (rows independent along them, such as a batch): the
  inputs are zero-padded up to the smallest bucket that holds them and the outputs sliced back;
- ``fallback``: an engine that takes dynamic dims runs the source model, ``fallback/model.onnx``
  (``Fallback.ORT``: ONNX Runtime; ``Fallback.OPENVINO``: OpenVINO, the model compiled once with its
  dynamic dims; ``Fallback.OPENVINO_BF16``: the same in bf16, where the user allowed bf16), or a StableHLO module compiled by IREE with its dynamic dims, ``fallback/main.vmfb``
  (``Fallback.IREE``);
- nothing: a shape between buckets is refused (the compiler refuses to build such an artifact unless
  every value in range is a bucket).

The buckets' ONNX files and the fallback model take their weights from one store at the root,
``weights.bin`` (``collage_runtime.weights``): each distinct weight is written once for all of them.

A shape outside a declared range is one error line naming the dimension, the value and the range.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Sequence

from .manifest import ArtifactError, confined, verified_file
from .weights import WEIGHTS, WeightStore

SHAPES = "shapes.json"
FORMAT = "collage-shapes"
#: 2: the buckets' ONNX files may refer to a weight store (``weights_sha256``).
VERSION = 2
READS = (1, 2)


@dataclass(frozen=True)
class DimRange:
    """A dynamic dimension's declared range: ``min <= value <= max``; ``opt`` is the shape to tune hardest
    for (TensorRT's optimization profile)."""

    name: str
    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ValueError(f"dimension '{self.name}': expected 1 <= MIN <= OPT <= MAX, got "
                             f"{self.min}:{self.opt}:{self.max}")

    def __contains__(self, value: int) -> bool:
        return self.min <= value <= self.max

    def __str__(self) -> str:
        return f"{self.name}={self.min}:{self.opt}:{self.max}"

    def to_json(self) -> dict:
        return {"name": self.name, "min": self.min, "opt": self.opt, "max": self.max}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "DimRange":
        if not (isinstance(data, dict) and isinstance(data.get("name"), str)
                and all(isinstance(data.get(k), int) for k in ("min", "opt", "max"))):
            raise ArtifactError(f"{where}: dims: expected {{name, min, opt, max}} entries")
        try:
            return cls(data["name"], data["min"], data["opt"], data["max"])
        except ValueError as exc:
            raise ArtifactError(f"{where}: {exc}") from None


class Fallback(str, Enum):
    """What runs a shape no bucket matches and padding cannot serve."""

    NONE = "none"
    ORT = "ort"            # ONNX Runtime on the source ONNX model, whose inputs keep their dynamic dims
    OPENVINO = "openvino"  # OpenVINO's CPU plugin on the same model, compiled with dynamic dims
    OPENVINO_BF16 = "openvino-bf16"  # the same with bf16 inference precision (`--precision bf16`)
    IREE = "iree"          # IREE's CPU program of a StableHLO module, compiled with its dynamic dims

    @property
    def file(self) -> str | None:
        """The fallback's model file inside the artifact."""
        if self is Fallback.NONE:
            return None
        return "fallback/main.vmfb" if self is Fallback.IREE else "fallback/model.onnx"


#: Per input (or output), per axis: the dimension's name, or None for a static axis.
Axes = tuple[tuple[str | None, ...], ...]


@dataclass(frozen=True)
class Bucket:
    """One static shape: the value of every dimension, and the artifact compiled for it."""

    values: Mapping[str, int]
    path: str

    @property
    def label(self) -> str:
        return dims_label(self.values)


@dataclass(frozen=True)
class ShapeTable:
    """``shapes.json``: the dims, which input and output axes carry them, the buckets and what serves the
    rest. ``function``: the one function the buckets take (``main``)."""

    dims: tuple[DimRange, ...]
    inputs: Axes
    outputs: Axes
    buckets: tuple[Bucket, ...]
    pad: tuple[str, ...] = ()
    fallback: Fallback = Fallback.NONE
    fallback_sha256: str | None = None
    function: str = "main"
    #: SHA-256 of the weight store (``collage_runtime.weights``) the buckets' ONNX files refer to; None: none.
    weights_sha256: str | None = None

    def dim(self, name: str) -> DimRange:
        return next(d for d in self.dims if d.name == name)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "function": self.function,
                "dims": [d.to_json() for d in self.dims],
                "inputs": [list(a) for a in self.inputs], "outputs": [list(a) for a in self.outputs],
                "buckets": [{"values": dict(b.values), "path": b.path} for b in self.buckets],
                "pad": list(self.pad), "fallback": self.fallback.value, "fallback_sha256": self.fallback_sha256,
                "weights_sha256": self.weights_sha256}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "ShapeTable":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ArtifactError(f"{where}: not a collage shape table")
        if data.get("version") not in READS:
            raise ArtifactError(f"{where}: shape table version {data.get('version')!r} is not supported "
                                f"(this runtime reads version {VERSION}); recompile the artifact")
        dims = tuple(DimRange.from_json(d, where) for d in _list(data, "dims", where))
        names = {d.name for d in dims}
        if len(names) != len(dims):
            raise ArtifactError(f"{where}: dims: names must be unique")

        def axes(key: str) -> Axes:
            rows = _list(data, key, where)
            if not all(isinstance(r, list) and all(a is None or a in names for a in r) for r in rows):
                raise ArtifactError(f"{where}: {key}: expected a list per tensor of declared dim names or null")
            return tuple(tuple(r) for r in rows)

        buckets = []
        for b in _list(data, "buckets", where):
            if not (isinstance(b, dict) and isinstance(b.get("path"), str) and isinstance(b.get("values"), dict)
                    and set(b["values"]) == names and all(isinstance(v, int) for v in b["values"].values())):
                raise ArtifactError(f"{where}: buckets: expected {{values: {{dim: int}} for every dim, path}}")
            buckets.append(Bucket(dict(b["values"]), b["path"]))
        pad = _list(data, "pad", where)
        if not all(p in names for p in pad):
            raise ArtifactError(f"{where}: pad: expected declared dim names")
        try:
            fallback = Fallback(data.get("fallback", Fallback.NONE.value))
        except ValueError:
            raise ArtifactError(f"{where}: fallback: expected one of {', '.join(f.value for f in Fallback)}") from None
        function = data.get("function", "main")
        sha, weights = data.get("fallback_sha256"), data.get("weights_sha256")
        if not isinstance(function, str) or not all(isinstance(v, (str, type(None))) for v in (sha, weights)):
            raise ArtifactError(f"{where}: function, fallback_sha256 and weights_sha256 must be strings")
        if not buckets:
            raise ArtifactError(f"{where}: buckets: at least one bucket")
        return cls(dims, axes("inputs"), axes("outputs"), tuple(buckets), tuple(pad), fallback, sha, function,
                   weights)


def dims_label(values: Mapping[str, int]) -> str:
    """``batch=8,seq=128``: a shape by its dims' values, as messages and file names show it."""
    return ",".join(f"{k}={v}" for k, v in values.items())


def serves(bucket: Mapping[str, int], values: Mapping[str, int], pad: Sequence[str]) -> bool:
    """Whether ``bucket`` serves a shape of dim ``values``: the same, or larger along dims in ``pad`` only."""
    return all(bucket[n] == v or (n in pad and bucket[n] > v) for n, v in values.items())


def bucket_for(buckets: Sequence[Mapping[str, int]], values: Mapping[str, int],
               pad: Sequence[str]) -> Mapping[str, int] | None:
    """The bucket that serves a shape of dim ``values``: the same shape, else the smallest (by size, the
    product of its dims) that is larger only along dims in ``pad``; None when none does."""
    fits = [b for b in buckets if serves(b, values, pad)]  # the exact one is the smallest
    return min(fits, key=lambda b: math.prod(b.values())) if fits else None


def pad_to(array, axes: tuple[str | None, ...], values: Mapping[str, int]):
    """``array`` zero-padded at the end of each axis that carries a dim, up to its value in ``values``."""
    import numpy as np

    widths = [(0, values[n] - array.shape[k]) if n is not None else (0, 0) for k, n in enumerate(axes)]
    return np.pad(array, widths) if any(w for _, w in widths) else array


def cut_to(array, axes: tuple[str | None, ...], values: Mapping[str, int]):
    """``array`` cut back to ``values`` along each axis that carries a dim (undoes ``pad_to``'s effect on a
    result)."""
    if len(axes) != array.ndim:
        return array
    return array[tuple(slice(0, values[n]) if n is not None else slice(None) for n in axes)]


def _list(data: dict, key: str, where: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ArtifactError(f"{where}: {key}: expected a list")
    return value


def load_shape_table(root: Path) -> ShapeTable:
    """Reads and checks ``root/shapes.json``: format, field types, bucket directories confined to ``root``
    and the fallback model and the weight store matching their SHA-256 (each bucket's own manifest is
    checked when it loads)."""
    table = _read_table(root)
    for b in table.buckets:
        confined(root, b.path, f"bucket {b.label}")
    if table.fallback.file is not None:
        verified_file(root, table.fallback.file, table.fallback_sha256, "fallback model")
    if table.weights_sha256 is not None:
        verified_file(root, WEIGHTS, table.weights_sha256, "weight store")
    return table


def write_shape_table(root: Path, table: ShapeTable) -> None:
    (root / SHAPES).write_text(json.dumps(table.to_json(), indent=1) + "\n")


def bucket_store(directory: Path) -> WeightStore | None:
    """The weight store of the shaped artifact whose bucket ``directory`` is (``<artifact>/buckets/<bucket>``),
    checked against its shape table; None where ``directory`` is no bucket or its artifact has no store."""
    root = Path(directory).resolve().parent.parent
    if not (root / SHAPES).is_file():
        return None
    table = _read_table(root)  # only the store is checked: the bucket's own files are its manifest's
    if table.weights_sha256 is None or not any((root / b.path).resolve() == Path(directory).resolve()
                                               for b in table.buckets):
        return None
    return WeightStore(verified_file(root, WEIGHTS, table.weights_sha256, "weight store"))


def _read_table(root: Path) -> ShapeTable:
    path = root / SHAPES
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{path}: cannot read the shape table ({' '.join(str(exc).split())})") from None
    return ShapeTable.from_json(data, str(path))
