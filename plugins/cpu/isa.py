"""The instruction sets the host CPU kernels are compiled for, and which the running CPU has.

``avx512_vnni``: AVX-512 F/BW/VL + VNNI (Intel Cascade Lake and later, AMD Zen 4 and later);
``avx2``: AVX2 + FMA + F16C (x86-64 since 2013-2015: Intel Haswell, AMD Zen 1-3). A library
built for an ISA the CPU lacks dies with SIGILL on its first instruction, so the runtime refuses
it first (:func:`missing_flags`).
"""

from __future__ import annotations

from pathlib import Path

from trtpipe.plugins.core.errors import OpError

# ISA -> (gcc flags, the /proc/cpuinfo flags the CPU needs, preprocessor define)
ISAS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "avx512_vnni": (
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"),
        ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"),
        "TP_ISA_AVX512",
    ),
    "avx2": (("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c"), "TP_ISA_AVX2"),
}
# fastest first: what "host" resolves to
PREFERENCE = ("avx512_vnni", "avx2")
# How each ISA's library holds the faithful (~15-bit) activations of ``levels: 2`` (csrc/tp.h):
# "int8x2", two int8 levels (two u8 x s8 dot passes), or "int16", one int16 level (one vpmaddwd
# pass, AVX2 only). Chosen by measurement (bench/native_gemm.py, current against baseline, the
# same artifact): on a 2-core AMD EPYC Zen 3 (AVX2), int16 against int8x2 measured in
# docs/benchmarks.md; on AVX-512 VNNI (vpdpbusd) two int8 passes stay (not remeasured).
ACT_FORMS = ("int8x2", "int16")
ACT_FORM = {"avx512_vnni": "int8x2", "avx2": "int16"}


def act_forms_of(isa: str) -> tuple[str, ...]:
    """The forms a library for ``isa`` can be compiled in (the kernel tests run each)."""
    return ACT_FORMS if isa == "avx2" else ("int8x2",)


def cpu_flags(cpuinfo_text: str | None = None) -> frozenset[str]:
    """The first processor's flags from ``/proc/cpuinfo`` (empty where there is none)."""
    if cpuinfo_text is None:
        try:
            cpuinfo_text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def missing_flags(isa: str, flags: frozenset[str] | None = None) -> list[str]:
    """The CPU flags ``isa`` needs that this CPU (or ``flags``) lacks. Raises :class:`OpError`
    for an unknown ISA."""
    if isa not in ISAS:
        raise OpError(f"cpu ISA {isa!r}: expected one of {', '.join(ISAS)}")
    have = cpu_flags() if flags is None else flags
    return [f for f in ISAS[isa][1] if f not in have]


def host_isa(flags: frozenset[str] | None = None) -> str | None:
    """The fastest ISA of :data:`PREFERENCE` this CPU runs, or None (not x86-64 with AVX2)."""
    for isa in PREFERENCE:
        if not missing_flags(isa, flags):
            return isa
    return None


def resolve_isa(setting: str, flags: frozenset[str] | None = None) -> str | None:
    """The ISA a recipe's ``engine.cpu_isa`` names: ``host`` -> :func:`host_isa` (None when this
    CPU runs none), else the setting itself (checked)."""
    if setting == "host":
        return host_isa(flags)
    missing_flags(setting, frozenset())  # raises for an unknown name
    return setting
