"""The host CPU kernels' C ABI, read from its one description, ``csrc/tp.h``: the structs as
ctypes Structures, the enums and ``#define`` integers as constants, the prototypes as
``(restype, argtypes)``. A change to a struct or a signature is made in tp.h alone; the library
reports ``tp_abi_version()`` and ``tp_struct_size(name)``, and :func:`check_library` refuses one
whose ABI is not this header's.

The reader takes the subset of C that tp.h is written in (checked by tests/plugins/test_cpu_abi.py):
``typedef struct { <type> <name>[, <name>]*; ... } <name>;`` with scalar, pointer and struct
fields; ``typedef struct X X;`` (opaque: ``void *``); ``enum { NAME = <int>, ... };``;
``#define NAME <int>``; prototypes ``<type> tp_<name>(<type> <name>, ...);``. Parsing tp.h takes
~1 ms, once per process.
"""

from __future__ import annotations

import ctypes as C
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from trtpipe.plugins.core.errors import OpError

HEADER = Path(__file__).with_name("csrc") / "tp.h"

_SCALARS: dict[str, type] = {
    "int": C.c_int, "float": C.c_float, "double": C.c_double, "size_t": C.c_size_t, "char": C.c_char,
    "int8_t": C.c_int8, "uint8_t": C.c_uint8, "int16_t": C.c_int16, "uint16_t": C.c_uint16,
    "int32_t": C.c_int32, "uint32_t": C.c_uint32, "int64_t": C.c_int64, "uint64_t": C.c_uint64,
}  # fmt: skip


@dataclass(frozen=True)
class Abi:
    """tp.h as ctypes: ``version`` (TP_ABI_VERSION), ``structs`` by typedef name, ``constants``
    (enums and integer defines), ``functions`` name -> (restype or None, [argtypes])."""

    version: int
    structs: dict[str, type[C.Structure]]
    constants: dict[str, int]
    functions: dict[str, tuple[object, list[object]]]


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def _ctype(base: str, stars: int, structs: dict[str, type[C.Structure]], opaque: set[str]) -> object:
    """The ctypes type of ``base`` with ``stars`` pointer levels; OpError for a type it cannot read."""
    if base == "void":
        if stars == 0:
            return None
        return C.c_void_p if stars == 1 else C.POINTER(C.c_void_p)
    if base in opaque:
        if stars == 0:
            raise OpError(f"tp.h: the opaque type {base} is only usable through a pointer")
        return C.c_void_p
    if base == "char" and stars == 1:
        return C.c_char_p
    t: type | None = _SCALARS.get(base) or structs.get(base)
    if t is None:
        raise OpError(f"tp.h: unknown type {base!r}. Fix: add it to plugins/cpu/abi.py's scalar table")
    for _ in range(stars):
        t = C.POINTER(t)
    return t


def _declarators(decl: str) -> tuple[str, list[tuple[int, str]]]:
    """``const float *a, *b`` -> ("float", [(1, "a"), (1, "b")])."""
    decl = re.sub(r"\bconst\b", " ", decl).strip()
    m = re.match(r"(?:struct\s+)?(\w+)\s*(.*)$", decl, flags=re.S)
    if m is None:
        raise OpError(f"tp.h: cannot read the declaration {decl!r}")
    names = []
    for part in m.group(2).split(","):
        part = part.strip()
        stars = part.count("*")
        names.append((stars, part.replace("*", "").strip()))
    return m.group(1), names


def _structs(text: str, opaque: set[str]) -> dict[str, type[C.Structure]]:
    structs: dict[str, type[C.Structure]] = {}
    for body, name in re.findall(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        fields: list[tuple[str, object]] = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            base, names = _declarators(decl)
            fields += [(n, _ctype(base, stars, structs, opaque)) for stars, n in names]
        structs[name] = type(name, (C.Structure,), {"_fields_": fields})
    return structs


def _constants(text: str) -> dict[str, int]:
    out = {k: int(v, 0) for k, v in re.findall(r"#define\s+(TP_\w+)\s+(-?\w+)\b", text) if re.fullmatch(r"-?\d+", v)}
    for body in re.findall(r"\benum\s*\{(.*?)\}\s*;", text, flags=re.S):
        for k, v in re.findall(r"(\w+)\s*=\s*(-?\d+)", body):
            out[k] = int(v)
    return out


def _functions(text: str, structs: dict[str, type[C.Structure]], opaque: set[str]) -> dict[str, tuple[object, list]]:
    out: dict[str, tuple[object, list]] = {}
    for ret, name, params in re.findall(r"^\s*((?:const\s+)?\w+\s*\**)\s*(tp_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.M):
        base, ((stars, _),) = _declarators(ret + " x")
        args = []
        if params.strip() != "void":
            for p in params.split(","):
                pbase, ((pstars, _),) = _declarators(p)
                args.append(_ctype(pbase, pstars, structs, opaque))
        out[name] = (_ctype(base, stars, structs, opaque), args)
    return out


@cache
def abi(header: Path = HEADER) -> Abi:
    """tp.h read into an :class:`Abi`. Raises :class:`OpError` for a construct it cannot read."""
    text = _strip_comments(header.read_text(encoding="utf-8"))
    text = re.sub(r"static\s+inline[^{]*\{[^}]*\}", " ", text)  # helpers defined in the header
    opaque = set(re.findall(r"typedef\s+struct\s+(\w+)\s+\1\s*;", text))
    structs = _structs(text, opaque)
    constants = _constants(text)
    return Abi(constants["TP_ABI_VERSION"], structs, constants, _functions(text, structs, opaque))


def check_library(lib: C.CDLL, path: str | Path, header: Path = HEADER) -> None:
    """Refuse a library whose ABI is not ``header``'s: no ``tp_abi_version`` (built before the
    ABI was versioned), another version, or a struct of another size. Raises :class:`OpError`
    naming what differs."""
    a = abi(header)
    if not hasattr(lib, "tp_abi_version"):
        raise OpError(f"the host CPU kernels {path} predate the versioned ABI (this trtpipe reads ABI {a.version})")
    lib.tp_abi_version.restype = C.c_int
    version = int(lib.tp_abi_version())
    if version != a.version:
        raise OpError(f"the host CPU kernels {path} are ABI {version}; this trtpipe reads ABI {a.version}")
    lib.tp_struct_size.restype, lib.tp_struct_size.argtypes = C.c_size_t, [C.c_char_p]
    for name, struct in a.structs.items():
        size = int(lib.tp_struct_size(name.encode()))
        if size != C.sizeof(struct):
            raise OpError(f"the host CPU kernels {path}: sizeof({name}) is {size} bytes, tp.h reads {C.sizeof(struct)}")


def bind(lib: C.CDLL) -> None:
    """Type every ``tp_*`` entry point of tp.h that ``lib`` exports (restype, argtypes)."""
    for name, (restype, argtypes) in abi().functions.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
