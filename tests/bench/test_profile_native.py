"""bench/profile_native.py's folding of a ``perf report`` into kernel classes (no perf needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import profile_native  # noqa: E402

# the shape of `perf report --no-children --sort dso,symbol --stdio -g none` rows
REPORT = """\
# Samples: 13K of event 'cpu-clock:ppp'
#
    57.05%  libtrtpipe_cpu.so   [.] pairs_q4_l2_r4
     9.79%  libtrtpipe_cpu.so   [.] tp_attention._omp_fn.0
     6.58%  [kernel.kallsyms]   [k] clear_page_erms
     6.33%  libtrtpipe_cpu.so   [.] block_scores_rows
     2.00%  libtrtpipe_cpu.so   [.] decode_rows
     3.85%  libtrtpipe_cpu.so   [.] tp_quant_act._omp_fn.0
     1.63%  libgomp.so.1.0.0    [.] 0x000000000001f622
     1.27%  libtrtpipe_cpu.so   [.] tp_silu_mul._omp_fn.0
     0.16%  libtrtpipe_cpu.so   [.] wide_q8_l2_r1
     0.22%  python3.11          [.] _PyEval_EvalFrameDefault
     0.15%  libc.so.6           [.] _int_malloc
"""


def test_perf_rows_fold_into_kernel_classes(monkeypatch):
    def run(cmd, **_kw):
        assert cmd[:2] == ["perf", "report"]
        return subprocess.CompletedProcess(cmd, 0, stdout=REPORT, stderr="")

    monkeypatch.setattr(profile_native.subprocess, "run", run)
    shares = profile_native.perf_shares(Path("unused.data"))
    assert round(shares[profile_native.CLASSES[0][0]], 2) == 57.21  # both GEMM tile functions
    assert round(shares["attention (paged, causal)"], 2) == 18.12  # tp_attention + block_scores_rows + decode_rows
    assert shares["activation quantization (int8 levels)"] == 3.85
    assert shares["SiLU x up"] == 1.27
    assert shares["OpenMP runtime (barriers, waits)"] == 1.63
    assert shares["OS kernel (page faults, scheduling)"] == 6.58
    assert shares["Python"] == 0.22 and shares["other"] == 0.15
    assert round(sum(shares.values()), 2) == 89.03


def test_classify_unknown_symbol_of_the_library_is_other():
    assert profile_native.classify("tp_new_kernel", "libtrtpipe_cpu.so") == "other"
    assert profile_native.classify("pairs_q8_l1_r3", "libtrtpipe_cpu.so").startswith("GEMM")
