"""One deployable file: an artifact directory packed as a zip archive (``*.collage``).

The archive holds exactly the directory's files (manifest, ``main.vmfb``, region files). Loading unpacks it
into a private temporary directory and checks it like any artifact (paths confined, SHA-256 of every file
against the manifest), so a packed artifact is trusted no more than an unpacked one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from .manifest import ArtifactError

SUFFIX = ".collage"
#: Unpacked size beyond which an archive is refused (a zip bomb, not a model).
MAX_UNPACKED_BYTES = 16 << 30


def is_package(path: str | Path) -> bool:
    """Whether ``path`` names a packed artifact file (rather than an artifact directory)."""
    return Path(path).is_file()


def pack(directory: Path, target: Path) -> None:
    """Writes the artifact ``directory`` as the archive ``target``, atomically (beside it, then renamed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for path in sorted(p for p in directory.rglob("*") if p.is_file()):
                zf.write(path, path.relative_to(directory).as_posix())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for the partial file, not the artifact
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unpack(archive: Path) -> Path:
    """Unpacks ``archive`` into a new private directory and returns it (the caller removes it)."""
    try:
        zf = zipfile.ZipFile(archive)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise ArtifactError(f"{archive}: not a collage artifact (neither a directory nor a packed .collage "
                            f"file: {exc})") from None
    root = Path(tempfile.mkdtemp(prefix="collage-artifact-"))
    try:
        with zf:
            members = zf.infolist()
            if sum(m.file_size for m in members) > MAX_UNPACKED_BYTES:
                raise ArtifactError(f"{archive}: unpacks to more than {MAX_UNPACKED_BYTES >> 30} GiB; refused")
            for m in members:
                name = PurePosixPath(m.filename)
                if name.is_absolute() or ".." in name.parts or "\\" in m.filename:
                    raise ArtifactError(f"{archive}: member '{m.filename}' would lie outside the artifact")
                if m.is_dir():
                    continue
                dest = root.joinpath(*name.parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(m) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, ValueError) as exc:  # corrupt data
        shutil.rmtree(root, ignore_errors=True)
        raise ArtifactError(f"{archive}: corrupt packed artifact ({' '.join(str(exc).split())[:200]})") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root
