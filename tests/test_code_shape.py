"""The code-shape rules of the project, checked on every CI run: no code file over 400 lines and
no function over 60 lines (its docstring not counted) outside tests; a module that outgrows the
limit becomes a subfolder by concept, not a sibling file. No import circle between trtpipe
modules, type-only imports included, and folders ("wings") that import one way.

An exception is stated, with its reason, in the module docstring: "Exception to the 400-line
rule: <why>" for the file, "Exception to the 60-line rule: <why>" naming each function it covers
(e.g. plugins/ops/paged_attention/triton_kernels.py: Triton kernels are single ``@triton.jit`` bodies)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("pipeline", "runtime", "plugins", "bench")
PACKAGE_OF = {"pipeline": "trtpipe.pipeline", "runtime": "trtpipe.runtime", "plugins": "trtpipe.plugins"}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _code_files() -> list[Path]:
    return sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py"))


FILE_RULE, FUNCTION_RULE = "Exception to the 400-line rule", "Exception to the 60-line rule"


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function from its ``def`` to its end, less its docstring."""
    n = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1
    return n


def test_files_and_functions_are_small():
    problems = []
    for path in _code_files():
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        doc = " ".join((ast.get_docstring(tree) or "").split())
        rel = path.relative_to(ROOT)
        n = src.count("\n")
        if n > MAX_FILE_LINES and FILE_RULE not in doc:
            problems.append(f"{rel}: {n} lines > {MAX_FILE_LINES}")
        excused = doc[doc.index(FUNCTION_RULE) :] if FUNCTION_RULE in doc else ""
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = _function_lines(node)
                if length > MAX_FUNCTION_LINES and node.name not in excused:
                    problems.append(f"{rel}:{node.lineno} {node.name}: {length} lines > {MAX_FUNCTION_LINES}")
    assert not problems, (
        "a module over the line limit becomes a folder: split it by concept into a subfolder of the "
        "same name, one module per piece (a sibling file beside it only moves the problem); a "
        f"function over the limit into functions with one job each; or state '{FILE_RULE}: <why>' / "
        f"'{FUNCTION_RULE}: <why>' (naming the function) in the module docstring:\n" + "\n".join(problems)
    )


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [PACKAGE_OF[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    """trtpipe modules imported by ``path`` at module level, in functions or under ``if
    TYPE_CHECKING:`` (absolute and relative)."""
    out = set()
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("trtpipe.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("trtpipe."):
                out.add(name)
                out |= {f"{name}.{a.name}" for a in node.names}
    return out


def test_no_import_circles_between_modules():
    """Import graph of trtpipe modules (imports inside functions count too: a lazy import hides a
    circle, it does not remove it; so do ``if TYPE_CHECKING:`` imports: a type-only circle is the
    same tangle to a reader), re-export ``__init__`` files left out."""
    assert not _cycles(_module_graph()), "import circles:\n" + "\n".join(
        " -> ".join(c) for c in _cycles(_module_graph())
    )


def _wing(module: str) -> str:
    """The folder a module lives in (``trtpipe.runtime.kv.pool`` -> ``trtpipe.runtime.kv``); a
    module at the top of its package is its own wing (``trtpipe.runtime.llm``)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 else module


def test_wings_import_one_way():
    """Folders are floors: no two wings import each other, directly or around a loop (what the
    structure drawing shows as an arrow running back up), type-only imports included."""
    graph: dict[str, set[str]] = {}
    for m, deps in _module_graph().items():
        graph.setdefault(_wing(m), set()).update(_wing(d) for d in deps if _wing(d) != _wing(m))
    cycles = _cycles(graph)
    assert not cycles, "wings that import each other:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _module_graph() -> dict[str, set[str]]:
    files = [p for p in _code_files() if p.parts[len(ROOT.parts)] in PACKAGE_OF and p.name != "__init__.py"]
    modules = {_module_name(p): p for p in files}
    return {m: {i for i in _imports(p, m) if i in modules and i != m} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles


TYPED_PARTS = ("engine", "llm", "scheduler", "speculator")  # the runtime's parts (docs/contracts.md "Engine")


def _untyped_parts(src: str) -> list[tuple[int, str, str]]:
    """(line, parameter, annotation) of every parameter named one of TYPED_PARTS that is annotated
    ``Any`` (alone or inside a union / Optional) or not at all."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = node.args
        for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
            if arg.arg not in TYPED_PARTS or isinstance(node, ast.Lambda):
                continue
            ann = arg.annotation
            names = {n.id for n in ast.walk(ann) if isinstance(n, ast.Name)} if ann is not None else set()
            names |= {n.attr for n in ast.walk(ann) if isinstance(n, ast.Attribute)} if ann is not None else set()
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # "Any" as a string
                names |= {n.id for n in ast.walk(ast.parse(ann.value, mode="eval")) if isinstance(n, ast.Name)}
            if ann is None or "Any" in names:
                out.append((node.lineno, arg.arg, "none" if ann is None else ast.unparse(ann)))
    return out


def test_the_runtime_parts_are_typed_not_any():
    """A parameter named engine, llm, scheduler or speculator in runtime/ names its type (the
    ``Engine`` / ``Speculator`` protocols, ``LLM``, ``Scheduler``; ``if TYPE_CHECKING:`` imports where
    a module would import upward), never ``Any`` or nothing: mypy checks what a part is asked for,
    and a new engine learns what to implement from the protocol, not by grepping for probes."""
    problems = [
        f"{p.relative_to(ROOT)}:{line} {name}: {ann}"
        for p in sorted((ROOT / "runtime").rglob("*.py"))
        for line, name, ann in _untyped_parts(p.read_text(encoding="utf-8"))
    ]
    assert not problems, "parameters of the runtime's parts typed Any or not at all:\n" + "\n".join(problems)


def test_the_untyped_parts_check_finds_any_and_missing_annotations():
    src = (
        "def a(engine: Any, llm, scheduler: 'Any | None', speculator: Speculator | None, other: Any): ...\n"
        "def b(engine: Engine, llm: LLM, scheduler: typing.Any): ...\n"
    )
    assert _untyped_parts(src) == [
        (1, "engine", "Any"),
        (1, "llm", "none"),
        (1, "scheduler", "'Any | None'"),
        (2, "scheduler", "typing.Any"),
    ]
