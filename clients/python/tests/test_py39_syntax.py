"""Every file of the package (and its tests and examples) is Python 3.9.

``ast.parse(..., feature_version=(3, 9))`` refuses the newer grammar it knows (``match``,
``except*``); what it lets through is checked here by hand: ``X | Y`` types outside
annotations (every module has ``from __future__ import annotations``, so annotations are
never evaluated), parenthesized context managers, and library names added after 3.9.

Also a script: ``python tests/test_py39_syntax.py`` prints the offences and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(
    p for d in ("src", "tests", "examples") for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts
)

NEWER_TYPING = {"TypeAlias", "ParamSpec", "Concatenate", "TypeGuard", "Self", "Never", "LiteralString",
                "Required", "NotRequired", "Unpack", "TypeVarTuple", "assert_never", "reveal_type", "override"}
NEWER_MODULES = {"tomllib"}
NEWER_ATTRS = {("asyncio", "timeout"), ("asyncio", "TaskGroup"), ("asyncio", "Runner"), ("typing", "TypeAlias")}
NEWER_BUILTINS = {"aiter", "anext", "ExceptionGroup", "BaseExceptionGroup", "EncodingWarning"}
TYPE_NAMES = {"int", "str", "float", "bytes", "bool", "list", "dict", "tuple", "set", "type", "object"}


def _annotation_nodes(tree: ast.AST) -> set:
    inside = set()
    for node in ast.walk(tree):
        anns: List[ast.AST] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None and a.annotation is not None:
                    anns.append(a.annotation)
            if node.returns is not None:
                anns.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        for a in anns:
            inside.update(id(n) for n in ast.walk(a))
    return inside


def offences(path: Path) -> List[str]:
    source = path.read_text(encoding="utf-8")
    name = str(path.relative_to(ROOT)) if ROOT in path.parents else path.name
    try:
        tree = ast.parse(source, filename=name, feature_version=(3, 9))
    except SyntaxError as e:
        return ["%s:%s: not Python 3.9: %s" % (name, e.lineno, e.msg)]
    out: List[str] = []
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    has_future = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
        for n in body[:3]
    )
    if body and not has_future:
        out.append("%s: no `from __future__ import annotations`" % name)
    annotations = _annotation_nodes(tree)
    lines = source.splitlines()
    for node in ast.walk(tree):
        where = "%s:%s" % (name, getattr(node, "lineno", "?"))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in annotations:
            for side in (node.left, node.right):
                if (isinstance(side, ast.Constant) and side.value is None) or (
                    isinstance(side, ast.Name) and side.id in TYPE_NAMES
                ):
                    out.append("%s: `X | Y` type evaluated at run time (use typing.Union)" % where)
        elif isinstance(node, (ast.With, ast.AsyncWith)) and len(node.items) > 1:
            text = lines[node.lineno - 1].strip()
            if text.startswith(("with (", "async with (")):
                out.append("%s: parenthesized context managers are Python 3.10" % where)
        elif isinstance(node, ast.ImportFrom) and node.module == "typing":
            for a in node.names:
                if a.name in NEWER_TYPING:
                    out.append("%s: typing.%s is newer than 3.9" % (where, a.name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                if m.split(".")[0] in NEWER_MODULES:
                    out.append("%s: module %s is newer than 3.9" % (where, m))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in NEWER_ATTRS:
                out.append("%s: %s.%s is newer than 3.9" % (where, node.value.id, node.attr))
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            out.append("%s: %s is newer than 3.9" % (where, node.id))
        elif isinstance(node, ast.Call):
            fn = node.func
            fname = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            kws = {k.arg for k in node.keywords}
            if fname == "zip" and "strict" in kws:
                out.append("%s: zip(strict=) is Python 3.10" % where)
            if fname == "dataclass" and kws & {"slots", "kw_only", "match_args"}:
                out.append("%s: dataclass(%s) is Python 3.10" % (where, ", ".join(sorted(kws))))
    return out


def test_the_files_are_found() -> None:
    names = {p.name for p in FILES}
    assert {"__init__.py", "client.py", "aio.py", "_codec.py", "rag_loop.py"} <= names


def test_every_file_is_python_3_9() -> None:
    problems = [o for p in FILES for o in offences(p)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    samples = {
        "match x:\n    case 1:\n        pass\n": "not Python 3.9",
        "from __future__ import annotations\nT = int | None\n": "run time",
        "from __future__ import annotations\nwith (a as b, c as d):\n    pass\n": "parenthesized",
        "from __future__ import annotations\nfrom typing import TypeAlias\n": "TypeAlias",
        "from __future__ import annotations\nimport tomllib\n": "tomllib",
        "x = 1\n": "__future__",
    }
    for source, what in samples.items():
        bad.write_text(source)
        found = offences(bad)
        assert any(what in o for o in found), (source, found)
    bad.write_text("from __future__ import annotations\ndef f(x: int | None) -> str | None:\n    return None\n")
    assert offences(bad) == []


if __name__ == "__main__":
    found = [o for p in FILES for o in offences(p)]
    print("\n".join(found) if found else "%d files: Python 3.9 syntax" % len(FILES))
    sys.exit(1 if found else 0)
