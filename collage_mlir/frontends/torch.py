"""PyTorch frontend: ``nn.Module`` + example inputs → StableHLO through torch-mlir's fx importer.

torch-mlir has its own MLIR build, so its module is handed to IREE's context as bytecode. Imports are
cached on disk, keyed by a hash of the model (structure and weights), the input signature and the
torch / torch-mlir versions: importing a big model is slow, re-importing it is not.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import tempfile
import warnings
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from collage_runtime.types import NUMPY_DTYPES

from ..dialects import stablehlo as sh
from ..errors import CollageError
from ..ir import ir, new_context, parse_module
from . import cache_dir, write_cache
from .onnx import import_onnx
from .refine import SYMBOLIC_DIMS
from . import torch_fastpath, wide_sums


def to_numpy(t) -> np.ndarray:
    """A CPU tensor's values as a numpy array, without a copy where it is on the CPU and contiguous; a bf16
    tensor as ml_dtypes' ``bfloat16`` (numpy has none; torch's ``.numpy()`` refuses it)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(NUMPY_DTYPES["bf16"])
    return t.numpy()


def to_torch(a: np.ndarray):
    """``to_numpy``'s inverse: a tensor over the array's memory (a bf16 array as ``torch.bfloat16``)."""
    import torch

    a = np.asarray(a)
    if a.dtype == NUMPY_DTYPES["bf16"]:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def model_key(model, example_inputs: Sequence) -> str:
    """Hash of the model's code (each module's class source; a traced graph's generated code, which is all
    that tells two of dynamo's weightless graphs apart), structure, weights, input signature and importer
    versions."""
    import torch

    h = hashlib.sha256()
    h.update(f"{type(model).__module__}.{type(model).__qualname__}\n{model!r}\n".encode())
    for sub in model.modules():
        h.update(_code(sub).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    for x in example_inputs:
        h.update(f"in:{tuple(x.shape)}:{x.dtype}\n".encode())
    h.update(f"torch={torch.__version__} torch-mlir={version('torch-mlir')}".encode())
    return h.hexdigest()[:32]


def _code(module) -> str:
    """What ``module`` runs: a GraphModule's generated code, else its class's source where Python has it."""
    import torch

    return module.code if isinstance(module, torch.fx.GraphModule) else _class_source(type(module))


@functools.cache
def _class_source(cls) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # defined in a REPL or a C extension: its name (in the key already) alone
        return ""


@contextmanager
def _persistent_buffers(model) -> Iterator[None]:
    """Registers the model's non-persistent buffers as persistent while it is exported, then as they were.
    torch.export lifts a non-persistent buffer (Hugging Face BERT's ``position_ids``/``token_type_ids``)
    as a constant the torch-mlir importer asserts on ("Could not find state mapping for buffer")."""
    changed = []
    for sub in model.modules():
        for name in list(getattr(sub, "_non_persistent_buffers_set", ())):
            sub._non_persistent_buffers_set.discard(name)
            changed.append((sub, name))
    try:
        yield
    finally:
        for sub, name in changed:
            sub._non_persistent_buffers_set.add(name)


def pt2e_quantized(model) -> bool:
    """Whether ``model`` is a PT2E-quantized graph (``convert_pt2e``'s: ``quantized_decomposed`` ops)."""
    graph = getattr(model, "graph", None)
    return graph is not None and any(
        n.op == "call_function" and str(n.target).startswith("quantized_decomposed.") for n in graph.nodes)


def _through_onnx(model, example_inputs: Sequence, func_name: str) -> bytes:
    """A PT2E-quantized model as StableHLO bytecode through torch's ONNX exporter and the ONNX frontend:
    torch-mlir's fx importer cannot legalize ``dequantize_per_channel``'s zero points (an int64
    ``torch.vtensor.literal``), while torch.export's ONNX writes each quantize/dequantize as
    ``QuantizeLinear``/``DequantizeLinear``, which the ONNX frontend keeps quantized (``onnx_qdq``)."""

    with tempfile.TemporaryDirectory(prefix="collage-pt2e-") as tmp:
        path = export_onnx(model, tuple(example_inputs), Path(tmp) / "model.onnx", "the PT2E-quantized model")
        module = import_onnx(path, new_context(), func_name=func_name)
        return module.operation.get_asm(binary=True)


def export_onnx(model, args: tuple, path: Path, what: str) -> Path:
    """``model`` (a module, or an ``ExportedProgram`` with ``args`` empty: its dynamic dims kept as
    ``dim_param``s) written to ``path`` by torch's ONNX exporter (torch.export's); one CollageError line
    naming ``what`` where it cannot."""
    import torch

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if isinstance(model, torch.export.ExportedProgram):  # a graph dynamo captured may hold fast paths
                model = model.run_decompositions(torch_fastpath.fast_paths())
            torch.onnx.export(model, args, str(path), dynamo=True)
    except Exception as exc:  # noqa: BLE001  the exporter raises any type
        raise CollageError(f"cannot export {what} to ONNX: {' '.join(str(exc).split())[:300]}") from None
    return path


#: Where torch's eager-mode quantized modules live (``quantize_dynamic``, ``torch.ao.quantization.convert``).
EAGER_QUANTIZED = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized")


def _refuse_eager_quantized(model) -> None:
    """One CollageError where ``model`` holds torch.ao's eager-mode quantized modules: their packed weights
    and ``quantized::`` ops have no import (nor ONNX export); the f32 model in int8 is what collage takes."""
    for name, sub in getattr(model, "named_modules", lambda: ())():
        if type(sub).__module__.startswith(EAGER_QUANTIZED):
            raise CollageError(f"the model has torch.ao eager-mode quantized modules ({name}: {type(sub).__module__}."
                               f"{type(sub).__name__}), which collage cannot import: compile the f32 model with "
                               "precision='int8' and calibrate=batches, or quantize it with PT2E (convert_pt2e)")


def import_torch(model, example_inputs: Sequence, context: ir.Context, *, func_name: str = "main",
                 cache: Path | None | bool = True) -> ir.Module:
    """Imports ``model`` (in eval mode) as StableHLO into ``context``; ``cache=False`` disables the cache."""
    try:
        import torch
        from torch_mlir import fx
    except ImportError as exc:
        raise CollageError(f"the torch frontend needs torch and torch-mlir ({exc}); "
                           "run `pip install torch==2.13.0 'collage-mlir[torch]'`") from None
    try:
        model = model.eval()
    except NotImplementedError:  # an exported module (a PT2E-quantized one): traced in eval mode already
        pass
    _refuse_eager_quantized(model)
    path = None
    if cache is not False:
        root = Path(cache) if isinstance(cache, (str, Path)) else cache_dir() / "torch"
        path = root / f"{model_key(model, example_inputs)}-{func_name}.mlirbc"
        if path.exists():
            module = parse_module(path.read_bytes(), context, where=str(path))
            sh.inline_bf16_resources(module)  # a cache entry written before they were inlined
            wide_sums.widen(module)  # or before its sums were widened
            return module
    if pt2e_quantized(model):
        data = _through_onnx(model, example_inputs, func_name)
    else:
        with torch.no_grad(), _persistent_buffers(model), warnings.catch_warnings():
            # torch.export (2.13) warns about its own use of a deprecated pytree class: nothing to act on.
            warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
            imported = fx.export_and_import(model, *example_inputs, output_type="stablehlo", func_name=func_name,
                                            decomposition_table=torch_fastpath.decompositions())
        buf = io.BytesIO()
        imported.operation.write_bytecode(buf)
        data = buf.getvalue()
    module = parse_module(data, context, where=f"torch:{type(model).__name__}")
    # A bf16 model's weights as IREE takes them; its sums accumulated in f32, as torch computes them.
    if sh.inline_bf16_resources(module) + wide_sums.widen(module):
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        data = buf.getvalue()
    if path is not None:
        write_cache(path, data)
    return module


def import_exported_dynamic(program, context: ir.Context) -> ir.Module:
    """A ``torch.export.ExportedProgram`` with ``Dim`` ranges imported as StableHLO with its dynamic dims kept
    (``?``), marked ``refine.SYMBOLIC_DIMS``: torch.export traces a symbolic dim's broadcast only to itself
    (its guards decide any other). For IREE's dynamic program between buckets (``refine.for_iree``)."""
    from torch_mlir import fx

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
        try:
            imported = fx.export_and_import(program, output_type="stablehlo",
                                            decomposition_table=torch_fastpath.decompositions())
        except Exception as exc:  # noqa: BLE001  torch-mlir's import errors have several types
            raise CollageError(f"torch-mlir cannot import the program with its dynamic dims, so no fallback serves "
                               f"the shapes between buckets ({' '.join(str(exc).split())[:160]}); list every value "
                               "in buckets=, or declare the dim paddable with pad=") from None
    buf = io.BytesIO()
    imported.operation.write_bytecode(buf)
    module = parse_module(buf.getvalue(), context, where="torch.export")
    sh.inline_bf16_resources(module)
    wide_sums.widen(module)
    with context:
        module.operation.attributes[SYMBOLIC_DIMS] = ir.UnitAttr.get()
    return module

