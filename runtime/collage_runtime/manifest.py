"""The artifact manifest: what ``collage compile`` writes beside ``main.vmfb`` and what the runtime checks
before anything runs. An artifact is data: every file it names must lie inside the artifact directory
and match the SHA-256 recorded for it, and every field must have the type it should."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .types import numpy_dtype

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


def _tensor_specs(root: Path, specs: Any, what: str) -> None:
    ok = isinstance(specs, list) and all(
        isinstance(s, dict) and isinstance(s.get("shape"), list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s["shape"])
        and isinstance(s.get("dtype"), str) and numpy_dtype(s["dtype"]) is not None for s in specs)
    if not ok:
        raise ArtifactError(f"{root / MANIFEST}: {what}: expected a list of {{shape: [int...], dtype}} entries")


def load_manifest(root: Path) -> dict:
    """Reads and checks ``root/manifest.json``: format and version, field types, every named file confined to
    ``root`` and matching its SHA-256. Raises ArtifactError with one line naming what is wrong."""
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{path}: cannot read artifact manifest ({' '.join(str(exc).split())})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a collage artifact manifest")
    if manifest.get("version") != VERSION:
        raise ArtifactError(f"{path}: artifact version {manifest.get('version')!r} is not supported "
                            f"(this runtime reads version {VERSION}); recompile the artifact")
    verified_file(root, manifest.get("module"), manifest.get("module_sha256"), "module")
    devices = manifest.get("devices", [])
    if not isinstance(devices, list):
        raise ArtifactError(f"{path}: devices: expected a list")
    regions = manifest.get("regions")
    if not isinstance(regions, list) or not all(isinstance(r, dict) for r in regions):
        raise ArtifactError(f"{path}: regions: expected a list of region entries")
    names = set()
    for k, region in enumerate(regions):
        name = region.get("name")
        if not isinstance(name, str) or not name.isidentifier() or name in names:
            raise ArtifactError(f"{path}: regions[{k}]: expected a unique identifier as name, got {name!r}")
        names.add(name)
        if not isinstance(region.get("executor"), str):
            raise ArtifactError(f"{path}: region '{name}': no executor")
        _tensor_specs(root, region.get("inputs"), f"region '{name}' inputs")
        _tensor_specs(root, region.get("outputs"), f"region '{name}' outputs")
        if not region["outputs"]:
            raise ArtifactError(f"{path}: region '{name}' outputs: a region returns at least one tensor")
        verified_file(root, region.get("artifact"), region.get("sha256"), f"region '{name}' artifact")
    return manifest
