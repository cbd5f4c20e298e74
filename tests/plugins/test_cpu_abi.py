"""The host CPU kernels' ABI from its one description (plugins/cpu/abi.py reads csrc/tp.h): the
structs ctypes builds have the sizes the compiled library reports, and a library of another ABI
(no version symbol, another version, a struct of another size) is refused at load, by the engine
with the rebuild command."""

from __future__ import annotations

import ctypes as C
import json
import subprocess
from pathlib import Path

import pytest

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.cpu import abi as A
from trtpipe.plugins.cpu import library
from trtpipe.plugins.cpu.compile import compile_library, compiler
from trtpipe.plugins.cpu.isa import host_isa

needs_cc = pytest.mark.skipif(host_isa() is None or compiler() is None, reason="needs x86-64 AVX2 and a C compiler")


def test_the_header_reader_takes_each_construct(tmp_path):
    """Multi-name and const pointer fields, nested structs, an opaque handle, enums, defines,
    multi-line prototypes, and helpers defined in the header (skipped), against hand-built ctypes."""
    h = tmp_path / "t.h"
    h.write_text(
        "#define TP_ABI_VERSION 7\n#define TP_X 3 /* c */\n"
        "enum { TP_A = 1, TP_B = -2 };\n"
        "typedef struct tp_ws tp_ws;\n"
        "typedef struct {\n  int a, b; /* two */\n  const float *p, *q;\n  uint16_t *h;\n} tp_in;\n"
        "typedef struct {\n  tp_in in;\n  const tp_in *ins; // many\n  void *raw;\n  float s;\n} tp_out;\n"
        "static inline size_t tp_helper(int d) { return d ? 4 : 2; }\n"
        "int tp_run(const tp_out *o, tp_ws *ws,\n           int n, float *y);\nconst char *tp_name(void);\n"
    )
    a = A.abi(h)
    assert a.version == 7 and a.constants == {"TP_ABI_VERSION": 7, "TP_X": 3, "TP_A": 1, "TP_B": -2}

    class In(C.Structure):
        _fields_ = [("a", C.c_int), ("b", C.c_int), ("p", C.POINTER(C.c_float)), ("q", C.POINTER(C.c_float)),
                    ("h", C.POINTER(C.c_uint16))]  # fmt: skip

    class Out(C.Structure):
        _fields_ = [("in", In), ("ins", C.POINTER(In)), ("raw", C.c_void_p), ("s", C.c_float)]

    got_in, got_out = a.structs["tp_in"], a.structs["tp_out"]
    assert [(n, C.sizeof(t)) for n, t in got_in._fields_] == [(n, C.sizeof(t)) for n, t in In._fields_]
    assert (C.sizeof(got_in), C.sizeof(got_out)) == (C.sizeof(In), C.sizeof(Out)) == (32, 56)
    assert [n for n, _ in got_out._fields_] == ["in", "ins", "raw", "s"]
    restype, args = a.functions["tp_run"]
    assert restype is C.c_int and args[1:] == [C.c_void_p, C.c_int, C.POINTER(C.c_float)]
    assert args[0]._type_ is got_out
    assert a.functions["tp_name"] == (C.c_char_p, [])
    assert "tp_helper" not in a.functions


@needs_cc
def test_the_library_reports_the_header_s_version_and_struct_sizes(tmp_path):
    lib = library.load(compile_library(host_isa(), tmp_path))  # check_library ran: the sizes agree
    a = A.abi()
    assert lib.tp_abi_version() == a.version == a.constants["TP_ABI_VERSION"]
    sizes = {n: lib.tp_struct_size(n.encode()) for n in a.structs}
    assert sizes == {n: C.sizeof(s) for n, s in a.structs.items()}
    # tp_weight: 3 ints (+pad), 3 pointers, an int (+pad), 2 pointers; tp_kv: an int (+pad), 4 pointers
    assert sizes["tp_weight"] == 64 and sizes["tp_kv"] == 40
    assert lib.tp_struct_size(b"tp_nothing") == 0


def _fake_library(tmp_path: Path, body: str) -> Path:
    src, out = tmp_path / "fake.c", tmp_path / "libfake.so"
    src.write_text("#include <stddef.h>\n#include <string.h>\n" + body)
    subprocess.run([compiler(), "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


@needs_cc
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("int tp_isa_like(void) { return 0; }\n", "predate the versioned ABI"),
        ("int tp_abi_version(void) { return 1; }\n", r"are ABI 1; this trtpipe reads ABI \d+"),
        ("int tp_abi_version(void) { return %d; }\nsize_t tp_struct_size(const char *n) { return 8; }\n",
         r"sizeof\(tp_\w+\) is 8 bytes, tp.h reads \d+"),
    ],
)  # fmt: skip
def test_a_library_of_another_abi_is_refused(tmp_path, body, message):
    lib = _fake_library(tmp_path, body.replace("%d", str(A.abi().version)))
    with pytest.raises(OpError, match=message):
        library.load(lib)


@needs_cc
def test_the_engine_refuses_an_artifact_library_of_another_abi_with_the_rebuild_command(default_artifact, tmp_path):
    import hashlib

    from trtpipe.runtime.errors import ArtifactError
    from trtpipe.runtime.llm import LLM

    art = tmp_path / "art"
    art.mkdir()
    for f in default_artifact.iterdir():
        if f.is_file() and f.name not in ("manifest.json", "libtrtpipe_cpu.so"):
            (art / f.name).symlink_to(f)
    fake = _fake_library(tmp_path, "int tp_abi_version(void) { return 1; }\n")
    (art / "libtrtpipe_cpu.so").write_bytes(fake.read_bytes())
    m = json.loads((default_artifact / "manifest.json").read_text())
    m["files"]["libtrtpipe_cpu.so"] = hashlib.sha256(fake.read_bytes()).hexdigest()
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"are ABI 1; .*Fix: `trtpipe build smollm2-135m-cpu[^`]*--force`"):
        LLM(art, engine="native")
