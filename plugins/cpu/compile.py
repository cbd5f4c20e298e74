"""Compile ``csrc/`` into one shared library for a target ISA (:mod:`.isa`) with the system C
compiler (``$CC``, else ``cc``): ``-O3 -fopenmp -fno-math-errno -std=c11`` (ISO C: no FMA contraction, so the arithmetic is what
the sources write) and the ISA's flags, never ``-march=native``
(the build machine is not the target). Builds are cached by (sources, ISA, compiler) under
``$TRTPIPE_CACHE`` (default ``~/.cache/trtpipe``)/cpu-kernels.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.cpu.isa import ACT_FORM, ACT_FORMS, ISAS

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("act.c", "gemm.c", "ops.c", "kv_write.c", "attention.c", "forward.c")
HEADERS = ("tp.h", "vmath.h", "gemm_isa.h", "attention_block.h", "attention_i8.h", "workspace.h")
LIBRARY_NAME = "libtrtpipe_cpu.so"


def compiler() -> str | None:
    """The C compiler's path, or None when there is none."""
    return shutil.which(os.environ.get("CC", "cc"))


def sanitizer_flags() -> list[str]:
    """``$TRTPIPE_CPU_SANITIZE`` (e.g. ``address,undefined``) as gcc flags, for the test run that
    holds the kernels to AddressSanitizer and UBSan (tests/plugins/test_cpu_sanitizers.py); empty
    when unset. A sanitized library needs the sanitizer runtime preloaded (``LD_PRELOAD``)."""
    kinds = os.environ.get("TRTPIPE_CPU_SANITIZE", "").strip()
    if not kinds:
        return []
    return [f"-fsanitize={kinds}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def act_form_flags(isa: str, form: str | None = None) -> list[str]:
    """The define of ``form`` (default: the ISA's, :data:`.isa.ACT_FORM`): ``-DTP_ACT_I16`` for
    "int16". Raises :class:`OpError` for an unknown form, or int16 on an ISA it is not written for."""
    form = form or ACT_FORM[isa]
    if form not in ACT_FORMS or (form == "int16" and isa != "avx2"):
        raise OpError(f"activation form {form!r} for {isa}: expected int8x2, or int16 on avx2")
    return ["-DTP_ACT_I16"] if form == "int16" else []


def _command(
    cc: str, isa: str, out: Path, csrc: Path = CSRC, sources: tuple[str, ...] = SOURCES, form: str | None = None
) -> list[str]:
    flags, _, define = ISAS[isa]
    srcs = [str(csrc / s) for s in sources]
    return [
        cc,
        *sanitizer_flags(),
        "-O3",
        "-fopenmp",
        "-fno-math-errno",
        "-fPIC",
        "-shared",
        "-std=c11",
        f"-D{define}",
        *act_form_flags(isa, form),
        *flags,
        *srcs,
        "-o",
        str(out),
        "-lm",
    ]


def build_key(isa: str, cc: str, form: str | None = None) -> str:
    """Hash of the sources, ISA, flags and compiler version: what decides a rebuild."""
    h = hashlib.sha256(sources_hash().encode())
    h.update(" ".join(_command("cc", isa, Path("lib"), form=form)).encode())
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    h.update(ver.encode())
    return h.hexdigest()[:16]


def compile_sources(isa: str, csrc: Path, out: Path, form: str | None = None) -> Path:
    """Compile every ``*.c`` of ``csrc`` (another revision's kernel sources, for A/B benchmarks)
    into ``out`` with this module's flags (``form``: :func:`act_form_flags`), uncached. Raises
    :class:`OpError` as :func:`compile_library` does."""
    cc = compiler()
    if cc is None or isa not in ISAS:
        raise OpError(f"cannot compile the host CPU kernels for {isa!r}: no C compiler, or an unknown ISA")
    sources = tuple(sorted(p.name for p in csrc.glob("*.c")))
    r = subprocess.run(_command(cc, isa, out, csrc, sources, form), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise OpError(f"compiling the host CPU kernels of {csrc} for {isa} failed:\n{r.stderr[-4000:]}")
    return out


def compile_library(isa: str, cache_dir: Path | None = None, form: str | None = None) -> Path:
    """The library for ``isa`` (compiled on first use, then cached) holding ``levels: 2`` in
    ``form`` (default the ISA's, :data:`.isa.ACT_FORM`). Raises :class:`OpError` when there is no
    C compiler, the ISA or form is unknown, or compilation fails (with its output)."""
    if isa not in ISAS:
        raise OpError(f"cpu ISA {isa!r}: expected one of {', '.join(ISAS)}")
    cc = compiler()
    if cc is None:
        raise OpError(
            f"no C compiler ({os.environ.get('CC', 'cc')}) to build the host CPU kernels. "
            "Fix: install gcc (apt install gcc), or set engine.cpu_backend: ort in the recipe."
        )
    root = cache_dir or Path(os.environ.get("TRTPIPE_CACHE", Path.home() / ".cache" / "trtpipe")) / "cpu-kernels"
    lib = root / f"{isa}-{build_key(isa, cc, form)}" / LIBRARY_NAME
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        out = Path(tmp) / LIBRARY_NAME
        r = subprocess.run(_command(cc, isa, out, form=form), capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise OpError(f"compiling the host CPU kernels for {isa} failed:\n{r.stderr[-4000:]}")
        os.replace(out, lib)  # atomic: a concurrent build sees the whole file or none
    return lib


def sources_hash() -> str:
    """Hash of the kernel sources alone (enters the build's inputs hash)."""
    h = hashlib.sha256()
    for s in (*SOURCES, *HEADERS):
        h.update((CSRC / s).read_bytes())
    return h.hexdigest()[:16]
