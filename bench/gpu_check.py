"""GPU check of the Triton kernels: correctness against the NumPy reference, then achieved
bandwidth against the HBM limit (run through bench/gpu_check.sh; budget: < 8 minutes on an H200).

1. Correctness (fp16 and fp32, small shapes, with and without a sliding window, GQA): the
   launchers of plugins/ops/<op>/triton_launch.py and the TensorRT plugin wrapper kernels of
   plugins/ops/<op>/trt_kernels.py, each against plugins/ops/<op>/reference.py.
2. Bandwidth (fp16):
   - paged decode attention, batch 1/8/32 x context 512/4096, window off and 1024: bytes = the
     K/V rows each sequence reads (min(context, window) tokens) + queries + outputs;
   - INT4 GEMV/GEMM W4A16 with float zero points, batch (M) 1/4/16: bytes = packed weights +
     scales + zero points + activations + outputs, next to torch fp16 matmul of the same shape
     (bytes = fp16 weights + activations + outputs) and the INT4 speedup over it.
   Each row: median time (CUDA events), GB/s, and % of the device's peak HBM bandwidth
   (``--peak-gbps`` or a table of known GPUs) and of a measured device-to-device copy.

Exit codes: 0 all correct; 1 a correctness check failed; 2 no usable GPU (torch without CUDA,
no device) -- nothing is measured then.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _import_trtpipe_from_checkout() -> None:
    """Make ``trtpipe.plugins`` importable from this checkout when trtpipe is not installed (a
    bare GPU machine): the package maps the folder plugins/ to trtpipe.plugins (pyproject)."""
    try:
        import trtpipe.plugins  # noqa: F401

        return
    except ImportError:
        pass
    import importlib.util
    import types

    pkg = types.ModuleType("trtpipe")
    pkg.__path__ = []
    sys.modules["trtpipe"] = pkg
    for sub in ("plugins", "runtime"):
        spec = importlib.util.spec_from_file_location(
            f"trtpipe.{sub}", ROOT / sub / "__init__.py", submodule_search_locations=[str(ROOT / sub)]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"trtpipe.{sub}"] = mod
        setattr(pkg, sub, mod)
        spec.loader.exec_module(mod)


PEAK_GBPS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100-SXM4-40GB": 1555.0,
    "A100": 1555.0,
    "Orin": 204.8,
}


def _fail_no_gpu(msg: str) -> None:
    print(
        f"gpu_check: {msg}. Nothing was measured. Run this on a machine with an NVIDIA GPU and torch built with "
        "CUDA (the GPU check has not been run in CI: see docs/tensorrt.md).",
        file=sys.stderr,
    )
    sys.exit(2)


def _setup():
    try:
        import torch
    except ImportError:
        _fail_no_gpu("torch is not installed")
    if not torch.cuda.is_available():
        _fail_no_gpu(f"torch {torch.__version__} sees no CUDA device")
    try:
        import triton  # noqa: F401
    except ImportError:
        _fail_no_gpu("triton is not installed")
    return torch


def _peak(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, v in PEAK_GBPS.items():
        if key.lower() in name.lower():
            return v
    return None


def _time_ms(torch, fn, warmup: int = 10, iters: int = 50) -> float:
    if not torch.cuda.is_available():  # --dry-run-cpu: wall clock, once
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


# ----------------------------------------------------------------------------------------------
# correctness
# ----------------------------------------------------------------------------------------------


def _paged_case(rng, H, KVH, D, BS, NB, chunks, dtype):
    """One packed step for plugins/ops/paged_attention/reference.py: per sequence (cached, new) tokens; the caches are
    the head-major pool ``[KVH, NB, BS, D]`` (docs/contracts.md)."""
    from trtpipe.runtime.kv.planning import blocks_for_tokens

    kc = rng.standard_normal((KVH, NB, BS, D)).astype(dtype)
    vc = rng.standard_normal((KVH, NB, BS, D)).astype(dtype)
    free = list(rng.permutation(np.arange(1, NB)))
    S = len(chunks)
    MB = max(blocks_for_tokens(c + n, BS) for c, n in chunks)
    bt = np.zeros((S, MB), np.int64)
    cl, qsl, slots = np.zeros(S, np.int64), np.zeros(S + 1, np.int64), []
    for s, (cached, new) in enumerate(chunks):
        nb = blocks_for_tokens(cached + new, BS)
        bt[s, :nb] = [free.pop() for _ in range(nb)]
        cl[s], qsl[s + 1] = cached + new, qsl[s] + new
        slots += [int(bt[s, p // BS] * BS + p % BS) for p in range(cached, cached + new)]
    T = int(qsl[-1])
    q = rng.standard_normal((T, H * D)).astype(dtype)
    k = rng.standard_normal((T, KVH * D)).astype(dtype)
    v = rng.standard_normal((T, KVH * D)).astype(dtype)
    return q, k, v, kc, vc, np.array(slots, np.int64), bt, cl, qsl


def _plugin_paged_attention(torch, targs: list, kw: dict, dn: str, *, decode: bool) -> tuple:
    """The TensorRT plugin wrapper kernels on ``targs`` (the :func:`_paged_case` step as device
    tensors) in the plugins' argument order (inputs, extra scalars, outputs): PagedKVWrite (extra
    NB), then PagedAttention (extras [S,] MB, NB), as the two plugin nodes. Returns ``(output,
    key cache after the write)``."""
    from trtpipe.plugins.ops import trt_plugins as TP

    q, k, v, kc, vc, sm, bt, cl, qsl = targs
    KVH, NB = kc.shape[0], kc.shape[1]  # head-major [KVH, NB, BS, D]
    T, S, MB = q.shape[0], bt.shape[0], bt.shape[1]
    write_attrs = dict(num_kv_heads=kw["num_kv_heads"], head_size=kw["head_size"], block_size=kw["block_size"])
    fn, _, c, warps = TP.kernel_config("PagedKVWrite", write_attrs, dn)
    fn[(T,)](k, v, kc, vc, sm, NB, kc, vc, **c, num_warps=warps)
    fn, _, c, warps = TP.kernel_config("PagedAttention", dict(kw, scale=0.0, decode=int(decode)), dn, tactic=1)
    out = torch.empty_like(q)
    if decode:
        fn[(S, KVH)](q, kc, vc, bt, cl, qsl, MB, NB, out, **c, num_warps=warps)
    else:
        fn[(T // c["BLOCK_Q"] + S, KVH)](q, kc, vc, bt, cl, qsl, S, MB, NB, out, **c, num_warps=warps)
    return out, kc


def check_correctness(torch, device: str = "cuda") -> list[tuple[str, float, float, bool]]:
    from trtpipe.plugins.ops import trt_plugins as TP
    from trtpipe.plugins.ops.int4_gemm import pack as P
    from trtpipe.plugins.ops.int4_gemm import reference as R4
    from trtpipe.plugins.ops.int4_gemm import triton_launch as TK4
    from trtpipe.plugins.ops.paged_attention import reference as R
    from trtpipe.plugins.ops.paged_attention import triton_launch as TK

    dev = torch.device(device)
    g = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(dev)  # noqa: E731
    rows = []
    rng = np.random.default_rng(0)
    H, KVH, D, BS, NB = 8, 2, 64, 16, 64
    for dtype, tol in ((np.float32, 2e-3), (np.float16, 2e-2)):
        dn = "fp32" if dtype == np.float32 else "fp16"
        for W in (0, 24):
            for label, chunks in (("prefill", [(40, 17), (0, 5), (100, 1)]), ("decode", [(40, 1), (0, 1), (200, 1)])):
                args = _paged_case(rng, H, KVH, D, BS, NB, chunks, dtype)
                kw = dict(num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=W)
                ref = R.paged_attention(*args, **kw)
                q, k, v, kc, vc, sm, bt, cl, qsl = (g(a) for a in args)
                out, kco, _ = TK.paged_attention(
                    q, k, v, kc, vc, sm, bt, cl, qsl, **kw, max_query_len=1 if label == "decode" else None
                )
                err = float(np.abs(out.float().cpu().numpy() - ref[0].astype(np.float32)).max())
                kerr = float(np.abs(kco.float().cpu().numpy() - ref[1].astype(np.float32)).max())
                rows.append((f"triton paged_attention {label} {dn} W={W}", err, tol, err <= tol and kerr == 0))
                out, kco = _plugin_paged_attention(torch, [g(a) for a in args], kw, dn, decode=label == "decode")
                err = float(np.abs(out.float().cpu().numpy() - ref[0].astype(np.float32)).max())
                kerr = float(np.abs(kco.float().cpu().numpy() - ref[1].astype(np.float32)).max())
                good = err <= tol and kerr == 0
                rows.append((f"plugin PagedKVWrite+PagedAttention {label} {dn} W={W}", err, tol, good))
        K, N, G = 512, 384, 32
        w = rng.standard_normal((N, K)).astype(np.float32)
        packed, scales, zp = P.quantize_rtn(w, G, symmetric=False)
        zf = P.unpack_zero_points_uint8(zp, N, K // G).astype(dtype)
        for M in (1, 4, 33):
            a = rng.standard_normal((M, K)).astype(dtype)
            ref = R4.int4_gemm(a, packed, scales.astype(dtype), zf, K=K, N=N, group_size=G).astype(np.float32)
            y = TK4.int4_gemm(g(a), g(packed), g(scales.astype(dtype)), g(zf), K=K, N=N, group_size=G)
            err = float(np.abs(y.float().cpu().numpy() - ref).max() / max(1.0, np.abs(ref).max()))
            rows.append((f"triton int4_gemm M={M} {dn} (rel)", err, tol, err <= tol))
            for tactic in sorted(TP.INT4_TACTICS):
                fn, _, c, warps = TP.kernel_config("Int4Gemm", dict(K=K, N=N, group_size=G, bits=4), dn, tactic)
                yp = torch.empty((M, N), dtype=y.dtype, device=dev)
                fn[(math.ceil(M / c["BLOCK_M"]), math.ceil(N / c["BLOCK_N"]))](
                    g(a), g(packed), g(scales.astype(dtype)), g(zf), M, yp, **c, num_warps=warps
                )
                err = float(np.abs(yp.float().cpu().numpy() - ref).max() / max(1.0, np.abs(ref).max()))
                rows.append((f"plugin Int4Gemm tactic {tactic} M={M} {dn} (rel)", err, tol, err <= tol))
    return rows


# ----------------------------------------------------------------------------------------------
# bandwidth
# ----------------------------------------------------------------------------------------------


def bench_decode_attention(
    torch, H, KVH, D, BS, iters, *, device="cuda", batches=(1, 8, 32), contexts=(512, 4096), windows=(0, 1024)
) -> list[tuple]:
    from trtpipe.plugins.ops.paged_attention import triton_launch as TK

    dev = torch.device(device)
    rows = []
    for ctx in contexts:
        for batch in batches:
            mb = ctx // BS
            nb = batch * mb + 1
            kc = torch.randn((KVH, nb, BS, D), dtype=torch.float16, device=dev)  # head-major pool
            vc = torch.randn_like(kc)
            bt = (torch.randperm(nb - 1, device=dev)[: batch * mb] + 1).view(batch, mb).to(torch.int64)
            cl = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
            q = torch.randn((batch, H * D), dtype=torch.float16, device=dev)
            out = torch.empty_like(q)
            for W in windows:
                keys = min(ctx, W) if W else ctx
                fn = lambda: TK.paged_attention_decode(
                    q,
                    kc,
                    vc,
                    bt,
                    cl,
                    num_heads=H,
                    num_kv_heads=KVH,  # noqa: E731
                    head_size=D,
                    block_size=BS,
                    sliding_window=W,
                    out=out,
                )
                ms = _time_ms(torch, fn, iters=iters)
                nbytes = batch * keys * 2 * KVH * D * 2 + 2 * q.numel() * 2 + bt.numel() * 8
                rows.append((f"decode attn b={batch} ctx={ctx} W={W or 'off'}", ms, nbytes, None))
    return rows


def bench_int4(torch, shapes, iters, *, device="cuda") -> list[tuple]:
    from trtpipe.plugins.ops.int4_gemm import triton_launch as TK

    dev = torch.device(device)
    rows = []
    G = 128
    for N, K in shapes:
        packed = torch.randint(0, 256, (N, K // G, G // 2), dtype=torch.uint8, device=dev)
        scales = torch.rand((N, K // G), dtype=torch.float16, device=dev) * 0.01
        zp = torch.full((N, K // G), 8.0, dtype=torch.float16, device=dev)
        w16 = torch.randn((K, N), dtype=torch.float16, device=dev)
        for M in (1, 4, 16):
            a = torch.randn((M, K), dtype=torch.float16, device=dev)
            bm = 16
            ms4 = _time_ms(
                torch,
                lambda: TK.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G, block_m=bm, block_n=64, block_k=64),
                iters=iters,
            )
            b4 = packed.numel() + scales.numel() * 2 + zp.numel() * 2 + a.numel() * 2 + M * N * 2
            ms16 = _time_ms(torch, lambda: a @ w16, iters=iters)
            b16 = w16.numel() * 2 + a.numel() * 2 + M * N * 2
            rows.append((f"int4 W4A16 M={M} N={N} K={K}", ms4, b4, ms16 / ms4))
            rows.append((f"torch fp16  M={M} N={N} K={K}", ms16, b16, None))
    return rows


def copy_gbps(torch) -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = _time_ms(torch, lambda: y.copy_(x), warmup=3, iters=10)
    return 2 * x.numel() / (ms * 1e-3) / 1e9


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak-gbps", type=float, default=None, help="HBM peak (GB/s); default: known-GPU table")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument(
        "--shape",
        choices=["llama8b", "smollm2"],
        default="llama8b",
        help="attention/GEMM shapes: Llama-3-8B-like (32/8 heads, d 128, 4096x14336) or SmolLM2-135M",
    )
    ap.add_argument("--skip-bench", action="store_true", help="correctness only")
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="check this script's correctness section on CPU under TRITON_INTERPRET=1 (no GPU; slow)",
    )
    return ap.parse_args(argv)


def _print_correctness_rows(rows: list) -> None:
    for label, err, tol, good in rows:
        print(f"{label:58s} {err:10.2e} {tol:8.0e} {'ok' if good else 'FAIL'}")


def _dry_run_cpu(argv: list[str] | None) -> int:
    """Run the correctness section and the bandwidth code paths on CPU under the Triton interpreter.

    Re-executes this script with TRITON_INTERPRET=1 when it is not set (it must be set before triton is
    imported). Returns the exit status: 0 when every correctness row is within tolerance, else 1.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":  # must be set before triton is imported
        import subprocess

        env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
        return subprocess.call([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], env=env)
    import torch

    rows = check_correctness(torch, "cpu")
    _print_correctness_rows(rows)
    bench = bench_decode_attention(
        torch, 4, 2, 32, 16, 1, device="cpu", batches=(1, 2), contexts=(64,), windows=(0, 32)
    ) + bench_int4(torch, [(64, 256)], 1, device="cpu")
    for label, ms, nbytes, _speedup in bench:  # exercises the bandwidth code paths; numbers mean nothing
        print(f"{label:40s} {nbytes / 1e6:9.3f} MB  (interpreter time {ms:.0f} ms)")
    print("dry run (CPU interpreter): " + ("all ok" if all(r[3] for r in rows) else "FAILED"))
    return 0 if all(r[3] for r in rows) else 1


def _print_bench(torch, shape: str, iters: int, peak: float | None) -> None:
    """Measure copy bandwidth, then time the attention and int4 kernels at `shape` and print the table."""
    if shape == "llama8b":
        H, KVH, D, gemm = 32, 8, 128, [(4096, 4096), (14336, 4096), (4096, 14336)]
    else:
        H, KVH, D, gemm = 9, 3, 64, [(576, 576), (1536, 576), (576, 1536)]
    cp = copy_gbps(torch)
    print(f"\nmeasured device-to-device copy: {cp:.0f} GB/s")
    bench = bench_decode_attention(torch, H, KVH, D, 16, iters) + bench_int4(torch, gemm, iters)
    print(f"\n{'kernel':40s} {'ms':>9s} {'MB':>9s} {'GB/s':>8s} {'% peak':>7s} {'% copy':>7s} {'int4 speedup':>12s}")
    for label, ms, nbytes, speedup in bench:
        gbps = nbytes / (ms * 1e-3) / 1e9
        pk = f"{100 * gbps / peak:6.1f}%" if peak else "    n/a"
        sp = f"{speedup:11.2f}x" if speedup else ""
        print(f"{label:40s} {ms:9.4f} {nbytes / 1e6:9.2f} {gbps:8.0f} {pk:>7s} {100 * gbps / cp:6.1f}% {sp}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    _import_trtpipe_from_checkout()
    if args.dry_run_cpu:
        return _dry_run_cpu(argv)
    torch = _setup()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    t0 = time.perf_counter()
    name = torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    peak = _peak(name, args.peak_gbps)
    print(
        f"device: {name} (sm_{major}{minor}), torch {torch.__version__}, peak HBM "
        f"{f'{peak:.0f} GB/s' if peak else 'unknown (pass --peak-gbps)'}"
    )
    rows = check_correctness(torch)
    ok = all(r[3] for r in rows)
    print(f"\n{'correctness check':58s} {'max err':>10s} {'tol':>8s}")
    _print_correctness_rows(rows)
    print(f"correctness: {'all ok' if ok else 'FAILED'} ({time.perf_counter() - t0:.0f} s)")
    if args.skip_bench:
        return 0 if ok else 1
    _print_bench(torch, args.shape, args.iters, peak)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
