"""The artifact manifest: what ``collage compile`` writes beside ``main.vmfb`` and what the runtime checks
before anything runs. An artifact is data: every file it names must lie inside the artifact directory
and match the SHA-256 recorded for it, and every field must have the type it should."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Mapping

from .types import Platform, TensorSpec, Tolerance

MANIFEST = "manifest.json"
FORMAT = "collage-artifact"
VERSION = 1


class ArtifactError(Exception):
    """The artifact directory is missing, incomplete, tampered with or from an incompatible version."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's contents."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def confined(root: Path, relative: Any, what: str) -> Path:
    """``root / relative`` if it names a file inside ``root`` (no absolute paths, no ``..`` escapes)."""
    if not isinstance(relative, str) or not relative:
        raise ArtifactError(f"{root / MANIFEST}: {what}: expected a relative file name, got {relative!r}")
    base = root.resolve()
    path = (base / relative).resolve()
    if Path(relative).is_absolute() or not path.is_relative_to(base):
        raise ArtifactError(f"{root / MANIFEST}: {what}: '{relative}' lies outside the artifact directory")
    return path


def verified_file(root: Path, relative: Any, sha256: Any, what: str) -> Path:
    """The confined path of a file the manifest names, after checking it exists and matches ``sha256``."""
    path = confined(root, relative, what)
    if not path.is_file():
        raise ArtifactError(f"{path}: {what} is missing; recompile the artifact")
    if not isinstance(sha256, str):
        raise ArtifactError(f"{root / MANIFEST}: {what} has no SHA-256; recompile the artifact")
    if sha256_file(path) != sha256:
        raise ArtifactError(f"{path}: {what} does not match its SHA-256 in the manifest (corrupt or modified); "
                            "recompile the artifact")
    return path


def _field(data: dict, key: str, kind: type, where: str):
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ArtifactError(f"{where}: {key}: expected {kind.__name__}, got {value!r}"[:300])
    return value


def _specs(data: dict, key: str, where: str) -> tuple[TensorSpec, ...]:
    items = data.get(key)
    try:
        if not isinstance(items, list):
            raise ValueError
        return tuple(TensorSpec.from_json(s) for s in items)
    except ValueError:
        raise ArtifactError(f"{where} {key}: expected a list of {{shape: [int...], dtype}} entries") from None


@dataclass(frozen=True)
class RegionEntry:
    """A region served through ``collage_rt``: its backend, tensor signature, the backend's tolerance, and
    the file its executor (an entry point of ``collage_runtime.executors``) loads, with that file's SHA-256
    (empty while the compile driver is still writing the artifact)."""

    name: str
    backend: str
    backend_version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tolerance: Tolerance
    artifact: str
    executor: str
    sha256: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "backend": self.backend, "backend_version": self.backend_version,
                "inputs": [s.to_json() for s in self.inputs], "outputs": [s.to_json() for s in self.outputs],
                "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
                "artifact": self.artifact, "executor": self.executor, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: object, where: str) -> "RegionEntry":
        """The entry ``to_json`` wrote; ArtifactError naming the field otherwise (``where``: the manifest)."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{where}: regions: expected a list of region entries")
        name = data.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ArtifactError(f"{where}: region: expected an identifier as name, got {name!r}")
        at = f"{where}: region '{name}'"
        if not isinstance(data.get("executor"), str):
            raise ArtifactError(f"{at}: no executor")
        if not isinstance(data.get("sha256"), str):
            raise ArtifactError(f"{at} artifact has no SHA-256; recompile the artifact")
        tolerance = data.get("tolerance", {})
        if not (isinstance(tolerance, dict) and all(isinstance(tolerance.get(k), (int, float)) for k in ("rtol", "atol"))):
            raise ArtifactError(f"{at}: tolerance: expected {{rtol, atol}} numbers")
        outputs = _specs(data, "outputs", at)
        if not outputs:
            raise ArtifactError(f"{at} outputs: a region returns at least one tensor")
        return cls(name, _field(data, "backend", str, at), str(data.get("backend_version", "")), _specs(data, "inputs", at),
                   outputs, Tolerance(float(tolerance["rtol"]), float(tolerance["atol"])),
                   data.get("artifact"), data["executor"], data["sha256"])


#: Where a value of a program with an ONNX tail comes from: ``("result", k)``, the IREE function's k-th
#: result; ``("arg", i)``, the call's i-th argument; ``("tail", j)``, the tail model's j-th output.
SOURCES = ("result", "arg", "tail")


@dataclass(frozen=True)
class TailEntry:
    """ONNX nodes run by ONNX Runtime after ``main``'s IREE function (``invoke`` runs them): a node whose
    output shape depends on its data (``NonZero``, ``NonMaxSuppression``) and every node after it, which no
    static program holds. ``inputs``: where each input of the tail model comes from (a result or an
    argument); ``outputs``: where each output of ``main`` comes from (a result or a tail output)."""

    artifact: str
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]
    sha256: str = ""

    def to_json(self) -> dict:
        return {"artifact": self.artifact, "inputs": [list(s) for s in self.inputs],
                "outputs": [list(s) for s in self.outputs], "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: object, where: str) -> "TailEntry":
        def sources(key: str, allowed: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
            items = data.get(key) if isinstance(data, dict) else None
            if not isinstance(items, list) or not all(
                    isinstance(s, list) and len(s) == 2 and s[0] in allowed and isinstance(s[1], int)
                    and not isinstance(s[1], bool) and s[1] >= 0 for s in items):
                raise ArtifactError(f"{where}: tail {key}: expected a list of [{'|'.join(allowed)}, index] pairs")
            return tuple((s[0], s[1]) for s in items)

        if not isinstance(data, dict) or not isinstance(data.get("sha256"), str):
            raise ArtifactError(f"{where}: tail: expected {{artifact, inputs, outputs, sha256}}")
        return cls(data.get("artifact"), sources("inputs", ("result", "arg")), sources("outputs", ("result", "tail")),
                   data["sha256"])


@dataclass(frozen=True)
class DeviceEntry:
    """A logical IREE device of the program (codegen configurations): ordinal 0 is the default device;
    ``executable_target`` is the ``#hal.executable.target`` it compiles for (None: IREE's default)."""

    name: str
    ordinal: int
    backends: tuple[str, ...]
    executable_target: str | None = None

    def to_json(self) -> dict:
        out = {"backends": list(self.backends), "name": self.name, "ordinal": self.ordinal}
        if self.executable_target is not None:
            out["executable_target"] = self.executable_target
        return out

    @classmethod
    def from_json(cls, data: object, where: str) -> "DeviceEntry":
        if not (isinstance(data, dict) and isinstance(data.get("backends"), list)
                and all(isinstance(b, str) for b in data["backends"])
                and isinstance(data.get("executable_target", ""), str)):
            raise ArtifactError(f"{where}: devices: expected {{name, ordinal, backends: [str...]}} entries")
        return cls(_field(data, "name", str, where), _field(data, "ordinal", int, where), tuple(data["backends"]),
                   data.get("executable_target"))


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: the IREE module and its SHA-256, the library regions and logical devices, the plan
    (as ``collage_mlir.plan.Plan`` writes it), the versions that built it and, when known, where the plan
    came from (``provenance``, for ``collage report``). ``platform``: where the module runs (its IREE
    driver); absent in the JSON means the CPU, as every manifest before GPU programs."""

    source: str
    source_sha256: str
    module: str
    module_sha256: str
    versions: Mapping[str, str]
    iree_args: tuple[str, ...]
    plan: Mapping[str, Any]
    devices: tuple[DeviceEntry, ...]
    regions: tuple[RegionEntry, ...]
    provenance: Mapping[str, Any] | None = None
    platform: Platform = Platform.CPU
    tail: TailEntry | None = None

    def region(self, name: str) -> RegionEntry | None:
        return next((r for r in self.regions if r.name == name), None)

    def to_json(self) -> dict:
        out = {"format": FORMAT, "version": VERSION, "source": self.source, "source_sha256": self.source_sha256,
               "module": self.module, "module_sha256": self.module_sha256, "versions": dict(self.versions),
               "iree_args": list(self.iree_args), "plan": dict(self.plan),
               "devices": [d.to_json() for d in self.devices], "regions": [r.to_json() for r in self.regions]}
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        if self.platform is not Platform.CPU:
            out["platform"] = self.platform.value
        if self.tail is not None:
            out["tail"] = self.tail.to_json()
        return out

    @classmethod
    def from_json(cls, data: object, where: str) -> "Manifest":
        """The manifest ``to_json`` wrote (format, version and field types checked); ArtifactError otherwise."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ArtifactError(f"{where}: not a collage artifact manifest")
        if data.get("version") != VERSION:
            raise ArtifactError(f"{where}: artifact version {data.get('version')!r} is not supported "
                                f"(this runtime reads version {VERSION}); recompile the artifact")
        devices, regions = data.get("devices", []), data.get("regions")
        if not isinstance(devices, list):
            raise ArtifactError(f"{where}: devices: expected a list")
        if not isinstance(regions, list):
            raise ArtifactError(f"{where}: regions: expected a list of region entries")
        entries = tuple(RegionEntry.from_json(r, where) for r in regions)
        names = [r.name for r in entries]
        if len(set(names)) != len(names):
            raise ArtifactError(f"{where}: regions: region names must be unique")
        versions, plan, provenance = data.get("versions", {}), data.get("plan", {}), data.get("provenance")
        if not isinstance(versions, dict) or not isinstance(plan, dict) or not isinstance(provenance, (dict, type(None))):
            raise ArtifactError(f"{where}: versions, plan and provenance must be objects")
        iree_args = data.get("iree_args", [])
        if not isinstance(iree_args, list) or not all(isinstance(a, str) for a in iree_args):
            raise ArtifactError(f"{where}: iree_args: expected a list of strings")
        try:
            platform = Platform(data.get("platform", Platform.CPU.value))
        except ValueError:
            raise ArtifactError(f"{where}: platform: expected one of {', '.join(p.value for p in Platform)}, "
                                f"got {data.get('platform')!r}"[:300]) from None
        return cls(str(data.get("source", "")), str(data.get("source_sha256", "")), data.get("module"),
                   data.get("module_sha256"), versions, tuple(iree_args), plan,
                   tuple(DeviceEntry.from_json(d, where) for d in devices), entries, provenance, platform,
                   TailEntry.from_json(data["tail"], where) if "tail" in data else None)


def load_manifest(root: Path) -> Manifest:
    """Reads and checks ``root/manifest.json``: format and version, field types, every named file confined to
    ``root`` and matching its SHA-256. Raises ArtifactError with one line naming what is wrong."""
    path = root / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{path}: cannot read artifact manifest ({' '.join(str(exc).split())})") from None
    manifest = Manifest.from_json(data, str(path))
    verified_file(root, manifest.module, manifest.module_sha256, "module")
    for region in manifest.regions:
        verified_file(root, region.artifact, region.sha256, f"region '{region.name}' artifact")
    if manifest.tail is not None:
        verified_file(root, manifest.tail.artifact, manifest.tail.sha256, "ONNX tail")
    return manifest


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Writes ``root/manifest.json`` (one space of indent, as before: the bytes ``collage compile`` wrote)."""
    (root / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
