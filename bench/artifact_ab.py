"""A against B (against C ...): trtpipe artifacts side by side, in separate processes, interleaved.

    python bench/artifact_ab.py base=artifacts/smollm2-135m-cpu/cpu new=/tmp/arts/x/cpu [--rounds 5]
    python bench/artifact_ab.py ort=artifacts/smollm2-135m-cpu/cpu@ort native=artifacts/smollm2-135m-cpu/cpu@native

``DIR@ENGINE`` runs that artifact on one engine (auto, native, ort; default auto).

Each round runs every artifact's worker once (``peers.py``'s trtpipe worker: load, warm up on every
shape, TTFT at 16/128/512 prompt tokens, TPOT over 64 tokens at each, 8 concurrent requests, peak
RSS), in an order rotated and reversed per round (``peers_measure.round_order``), so drift of the
shared machine hits every artifact alike. Prints the medians over the rounds and each artifact's
ratio to the first one, and the host kind (CPU model, family/model, SIMD flags) they ran on.
Same-run ratios are the only figures that count on these shared machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_measure import SETTLE_S, machine_info, round_order, run_worker, wait_quiet  # noqa: E402
from peers_workload import PROMPT_LENGTHS, make_spec  # noqa: E402


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs else "not run"}
    return {
        "runs": len(ok),
        "ttft_ms": {n: _median([r["ttft_s"][str(n)] * 1e3 for r in ok]) for n in PROMPT_LENGTHS},
        "tpot_ms": {n: _median([r["tpot_s"][str(n)] * 1e3 for r in ok]) for n in PROMPT_LENGTHS},
        "x8_tokens_per_s": _median([r["concurrent"]["output_tokens_per_s"] for r in ok]),
        "peak_rss_mib": max(r["peak_rss_bytes"] for r in ok) / 2**20,
        "first_output_ids": ok[0]["first_output_ids"],
    }


def report(summary: dict[str, dict], host: dict) -> str:
    names = list(summary)
    base = summary[names[0]]
    lines = [
        f"host: {host.get('cpu')} (family {host.get('cpu_family')} model {host.get('cpu_model')}; "
        f"{host.get('cpus')} CPUs; {host.get('simd')})",
        "| artifact | TTFT 16 / 128 / 512 ms | TPOT 16 / 128 / 512 ms | x8 tok/s | peak RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        s = summary[n]
        if "error" in s:
            lines.append(f"| {n} | error: {s['error']} | | | |")
            continue
        f = lambda d: " / ".join(f"{d[k]:.1f}" for k in PROMPT_LENGTHS)  # noqa: E731
        lines.append(
            f"| {n} ({s['runs']} runs) | {f(s['ttft_ms'])} | {f(s['tpot_ms'])} | "
            f"{s['x8_tokens_per_s']:.0f} | {s['peak_rss_mib']:.0f} |"
        )
    if "error" not in base:
        for n in names[1:]:
            s = summary[n]
            if "error" in s:
                continue
            r = lambda key: " / ".join(f"{s[key][k] / base[key][k]:.2f}" for k in PROMPT_LENGTHS)  # noqa: E731
            lines.append(
                f"| {n} / {names[0]} | {r('ttft_ms')}x | {r('tpot_ms')}x | "
                f"{s['x8_tokens_per_s'] / base['x8_tokens_per_s']:.2f}x | "
                f"{s['peak_rss_mib'] / base['peak_rss_mib']:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", nargs="+", help="LABEL=ARTIFACT_DIR, the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker-timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, help="also write the raw runs here")
    args = ap.parse_args(argv)
    arts: dict[str, Path] = {}
    engines: dict[str, str] = {}
    for a in args.artifacts:
        label, sep, where = a.partition("=")
        path, _, engine = where.partition("@")
        if not sep or not (Path(path) / "manifest.json").is_file() or engine not in ("", "auto", "native", "ort"):
            ap.error(f"{a!r}: expected LABEL=ARTIFACT_DIR[@auto|native|ort] with a manifest.json in it")
        arts[label] = Path(path)
        engines[label] = engine or "auto"
    runs: dict[str, list[dict]] = {k: [] for k in arts}
    with tempfile.TemporaryDirectory() as tmp:
        specs = {}
        for label, path in arts.items():
            specs[label] = Path(tmp) / f"{label}.json"
            specs[label].write_text(json.dumps({**make_spec(path, args.threads), "engine": engines[label]}))
        for r in range(args.rounds):
            wait_quiet(60, 0.3)
            for i, label in enumerate(round_order(list(arts), r)):
                if i:
                    import time

                    time.sleep(SETTLE_S)
                res = run_worker("trtpipe", specs[label], args.worker_timeout)
                runs[label].append(res)
                if "error" in res:
                    print(f"[round {r + 1}] {label}: ERROR {res['error']}", flush=True)
                    continue
                print(
                    f"[round {r + 1}] {label}: TTFT "
                    + "/".join(f"{res['ttft_s'][str(n)] * 1e3:.1f}" for n in PROMPT_LENGTHS)
                    + " ms, TPOT "
                    + "/".join(f"{res['tpot_s'][str(n)] * 1e3:.1f}" for n in PROMPT_LENGTHS)
                    + f" ms, x8 {res['concurrent']['output_tokens_per_s']:.0f} tok/s, "
                    + f"RSS {res['peak_rss_bytes'] / 2**20:.0f} MiB, foreign load {res.get('foreign_load_cores')}",
                    flush=True,
                )
    summary = {k: summarize(v) for k, v in runs.items()}
    host = machine_info()
    print(report(summary, host))
    if args.json:
        args.json.write_text(json.dumps({"host": host, "runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
