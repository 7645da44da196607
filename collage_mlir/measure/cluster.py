"""Measurement on a Ray cluster (``collage tune/measure --cluster ADDRESS``, the ``ray`` extra): ``RayPool``
sends builds and timings to the cluster's nodes; the cost DB and the search stay in the calling process,
which writes each row as its task comes back.

Which node runs what is said with Ray custom resources, which a node registers when it joins
(``python -m collage_mlir.measure.cluster --address HEAD:6379`` runs ``ray start`` with them):

- ``collage_device_<fingerprint>`` (capacity 1) for each platform the node can measure: its device
  fingerprint (``device.device_fingerprint``). Builds target the host they run on (IREE's llvm-cpu
  ``target-cpu=host``, a GPU's architecture as IREE finds it), so builds as well as timings go only to
  nodes whose fingerprint is the target's, that of the machine ``collage`` runs on. A build holds
  ``BUILD_SHARE`` of it and a CPU; a timing holds all of it, so nothing of this measurement builds on a
  node while it times there.
- ``collage_timer`` (capacity 1): a timing holds it, so one machine times one candidate at a time whatever
  the platform.

A task runs its ``tasks`` function in a ``worker.Worker`` child of the Ray worker process (crash isolation
and time limits as on one machine: a backend that crashes is a ``crash`` outcome, not a lost task). Inputs
travel as bytes (the region's bytecode, the data ``.npz``); a build's artifact goes packed into the
object store, from where Ray hands it to the node that times it (the caller never downloads it). A Ray
worker or node lost mid-task is retried elsewhere (``RETRIES``); an artifact lost with its node is built
again (Ray's lineage); only a task lost ``RETRIES + 1`` times becomes a ``crash`` outcome.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
import tarfile
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from collage_runtime.types import Platform

from ..errors import CollageError
from ..processes import python_command
from .device import device_fingerprint, platform_problem
from .pool import Artifact
from .status import Status
from .tasks import TASKS, Built
from .timing import TimingOptions
from .worker import Outcome, Worker, _short

#: One timing per machine at a time: every node registers this resource with capacity 1.
TIMER = "collage_timer"
#: What a build holds of its node's device resource (a timing holds all of it).
BUILD_SHARE = 0.001
#: How often Ray runs a task again whose worker or node was lost.
RETRIES = 3
#: The environment of every task: Ray sets ``OMP_NUM_THREADS`` (to the task's CPUs) where the node does not,
#: and hides the GPUs from a task that asks for none; a timing must see the node as a local worker sees its
#: machine. ``${VAR}`` is the node's own value (empty where unset: ``node_env`` drops it).
TASK_ENV = {"env_vars": {"OMP_NUM_THREADS": "${OMP_NUM_THREADS}", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}}
#: Seconds to wait for a task before checking the cluster can still run it.
_POLL_S = 10.0
#: Seconds to wait for the head's port before giving up on an address.
_CONNECT_S = 5.0

INSTALL_HINT = "pip install 'collage-mlir[ray]'"


def device_resource(fingerprint: str) -> str:
    """The custom resource of nodes whose device fingerprint is ``fingerprint``."""
    return f"collage_device_{fingerprint}"


def node_resources(platforms: list[Platform] | None = None) -> dict[str, float]:
    """The custom resources this machine joins a cluster with: the timer, and its device for each of
    ``platforms`` (default: every platform it can measure)."""
    platforms = platforms if platforms is not None else [p for p in Platform if platform_problem(p) is None]
    return {TIMER: 1.0, **{device_resource(device_fingerprint(p)[0]): 1.0 for p in platforms}}


def _ray():
    try:
        import ray
    except ImportError:
        raise CollageError(f"--cluster needs Ray: {INSTALL_HINT}", exit_code=2) from None
    return ray


@dataclass(frozen=True)
class ClusterInfo:
    """What a cluster offers for one target device: ``build_slots`` CPUs and ``time_slots`` machines on
    nodes whose fingerprint is ``device``."""

    address: str
    device: str
    build_slots: int
    time_slots: int


def _probe(address: str) -> None:
    """Raises where nothing answers on ``host:port`` (Ray itself would wait for minutes)."""
    m = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address)
    if m is None:
        return  # "auto", "local": Ray looks the cluster up and fails at once
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=_CONNECT_S).close()
    except OSError as exc:
        raise CollageError(f"cannot reach the Ray cluster at {address}: {exc}", where="--cluster",
                           exit_code=2) from None


def connect(address: str, platform: Platform = Platform.CPU) -> ClusterInfo:
    """Connects this process to the Ray cluster at ``address`` (once: a process already connected keeps its
    connection) and checks that a node of it can measure ``platform`` programs for this machine."""
    ray = _ray()
    if not ray.is_initialized():
        _probe(address)
        try:
            with warnings.catch_warnings():  # Ray's notes on its future defaults are not the user's business
                warnings.simplefilter("ignore")
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise CollageError(f"cannot reach the Ray cluster at {address}: {_short(str(exc), 300)}",
                               where="--cluster", exit_code=2) from None
    device, description = device_fingerprint(platform)
    nodes = _device_nodes(ray, device_resource(device))
    if not nodes:
        raise CollageError(f"no node of the Ray cluster at {address} can measure for this machine ({description}): "
                           f"join one with `python -m collage_mlir.measure.cluster --address ADDRESS` on a machine of "
                           f"this kind", where="--cluster", exit_code=2)
    return ClusterInfo(address, device, sum(int(n.get("CPU", 0)) for n in nodes), len(nodes))


def _device_nodes(ray, resource: str) -> list[dict]:
    """The total resources of each live node that has ``resource``."""
    return [n["Resources"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) >= 1]


# -- on the node --------------------------------------------------------------------------------------

#: This Ray worker process's task workers, by role (Ray runs one task at a time in a worker process).
_WORKERS: dict[str, Worker] = {}


def node_env() -> dict[str, str]:
    """The environment of a task worker on a node: the node's (``TASK_ENV``'s empty values dropped)."""
    return {k: v for k, v in os.environ.items() if not (k in TASK_ENV["env_vars"] and v == "")}


def _node_worker(role: str) -> Worker:
    if role not in _WORKERS:
        _WORKERS[role] = Worker(f"cluster-{role}", env=node_env())
    return _WORKERS[role]


def _check_device(device: str, platform: str) -> None:
    here, description = device_fingerprint(Platform(platform))
    if here != device:
        raise CollageError(f"node {socket.gethostname()} ({description}) is not device {device}: it was given "
                           f"{device_resource(device)} by hand; join it with `python -m collage_mlir.measure.cluster`")


def _pack(directory: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(directory, arcname=".")
    return buf.getvalue()


def _unpack(data: bytes, directory: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(directory, filter="data")


def build_on_node(module: bytes, plan: dict, timeout_s: float, device: str, platform: str) -> tuple[Outcome, bytes]:
    """(outcome, packed artifact: empty unless it built) of ``tasks.build_plan`` here."""
    _check_device(device, platform)
    with tempfile.TemporaryDirectory(prefix="collage-node-") as tmp:
        work = Path(tmp)
        (work / "module.mlirbc").write_bytes(module)
        outcome = _node_worker("build").call(f"{TASKS}:build_plan", timeout_s, module_file=str(work / "module.mlirbc"),
                                             plan=plan, out_dir=str(work / "artifact"))
        return outcome, _pack(work / "artifact") if outcome.ok else b""


def time_on_node(artifact: bytes, data: bytes, timing: dict | None, rtol: float | None, atol: float | None,
                 outputs: bool, timeout_s: float, device: str, platform: str) -> tuple[Outcome, bytes | None]:
    """(outcome, the results' ``.npz`` when ``outputs``) of ``tasks.time_artifact`` here."""
    _check_device(device, platform)
    with tempfile.TemporaryDirectory(prefix="collage-node-") as tmp:
        work = Path(tmp)
        _unpack(artifact, work / "artifact")
        (work / "data.npz").write_bytes(data)
        out = work / "outputs.npz"
        outcome = _node_worker("time").call(f"{TASKS}:time_artifact", timeout_s, artifact_dir=str(work / "artifact"),
                                            data_file=str(work / "data.npz"), timing=timing, rtol=rtol, atol=atol,
                                            outputs_file=str(out) if outputs else None)
        return outcome, out.read_bytes() if outputs and outcome.ok else None


# -- in the caller ------------------------------------------------------------------------------------

class RayPool:
    """Builds and times on the nodes of the Ray cluster at ``address`` whose device fingerprint is this
    machine's for ``platform`` (see the module's docstring); ``build_slots`` is their CPUs, ``time_slots``
    their number."""

    def __init__(self, address: str, platform: Platform = Platform.CPU):
        self._ray = _ray()
        self.info = connect(address, platform)
        self.platform = platform
        device = device_resource(self.info.device)
        self._build_needs = {"CPU": 1.0, device: BUILD_SHARE}
        self._time_needs = {TIMER: 1.0, device: 1.0}
        remote = self._ray.remote
        self._build = remote(build_on_node).options(num_cpus=1, resources={device: BUILD_SHARE}, num_returns=2,
                                                    max_retries=RETRIES, runtime_env=TASK_ENV)
        self._time = remote(time_on_node).options(num_cpus=0, resources={TIMER: 1, device: 1}, num_returns=2,
                                                  max_retries=RETRIES, runtime_env=TASK_ENV)

    @property
    def build_slots(self) -> int:
        return max(1, self.info.build_slots)

    @property
    def time_slots(self) -> int:
        return max(1, self.info.time_slots)

    def build(self, module_file: Path, plan: dict, timeout_s: float) -> Outcome:
        outcome, artifact = self._build.remote(Path(module_file).read_bytes(), plan, timeout_s, self.info.device,
                                               self.platform.value)
        found = self._get(outcome, self._build_needs)
        if not found.ok:
            return found
        built: Built = found.value
        return Outcome(Status.OK, Artifact(artifact, built.build_s))

    def time(self, artifact: Artifact, data_file: Path, timeout_s: float, *, timing: TimingOptions | None,
             rtol: float | None = None, atol: float | None = None, outputs_file: Path | None = None) -> Outcome:
        outcome, outputs = self._time.remote(artifact.handle, Path(data_file).read_bytes(),
                                             timing.to_json() if timing else None, rtol,
                                             atol, outputs_file is not None, timeout_s, self.info.device,
                                             self.platform.value)
        found = self._get(outcome, self._time_needs)
        if found.ok and outputs_file is not None:
            Path(outputs_file).write_bytes(self._ray.get(outputs))
        return found

    def discard(self, artifact: Artifact) -> None:
        """Nothing to do: the object store frees the packed artifact once no ``Artifact`` refers to it."""

    def close(self) -> None:
        """Nothing to do: the connection stays for the process's other pools (Ray closes it at exit)."""

    def _get(self, ref, needs: dict[str, float]) -> Outcome:
        """The task's outcome; a task lost more often than Ray retries it is a crash. Raises where the cluster
        no longer has a node that could run it, or where the node refused it (a misconfigured node)."""
        ray = self._ray
        while not ray.wait([ref], timeout=_POLL_S)[0]:
            if not any(n.get("Alive") and all(n["Resources"].get(k, 0) >= v for k, v in needs.items())
                       for n in ray.nodes()):
                raise CollageError(f"no node of the Ray cluster at {self.info.address} can run this task any more "
                                   f"(it needs {needs})", where="--cluster")
        errors = ray.exceptions
        try:
            return ray.get(ref)
        except errors.RayTaskError as exc:
            cause = getattr(exc, "cause", None) or exc
            raise CollageError(f"on the Ray cluster: {_short(str(cause), 500)}", where="--cluster") from None
        except (errors.WorkerCrashedError, errors.NodeDiedError, errors.ObjectLostError, errors.OutOfMemoryError,
                errors.TaskCancelledError) as exc:
            return Outcome(Status.CRASH, message=f"lost on the Ray cluster {RETRIES + 1} times: "
                                                 f"{_short(f'{type(exc).__name__}: {exc}', 400)}")


def main(argv: list[str] | None = None) -> int:
    """``python -m collage_mlir.measure.cluster [--platform P] [--print] RAY_START_ARGS...``: joins this
    machine to a cluster (``--address HEAD:6379``) or starts its head (``--head``) with the resources above."""
    parser = argparse.ArgumentParser(prog="python -m collage_mlir.measure.cluster",
                                     description="ray start, with the resources collage measures by")
    parser.add_argument("--platform", action="append", choices=[p.value for p in Platform],
                        help="a platform this node measures (repeatable; default: every one it can)")
    parser.add_argument("--print", action="store_true", help="print the ray start command, do not run it")
    args, rest = parser.parse_known_args(argv)
    resources = node_resources([Platform(p) for p in args.platform] if args.platform else None)
    command = python_command("ray.scripts.scripts", "start", "--resources", json.dumps(resources), *rest)
    if args.print:
        print(shlex.join(command))
        return 0
    _ray()
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
