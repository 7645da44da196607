"""Element types and tensor signatures: the one map from MLIR element types to numpy dtypes (runtime and
compiler both use it), and the parser of a compiled function's ABI declaration."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import ml_dtypes
import numpy as np

#: MLIR element type → numpy dtype of the host array that carries it. Sub-byte integers (i2, i4, ui4) are
#: carried one element per byte; bf16 is ``ml_dtypes.bfloat16`` (what JAX's arrays and IREE's runtime use;
#: IREE's runtime depends on ml_dtypes); f8 types have no numpy dtype here (None).
NUMPY_DTYPES: dict[str, np.dtype | None] = {
    "f16": np.dtype(np.float16), "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i1": np.dtype(np.bool_),
    "i2": np.dtype(np.int8), "i4": np.dtype(np.int8), "si4": np.dtype(np.int8),
    "i8": np.dtype(np.int8), "si8": np.dtype(np.int8), "i16": np.dtype(np.int16), "si16": np.dtype(np.int16),
    "i32": np.dtype(np.int32), "si32": np.dtype(np.int32), "i64": np.dtype(np.int64), "si64": np.dtype(np.int64),
    "ui2": np.dtype(np.uint8), "ui4": np.dtype(np.uint8),
    "ui8": np.dtype(np.uint8), "ui16": np.dtype(np.uint16), "ui32": np.dtype(np.uint32), "ui64": np.dtype(np.uint64),
    "complex<f32>": np.dtype(np.complex64), "complex<f64>": np.dtype(np.complex128),
}

#: Bits per element where an element is narrower than a byte (IREE packs them densely).
SUB_BYTE_BITS = {"i2": 2, "ui2": 2, "i4": 4, "si4": 4, "ui4": 4}


class NumberFormat(str, Enum):
    """The format a region's float math computes in: the model's own f32, or a lower one a backend opts into
    (OpenVINO's bf16 inference precision, Triton's TF32 products)."""

    F32 = "f32"
    BF16 = "bf16"
    TF32 = "tf32"


def is_float(dtype: np.dtype) -> bool:
    """Whether arrays of ``dtype`` hold real floats: numpy's, and bf16 (``ml_dtypes``, numpy kind ``V``)."""
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) == NUMPY_DTYPES["bf16"]


def restored(array: np.ndarray) -> np.ndarray:
    """``array`` as read back from a ``.npy``/``.npz`` file: numpy writes ml_dtypes' bfloat16 as 2-byte void
    (``|V2``), which this views as bfloat16 again (no other dtype here is saved as ``|V2``)."""
    return array.view(NUMPY_DTYPES["bf16"]) if array.dtype == np.dtype("V2") else array


def numpy_dtype(element: str) -> np.dtype | None:
    """The numpy dtype carrying MLIR element type ``element`` on the host, or None if numpy has none."""
    return NUMPY_DTYPES.get(element)


def byte_dtype(element: str) -> np.dtype | None:
    """The numpy dtype whose bytes are exactly ``element``'s in memory (None for sub-byte and unknown types,
    whose memory is packed differently): for reading raw buffers and blobs."""
    return None if element in SUB_BYTE_BITS else NUMPY_DTYPES.get(element)


class Platform(str, Enum):
    """Where a program's IREE module runs: the HAL driver that loads it and the kind of memory its buffers
    live in. A program runs on one platform (IREE cannot mix discrete-memory devices with the CPU in one
    program today); regions of engines that live elsewhere are served through ``collage_rt`` with copies."""

    CPU = "cpu"
    CUDA = "cuda"
    VULKAN = "vulkan"

    @property
    def driver(self) -> str:
        """The IREE HAL driver that runs the platform's modules."""
        return "local-task" if self is Platform.CPU else self.value

    @property
    def host_memory(self) -> bool:
        """Whether the platform's buffers are host memory (mapped in place); else device-only memory that
        the host reads and writes through staging copies, or that device engines take through DLPack."""
        return self is Platform.CPU

    @property
    def dlpack_device(self) -> int:
        """DLPack's device type of the platform's buffers (kDLCPU 1, kDLCUDA 2, kDLVulkan 7)."""
        return {Platform.CPU: 1, Platform.CUDA: 2, Platform.VULKAN: 7}[self]


@dataclass(frozen=True)
class Tolerance:
    """How far a backend's results may differ from IREE llvm-cpu's (numpy ``allclose`` semantics); a
    backend states it, and an artifact's manifest records it per region."""

    rtol: float = 1e-5
    atol: float = 1e-6


@dataclass(frozen=True)
class TensorSpec:
    """A tensor in a function signature: its shape (None for a dynamic dimension) and element type."""

    shape: tuple[int | None, ...]
    element: str

    @property
    def dtype(self) -> np.dtype | None:
        return numpy_dtype(self.element)

    def __str__(self) -> str:
        dims = "".join(("?" if d is None else str(d)) + "x" for d in self.shape)
        return f"tensor<{dims}{self.element}>"

    def to_json(self) -> dict:
        """``{"shape": [...], "dtype": "f32"}``, as a manifest or step program writes a tensor."""
        return {"shape": list(self.shape), "dtype": self.element}

    @classmethod
    def from_json(cls, data: object) -> "TensorSpec":
        """The spec ``to_json`` wrote; ValueError unless a static shape and an element type numpy carries."""
        if not (isinstance(data, dict) and isinstance(data.get("shape"), list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in data["shape"])
                and isinstance(data.get("dtype"), str) and numpy_dtype(data["dtype"]) is not None):
            raise ValueError("expected {shape: [int...], dtype}")
        return cls(tuple(data["shape"]), data["dtype"])

    def accepts(self, array: np.ndarray) -> bool:
        """Whether ``array`` has this element type's host dtype, this rank and these static dimensions."""
        return (self.dtype is not None and array.dtype == self.dtype and array.ndim == len(self.shape)
                and all(d is None or d == n for d, n in zip(self.shape, array.shape)))


_TENSOR = re.compile(r"tensor<((?:(?:\d+|\?)x)*)([^,]+)>")


def parse_tensor(text: str) -> TensorSpec | None:
    """``tensor<4x?xf32>`` → TensorSpec; None for anything else (encodings, non-tensor types)."""
    m = _TENSOR.fullmatch(text.strip())
    if m is None:
        return None
    shape = tuple(None if d == "?" else int(d) for d in m.group(1).split("x")[:-1])
    return TensorSpec(shape, m.group(2))


@dataclass(frozen=True)
class Signature:
    """A public function's inputs and outputs as its ABI declaration states them (None: not a tensor)."""

    inputs: tuple[TensorSpec | None, ...]
    outputs: tuple[TensorSpec | None, ...]


def split_top_level(text: str, brackets: str = "(<{") -> list[str]:
    """``text`` split at the commas outside any of ``brackets`` (and their closing partners), stripped."""
    closing = {"(": ")", "<": ">", "{": "}", "[": "]"}
    opens, closes = set(brackets), {closing[b] for b in brackets}
    parts, depth, cur = [], 0, []
    for k, ch in enumerate(text):
        if ch in opens:
            depth += 1
        elif ch in closes and not (ch == ">" and k and text[k - 1] == "-"):  # "->" closes nothing
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


_ENCODING = re.compile(r"\{.*iree\.abi\.encoding = (tensor<[^{}]*>).*\}")


def _type_of(part: str) -> TensorSpec | None:
    """One ``%name: type {attrs}`` entry; ``iree.abi.encoding`` (how an unsigned type travels) wins."""
    text = part.split(":", 1)[1] if ":" in part else part
    encoded = _ENCODING.search(text)
    return parse_tensor(encoded.group(1) if encoded else text.split("{", 1)[0])


def _types(text: str) -> tuple[TensorSpec | None, ...]:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return tuple(_type_of(p) for p in split_top_level(text))


def parse_declaration(decl: str) -> Signature | None:
    """Parses IREE's ``iree.abi.declaration`` (``sync func @f(%input0: tensor<4xf32>) -> (%output0: ...)``)."""
    start = decl.find("(")
    if start < 0 or "func @" not in decl[:start]:
        return None
    depth = 0
    for k in range(start, len(decl)):
        depth += decl[k] in "(<"
        depth -= decl[k] in ")>" and decl[k - 1] != "-"
        if depth == 0:
            rest = decl[k + 1:]
            return Signature(_types(decl[start:k + 1]), _types(rest.split("->", 1)[1]) if "->" in rest else ())
    return None
