"""Logical IREE devices: several llvm-cpu codegen configurations in one IREE program.

A codegen backend whose regions need another configuration than the program's default (data tiling
and microkernels, other CPU features) declares an ``IreeDevice``. ``collage-place-devices`` then
declares one logical ``local`` device per configuration on the module, each with its own
``#hal.executable.target``, and pins the regions' boundaries to their device with
``flow.tensor.transfer``. At run time every logical device is served by the same local-task device.

Executable targets are resolved by IREE itself (the host's CPU, features and vector width), from the
llvm-cpu flags a device declares, so that artifacts built here match what ``--iree-llvmcpu-*`` flags give.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import CollageError

#: Encoding resolvers: packed (data-tiled) layouts on llvm-cpu, or plain layouts.
DATA_TILING_RESOLVER = "#iree_cpu.cpu_encoding_resolver<>"
IDENTITY_RESOLVER = "#iree_encoding.identity_resolver<>"
_RESOLVER_KEY = re.compile(r"iree\.encoding\.resolver = #[\w.]+<[^<>]*>")


@dataclass(frozen=True)
class IreeDevice:
    """A logical IREE device of its own for a codegen backend's regions."""

    #: Symbol of the device in the IREE program (``@<name>``).
    name: str
    #: llvm-cpu flags that configure its executable target (``--iree-llvmcpu-enable-ukernels=all``, ...).
    target_flags: tuple[str, ...]
    #: Whether data-tiling encodings resolve to packed layouts on this device (else plain layouts).
    data_tiling: bool = False
    #: IREE flags the whole program needs once this device is in it.
    program_flags: tuple[str, ...] = ()


#: The device every region without a device of its own runs on (and the program's entry points).
DEFAULT_DEVICE_NAME = "dev_default"

#: IREE flags every program with more than one logical device needs (measured with IREE 3.13):
#: linked executables fail to load ("export ... not found"); compile-time evaluation of constant
#: expressions crashes on values transferred between devices (so they are evaluated at load time).
MULTI_DEVICE_FLAGS = ("--iree-hal-link-executables=false", "--iree-opt-const-eval=false")


def _balanced(text: str, start: int) -> str:
    """The attribute starting at ``text[start]`` up to its matching ``>`` (quotes respected)."""
    depth, quoted = 0, False
    for k in range(start, len(text)):
        ch = text[k]
        if ch == '"' and text[k - 1] != "\\":
            quoted = not quoted
        elif not quoted and ch == "<":
            depth += 1
        elif not quoted and ch == ">" and text[k - 1] != "-":
            depth -= 1
            if depth == 0:
                return text[start:k + 1]
    raise ValueError("unbalanced attribute")


@lru_cache(maxsize=16)
def _resolved_target(flags: tuple[str, ...]) -> str:
    from iree.compiler import tools

    probe = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n"
    try:
        out = tools.compile_str(probe, target_backends=["llvm-cpu"],
                                extra_args=[*flags, "--compile-to=preprocessing"]).decode()
    except tools.CompilerToolError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower()]
        raise CollageError(f"IREE rejected device flags {' '.join(flags)}: {lines[0] if lines else exc}") from None
    start = out.find('#hal.executable.target<"llvm-cpu"')
    if start < 0:
        raise CollageError(f"IREE gave no llvm-cpu executable target for flags {' '.join(flags)}")
    return _balanced(out, start)


def executable_target(flags: tuple[str, ...], data_tiling: bool) -> str:
    """The ``#hal.executable.target<"llvm-cpu", ...>`` IREE resolves for ``flags``, with the encoding
    resolver set for ``data_tiling`` (packed layouts) or not (plain layouts)."""
    text = _resolved_target(tuple(flags))
    resolver = f"iree.encoding.resolver = {DATA_TILING_RESOLVER if data_tiling else IDENTITY_RESOLVER}"
    if _RESOLVER_KEY.search(text):
        return _RESOLVER_KEY.sub(resolver, text, count=1)
    if data_tiling:
        raise CollageError(f"IREE has no data-tiling encoding resolver for this CPU target ({' '.join(flags)})")
    return text[:-2] + ", " + resolver + "}>"


def device_target(ordinal: int, executable: str) -> str:
    """A logical ``local`` device with one executable target, as the value of ``hal.device.targets``."""
    return f'#hal.device.target<"local", {{ordinal = {ordinal} : index}}, [{executable}]> : !hal.device'
