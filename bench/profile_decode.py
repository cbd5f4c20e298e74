#!/usr/bin/env python3
"""Where one batch-1 decode step of trtpipe's CPU runtime spends its time (issue 7).

    python bench/profile_decode.py [--artifact DIR] [--threads 2] [--steps 64] [--top 40] [--json]

Three nested timers per decode step (``LLM.step`` with one running sequence; trimmed means over
the steps, the slowest 10 % dropped, so that the parts add up):

    step wall time (perf_counter around llm.step())                         = TPOT
      engine time: llm.engine_time_s delta (OrtEngine.decode: bind inputs, run, copy logits)
        graph run: InferenceSession.run_with_iobinding, or the native engine's tp_forward (C)
      runtime overhead = step - engine  (scheduler, DecodeBatch, sampler, detokenizer, metrics)

Target: runtime overhead <= 10 % of TPOT.

Then, unless ``--no-pyinstrument`` or pyinstrument is not installed (``pip install pyinstrument``;
it is optional), the same decode steps run again under pyinstrument and the top of its call tree
is printed: it shows *where* the Python time goes; the timers above give the numbers (the
profiler itself slows Python down). Unless ``--no-ort-profile`` or the artifact runs the native
engine (one fused library call per step, no onnxruntime graph), a second ``LLM`` runs the same
steps with onnxruntime's profiler on, and the decode graph's time is split by op type and node.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import DEFAULT_ARTIFACT, RESULT_MARK, prompt_token_ids  # noqa: E402


def _wrap_graph_runs(llm) -> list[float]:
    """Time every call of the graph itself: ``run_with_iobinding`` of each onnxruntime session, or
    the native engine's library call (``tp_forward``); returns the list it appends to."""
    times: list[float] = []

    def timed(run):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return run(*a, **kw)
            finally:
                times.append(time.perf_counter() - t)

        return call

    sessions = getattr(llm.engine, "sessions", None)
    if sessions is None:  # the native engine: one ctypes call per step
        llm.engine.lib.tp_forward = timed(llm.engine.lib.tp_forward)
        return times
    for s in sessions.values():
        s.sess.run_with_iobinding = timed(s.sess.run_with_iobinding)
    return times


def decode_steps(llm, ids: list[int], num_steps: int, ort_times: list[float]) -> list[tuple[float, float, float]]:
    """Run one request: its prefill step, then ``num_steps`` decode steps; per decode step
    returns (step_s, engine_s, ort_run_s)."""
    from trtpipe.runtime.sample.params import SamplingParams

    llm.add_request(ids, SamplingParams(max_new_tokens=num_steps + 1, ignore_eos=True))
    llm.step()  # prefill (+ first token)
    out = []
    while llm.has_unfinished():
        e0, n0 = llm.engine_time_s, len(ort_times)
        t = time.perf_counter()
        llm.step()
        step = time.perf_counter() - t
        out.append((step, llm.engine_time_s - e0, sum(ort_times[n0:])))
    return out


def ort_op_profile(artifact: Path, threads: int, ids: list[int], num_steps: int) -> dict:
    """Per-node times of the decode graph from onnxruntime's own profiler, over ``num_steps``
    batch-1 decode steps (after a warm-up): where the engine time goes.

    A separate ``LLM`` is built with ``SessionOptions.enable_profiling`` (the runtime has no switch
    for it, so ``onnxruntime.SessionOptions`` is wrapped while it loads). Returns
    ``{"run_ms": mean model_run, "nodes_per_step": kernels run per step, "by_op": [(op_type,
    ms/step)], "by_node": [(node, ms/step)]}`` where ``by_node`` merges the 30 layers (node names
    with their layer/position numbers taken out).
    """
    import os
    import re
    import tempfile

    import onnxruntime as ort

    from trtpipe.runtime.llm import LLM

    tmp = tempfile.mkdtemp(prefix="trtpipe-ortprof-")
    plain = ort.SessionOptions

    def profiled():
        so = plain()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        return so

    ort.SessionOptions = profiled
    try:
        llm = LLM(artifact, num_threads=threads)
    finally:
        ort.SessionOptions = plain
    decode_steps(llm, ids, 8, [])  # warm-up
    decode_steps(llm, ids, num_steps, [])
    path = llm.engine.sessions[llm.engine.decode_graph].sess.end_profiling()
    events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-num_steps:]
    t0 = runs[0]["ts"]
    by_op: dict[str, float] = {}
    by_node: dict[str, float] = {}
    num_kernels = 0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < t0:
            continue
        num_kernels += 1
        op = e.get("args", {}).get("op_name", "?")
        node = e["name"][: -len("_kernel_time")]
        node = re.sub(r"layers\.\d+", "layers.N", node)  # /model/layers.3/attn/... style
        node = re.sub(r"_\d+$", "", re.sub(r"^n\d+(_\d+)*/", "", node))  # n0_241/matmul_nbits_2 style
        by_op[op] = by_op.get(op, 0.0) + e["dur"] / 1e3 / num_steps
        key = f"{node} ({op})"
        by_node[key] = by_node.get(key, 0.0) + e["dur"] / 1e3 / num_steps
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    top = lambda d, n: sorted(d.items(), key=lambda kv: -kv[1])[:n]  # noqa: E731
    return {
        "run_ms": statistics.fmean(r["dur"] for r in runs) / 1e3,
        "nodes_per_step": num_kernels / num_steps,
        "by_op": top(by_op, 12),
        "by_node": top(by_node, 12),
    }


def step_children(root, num_steps: int) -> list[tuple[str, float]]:
    """``[(callee, ms per decode step)]`` directly under ``LLM.step`` in a pyinstrument tree (plus
    ``LLM.step`` self time), largest first: where the time outside the graph goes."""
    totals: dict[str, float] = {}
    stack = [root]
    while stack:
        f = stack.pop()
        if f.function == "step" and f.file_path and f.file_path.replace("\\", "/").endswith("runtime/llm.py"):
            inner = 0.0
            for c in f.children:
                name = f"{c.class_name + '.' if c.class_name else ''}{c.function}"
                totals[name] = totals.get(name, 0.0) + c.time
                inner += c.time
            totals["(LLM.step itself)"] = totals.get("(LLM.step itself)", 0.0) + f.time - inner
            continue
        stack.extend(f.children)
    return sorted(((k, v * 1e3 / num_steps) for k, v in totals.items()), key=lambda kv: -kv[1])


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64, help="decode steps per run")
    ap.add_argument("--runs", type=int, default=3, help="runs of the timers (trimmed means over all their steps)")
    ap.add_argument("--top", type=int, default=45, help="lines of the pyinstrument tree to print")
    ap.add_argument("--no-pyinstrument", action="store_true")
    ap.add_argument("--no-ort-profile", action="store_true", help="skip onnxruntime's per-node profile")
    ap.add_argument("--json", action="store_true", help="print one JSON line (for bench/peers.py)")
    return ap


def time_decode(llm, ids: list[int], num_steps: int, num_runs: int, threads: int) -> dict:
    """The three nested timers over ``num_runs`` runs of ``num_steps`` decode steps (after a
    warm-up): trimmed means per step, the slowest 10 % dropped (preemption by other processes on
    the shared cores), so the parts add up: step = ort run + engine wrapper + runtime overhead.
    Also the achieved decode bandwidth (:mod:`trtpipe.runtime.metrics.decode_bandwidth`) at the mean context."""
    from trtpipe.runtime.metrics.decode_bandwidth import decode_bandwidth, read_model_from_manifest

    ort_times = _wrap_graph_runs(llm)
    decode_steps(llm, ids, 8, ort_times)  # warm-up
    rows = [r for _ in range(num_runs) for r in decode_steps(llm, ids, num_steps, ort_times)]
    kept = sorted(rows)[: max(1, int(len(rows) * 0.9))]
    step, engine, ort_run = (statistics.fmean(r[i] for r in kept) for i in range(3))
    overhead, wrapper = step - engine, engine - ort_run
    read = read_model_from_manifest(llm.manifest, llm.capabilities.backend)
    bw = None if read is None else decode_bandwidth(read, step, len(ids) + num_steps // 2)
    return {
        "threads": threads,
        "prompt_tokens": len(ids),
        "num_steps": len(rows),
        "num_steps_kept": len(kept),
        "step_s": step,
        "engine_s": engine,
        "ort_run_s": ort_run,
        "overhead_s": overhead,
        "engine_wrapper_s": wrapper,
        "overhead_fraction": overhead / step,
        "overhead_incl_wrapper_fraction": (overhead + wrapper) / step,
        "decode_bandwidth": None if bw is None else bw.to_dict(),
    }


def pyinstrument_profile(llm, ids: list[int], num_steps: int, top_lines: int, res: dict) -> list[str]:
    """The top of pyinstrument's call tree over one request's decode steps (and, into ``res``,
    the callees of ``LLM.step``); one line saying why when pyinstrument is not installed."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return ["(pyinstrument is not installed: pip install pyinstrument)"]
    from trtpipe.runtime.sample.params import SamplingParams

    llm.add_request(ids, SamplingParams(max_new_tokens=num_steps + 1, ignore_eos=True))
    llm.step()  # prefill, outside the profile
    prof = Profiler(interval=0.0002)
    prof.start()
    while llm.has_unfinished():
        llm.step()
    prof.stop()
    text = prof.output_text(unicode=False, color=False, show_all=False, short_mode=False)
    res["pyinstrument_step_children"] = step_children(prof.last_session.root_frame(), num_steps)
    return [ln for ln in text.splitlines() if ln.strip()][:top_lines]


def print_text(res: dict) -> None:
    """The human-readable form of ``res`` (what --json prints as one line)."""
    ms = lambda x: f"{x * 1e3:7.3f} ms"  # noqa: E731
    step, engine, ort_run = res["step_s"], res["engine_s"], res["ort_run_s"]
    wrapper, overhead = res["engine_wrapper_s"], res["overhead_s"]
    print(
        f"batch-1 decode, {res['prompt_tokens']}-token prompt, {res['num_steps']} steps, {res['threads']} threads "
        "(trimmed means per step)"
    )
    print(f"  step (TPOT)          {ms(step)}")
    print(f"  engine               {ms(engine)}   ({engine / step * 100:.1f} %)")
    print(f"    graph run          {ms(ort_run)}   ({ort_run / step * 100:.1f} %)")
    print(f"    engine wrapper     {ms(wrapper)}   ({wrapper / step * 100:.1f} %)")
    print(f"  runtime overhead     {ms(overhead)}   ({overhead / step * 100:.1f} %; target <= 10 %)")
    if res.get("decode_bandwidth"):
        from trtpipe.runtime.metrics.decode_bandwidth import DecodeBandwidth

        print(f"  {DecodeBandwidth.from_dict(res['decode_bandwidth']).describe()}")
    if res["pyinstrument_top"]:
        print("\n" + "\n".join(res["pyinstrument_top"]))
    if res.get("ort_ops"):
        o = res["ort_ops"]
        print(
            f"\nonnxruntime profile of the decode graph (model_run {o['run_ms']:.2f} ms/step, "
            f"{o['nodes_per_step']:.0f} kernels/step), by op type:"
        )
        for name, v in o["by_op"]:
            print(f"  {v:8.3f} ms  {name}")
        print("by node (30 layers merged):")
        for name, v in o["by_node"]:
            print(f"  {v:8.3f} ms  {name}")
    if res.get("pyinstrument_step_children"):
        print("\nunder LLM.step, per decode step (pyinstrument, inflated by the profiler):")
        for name, ms_ in res["pyinstrument_step_children"]:
            print(f"  {ms_:8.3f} ms  {name}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trtpipe.runtime.llm import LLM

    llm = LLM(args.artifact, num_threads=args.threads)
    ids = prompt_token_ids(args.artifact)[: args.prompt_tokens]
    res = time_decode(llm, ids, args.steps, args.runs, args.threads)
    res["pyinstrument_top"] = [] if args.no_pyinstrument else pyinstrument_profile(llm, ids, args.steps, args.top, res)
    if not args.no_ort_profile and llm.capabilities.backend != "native":
        del llm  # one model in memory at a time
        res["ort_ops"] = ort_op_profile(args.artifact, args.threads, ids, args.steps)
    if args.json:
        print(RESULT_MARK + json.dumps(res))
    else:
        print_text(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
