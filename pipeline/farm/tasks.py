"""One farm cell on one node: build, validate, publish. Runs inside a Ray task.

The work shells out to ``trtpipe build`` / ``trtpipe validate`` (``python -m
trtpipe.pipeline.cli.main``), so a cell gets exactly the CLI's behaviour: its exit codes, its atomic
writes, its log lines, its SIGTERM unwinding. The child gets SIGTERM when the Ray worker dies
(``PR_SET_PDEATHSIG``), so a lost node or a cancelled task also stops its build, and a killed
build leaves only a hidden temp folder that the next build removes.

Exit codes read from the CLI: build 0 built (or up to date), 3 build spec written, finish on the
target (older trtpipe: 2 with the "cannot be built on this machine" message), anything else
failed; validate 0 pass, 1 a budget or correctness check failed, anything else an error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

# cell status -> counts as a failure of the farm run (exit code 1)
STATUS_FAILED = {
    "published": False,  # built (validated when asked) and published
    "skipped": False,  # this build hash is already in the store
    "planning": False,  # a planning recipe (no model.source): nothing to build, by design
    "needs_target": False,  # build spec written; TensorRT plans need the target (exit code 3)
    "validate_failed": True,  # built; a budget or correctness check failed; not published
    "build_failed": True,
    "refused_memory": True,  # the node has less memory than the build needs
    "no_node": True,  # no node advertises trtpipe_target_<target>
    "node_lost": True,  # the node died and no retry was left or no other node has the resource
    "cancelled": True,  # Ctrl-C
    "error": True,  # validate or publish error
}
EXIT_SPEC_WRITTEN = 3  # trtpipe build: "GPU build spec written, finish on the target"
LOG_DIR = ".farm-logs"


@dataclass(frozen=True)
class CellSpec:
    """What the driver sends to a node for one (recipe, target) cell."""

    recipe: str  # recipe name (the store key)
    target: str
    recipe_path: str  # absolute path of the YAML on the driver
    recipe_text: str  # its text, written to the work dir when the node lacks the path
    build_hash: str
    store_url: str
    work_dir: str  # node-local artifacts root (trtpipe build --artifacts)
    validate: bool = False
    scenarios: tuple[str, ...] = ()
    build_host_bytes: int = 0  # `trtpipe estimate`: host memory the build needs (Ray `memory` request)
    force: bool = False


@dataclass(frozen=True)
class CellResult:
    """The outcome of one cell; ``detail`` is one short paragraph a person can act on."""

    recipe: str
    target: str
    status: str  # a key of STATUS_FAILED
    detail: str = ""
    node: str | None = None  # "<hostname>/<ray node id[:8]>"
    build_hash: str = ""
    build_s: float | None = None
    validate_s: float | None = None
    publish_s: float | None = None
    total_s: float | None = None
    validate: str | None = None  # PASS | FAIL | None (not run)
    failing_budgets: tuple[str, ...] = ()
    manifest_sha256: str | None = None
    store_url: str | None = None
    log_path: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return STATUS_FAILED[self.status]


def _node_name() -> str:
    try:
        import ray

        nid = ray.get_runtime_context().get_node_id()[:8]
    except Exception:
        nid = "local"
    return f"{socket.gethostname()}/{nid}"


def _die_with_parent() -> None:  # preexec_fn: SIGTERM to the child when the Ray worker dies
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _run_cli(args: list[str], log_path: Path) -> tuple[int, str]:
    """Run ``trtpipe ARGS`` with stdout+stderr appended to ``log_path``; (exit code, stdout)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="160")
    cmd = [sys.executable, "-m", "trtpipe.pipeline.cli.main", *args]
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ trtpipe {' '.join(args)}\n")
        log.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, preexec_fn=_die_with_parent)
        try:
            out, _ = p.communicate()
        except BaseException:  # Ray cancel (KeyboardInterrupt) or worker shutdown: stop the build
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
        log.write(out)
    return p.returncode, out


def _error_text(log_path: Path) -> str:
    """The CLI's ``error: ...`` message (to the end of the log), else the log's last lines."""
    text = log_path.read_text(encoding="utf-8", errors="replace")
    i = text.rfind("error: ")
    tail = text[i + len("error: ") :] if i >= 0 else "\n".join(text.strip().splitlines()[-6:])
    return tail.strip()[:2000]


def _recipe_arg(spec: CellSpec, work: Path) -> str:
    if Path(spec.recipe_path).is_file():
        return spec.recipe_path
    p = work / ".farm-recipes" / f"{spec.recipe}.yaml"  # a node without the driver's checkout
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(spec.recipe_text, encoding="utf-8")
    return str(p)


def _failing_budgets(report_json: Path) -> tuple[str, ...]:
    try:
        doc = json.loads(report_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    out = []
    for s in doc.get("scenarios", []):
        for b in s.get("budgets", []):
            if not b.get("passed"):
                out.append(
                    f"{s['name']}: {b.get('metric')} {b.get('percentile') or ''} measured "
                    f"{b.get('measured')} > limit {b.get('limit')} {b.get('unit') or ''}".replace("  ", " ")
                )
    if doc.get("gate", {}).get("correctness_passed") is False:
        out.append("correctness: agreement with the golden outputs below the recipe's minimum")
    return tuple(out)


def _validate(spec: CellSpec, recipe_arg: str, work: Path, log_path: Path, base: CellResult) -> tuple[int, CellResult]:
    """``trtpipe validate`` on the node's artifact -> (exit code, base with validate_s and the
    failing budgets of the newest report)."""
    t = time.perf_counter()
    args = ["validate", recipe_arg, "--artifacts", str(work)]
    for s in spec.scenarios:
        args += ["--scenario", s]
    rc, _ = _run_cli(args, log_path)
    art = work / spec.recipe / spec.target
    reports = sorted(art.glob("validate/**/report.json"), key=lambda p: p.stat().st_mtime)
    failing = _failing_budgets(reports[-1]) if rc == 1 and reports else ()
    return rc, replace(base, validate_s=time.perf_counter() - t, failing_budgets=failing)


def _already_stored(spec: CellSpec, store, base: CellResult, t0: float) -> CellResult | None:
    """The "skipped" result when the store already holds this build hash (and no --force)."""
    if spec.force or (found := store.lookup(spec.recipe, spec.target, spec.build_hash)) is None:
        return None
    return replace(
        base,
        status="skipped",
        detail=f"build {spec.build_hash[:12]} is already in the store "
        f"(published {found.published_at} from {found.node})",
        store_url=found.url,
        validate=found.validate,
        total_s=time.perf_counter() - t0,
    )


def _start_log(spec: CellSpec, work: Path, node: str) -> Path:
    """Create this cell's log file under ``work/.farm-logs`` (one per attempt) and return its path."""
    (work / LOG_DIR).mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    log_path = work / LOG_DIR / f"{spec.recipe}.{spec.target}.{node.split('/')[-1]}.{stamp}-{os.getpid()}.log"
    log_path.write_text(f"farm cell {spec.recipe} x {spec.target} on {node}\n", encoding="utf-8")
    return log_path


def _build(
    spec: CellSpec, recipe_arg: str, work: Path, log_path: Path, base: CellResult, t0: float
) -> tuple[CellResult, CellResult | None]:
    """``trtpipe build`` -> (base with build_s, the final result when the build did not finish here)."""
    t = time.perf_counter()
    rc, _ = _run_cli(["build", recipe_arg, "--artifacts", str(work)] + (["--force"] if spec.force else []), log_path)
    base = replace(base, build_s=time.perf_counter() - t)
    if rc == 0:
        return base, None
    msg = _error_text(log_path)
    if rc == EXIT_SPEC_WRITTEN or (rc == 2 and "cannot be built on this machine" in msg):
        return base, replace(
            base,
            status="needs_target",
            total_s=time.perf_counter() - t0,
            detail=f"build spec written on node {base.node}; TensorRT plans not built there: {msg}",
        )
    return base, replace(
        base, status="build_failed", detail=f"trtpipe build exited {rc}: {msg}", total_s=time.perf_counter() - t0
    )


def _check_manifest(spec: CellSpec, art: Path, base: CellResult) -> tuple[CellResult, CellResult | None]:
    """(base with the manifest's sha256, the "error" result when the artifact records another
    build hash than the driver computed: the node runs another trtpipe version)."""
    from trtpipe.runtime.artifact.manifest import load_manifest, sha256_file

    m = load_manifest(art, verify_hashes=True)
    if (m.build_info or {}).get("build_hash") != spec.build_hash:
        return base, replace(
            base,
            status="error",
            detail=f"{art} records build {str(m.build_info.get('build_hash'))[:12]}, "
            f"the driver computed {spec.build_hash[:12]}: the node runs another trtpipe version.",
        )
    return replace(base, manifest_sha256=sha256_file(art / "manifest.json")), None


def _validate_gate(
    spec: CellSpec, recipe_arg: str, work: Path, log_path: Path, base: CellResult, t0: float
) -> tuple[CellResult, CellResult | None]:
    """``trtpipe validate`` -> (base with validate_s, the final result when it did not pass)."""
    rc, base = _validate(spec, recipe_arg, work, log_path, base)
    if rc == 1:
        return base, replace(
            base,
            status="validate_failed",
            validate="FAIL",
            total_s=time.perf_counter() - t0,
            detail="validate failed; not published",
        )
    if rc != 0:
        return base, replace(
            base,
            status="error",
            detail=f"trtpipe validate exited {rc}: {_error_text(log_path)}",
            total_s=time.perf_counter() - t0,
        )
    return base, None


def run_cell(spec: CellSpec) -> CellResult:
    """Build (and validate) ``spec`` on this node and publish it; never raises for a build or
    validate failure (the result says what happened), only for bugs or a cancelled task."""
    from trtpipe.pipeline.farm.store import ArtifactStore

    t0 = time.perf_counter()
    node = _node_name()
    base = CellResult(spec.recipe, spec.target, "error", node=node, build_hash=spec.build_hash)
    store = ArtifactStore(spec.store_url)
    if (skipped := _already_stored(spec, store, base, t0)) is not None:
        return skipped
    work = Path(spec.work_dir).expanduser().resolve()
    log_path = _start_log(spec, work, node)
    base = replace(base, log_path=str(log_path))
    recipe_arg = _recipe_arg(spec, work)
    base, done = _build(spec, recipe_arg, work, log_path, base, t0)
    if done is not None:
        return done
    art = work / spec.recipe / spec.target
    base, done = _check_manifest(spec, art, base)
    if done is not None:
        return done
    verdict = None
    if spec.validate:
        base, done = _validate_gate(spec, recipe_arg, work, log_path, base, t0)
        if done is not None:
            return done
        verdict = "PASS"
    t = time.perf_counter()
    stored, new = store.publish(
        art,
        recipe=spec.recipe,
        target=spec.target,
        build_hash=spec.build_hash,
        node=node,
        validate=verdict,
        extra={"build_s": round(base.build_s or 0.0, 2)},
    )
    return replace(
        base,
        status="published" if new else "skipped",
        validate=verdict,
        store_url=stored.url,
        publish_s=time.perf_counter() - t,
        total_s=time.perf_counter() - t0,
        detail=f"published {stored.url}" if new else f"already in the store: {stored.url}",
    )
