"""Where a CPU build's memory goes: the stages of ``build_cpu`` run one by one in this process,
with the peak RSS reached inside each and the RSS held after it (psutil, sampled every 10 ms).

Stage by stage, the functions ``pipeline/stages/cpu.py::build_cpu`` calls: load_model
(GGUF read), prepare_model (quantize_model: linears repacked, LM head), export_graphs (torch
references, ``torch.onnx.export`` per phase, graphs read back), lower_ort, write_graphs_shared,
write_golden (the fp32 torch reference's greedy tokens), write_native. The artifact is written
into a scratch folder and discarded.

    python bench/build_stage_peaks.py recipes/synthetic-llama-mid-cpu.yaml [--json F]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil


class Sampler:
    """Peak RSS of this process since the last :meth:`mark`."""

    def __init__(self, interval_s: float = 0.01):
        self.proc, self.interval_s, self.peak, self.running = psutil.Process(), interval_s, 0, True
        self.rows: list[dict] = []
        self.t = time.perf_counter()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval_s)

    def mark(self, stage: str) -> None:
        gc.collect()
        held = self.proc.memory_info().rss
        row = {"stage": stage, "seconds": round(time.perf_counter() - self.t, 1),
               "peak_gb": round(max(self.peak, held) / 1e9, 3), "held_after_gb": round(held / 1e9, 3)}  # fmt: skip
        self.rows.append(row)
        print(f"{stage:28s} {row['seconds']:7.1f} s  peak {row['peak_gb']:6.2f} GB  held after {row['held_after_gb']:6.2f} GB",
              flush=True)  # fmt: skip
        self.peak, self.t = held, time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from trtpipe.pipeline.recipe import load_recipe
    from trtpipe.pipeline.stages.cpu import choose_cpu_backend
    from trtpipe.pipeline.stages.export import export_graphs
    from trtpipe.pipeline.stages.golden.stage import write_golden
    from trtpipe.pipeline.stages.load import load_model, prepare_model
    from trtpipe.pipeline.stages.lower_ort import lower_ort
    from trtpipe.pipeline.stages.native import write_native
    from trtpipe.pipeline.stages.package import write_graphs_shared

    s = Sampler()
    recipe = load_recipe(args.recipe)
    s.mark("imports + recipe")
    quiet = lambda m: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="stage-peaks-") as d:
        tmp = Path(d)
        loaded = load_model(recipe)
        s.mark("load_model")
        model = prepare_model(recipe, loaded)
        s.mark("prepare_model")
        exported = export_graphs(recipe, model, ("prefill", "decode"), tmp, weight_precision=lambda p: p, log=quiet)
        s.mark("export_graphs")
        lowered = lower_ort(recipe, exported)
        exported = replace(exported, graphs={})  # as build_cpu: the raw graphs dropped once lowered
        s.mark("lower_ort")
        write_graphs_shared(lowered.graphs, tmp)
        s.mark("write_graphs_shared")
        write_golden(recipe, model, exported, tmp / "root", tmp, log=quiet)
        s.mark("write_golden (fp32 reference)")
        chosen = choose_cpu_backend(recipe, model, quiet)
        if chosen is not None:
            write_native(model, tmp, *chosen, log=quiet)
            s.mark("write_native")
    s.running = False
    print(f"peak of all: {max(r['peak_gb'] for r in s.rows):.2f} GB")
    if args.json:
        args.json.write_text(json.dumps(s.rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
