"""Weights written once per artifact: the shared weight store (``weights.bin``) of a shaped artifact.

A model compiled per shape bucket has the same weights in every bucket (and in the fallback model). Each
graph-engine region is an ONNX file, which would carry its own copy: BERT-base with six buckets was a
2.9 GB artifact for a 0.44 GB model. Instead the compiler moves every initializer of at least
``MIN_BYTES`` out of the ONNX files of a shaped artifact into one store at the artifact's root, each
distinct tensor once (keyed by its bytes' SHA-256, 64-byte aligned), and each file keeps an ONNX external
data reference to it: ``location`` is ``weights.bin`` (the store, not a file beside the model), with
``offset`` and ``length``. The shape table records the store's SHA-256.

At load the runtime maps the store once and each executor takes its tensors from the mapping, with no
copy: ONNX Runtime as external initializers, OpenVINO as constants that share the memory, put in place of
those initializers read as model inputs (its ONNX reader refuses external data outside the model's
directory). The engines still make their own packed copies where their kernels want another layout. Small
initializers (shapes, scalars) stay in the files, where the engines' importers and graph optimizers read
their values.
"""

from __future__ import annotations

import hashlib
import mmap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .manifest import ArtifactError, sha256_file

if TYPE_CHECKING:
    import onnx

WEIGHTS = "weights.bin"
#: Initializers smaller than this stay inside their ONNX file.
MIN_BYTES = 1024
ALIGN = 64


class WeightWriter:
    """Writes the store at ``path`` while an artifact is built: ``externalize(model)`` moves a model's large
    initializers into it (each distinct tensor once) and points them at it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "wb")
        self._at: dict[bytes, int] = {}  # the bytes' SHA-256 → offset
        self.size = 0

    def externalize(self, model: "onnx.ModelProto") -> int:
        """Moves ``model``'s initializers of at least ``MIN_BYTES`` into the store, in place; returns how
        many. Only the main graph's: a subgraph's stay in its file (ONNX Runtime takes external initializers
        for the main graph only)."""
        from onnx import TensorProto, numpy_helper

        moved = 0
        for tensor in model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                raise ValueError(f"initializer '{tensor.name}' already refers to external data")
            data = numpy_helper.to_array(tensor) if not tensor.HasField("raw_data") else None
            raw = tensor.raw_data if data is None else np.ascontiguousarray(data).tobytes()
            dtype = _numpy_dtype(tensor)
            if len(raw) < MIN_BYTES or dtype is None or len(raw) != dtype.itemsize * _count(tensor):
                continue  # strings, packed sub-byte types: kept in the file
            offset = self._put(raw)
            dims, name, dtype = list(tensor.dims), tensor.name, tensor.data_type
            tensor.Clear()
            tensor.name, tensor.data_type = name, dtype
            tensor.dims.extend(dims)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", WEIGHTS), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            moved += 1
        return moved

    def _put(self, raw: bytes) -> int:
        key = hashlib.sha256(raw).digest()
        offset = self._at.get(key)
        if offset is None:
            pad = -self.size % ALIGN
            self._file.write(b"\0" * pad)
            offset = self._at[key] = self.size + pad
            self._file.write(raw)
            self.size = offset + len(raw)
        return offset

    def close(self) -> str:
        """Finishes the store; its SHA-256 (for the shape table)."""
        self._file.close()
        return sha256_file(self.path)


class WeightStore:
    """The store of a loaded artifact, mapped once (copy-on-write: the engines' APIs take writable arrays;
    they only read them, and the file is never written). Its tensors are views of the mapping, and each
    view keeps the mapping alive: an engine that holds one can never read unmapped memory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if self.path.stat().st_size else b""
        self._bytes = np.frombuffer(mapped, dtype=np.uint8)

    def array(self, tensor: "onnx.TensorProto", where: str) -> np.ndarray:
        """The array ``tensor`` (an initializer pointing into the store) refers to."""
        info = {e.key: e.value for e in tensor.external_data}
        dtype = _numpy_dtype(tensor)
        try:
            offset, length = int(info.get("offset", "0")), int(info["length"])
        except (KeyError, ValueError):
            raise ArtifactError(f"{where}: initializer '{tensor.name}': malformed external data reference") from None
        if info.get("location") != WEIGHTS or dtype is None or offset < 0 \
                or length != _count(tensor) * dtype.itemsize or offset + length > self._bytes.size:
            raise ArtifactError(f"{where}: initializer '{tensor.name}' does not lie in the artifact's weight store; "
                                "recompile the artifact")
        return self._bytes[offset:offset + length].view(dtype).reshape(tuple(tensor.dims))

    def external(self, model: "onnx.ModelProto", where: str) -> list[tuple[str, np.ndarray]]:
        """(name, array) for each of ``model``'s initializers that refer to the store."""
        from onnx import TensorProto

        return [(t.name, self.array(t, where)) for t in model.graph.initializer
                if t.data_location == TensorProto.EXTERNAL]

    def close(self) -> None:
        """Lets the mapping go (it is unmapped once no engine holds a view of it)."""
        self._bytes = np.zeros(0, np.uint8)


def _numpy_dtype(tensor: "onnx.TensorProto") -> np.dtype | None:
    """The numpy dtype of ``tensor``'s elements; None for strings and types numpy has no width for."""
    from onnx import TensorProto, helper

    if tensor.data_type == TensorProto.STRING:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None


def _count(tensor: "onnx.TensorProto") -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))
