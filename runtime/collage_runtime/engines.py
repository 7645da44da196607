"""One thread budget for a whole program, and the engine handles its regions share.

A collage program runs one region at a time: IREE's dispatches, then an ONNX Runtime region, then an
OpenVINO one, ... So every engine may use all of the program's threads, but none may keep cores busy
while another engine runs. ``Engines`` gives each engine that budget and shares what can be shared:

- IREE (local-task): ``--task_topology_group_count=N`` workers, set before the process's first device
  (the driver creates its executor once); workers never spin (``--task_worker_spin_us`` defaults to 0),
  they block on the task queue. The device uses IREE's caching allocator (see ``iree_device``; not on
  Vulkan, where it fails).
- ONNX Runtime: each session gets ``intra_op_num_threads=N`` with ``session.intra_op.allow_spinning=0``
  (workers block when idle; ORT's default spins them after every op, which with hundreds of sessions
  starved every other engine), ``inter_op_num_threads=1`` (sequential execution). A program whose only
  region is one ORT session (``sole``) spins inside a run (nothing else runs beside it) and stops when the
  run ends (``session.force_spinning_stop``), so no core burns between calls.
- OpenVINO: one ``ov.Core`` for every region (one TBB arena set, one plugin instance), compiled models with
  ``INFERENCE_NUM_THREADS=N``, one stream, the latency hint, no CPU pinning or reservation (the cores are
  shared with the other engines). A region whose work is small (``SMALL_REGION_MACS``) gets one thread:
  OpenVINO's TBB (oneTBB 2021.13 in the wheel) keeps a worker spinning (yielding) in the arena for 1 ms after
  every parallel phase ("delayed leave"), and neither OpenVINO nor that TBB has a setting to stop it; one
  thread means no worker joins, so nothing spins after the region.
- torch (oneDNN/MKL): ``torch.set_num_threads(N)``; OpenMP workers passive (``OMP_WAIT_POLICY=PASSIVE``
  unless set; ``executors.torch_steps`` sets it before it imports torch, which only takes effect if
  nothing imported torch earlier), so they sleep instead of spinning between regions. A small region
  (``SMALL_REGION_MACS``) runs with one thread: MKL splits even a 128x8x8 matmul over both threads, and
  waking the sleeping worker made that call 77-106 µs instead of 4.8 (AMD EPYC, 2 threads).
- XLA (jaxlib PJRT CPU): one client per process; jaxlib exposes no thread count, XLA sizes its pool to the
  usable cores (bound it with ``taskset`` when ``N`` is smaller).

A shaped artifact's ONNX files may refer to its weight store (``collage_runtime.weights``): ``weights``,
mapped once and read by every program of the artifact.

Engine objects are created on first use, so a program without OpenVINO regions never imports OpenVINO.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import iree.runtime as rt

from .types import NumberFormat
from .weights import WeightStore


def usable_cores() -> int:
    """CPUs this process may be scheduled on (its affinity mask: taskset, cpusets)."""
    return len(os.sched_getaffinity(0))


#: An OpenVINO or torch region whose estimated work (multiply-adds of its matmuls and convolutions plus one
#: per element every other op produces) is below this runs on one thread: below it, a second thread saves
#: at most tens of µs of the region's wall time (~4M MACs take ~100-130 µs on one core here), while the
#: worker it wakes spins 1 ms after every call (OpenVINO's TBB) or takes ~100 µs to wake (torch's passive
#: OpenMP).
SMALL_REGION_MACS = 4_000_000

#: IREE task workers per driver, as asked by the first program of this process (see ``iree_device``).
IREE_POOLS: dict[str, int] = {}
_DEVICES: dict[str, rt.HalDevice] = {}
#: Programs holding each driver's device (``iree_device``, ``release_device``).
_HOLDERS: dict[str, int] = {}

#: Drivers whose device goes when the last program holding it is closed or collected; the others' stays for
#: the process. An idle IREE Vulkan device on Mesa's lavapipe keeps two of IREE's threads polling the driver
#: (half a core of a 2-core machine, for as long as the device lives): kept for the process, one Vulkan
#: program loaded and closed left every later engine of that process on half the cores it was given (IREE
#: 3.13, Mesa 22.3; creating the device again costs ~45 ms). The CPU drivers' devices cost nothing idle, and
#: local-task's pool is sized once per process (``IREE_POOLS``).
RELEASED_DRIVERS = frozenset({"vulkan"})

#: Drivers whose devices get IREE's caching allocator. Not vulkan: with it every program fails in its first
#: ``hal.device.queue.alloca`` ("allocator cannot allocate a Vulkan buffer with the given parameters;
#: memory_type=DEVICE_LOCAL", IREE 3.13 on Mesa's llvmpipe). cuda, from IREE's sources (not run here): the
#: caching allocator pools only synchronous allocations (the runtime's result and staging buffers, each a
#: cuMemAlloc or cuMemHostAlloc otherwise), hands import and export (DLPack) to the CUDA allocator, and
#: the program's own queue allocations go to CUDA's stream-ordered pools without it.
CACHING_DRIVERS = frozenset({"local-task", "local-sync", "cuda"})


def iree_device(driver: str, threads: int, sync_allocations: bool = False) -> rt.HalDevice:
    """The process's IREE device of ``driver`` for one more holder (a program: ``release_device`` when it
    is done with it), with IREE's caching allocator where it works
    (``CACHING_DRIVERS``): a region's result buffers are allocated on every call, and a freed buffer is
    reused instead of mapping fresh pages (a 16 MB result: 480 µs of page faults per call without it,
    36 µs with it). local-task creates its task executor with the driver, once per process, from
    ``--task_topology_group_count``: the first program loaded in a process sizes IREE's pool to its
    budget and later ones share that pool.

    ``sync_allocations`` (a CUDA program with served regions): IREE's queue allocations without CUDA's
    stream-ordered pools (``--cuda_async_allocations=false``), so that a device executor takes the program's
    buffers through DLPack instead of a device copy. On an H200 a served cuBLAS layer cost 193 µs instead of
    323, and programs without served regions 0-5 % more (studies/gpu/results/h200_kernel_overhead*.json).
    A process-wide IREE flag, read when the CUDA driver makes its device: the first CUDA program loaded
    decides for the process."""
    if driver not in _DEVICES:
        if driver == "cuda" and sync_allocations:
            rt.flags.parse_flags("--cuda_async_allocations=false")
        if driver == "local-task":
            rt.flags.parse_flags(f"--task_topology_group_count={threads}")
            IREE_POOLS[driver] = threads
        allocators = ["caching"] if driver in CACHING_DRIVERS else None
        _DEVICES[driver] = rt.get_driver(driver).create_default_device(allocators=allocators)
    _HOLDERS[driver] = _HOLDERS.get(driver, 0) + 1
    return _DEVICES[driver]


def release_device(driver: str) -> None:
    """One holder of ``driver``'s device is done with it; the last one's release drops the device of a
    ``RELEASED_DRIVERS`` driver (what still holds its buffers keeps it alive until they go)."""
    _HOLDERS[driver] = max(0, _HOLDERS.get(driver, 0) - 1)
    if not _HOLDERS[driver] and driver in RELEASED_DRIVERS:
        _DEVICES.pop(driver, None)


@dataclass
class Engines:
    """The thread budget of one program and the engine handles its regions share (created lazily)."""

    threads: int
    #: The engine of the program's only region, if it has exactly one: no other engine shares the cores
    #: with it, so it runs with its own idle policy (ONNX Runtime: spinning workers, as its users run it).
    sole: str | None = None
    #: The artifact's shared weight store (``collage_runtime.weights``), where its ONNX files refer to one.
    weights: WeightStore | None = None
    _openvino_core: Any = field(default=None, repr=False)
    # Regions may load on several threads at once (rt_module.load_executors): one of them creates the core.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ValueError(f"threads must be a positive integer, got {self.threads!r}")

    def ort_session_options(self):
        """SessionOptions for an ONNX Runtime region: the budget's intra-op threads, no spinning (unless
        ORT is the program's ``sole`` engine: whole-model one-region programs on a quiet machine, spinning
        vs not, wall ms: MobileNetV2 4.63 vs 5.43, DCGAN 1.52 vs 1.97, ResNet-50 41.4 vs 43.1)."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # The sole engine's workers spin inside a run and block when it ends (``force_spinning_stop``): as
        # fast as ORT's default spinning, which went on burning a core for ~35 ms after every call
        # (studies/threads: ort_spin.md). Beside other regions they never spin: in-run spinning made
        # chains of small ORT regions alternating with oneDNN or OpenVINO regions 3-4.5x slower.
        sole = self.sole == "ort"
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if sole else "0")
        opts.add_session_config_entry("session.force_spinning_stop", "1" if sole else "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        # Fatal only: an error a run meets comes back as the exception the runtime reports in one line
        # (RegionFailure); ORT's own logger would print it a second time.
        opts.log_severity_level = 4
        return opts

    def openvino_core(self):
        """The program's one ``ov.Core``; with ``COLLAGE_OPENVINO_CACHE_DIR`` set, OpenVINO keeps compiled
        models there (keyed by model, device and properties) and later loads import them instead of
        compiling: ~3x less CPU per region (ResNet-50's 275 regions: see docs/runtime.md). Opt-in because
        it writes outside the artifact."""

        with self._lock:
            if self._openvino_core is None:
                import openvino as ov

                core = ov.Core()
                cache = os.environ.get("COLLAGE_OPENVINO_CACHE_DIR")
                if cache:
                    import openvino.properties as props

                    core.set_property({props.cache_dir: cache})
                self._openvino_core = core
        return self._openvino_core

    def region_threads(self, work: float | None = None) -> int:
        """Threads for an OpenVINO or torch region of ``work`` (see ``SMALL_REGION_MACS``; None: unknown,
        the budget)."""
        return 1 if work is not None and work < SMALL_REGION_MACS else self.threads

    def openvino_config(self, work: float | None = None, precision: NumberFormat = NumberFormat.F32) -> dict:
        """compile_model properties for an OpenVINO region of ``work`` computing float math in ``precision``
        (``f32``, stated: OpenVINO's own default is bf16 on a CPU that has it; ``bf16`` where the region's
        backend says so, ``backends.openvino.OpenVinoBf16Backend``)."""
        import openvino as ov
        import openvino.properties as props
        import openvino.properties.hint as hints

        return {
            props.inference_num_threads: self.region_threads(work),
            props.num_streams: 1,
            hints.performance_mode: hints.PerformanceMode.LATENCY,
            hints.inference_precision: {NumberFormat.F32: ov.Type.f32, NumberFormat.BF16: ov.Type.bf16}[precision],
            hints.enable_cpu_pinning: False,
            hints.enable_cpu_reservation: False,
        }

    def torch(self):
        """torch with the budget's intra-op threads (process-wide: the last program loaded sets it)."""

        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return torch

    def xla_client(self):
        """The process's PJRT CPU client (synchronous dispatch: less per-call overhead for small regions)."""
        return _xla_client()


@lru_cache(maxsize=1)
def _xla_client():
    from jax._src.lib import xla_client as xc

    return xc.make_cpu_client(asynchronous=False)


def engine_message(exc: BaseException, limit: int = 200) -> str:
    """An engine's error as one line of at most ``limit`` characters: OpenVINO's chain of source locations
    ("Exception from src/inference/src/cpp/core.cpp:117:") dropped, as its reason comes after them, and of a
    longer text the end kept (ONNX Runtime's reason comes last)."""
    text = " ".join(re.sub(r"Exception from src/\S+:\d+:", " ", str(exc)).split()) or type(exc).__name__
    return text if len(text) <= limit else "..." + text[-limit:]
