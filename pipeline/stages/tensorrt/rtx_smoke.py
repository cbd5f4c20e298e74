"""TensorRT-RTX smoke build (CPU, ahead of time): a parser + builder check of plugin-free graphs.

TensorRT-RTX installs everywhere and its builder works without a GPU, ahead of time for
sm 75/80/86/89/120 (no sm_87 Orin, no sm_90 H200), but it runs standard ops only and its engines
are not TensorRT plans: the engine bytes are discarded. Each build runs in a subprocess
(``python -m trtpipe.pipeline.stages.tensorrt.rtx_smoke``), because polygraphy picks its TensorRT module
at import time (``POLYGRAPHY_USE_TENSORRT_RTX=1``) and a plugin node can abort the process.

Command line (a developer check; docs/tensorrt.md)::

    python -m trtpipe.pipeline.stages.tensorrt.rtx_smoke spec SPEC [--sm 80]       every plugin-free plan of a spec
    python -m trtpipe.pipeline.stages.tensorrt.rtx_smoke graph GRAPH --profiles JSON [--sm 80] [--opt-level 3]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.pipeline.stages.tensorrt.profiles import OptimizationProfile, ShapeRanges
from trtpipe.pipeline.stages.tensorrt.spec import load_spec
from trtpipe.plugins.core.versions import TRT_PLUGINS_REQUIREMENT

RTX_SMS = (75, 80, 86, 89, 120)


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    seconds: float
    engine_bytes: int  # size of the RTX engine built in memory (discarded: not a TensorRT plan)
    log_tail: str


def rtx_smoke_build(
    graph: str | Path, profiles: list[ShapeRanges], *, sm: int = 80, opt_level: int = 3, timeout_s: float = 900
) -> SmokeResult:
    """Parse and build ``graph`` ahead of time for ``sm`` with TensorRT-RTX through polygraphy,
    with ``profiles`` (one ``{input: [min, opt, max]}`` per optimization profile), in a
    subprocess. Raises :class:`BuildError` for an SM RTX cannot target."""
    if sm not in RTX_SMS:
        raise BuildError(
            f"TensorRT-RTX builds ahead of time for sm {list(RTX_SMS)}, not sm_{sm} "
            "(no sm_87 Orin or sm_90 H200): use sm 80 for the smoke build"
        )
    env = dict(os.environ, POLYGRAPHY_USE_TENSORRT_RTX="1")
    cmd = [
        sys.executable,
        "-m",
        "trtpipe.pipeline.stages.tensorrt.rtx_smoke",
        "graph",
        str(graph),
        "--sm",
        str(sm),
        "--opt-level",
        str(opt_level),
        "--profiles",
        json.dumps(profiles),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    out = proc.stdout + proc.stderr
    nbytes = 0
    for line in out.splitlines():
        if line.startswith("RTX_SMOKE_OK "):
            nbytes = int(line.split()[1])
    return SmokeResult(proc.returncode == 0 and nbytes > 0, time.perf_counter() - t0, nbytes, out[-4000:])


def _build_in_this_process(graph: str, sm: int, opt_level: int, profiles: list[ShapeRanges]) -> int:
    if os.environ.get("POLYGRAPHY_USE_TENSORRT_RTX", "0") == "0":
        print("set POLYGRAPHY_USE_TENSORRT_RTX=1", file=sys.stderr)
        return 2
    from polygraphy.backend.tensorrt_rtx import CreateConfigRTX
    from polygraphy.backend.trt import EngineBytesFromNetwork, NetworkFromOnnxPath

    profs = [OptimizationProfile.from_shapes("smoke", s).to_polygraphy() for s in profiles]
    major, minor = divmod(sm, 10)  # 80 -> (8, 0), 120 -> (12, 0)
    net = NetworkFromOnnxPath(graph, strongly_typed=True)
    cfg = CreateConfigRTX(profiles=profs, compute_capabilities=[(major, minor)], builder_optimization_level=opt_level)
    engine = EngineBytesFromNetwork(net, config=cfg)()
    if engine is None:
        return 1
    print(f"RTX_SMOKE_OK {engine.nbytes}")
    return 0


def smoke_spec(spec_path: Path, sm: int = 80) -> int:
    """Smoke-build every plugin-free plan of a spec, printing one line per plan; 0 when all built."""
    spec = load_spec(spec_path)
    rc = 0
    for p in spec.plans:
        g = spec.graphs[Path(p.graph).stem]
        if g.lowering != "plugin_free":
            print(f"{p.name}: skipped ({g.lowering} graphs need {TRT_PLUGINS_REQUIREMENT}; RTX has no Python plugins)")
            continue
        r = rtx_smoke_build(spec_path.parent / p.graph, [prof.shapes() for prof in p.profiles], sm=sm)
        phases = "+".join(prof.phase for prof in p.profiles)
        print(
            f"{p.name} [{phases} profile(s)]: {'OK' if r.ok else 'FAILED'} in {r.seconds:.1f} s "
            f"({r.engine_bytes / 2**20:.1f} MiB engine, discarded)"
        )
        if not r.ok:
            print(r.log_tail)
            rc = 1
    return rc


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m trtpipe.pipeline.stages.tensorrt.rtx_smoke", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("spec", help="smoke-build every plugin-free plan of a build spec")
    s.add_argument("spec")
    s.add_argument("--sm", type=int, default=80)
    a = sub.add_parser("graph", help="build one graph (in this process; needs POLYGRAPHY_USE_TENSORRT_RTX=1)")
    a.add_argument("graph")
    a.add_argument("--profiles", required=True, help="JSON [{input: [[min], [opt], [max]]}, ...]")
    a.add_argument("--sm", type=int, default=80)
    a.add_argument("--opt-level", type=int, default=3)
    args = ap.parse_args(argv)
    if args.cmd == "graph":
        return _build_in_this_process(args.graph, args.sm, args.opt_level, json.loads(args.profiles))
    return smoke_spec(Path(args.spec).resolve(), args.sm)


if __name__ == "__main__":
    sys.exit(main())
