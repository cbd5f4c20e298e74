"""The farm driver: recipes -> cells -> Ray tasks on matching nodes -> results.

    recipes ──► cells (recipe x its target, --targets filter) ──► planning recipe? report it
                 │                                                already in the store? skip
                 ▼
    cluster resources: no node advertises trtpipe_target_<t> ──► fail fast (no_node)
                       no such node has the memory the build needs ──► fail fast (refused_memory)
                 ▼
    one Ray task per cell: resources={trtpipe_target_<t>: 1}, memory=<build bytes>, max_retries
                 ▼
    wait loop: results as they finish; a pending cell whose resource vanished from the cluster
    (its node died, no other has it) is cancelled and reported node_lost; Ctrl-C cancels the rest

Without an address, a local Ray instance on 127.0.0.1 (no dashboard, a small object store)
advertises ``trtpipe_target_cpu``: the same command works on one laptop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtpipe.pipeline.farm.node import resource_name
from trtpipe.pipeline.farm.tasks import CellResult, CellSpec, run_cell

DEFAULT_WORK_DIR = "~/.cache/trtpipe/farm"
LOCAL_OBJECT_STORE_BYTES = 80 * 2**20  # tasks return small records; artifacts go to the store
LOST_GRACE_S = 3.0  # a resource absent this long while its cell is pending -> node_lost
CANCEL_WAIT_S = 30.0


@dataclass(frozen=True)
class FarmOptions:
    store_url: str
    address: str | None = None  # None: a local instance; "auto"; "host:port"; "ray://host:10001"
    targets: tuple[str, ...] = ()  # () = every recipe's own target
    validate: bool = False
    scenarios: tuple[str, ...] = ()
    work_dir: str = DEFAULT_WORK_DIR
    force: bool = False
    max_retries: int = 1  # re-runs of a cell whose node died
    timeout_s: float = 4 * 3600.0
    local_num_cpus: int | None = None


def plan_cells(recipe_args: Sequence[str], opts: FarmOptions) -> tuple[list[CellSpec], list[CellResult]]:
    """Load the recipes; return (cells to run, cells already decided: planning or skipped)."""
    from trtpipe.pipeline.estimate import build_host_bytes, model_config_for
    from trtpipe.pipeline.farm.store import ArtifactStore
    from trtpipe.pipeline.recipe import build_hash, load_recipe, resolve_recipe_path

    store = ArtifactStore(opts.store_url)
    todo: list[CellSpec] = []
    done: list[CellResult] = []
    for arg in recipe_args:
        path = resolve_recipe_path(arg).resolve()
        r = load_recipe(path)
        if opts.targets and r.target not in opts.targets:
            continue
        bh = build_hash(r)
        if not r.model.has_weights:
            done.append(
                CellResult(
                    r.name,
                    r.target,
                    "planning",
                    build_hash=bh,
                    detail=("planning recipe: no model.source, nothing to build (trtpipe estimate reads it)"),
                )
            )
            continue
        if not opts.force and (found := store.lookup(r.name, r.target, bh)) is not None:
            done.append(
                CellResult(
                    r.name,
                    r.target,
                    "skipped",
                    build_hash=bh,
                    store_url=found.url,
                    validate=found.validate,
                    node=found.node,
                    total_s=0.0,
                    detail=f"build {bh[:12]} is already in the store (published {found.published_at})",
                )
            )
            continue
        todo.append(
            CellSpec(
                recipe=r.name,
                target=r.target,
                recipe_path=str(path),
                recipe_text=path.read_text(encoding="utf-8"),
                build_hash=bh,
                store_url=opts.store_url,
                work_dir=opts.work_dir,
                validate=opts.validate,
                scenarios=opts.scenarios,
                build_host_bytes=build_host_bytes(model_config_for(r), r.target.split("-")[0]),
                force=opts.force,
            )
        )
    return todo, done


def connect(opts: FarmOptions) -> None:
    """ray.init: the given cluster, or a local instance advertising the cpu target."""
    import ray

    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if opts.address:
        host = opts.address.split("://")[-1].rsplit(":", 1)[0]
        if host in ("127.0.0.1", "localhost"):
            # Ray rewrites a loopback address to this machine's outward IP, where a head bound
            # to 127.0.0.1 does not listen; its single-machine mode keeps the loopback address.
            import ray._private.ray_constants as ray_constants

            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            ray_constants.ENABLE_RAY_CLUSTER = False
            common["_node_ip_address"] = "127.0.0.1"
        ray.init(address=opts.address, **common)
    else:
        ray.init(
            address="local",
            num_cpus=opts.local_num_cpus or min(2, os.cpu_count() or 1),
            resources={resource_name("cpu"): 1},
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            _node_ip_address="127.0.0.1",
            **common,
        )


def _alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def capacity_problem(cell: CellSpec, nodes: Sequence[dict], address: str | None) -> CellResult | None:
    """no_node / refused_memory for ``cell`` given the alive nodes (``ray.nodes()`` records),
    or None when some node advertises the target and has the memory the build needs."""
    res = resource_name(cell.target)
    have = [n for n in nodes if n.get("Resources", {}).get(res, 0) >= 1]
    join = f"--address {address}" if address else "--address <head>:6379"
    if not have:
        seen = sorted({k for n in nodes for k in n.get("Resources", {}) if k.startswith("trtpipe_target_")})
        return CellResult(
            cell.recipe,
            cell.target,
            "no_node",
            build_hash=cell.build_hash,
            detail=(
                f"no node in the cluster advertises the resource {res} (advertised: {', '.join(seen) or 'none'}). "
                f"Fix: on each {cell.target} machine run `trtpipe farm node --target {cell.target} {join} --run`."
            ),
        )
    fits = [n for n in have if n.get("Resources", {}).get("memory", float("inf")) >= cell.build_host_bytes]
    if not fits:
        mem = ", ".join(
            f"{n.get('NodeManagerHostname', '?')}/{n.get('NodeID', '')[:8]} "
            f"{n['Resources'].get('memory', 0) / 2**30:.1f} GiB"
            for n in have
        )
        return CellResult(
            cell.recipe,
            cell.target,
            "refused_memory",
            build_hash=cell.build_hash,
            detail=(
                f"the build of {cell.recipe} needs about {cell.build_host_bytes / 2**30:.1f} GiB of host memory "
                f"(trtpipe estimate: exporter / TensorRT builder peak), the nodes with {res} have {mem} (Ray memory "
                f"resource). Fix: add a node with more memory (trtpipe farm node --target {cell.target})."
            ),
        )
    return None


def _submit(cell: CellSpec, opts: FarmOptions):
    import ray

    task = ray.remote(run_cell).options(
        resources={resource_name(cell.target): 1},
        num_cpus=1,
        memory=cell.build_host_bytes or None,
        max_retries=opts.max_retries,
        retry_exceptions=False,
        name=f"trtpipe-{cell.recipe}-{cell.target}",
    )
    return task.remote(cell)


def _lost(cell: CellSpec, why: str) -> CellResult:
    return CellResult(
        cell.recipe,
        cell.target,
        "node_lost",
        build_hash=cell.build_hash,
        detail=(
            f"{why}; nothing was published (the store holds complete artifacts only). Fix: rerun "
            "`trtpipe farm build` (cells already in the store are skipped)."
        ),
    )


def _collect(pending: dict, opts: FarmOptions, log: Callable[[str], None], out: list[CellResult]) -> None:
    """Wait for every task, appending results to ``out`` (kept when Ctrl-C interrupts); a cell
    whose resource left the cluster is cancelled and reported node_lost."""
    import ray

    absent_since: dict = {}
    t_end = time.monotonic() + opts.timeout_s
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        for ref in ready:
            cell = pending.pop(ref)
            try:
                res = ray.get(ref)
            except ray.exceptions.TaskCancelledError:
                res = _lost(cell, "the task was cancelled")
            except ray.exceptions.RayTaskError as e:  # an exception in run_cell: a bug, report it
                res = CellResult(
                    cell.recipe,
                    cell.target,
                    "error",
                    build_hash=cell.build_hash,
                    detail=f"the farm task raised {str(e).strip().splitlines()[-1][:400]}",
                )
            except ray.exceptions.RayError as e:  # worker or node died, retries used up
                res = _lost(
                    cell, f"the node running it died and {opts.max_retries} retries are used up ({type(e).__name__})"
                )
            log(f"{res.recipe} x {res.target}: {res.status}")
            out.append(res)
        nodes = _alive_nodes() if pending else []
        now = time.monotonic()
        for ref, cell in list(pending.items()):
            if any(n.get("Resources", {}).get(resource_name(cell.target), 0) >= 1 for n in nodes):
                absent_since.pop(ref, None)
                continue
            if now - absent_since.setdefault(ref, now) >= LOST_GRACE_S:
                ray.cancel(ref, force=True)
                pending.pop(ref)
                out.append(
                    _lost(
                        cell,
                        f"the node running it left the cluster and no other node advertises "
                        f"{resource_name(cell.target)}",
                    )
                )
                log(f"{cell.recipe} x {cell.target}: node_lost")
        if now > t_end and pending:
            for ref, cell in pending.items():
                ray.cancel(ref, force=True)
                out.append(
                    CellResult(
                        cell.recipe,
                        cell.target,
                        "error",
                        build_hash=cell.build_hash,
                        detail=f"timed out after {opts.timeout_s:.0f} s (--timeout-s); cancelled",
                    )
                )
            pending.clear()


def _cancel_all(pending: dict, log: Callable[[str], None]) -> list[CellResult]:
    """Ctrl-C: interrupt every running task (its build gets SIGTERM and removes its temp folder)."""
    import ray

    log(f"cancelling {len(pending)} task(s) ...")
    for ref in pending:
        ray.cancel(ref, force=False)
    ray.wait(list(pending), num_returns=len(pending), timeout=CANCEL_WAIT_S)
    return [
        CellResult(
            c.recipe,
            c.target,
            "cancelled",
            build_hash=c.build_hash,
            detail="cancelled by Ctrl-C; nothing was published for this cell",
        )
        for c in pending.values()
    ]


def farm_build(
    recipe_args: Sequence[str], opts: FarmOptions, *, log: Callable[[str], None] = print
) -> tuple[list[CellResult], bool]:
    """Run the farm; returns (results in recipe order, interrupted by Ctrl-C)."""
    import ray

    todo, done = plan_cells(recipe_args, opts)
    for r in done:
        log(f"{r.recipe} x {r.target}: {r.status}")
    results = list(done)
    interrupted = False
    if todo:
        connect(opts)
        try:
            nodes = _alive_nodes()
            pending = {}
            for cell in todo:
                problem = capacity_problem(cell, nodes, opts.address)
                if problem is not None:
                    log(f"{cell.recipe} x {cell.target}: {problem.status}")
                    results.append(problem)
                    continue
                pending[_submit(cell, opts)] = cell
                log(f"{cell.recipe} x {cell.target}: submitted (needs {resource_name(cell.target)})")
            try:
                _collect(pending, opts, log, results)
            except KeyboardInterrupt:
                interrupted = True
                results += _cancel_all(pending, log)
        finally:
            ray.shutdown()
    results.sort(key=lambda r: (r.recipe, r.target))
    return results, interrupted
