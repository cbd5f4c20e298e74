#!/usr/bin/env python3
"""This CPU's peak rates, measured with ONNX Runtime's own kernels (issue 13: floors that match
the CPU the benchmark ran on).

    python bench/host_peaks.py [--threads 2] [--json]

Each probe is one small ONNX graph run by ``onnxruntime`` on the CPU execution provider with
``--threads`` intra-op threads (the engines' setting), fastest of ``repeats`` timed runs after a
warm-up, so a probe reports what the kernels can reach, not the host's average:

=====================  ==========================================================================
read bandwidth          ``ReduceSum`` of a [256, 256 Ki] float32 tensor (256 MiB) along its rows:
                        bytes read / s (a decode step reads: weights and KV once each; one row
                        per output lets every thread read)
copy bandwidth          NumPy ``copyto`` of 256 MiB: (read + write bytes) / s (what
                        ``trtpipe.pipeline.targets.measure_host`` reports)
fp32 peak               ``MatMul`` [1024, 2048] x [2048, 2048] float32 (MLAS SGEMM): 2MNK FLOP / s
int8 peak               ``MatMulInteger`` [1024, 2048] uint8 x [2048, 2048] int8 (MLAS QGEMM: AVX2
                        ``vpmaddubsw``, AVX-512 VNNI ``vpdpbusd`` where the CPU has it): 2MNK op / s
bf16 peak               torch ``matmul`` [1024, 2048] x [2048, 2048] bfloat16 (oneDNN: AVX-512 BF16
                        ``vdpbf16ps`` or AMX-BF16 where the CPU has them; None without torch):
                        2MNK FLOP / s
int4 GEMM, M=256        ``MatMulNBits`` K=576, N=3072, block 32, no zero-point input (its
                        symmetric kernel, which trtpipe's exact Q4_1 form and onnxruntime-genai
                        int4 run), accuracy level 4 (int8 activations); 2MNK op / s
int4 GEMV, M=1          40 such GEMMs with their own weights (44 MB, more than the L3 cache) at
                        M = 1: weight bytes (codes + fp32 scales) / s
=====================  ==========================================================================

The prefill floor of an INT4 artifact whose GEMMs take int8 activations (``accuracy_level`` 4,
the cpu default) is its FLOP at the **int8** peak, several times below the fp32 one on a CPU with
VNNI; ``bench/peers_floors.py`` uses these rates. The host is shared: a probe that ran while other
processes held the cores reports less than the peak (the script says so when the 1-minute load
average was above 0.5, or when the GEMV read faster than the bandwidth probe); run it again on a
quiet machine. About 5-10 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import numpy as np

REPEATS = 5


@dataclass(frozen=True)
class HostPeaks:
    """Peak rates of this CPU under ONNX Runtime with ``threads`` intra-op threads."""

    threads: int
    read_bytes_per_s: float
    copy_bytes_per_s: float  # read + write bytes
    fp32_flops_per_s: float
    int8_ops_per_s: float
    int4_gemm_ops_per_s: float  # MatMulNBits, M = 256, int8 activations
    int4_gemv_bytes_per_s: float  # MatMulNBits, M = 1: weight bytes read / s
    bf16_flops_per_s: float | None = None  # torch bf16 matmul; None without torch (or in older reports)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        return [
            f"read bandwidth     {self.read_bytes_per_s / 1e9:7.1f} GB/s   (ReduceSum, 256 MiB float32)",
            f"copy bandwidth     {self.copy_bytes_per_s / 1e9:7.1f} GB/s   (NumPy copy, read + write bytes)",
            f"fp32 peak          {self.fp32_flops_per_s / 1e9:7.0f} GFLOP/s (MatMul 1024x2048x2048)",
            f"int8 peak          {self.int8_ops_per_s / 1e9:7.0f} GOP/s   (MatMulInteger u8 x s8 1024x2048x2048)",
            "bf16 peak          "
            + (f"{self.bf16_flops_per_s / 1e9:7.0f} GFLOP/s" if self.bf16_flops_per_s else "    n/a        ")
            + " (torch matmul bf16 1024x2048x2048)",
            f"int4 GEMM, M=256   {self.int4_gemm_ops_per_s / 1e9:7.0f} GOP/s   (MatMulNBits 576x3072, no zero points, accuracy 4)",
            f"int4 GEMV, M=1     {self.int4_gemv_bytes_per_s / 1e9:7.1f} GB/s   (the same, weight bytes read / s)",
        ]


def _session(nodes, inputs, outputs, initializers, threads: int):
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph(nodes, "probe", inputs, outputs, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10  # onnxruntime 1.31 reads IR <= 13; onnx 1.20 writes 14 by default
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _best_s(run, repeats: int = REPEATS) -> float:
    run()  # warm-up (arena, prepacking, threads)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def _read_bandwidth(threads: int) -> float:
    from onnx import TensorProto, helper

    x = np.ones((256, 2**18), dtype=np.float32)
    s = _session(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.shape[0]])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
        threads,
    )
    return x.nbytes / _best_s(lambda: s.run(None, {"x": x}))


def _matmul_rate(threads: int, integer: bool) -> float:
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = 1024, 2048, 2048
    rng = np.random.default_rng(0)
    if integer:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        b = numpy_helper.from_array(rng.integers(-128, 128, (k, n), dtype=np.int8), "b")
        node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
        a_type, y_type = TensorProto.UINT8, TensorProto.INT32
    else:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "b")
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        a_type, y_type = TensorProto.FLOAT, TensorProto.FLOAT
    s = _session(
        [node],
        [helper.make_tensor_value_info("a", a_type, [m, k])],
        [helper.make_tensor_value_info("y", y_type, [m, n])],
        [b],
        threads,
    )
    return 2 * m * n * k / _best_s(lambda: s.run(None, {"a": a}))


def _bf16_rate(threads: int) -> float | None:
    """torch's bf16 matmul (oneDNN picks AMX-BF16 / AVX-512 BF16 where the CPU has them)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    m, k, n = 1024, 2048, 2048
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16)
    return 2 * m * n * k / _best_s(lambda: torch.matmul(a, b))


NUM_GEMV_WEIGHTS = 40  # 40 x 1.1 MB: more than a Zen 3/4 L3 (32 MiB), so the GEMV reads DRAM


def _int4_rates(threads: int) -> tuple[float, float]:
    """(GEMM op/s at M = 256, GEMV weight bytes/s at M = 1) of MatMulNBits 576 x 3072, block 32:
    :data:`NUM_GEMV_WEIGHTS` nodes with their own weights, each its own graph output."""
    from onnx import TensorProto, helper, numpy_helper

    k, n, block = 576, 3072, 32
    blocks = k // block
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    for i in range(NUM_GEMV_WEIGHTS):
        codes = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
        scales = rng.random(n * blocks, dtype=np.float32) * 0.01
        inits += [numpy_helper.from_array(codes, f"b{i}"), numpy_helper.from_array(scales, f"s{i}")]
        attrs = dict(K=k, N=n, bits=4, block_size=block, accuracy_level=4)
        nodes.append(
            helper.make_node("MatMulNBits", ["a", f"b{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft", **attrs)
        )
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    weight_bytes = NUM_GEMV_WEIGHTS * (n * blocks * (block // 2) + n * blocks * 4)
    a_info = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])]
    many = _session(nodes, a_info, outputs, inits, threads)
    one_gemm = _session(nodes[:1], a_info, outputs[:1], inits[:2], threads)
    big = rng.standard_normal((256, k), dtype=np.float32)
    row = rng.standard_normal((1, k), dtype=np.float32)
    gemm = 2 * 256 * n * k / _best_s(lambda: one_gemm.run(None, {"a": big}))
    gemv = weight_bytes / _best_s(lambda: many.run(None, {"a": row}))
    return gemm, gemv


def measure_peaks(threads: int = 2) -> HostPeaks:
    """Run every probe once (~5-10 s on 2 cores); the copy bandwidth is the estimate's own
    :func:`trtpipe.pipeline.targets.measure_host` figure."""
    from trtpipe.pipeline.targets import measure_host

    gemm, gemv = _int4_rates(threads)
    return HostPeaks(
        threads,
        _read_bandwidth(threads),
        measure_host(refresh=True).bandwidth_bytes_per_s,
        _matmul_rate(threads, integer=False),
        _matmul_rate(threads, integer=True),
        gemm,
        gemv,
        _bf16_rate(threads),
    )


def _threads(text: str) -> int:
    """argparse type: an intra-op thread count from 1 to this machine's CPU count."""
    import os

    cpus = os.cpu_count() or 1
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= n <= cpus:
        raise argparse.ArgumentTypeError(f"{n}: expected 1..{cpus} (this machine's CPUs); the engines use 2")
    return n


def warnings(peaks: HostPeaks, load_1m: float) -> list[str]:
    """Why these figures may be below the peaks: a busy host, or a GEMV that read faster than the
    bandwidth probe (which only happens when the bandwidth probe was slowed)."""
    out = []
    if load_1m > 0.5:
        out.append(f"warning: 1-minute load average {load_1m:.2f}: other processes shared the cores; rerun when quiet")
    if peaks.int4_gemv_bytes_per_s > peaks.read_bytes_per_s:
        out.append("warning: the GEMV read faster than the bandwidth probe: the host was busy during it; rerun")
    return out


def main() -> None:
    import os

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--threads", type=_threads, default=2, help="intra-op threads of every probe, 1..CPU count (default 2)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    peaks = measure_peaks(args.threads)
    if args.json:
        print(json.dumps(peaks.to_dict()))
        return
    from trtpipe.runtime.artifact.host_cpu import host_id

    print(f"{host_id()}, {args.threads} threads, fastest of {REPEATS} runs per probe")
    print("\n".join(peaks.lines() + warnings(peaks, load_before)))


if __name__ == "__main__":
    main()
