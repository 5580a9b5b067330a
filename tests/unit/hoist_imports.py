"""Move the imports inside functions that the import rule forbids to the top of their module (the rule's fixer).

    python tests/unit/hoist_imports.py $(git ls-files 'qserve/*.py' 'exporters/*.py' 'benchmarks/*.py')
    ruff format . && ruff check --fix .      # then: the import order and the layout of what moved

The rule (tests/unit/test_imports.py, ruff's PLC0415): an import inside a function names a LAZY library or a
LAZY_OWN module; ruff finds the others but cannot move them. This moves each to the top of its module (after the
module's last top-level import) and deletes it where it was. A file it cannot change safely is left as it is and
named with the reason (an import that would empty its block, a name bound otherwise at the top, one name imported
two ways): move those by hand. Read the diff: an import may sit in a function on purpose, to run after something
else (an environment variable set first); the rule then wants a reason that belongs in LAZY.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from test_imports import LAZY, LAZY_OWN

STDLIB = set(sys.stdlib_module_names)
FIRST_PARTY = {"qserve", "exporters", "benchmarks"}
Import = ast.Import | ast.ImportFrom


def lazy(node: Import) -> bool:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level:
        return False
    else:
        names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
    return any(n.split(".")[0] in LAZY or any(n == m or n.startswith(m + ".") for m in LAZY_OWN) for n in names)


def section(node: Import) -> int:
    """isort's sections: __future__, the standard library, third party, first party."""
    top = (node.names[0].name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
    return 0 if top == "__future__" else 1 if top in STDLIB else 3 if top in FIRST_PARTY else 2


def bindings(node: Import) -> dict[str, str]:
    """Each name the import binds -> the one-name import statement that binds it."""
    if isinstance(node, ast.Import):
        return {(a.asname or a.name.split(".")[0]): ast.unparse(ast.Import(names=[a])) for a in node.names}
    return {
        (a.asname or a.name): ast.unparse(ast.ImportFrom(module=node.module, names=[a], level=0)) for a in node.names
    }


def strays(tree: ast.Module) -> list[tuple[Import, list[ast.stmt]]]:
    """(import, the statement list holding it) for every forbidden import inside a function, once each."""
    out: dict[int, tuple[Import, list[ast.stmt]]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for owner in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(owner, field, None)
                if isinstance(block, list):
                    for st in block:
                        if isinstance(st, (ast.Import, ast.ImportFrom)) and not lazy(st):
                            out[id(st)] = (st, block)
    return list(out.values())


def hoist(path: Path) -> str:
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines(keepends=True)
    tree = ast.parse(src)
    found = strays(tree)
    if not found:
        return ""
    at_top: dict[str, str] = {}
    other: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            at_top.update(bindings(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
        elif isinstance(node, ast.Assign):
            other |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    problems, new, drop = [], {}, set()
    for node, block in found:
        if all(isinstance(st, (ast.Import, ast.ImportFrom)) and not lazy(st) for st in block):
            problems.append(f"line {node.lineno}: its block would be empty")
        for name, text in bindings(node).items():
            if at_top.get(name, text) != text or name in other:
                problems.append(f"line {node.lineno}: {name} is bound otherwise at the top")
            elif new.get(name, (text,))[0] != text:
                problems.append(f"line {node.lineno}: {name} is imported two ways")
            elif name not in at_top:
                new[name] = (text, section(node))
        if not lines[node.lineno - 1].lstrip().startswith(("import ", "from ")):
            problems.append(f"line {node.lineno}: the import shares its line")
        drop |= set(range(node.lineno - 1, (node.end_lineno or node.lineno)))
    if problems:
        return f"{path}: left as it is: " + "; ".join(problems)
    for i in sorted(drop):  # a blank line left after the def, its docstring or another blank line goes too
        j, k = i + 1, i - 1
        while j in drop:
            j += 1
        while k in drop:
            k -= 1
        prev = lines[k].rstrip() if k >= 0 else ""
        if j < len(lines) and not lines[j].strip() and (not prev.strip() or prev.endswith(('"' * 3, "'" * 3, ":"))):
            drop.add(j)
    kept = [line for i, line in enumerate(lines) if i not in drop]
    body = ast.parse("".join(kept)).body
    tops = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    docstring = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    after = max((n.end_lineno or n.lineno) for n in tops) if tops else (body[0].end_lineno or 0) if docstring else 0
    added = [text + "\n" for text, _ in sorted(new.values(), key=lambda v: (v[1], v[0]))]
    path.write_text("".join(kept[:after] + added + kept[after:]), encoding="utf-8")
    return f"{path}: {len(found)} moved to the top"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if said := hoist(Path(arg)):
            print(said)
