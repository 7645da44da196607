"""Measurement on a Ray cluster (``MeasureOptions.cluster``, ``collage tune/measure --cluster``): the same
rows as worker processes here, a crash on a node is a crash row, a Ray worker killed mid-build costs no
row, plans are timed there with their results brought back, and the errors a user can meet are one
clear line. The cluster is a local one the tests start (a head node with 2 CPUs and this machine's
timing resources)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from collage_mlir.backends import RegionKey, get_backend, registry  # noqa: E402
from collage_mlir.errors import CollageError  # noqa: E402
from collage_mlir.graph import Graph  # noqa: E402
from collage_mlir.measure.cluster import (INSTALL_HINT, TIMER, RayPool, connect, device_resource,  # noqa: E402
                                         node_resources)
from collage_mlir.measure import cluster as cluster_mod  # noqa: E402
from collage_mlir.measure.db import CostDB  # noqa: E402
from collage_mlir.measure.device import device_fingerprint  # noqa: E402
from collage_mlir.measure.extract import extract_region  # noqa: E402
from collage_mlir.measure.harness import MeasureOptions, measure_regions  # noqa: E402
from collage_mlir.measure.plan_timing import PlanTimer  # noqa: E402
from collage_mlir.measure.pool import LocalPool  # noqa: E402
from collage_mlir.measure.timing import TimingOptions  # noqa: E402
from collage_mlir.plan import Plan, Region  # noqa: E402
from collage_mlir.search.tune import tune  # noqa: E402
from collage_runtime.types import Platform  # noqa: E402

from helpers import FAULTY  # noqa: E402
from models import ELEMENTWISE, numbered, two_blocks  # noqa: E402

QUICK = TimingOptions(budget_s=0.05, min_repeats=3, max_repeats=20)

@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster: one head node with 2 CPUs and this machine's timer and CPU device resources.
    Its workers (and their worker processes) see the faulty backends (test/python/faulty)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(FAULTY), saved or ""])
    sys.path.insert(0, str(FAULTY))
    registry.cache_clear()
    head = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": node_resources([Platform.CPU]), "include_dashboard": False})
    try:
        ray.init(address=head.address, log_to_driver=False)
        yield head
    finally:
        ray.shutdown()
        head.shutdown()
        sys.path.remove(str(FAULTY))
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        registry.cache_clear()


def _statuses(summary) -> dict[tuple[str, frozenset[int]], str]:
    return {(r.backend, r.ops): str(m.status) for r, m in summary.rows.items()}


@pytest.mark.bench  # minutes on 2 shared cores: the default suite keeps the killed-worker test
def test_cluster_gives_the_rows_worker_processes_give(cluster, tmp_path):
    """Every pair gets a row on the cluster, with the status it gets here; a backend that aborts the process
    on a node is a crash row with the signal, as in a local worker."""
    module = numbered(ELEMENTWISE)
    graph = Graph(module)
    multiply = next(i for i, n in graph.nodes.items() if n.name == "stablehlo.multiply")
    regions = [RegionKey(b, frozenset({multiply})) for b in ("iree-cpu", "faulty-crash", "faulty-wrong", "faulty-build")]
    local = measure_regions(module, regions, CostDB(tmp_path / "local.sqlite"),
                            options=MeasureOptions(timing=QUICK, jobs=2))
    on_cluster = measure_regions(module, regions, CostDB(tmp_path / "cluster.sqlite"),
                                 options=MeasureOptions(timing=QUICK, cluster=cluster.address))
    assert len(on_cluster.rows) == len(regions)
    assert _statuses(on_cluster) == _statuses(local)
    assert {s for s in _statuses(on_cluster).values()} == {"ok", "crash", "wrong", "error"}
    crash = next(m for r, m in on_cluster.rows.items() if r.backend == "faulty-crash")
    assert "SIGABRT" in crash.message
    ok = [m for m in CostDB(tmp_path / "cluster.sqlite").measurements() if m.status == "ok"]
    assert ok and all(m.median_s > 0 and m.device == device_fingerprint()[0] for m in ok)


def _ray_workers_building() -> list[tuple[int, int]]:
    """(Ray worker pid, its worker child's pid) for each task worker this test process's cluster runs."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent_cmd = Path(f"/proc/{parent}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if b"collage_mlir.measure.worker" in cmdline and b"ray::" in parent_cmd and _descends(parent):
            found.append((parent, int(entry.name)))
    return found


def _descends(pid: int) -> bool:
    """Whether ``pid`` is a descendant of this test process (its cluster's raylet started it)."""
    while pid > 1:
        if pid == os.getpid():
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


@pytest.mark.bench  # ~5 minutes on 2 cores (a Ray cluster and 4 region builds on it)
def test_ray_worker_killed_mid_build_costs_no_row(cluster, tmp_path):
    """The first Ray worker seen running a build is killed (with its worker child): Ray runs the build
    again, and every region still gets its row."""
    module, graph, blocks = two_blocks()
    regions = [RegionKey("iree-cpu", b) for b in blocks] + [RegionKey("iree-cpu-dt", b) for b in blocks]
    killed: list[int] = []
    stop = threading.Event()

    def kill_one() -> None:
        while not stop.is_set() and not killed:
            for ray_worker, child in _ray_workers_building():
                for pid in (child, ray_worker):
                    os.kill(pid, signal.SIGKILL)
                killed.append(ray_worker)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one)
    killer.start()
    try:
        summary = measure_regions(module, regions, CostDB(tmp_path / "costs.sqlite"),
                                  options=MeasureOptions(timing=QUICK, cluster=cluster.address))
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker was seen building"
    assert len(summary.rows) == len(regions) and {str(m.status) for m in summary.rows.values()} == {"ok"}
    # The two blocks are one structural hash: a row per backend, each written once.
    assert len(CostDB(tmp_path / "costs.sqlite").measurements()) == 2


@pytest.mark.bench  # minutes on 2 shared cores: the default suite keeps the killed-worker test
def test_plan_timed_on_the_cluster_brings_its_results_back(cluster, tmp_path):
    """``PlanTimer`` on the cluster: the plan is built and timed on a node; its results come back to
    ``outputs_to`` equal to a local run's; a kept build is timed again without building."""
    module, graph, blocks = two_blocks()
    plan = Plan([Region("block0", "iree-cpu-dt", blocks[0])], "iree-cpu", "test")
    x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    results = {}
    for name, cluster_address in (("local", None), ("cluster", cluster.address)):
        with PlanTimer(tmp_path / name, MeasureOptions(timing=QUICK, cluster=cluster_address), keep=2) as timer:
            out = tmp_path / f"{name}.npz"
            first = timer.time(module, plan, [x], outputs_to=out)
            again = timer.time(module, plan, [x])
            assert first.ok and first.value.median_s > 0 and again.ok and again.value.median_s > 0
            with np.load(out) as data:
                results[name] = [data[k] for k in sorted(data.files)]
    assert len(results["cluster"]) == len(results["local"]) > 0
    for a, b in zip(results["cluster"], results["local"]):
        np.testing.assert_allclose(a, b, rtol=1e-6)


# The probe below runs on the cluster: shipped by value (importlib mode gives this module no importable name).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _task_worker_env(names: list[str]) -> dict[str, str | None]:
    """What a node's task worker (a child of a Ray worker running a task as RayPool runs them) sees of ``names``."""
    worker = cluster_mod._node_worker("env-probe")
    return {n: worker.call("os:getenv", 60, key=n).value for n in names}


@pytest.mark.bench  # starts a local Ray cluster (~1 min on 2 cores)
def test_node_task_workers_see_the_node_not_rays_task_settings(cluster):
    """Ray sets OMP_NUM_THREADS=1 and hides the GPUs in a task's process; the worker that times there sees
    the node's environment, as a local timing worker sees this machine's."""
    names = ["OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"]
    probe = ray.remote(_task_worker_env).options(num_cpus=0, runtime_env=cluster_mod.TASK_ENV)
    assert ray.get(probe.remote(names)) == {n: os.environ.get(n) for n in names}
    bare = ray.get(ray.remote(_task_worker_env).options(num_cpus=0).remote(names))
    assert bare["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")  # what TASK_ENV undoes


@pytest.mark.bench  # starts a local Ray cluster (~1 min on 2 cores)
def test_cluster_without_a_node_of_this_device_is_one_error(cluster):
    """Timings go only to nodes of this machine's fingerprint: a cluster with none refuses at once."""
    assert device_resource(device_fingerprint(Platform.CPU)[0]) in ray.cluster_resources()
    assert ray.cluster_resources()[TIMER] == 1
    with pytest.raises(CollageError, match="no node of the Ray cluster .* can measure for this machine"):
        connect(cluster.address, Platform.CUDA)


@pytest.mark.fast
def test_cluster_without_ray_is_one_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(CollageError, match=r"--cluster needs Ray: pip install 'collage-mlir\[ray\]'") as exc:
        connect("127.0.0.1:6379")
    assert INSTALL_HINT in str(exc.value)


def test_unreachable_cluster_is_one_error_line(tmp_path):
    """``collage measure --cluster`` with nothing listening: one error line, exit 2, in seconds (Ray itself
    would wait minutes)."""
    model = tmp_path / "m.mlir"
    model.write_text(ELEMENTWISE)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "measure", str(model), "--backends",
                           "iree-cpu", "--db", str(tmp_path / "c.sqlite"), "--cluster", "127.0.0.1:9"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "cannot reach the Ray cluster at 127.0.0.1:9" in errors[0]
    assert time.monotonic() - t0 < 60


def test_local_pool_keeps_artifacts_where_they_are_built(tmp_path):
    """The local pool hands the artifact directory itself to the timing worker (no copy) and removes it
    when discarded."""
    module, graph, blocks = two_blocks()
    region = extract_region(graph, blocks[0])
    (tmp_path / "r.mlirbc").write_bytes(region.bytecode)
    pool = LocalPool(tmp_path, 1)
    try:
        built = pool.build(tmp_path / "r.mlirbc", region.plan("iree-cpu", "iree-cpu").to_json(), 120)
        assert built.ok and Path(built.value.handle).is_dir()
        assert Path(built.value.handle).parent == tmp_path / "artifacts"
        pool.discard(built.value)
        assert not Path(built.value.handle).exists()
    finally:
        pool.close()


@contextmanager
def _own_cluster(nodes: int):
    """A local Ray cluster of its own (for the bench tests): a head with no CPU and ``nodes`` worker nodes of
    1 CPU each, each with this machine's timer and CPU device resources; this process connected to it."""
    if ray.is_initialized():
        pytest.skip("this process is connected to another Ray cluster")
    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            head.add_node(num_cpus=1, resources=node_resources([Platform.CPU]))
        head.wait_for_nodes()
        ray.init(address=head.address, log_to_driver=False)
        yield head
    finally:
        ray.shutdown()
        head.shutdown()


def _builds_per_minute(pool, module_file: Path, plan: dict, count: int) -> float:
    """Builds of ``module_file`` per minute, ``count`` at once as the pool allows, after one warm-up
    round (worker processes started, imports done)."""
    with ThreadPoolExecutor(max_workers=pool.build_slots) as threads:
        def build(_):
            outcome = pool.build(module_file, plan, 300)
            assert outcome.ok, outcome.message
            pool.discard(outcome.value)

        list(threads.map(build, range(pool.build_slots)))
        t0 = time.perf_counter()
        list(threads.map(build, range(count)))
        return 60 * count / (time.perf_counter() - t0)


@pytest.mark.bench
def test_builds_per_minute_local_and_on_clusters_of_1_2_4_nodes(tmp_path):
    """`python3 -m pytest -m bench -s test/python/measure/test_cluster.py -k builds_per_minute`: one region
    (a matmul+tanh block on iree-cpu) built 12 times by worker processes here (--jobs = CPU count), and
    by local Ray clusters of 1, 2 and 4 worker nodes of 1 CPU each (processes on this machine, loopback)."""
    module, graph, blocks = two_blocks()
    region = extract_region(graph, blocks[0])
    module_file = tmp_path / "region.mlirbc"
    module_file.write_bytes(region.bytecode)
    plan = region.plan("iree-cpu", "iree-cpu").to_json()
    count = 12
    rates = {}
    jobs = len(os.sched_getaffinity(0))
    local = LocalPool(tmp_path, jobs)
    try:
        rates[f"local workers (--jobs {jobs})"] = _builds_per_minute(local, module_file, plan, count)
    finally:
        local.close()
    for nodes in (1, 2, 4):
        with _own_cluster(nodes) as head:
            pool = RayPool(head.address)
            assert pool.build_slots == nodes
            rates[f"Ray cluster, {nodes} worker node(s) of 1 CPU"] = _builds_per_minute(pool, module_file, plan, count)
    print(f"\n{count} builds each, {os.cpu_count()} CPUs")
    for name, rate in rates.items():
        print(f"  {name}: {rate:.1f} builds/min")


@pytest.mark.bench
def test_node_lost_mid_build_costs_no_row(tmp_path):
    """A cluster of two worker nodes loses one (killed, not drained) while builds run on both: its tasks
    run again on the other node and every region gets its row."""
    module, graph, blocks = two_blocks()
    regions = [RegionKey(b, blocks[0]) for b in ("iree-cpu", "iree-cpu-dt", "ort")]
    lost = []
    stop = threading.Event()
    with _own_cluster(2) as head:
        victim = next(iter(head.worker_nodes))

        def lose_one() -> None:
            while not stop.is_set() and not lost:
                if len(_ray_workers_building()) >= 2:  # a build on each node
                    head.remove_node(victim, allow_graceful=False)
                    lost.append(victim)
                time.sleep(0.05)

        killer = threading.Thread(target=lose_one)
        killer.start()
        try:
            summary = measure_regions(module, regions, CostDB(tmp_path / "costs.sqlite"),
                                      options=MeasureOptions(timing=QUICK, cluster=head.address))
        finally:
            stop.set()
            killer.join()
    assert lost, "the builds never ran on both nodes at once"
    assert len(summary.rows) == len(regions) and "crash" not in {str(m.status) for m in summary.rows.values()}


@pytest.mark.bench
def test_tune_on_a_cluster_and_here_on_its_db_choose_one_plan(tmp_path):
    """A tune on the cluster fills the DB; searching again here on that DB (reuse off) chooses the same plan."""
    module, graph, blocks = two_blocks()
    backends = [get_backend("iree-cpu"), get_backend("iree-cpu-dt")]
    db = CostDB(tmp_path / "costs.sqlite")
    with _own_cluster(2) as head:
        remote = tune(module, backends, db, tmp_path / "cluster", budget_s=30,
                      measure=MeasureOptions(timing=QUICK, cluster=head.address))
    rows = {(m.region_hash, m.backend): m.status for m in db.measurements()}
    assert rows and "crash" not in rows.values()
    module, graph, blocks = two_blocks()
    here = tune(module, backends, db, tmp_path / "here", budget_s=30, measure=MeasureOptions(timing=QUICK),
                reuse=False)
    assert here.plan.key == remote.plan.key
