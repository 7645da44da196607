"""Backend registry, filled from the ``collage_mlir.backends`` entry-point group.

Installing a package that declares an entry point in that group adds a backend; the compiler
never names concrete backends.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import entry_points

from ..dialects import collage
from ..errors import CollageError
from ..ir import ir
from .base import Backend, BackendInfo, BackendKind, Candidate, Platform, Precision, RegionArtifact, RegionKey, Tolerance
from .iree_codegen import IreeCodegenBackend

__all__ = ["Backend", "BackendInfo", "BackendKind", "Candidate", "Precision", "RegionArtifact", "RegionKey", "Tolerance", "registry",
           "expand_names",
           "get_backend", "pinned_backend", "DEFAULT_BACKEND", "PLATFORM_DEFAULTS", "program_default", "Platform"]

GROUP = "collage_mlir.backends"
DEFAULT_BACKEND = "iree-cpu"
#: The default backend of a program on each platform (ops outside every region run on it).
PLATFORM_DEFAULTS = {Platform.CPU: "iree-cpu", Platform.CUDA: "iree-cuda", Platform.VULKAN: "iree-vulkan"}
#: The engine that runs an ONNX node kept as ONNX wherever a plan leaves it on the default backend.
ONNX_NODE_BACKEND = "ort"


def pinned_backend(op: ir.Operation) -> str | None:
    """The backend ``op`` runs on whatever a plan says (``ONNX_NODE_BACKEND`` for an ONNX node kept as ONNX,
    which no codegen backend runs), or None."""
    return ONNX_NODE_BACKEND if collage.is_onnx_node(op) else None


@lru_cache(maxsize=1)
def registry() -> dict[str, BackendInfo]:
    """Every registered backend by name; one that fails to load is listed with its problem."""
    infos: dict[str, BackendInfo] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            backend = ep.load()()
        except Exception as exc:  # a broken plug-in must not take the compiler down
            infos[ep.name] = BackendInfo(ep.name, None, f"failed to load {ep.value}: {exc}")
            continue
        infos[ep.name] = BackendInfo(ep.name, backend, backend.available())
        for variant in backend.variants():
            infos[variant.name] = BackendInfo(variant.name, variant, variant.available())
    return infos


def expand_names(names: list[str]) -> list[str]:
    """Backend names with each ``NAME@*`` replaced by every variant of ``NAME`` (its tactics), in order."""
    out: list[str] = []
    for name in names:
        if name.endswith("@*"):
            base = name[:-2]
            found = sorted(n for n in registry() if n.startswith(base + "@"))
            if not found:
                raise CollageError(f"backend '{base}' has no variants to expand '{name}' to")
            out += found
        else:
            out.append(name)
    return out


def get_backend(name: str, *, where: str | None = None) -> Backend:
    """The usable backend called ``name``, or a CollageError naming the known ones."""
    info = registry().get(name)
    if info is None:
        known = ", ".join(sorted(registry())) or "none (is collage-mlir installed with `pip install -e .`?)"
        raise CollageError(f"unknown backend '{name}'; known backends: {known}", where=where)
    if info.backend is None or info.problem:
        hint = f" ({info.backend.install_hint})" if info.backend and info.backend.install_hint else ""
        raise CollageError(f"backend '{name}' is unavailable: {info.problem}{hint}", where=where)
    return info.backend


def program_default(name: str, *, where: str | None = None) -> IreeCodegenBackend:
    """The usable codegen backend ``name`` as a program's default backend (``Plan.default_backend``), or a
    CollageError saying which backends can be one."""
    backend = get_backend(name, where=where)
    if not isinstance(backend, IreeCodegenBackend):
        raise CollageError(f"backend '{name}' cannot be a program's default backend (ops outside regions run on "
                           f"it): use one of {', '.join(PLATFORM_DEFAULTS.values())}, and give ops to '{name}' "
                           f"with regions (e.g. --plan prefer:{name})", where=where)
    return backend
