"""crnet's layout, read from the source (pure: nothing of crnet is imported or run).

- Imports go one way: no circle among crnet's modules. Every import counts: type-only ones
  (under ``if TYPE_CHECKING:``), ones inside functions, relative ones (resolved to absolute
  names). A package's ``__init__`` is a module of its own; ``from pkg import name`` imports
  the submodule ``pkg.name`` when there is one (else ``pkg`` itself), and ``import a.b.c``
  also runs the ``__init__`` of each package on the way that the importer is not inside.
- No module uses another module's underscore names: ``from x import _y``, or ``x._y`` where
  ``x`` names an imported crnet module (attributes of other objects are not checked).
  Dunder names are public. A private submodule (``crnet.coding._core``, the Cython kernels) belongs
  to its package: the modules inside that package may import it, no one else.
- docs/development.md's layout names every module, where ``tree`` would draw it (a new one is
  described where maintainers look), and no module that is gone.

Modules are split by concept, not by length: no line cap.

``.pyx`` files are not Python: their ``import``/``from ... import`` statements (not
``cimport``) are read line by line for the first check; their attribute uses are not.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from ..helpers import REPO

SRC = REPO / "crnet"
DEVELOPMENT = REPO / "docs" / "development.md"


@dataclass(frozen=True)
class Module:
    name: str          # dotted, e.g. crnet.node.engine; a package's __init__ is the package
    path: Path
    is_package: bool
    file: str          # the path from the package's parent, e.g. crnet/node/engine.py

    @property
    def package(self) -> str:
        """The package a relative import with one dot starts from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def inside(self, package: str) -> bool:
        """This module is ``package`` or in it."""
        return self.name == package or self.name.startswith(package + ".")


def find_modules(src: Path) -> dict[str, Module]:
    """Every module under ``src`` (a package directory), by dotted name."""
    found = {}
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        parts = path.relative_to(src.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        found[name] = Module(name, path, is_package, str(path.relative_to(src.parent)))
    return found


_PYX_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]|import[ \t])")


@functools.cache   # each check reads the same source
def parse(module: Module) -> ast.Module:
    text = module.path.read_text()
    if module.path.suffix == ".py":
        return ast.parse(text, str(module.path))
    # Cython: only its Python import statements (one line, or parenthesized over several).
    statements, lines = [], iter(text.splitlines())
    for line in lines:
        if not _PYX_IMPORT.match(line) or " cimport " in line:
            continue
        statement = line.strip()
        while statement.count("(") > statement.count(")"):
            statement += " " + next(lines).strip()
        statements.append(statement)
    return ast.parse("\n".join(statements), str(module.path))


def resolve(importer: Module, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from ... import`` takes names from."""
    if node.level == 0:
        return node.module or ""
    parts = importer.package.split(".")
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Use:
    """One import of a crnet module, or one use of an underscore name."""

    module: str        # the importer
    target: str        # the module imported, or ``owner.name`` of an underscore name
    line: int
    where: str         # "" (top level), "type-only" or "in a function"

    def at(self, modules: dict[str, Module]) -> str:
        return f"{modules[self.module].file}:{self.line}" + (f" ({self.where})" if self.where else "")


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every node, with where it is: in an ``if TYPE_CHECKING:`` block, in a function, or ""."""
    todo: deque[tuple[ast.AST, str]] = deque([(tree, "")])
    while todo:
        node, where = todo.popleft()
        yield node, where
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend((child, where or "type-only") for child in node.body)
            todo.extend((child, where) for child in node.orelse)
            continue
        inner = "in a function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
        todo.extend((child, where or inner) for child in ast.iter_child_nodes(node))


def _type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (also within a larger condition)."""
    return any((isinstance(n, ast.Name) and n.id == "TYPE_CHECKING")
               or (isinstance(n, ast.Attribute) and n.attr == "TYPE_CHECKING") for n in ast.walk(test))


def _imported(importer: Module, node: ast.Import | ast.ImportFrom,
              modules: dict[str, Module]) -> list[str]:
    """The crnet modules an import statement names (before the packages on the way)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = resolve(importer, node)
    subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
    return subs + ([base] if len(subs) < len(node.names) else [])


def imports(importer: Module, tree: ast.AST, modules: dict[str, Module]) -> list[Use]:
    """What the module imports of crnet: each named module, and the packages on the way to
    it that the importer is not inside (their ``__init__`` runs for it too)."""
    found = []
    for node, where in _walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for name in _imported(importer, node, modules):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target not in modules or target == importer.name:
                    continue
                if target == name or not importer.inside(target):
                    found.append(Use(importer.name, target, node.lineno, where))
    return found


def _private_use(importer: Module, owner: str, name: str, modules: dict[str, Module]) -> bool:
    """Whether ``importer`` using ``owner.name`` uses another module's underscore name."""
    if not is_private(name) or owner == importer.name:
        return False
    if f"{owner}.{name}" in modules:    # a private submodule: its own package's to use
        return not importer.inside(owner)
    return True


def underscore_uses(importer: Module, tree: ast.AST, modules: dict[str, Module]) -> list[Use]:
    found = []
    bound: dict[str, str] = {}    # a name in the importer -> the crnet module it is bound to
    for node, where in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for i in range(1, len(parts)):
                    if _private_use(importer, ".".join(parts[:i]), parts[i], modules):
                        found.append(Use(importer.name, alias.name, node.lineno, where))
                if alias.name in modules:
                    bound[alias.asname or parts[0]] = alias.name if alias.asname else parts[0]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(importer, node)
            if base.split(".")[0] not in {m.split(".")[0] for m in modules}:
                continue
            parts = base.split(".")
            for i in range(1, len(parts)):
                if _private_use(importer, ".".join(parts[:i]), parts[i], modules):
                    found.append(Use(importer.name, base, node.lineno, where))
            for alias in node.names:
                if _private_use(importer, base, alias.name, modules):
                    found.append(Use(importer.name, f"{base}.{alias.name}", node.lineno, where))
                if f"{base}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node, where in _walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = _module_of(node.value, bound, modules)
        if owner is not None and _private_use(importer, owner, node.attr, modules):
            found.append(Use(importer.name, f"{owner}.{node.attr}", node.lineno, where))
    return found


def _module_of(node: ast.expr, bound: dict[str, str], modules: dict[str, Module]) -> str | None:
    """The crnet module an expression like ``x`` or ``x.y.z`` names, or None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _module_of(node.value, bound, modules)
        if owner is not None and f"{owner}.{node.attr}" in modules:
            return f"{owner}.{node.attr}"
    return None


def import_graph(src: Path) -> tuple[dict[str, Module], dict[str, dict[str, Use]]]:
    """The modules, and for each its imports of other crnet modules (the first of each)."""
    modules = find_modules(src)
    graph: dict[str, dict[str, Use]] = {}
    for module in modules.values():
        edges = graph[module.name] = {}
        for use in imports(module, parse(module), modules):
            edges.setdefault(use.target, use)
    return modules, graph


def cycles(graph: dict[str, dict[str, Use]]) -> list[list[str]]:
    """Circles of imports: for each module on one, the shortest circle through it
    (deduplicated), as [a, b, ..., a]."""
    found = set()
    for start in sorted(graph):
        came_from: dict[str, str] = {}
        todo = deque([start])
        while todo:
            node = todo.popleft()
            if start in graph[node]:
                chain = [node]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                chain.reverse()
                i = chain.index(min(chain))          # one rotation per circle
                found.add(tuple(chain[i:] + chain[:i]))
                break
            for nxt in sorted(graph[node]):
                if nxt not in came_from and nxt != start:
                    came_from[nxt] = node
                    todo.append(nxt)
    return [list(c) + [c[0]] for c in sorted(found, key=lambda c: (len(c), c))]


def describe(chain: list[str], graph: dict[str, dict[str, Use]], modules: dict[str, Module]) -> str:
    edges = "; ".join(f"{a} -> {b} at {graph[a][b].at(modules)}" for a, b in pairwise(chain))
    return f"{' -> '.join(chain)}\n    ({edges})"


# ------------------------------------------------------------------ crnet itself

def test_no_import_circle_in_crnet():
    modules, graph = import_graph(SRC)
    circles = cycles(graph)
    assert not circles, "import circles:\n" + "\n".join(describe(c, graph, modules) for c in circles)


def test_the_daemon_imports_nothing_of_the_tools():
    """crnetd (``crnet.node`` and all it imports, at any depth) has no use for what runs
    trees from outside, ``crnet status``'s client among them: ``crnetd --plan auto`` ranks
    with the pure half of ``crnet tune`` (``crnet.tune.tuning``), not with ``crnet.tune.gather``."""
    modules, graph = import_graph(SRC)
    came_from: dict[str, str] = {}
    todo = deque(["crnet.node"])
    while todo:
        module = todo.popleft()
        for target in sorted(graph[module]):
            if target not in came_from:
                came_from[target] = module
                todo.append(target)
    tools = sorted(m for m in came_from if m == "crnet.tools" or m.startswith("crnet.tools."))
    chains = []
    for target in tools:
        chain = [target]
        while chain[-1] != "crnet.node":
            chain.append(came_from[chain[-1]])
        chains.append(describe(chain[::-1], graph, modules))
    assert not tools, "crnet.node imports the tools:\n" + "\n".join(chains)


def test_no_module_uses_another_modules_underscore_names():
    modules = find_modules(SRC)
    uses = [use for m in modules.values() for use in underscore_uses(m, parse(m), modules)]
    assert not uses, "underscore names of other modules:\n" + "\n".join(
        f"{use.at(modules)}: {use.target}" for use in uses)


def layout_paths(text: str) -> set[str]:
    """The paths docs/development.md's layout block names, read as ``tree`` draws them: a
    line's first words (``a.py``, ``b.py`` or a folder ``x/``) are entries of the folder the
    nearest less indented folder line names; the rest of the line, and lines that start
    with anything else, are descriptions."""
    block = text[text.index("```\ncrnet/"):]
    block = block[4:block.index("\n```", 4)]
    paths: set[str] = set()
    folders: list[tuple[int, str]] = []      # (indent, path) of the enclosing folders
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names = [n for n in re.split(r",\s*", head) if n]
        if not names or not all(n.endswith((".py", ".pyx", "/")) for n in names):
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        base = folders[-1][1] if folders else ""
        for name in names:
            paths.add(base + name)
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, base + names[0]))
    return paths


def test_development_md_names_every_module():
    """Every module of crnet/ is in docs/development.md's layout, where ``tree`` would draw
    it (a package's ``__init__.py`` by its folder's line or its own), and nothing more."""
    named = layout_paths(DEVELOPMENT.read_text())
    modules = {m.file for m in find_modules(SRC).values()}
    folders = {str(Path(f).parent) + "/" for f in modules if f.endswith("/__init__.py")}
    missing = sorted(f for f in modules if f not in named
                     and not (f.endswith("/__init__.py") and str(Path(f).parent) + "/" in named))
    gone = sorted(p for p in named if p.startswith("crnet/") and p not in modules and p not in folders)
    assert not missing, "modules docs/development.md does not name:\n" + "\n".join(missing)
    assert not gone, "docs/development.md names what crnet/ does not have:\n" + "\n".join(gone)


def test_the_layout_is_read_as_tree_draws_it():
    text = ("```\ncrnet/   the package\n  a.py   one\n  sub/   a folder\n    b.py, c.py  two\n"
            "           a description that wraps\n  d.pyx  three\nother/\n  e.py\n```\n")
    assert layout_paths(text) == {"crnet/", "crnet/a.py", "crnet/sub/", "crnet/sub/b.py", "crnet/sub/c.py",
                                  "crnet/d.pyx", "other/", "other/e.py"}


# ------------------------------------------------------------------ the checks themselves

@pytest.fixture
def pkg(tmp_path):
    """``pkg({"a.py": source, "sub/__init__.py": ..., ...})``: a package ``p`` of these
    files; returns its modules and import graph."""
    def make(files: dict[str, str]):
        root = tmp_path / "p"
        for rel, text in {"__init__.py": "", **files}.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return import_graph(root)
    return make


def test_every_kind_of_import_is_an_edge(pkg):
    _, graph = pkg({
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "b.py": "def f():\n    import p.sub.c\n",
        "sub/__init__.py": "from . import c\n",
        "sub/c.py": "from .. import a, d\nfrom ..e import x\n",
        "d.py": "", "e.py": "",
        "f.pyx": "from libc.string cimport memcpy\nfrom .e import (\n    x,\n    y)\nimport numpy\n",
    })
    assert set(graph["p.a"]) == {"p.b"} and graph["p.a"]["p.b"].where == "type-only"
    assert set(graph["p.b"]) == {"p.sub", "p.sub.c"}   # the package's __init__ runs too
    assert graph["p.b"]["p.sub.c"].where == "in a function"
    assert set(graph["p.sub"]) == {"p.sub.c"}
    assert set(graph["p.sub.c"]) == {"p.a", "p.d", "p.e"}   # submodules, not the package p
    assert set(graph["p.f"]) == {"p.e"}
    assert set(graph["p"]) == set()


def test_a_name_taken_from_a_package_imports_its_init(pkg):
    _, graph = pkg({"__init__.py": "from .a import A\n", "a.py": "from p import VERSION\n"})
    assert cycles(graph) == [["p", "p.a", "p"]]


def test_circles_are_listed_once_each_as_chains(pkg):
    modules, graph = pkg({
        "a.py": "from . import b\n",
        "b.py": "from . import c\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
        "d.py": "import p.e\n", "e.py": "import p.d\n", "f.py": "from . import a\n",
    })
    assert cycles(graph) == [["p.d", "p.e", "p.d"], ["p.a", "p.b", "p.c", "p.a"]]
    assert "p/c.py:3 (type-only)" in describe(cycles(graph)[1], graph, modules)


def test_underscore_names_of_other_modules_are_found(pkg):
    modules, _ = pkg({
        "a.py": ("from . import b\nfrom .b import _hidden, __version__, shown\nimport p.sub.c as c\n"
                 "import p.sub.c\nx = b._state, b.__doc__, c._f(), p.sub.c._g, _own\n"
                 "_own = 1\nobj = object()\nobj._attr\nfrom . import _core\n"),
        "b.py": "", "_core.py": "", "sub/__init__.py": "", "sub/c.py": "from .. import _core\n",
        "sub/d.py": "from p.a import _own\n",
    })
    found = {m: sorted(u.target for u in underscore_uses(modules[m], parse(modules[m]), modules))
             for m in ("p.a", "p.sub.c", "p.sub.d")}
    assert found == {"p.a": ["p.b._hidden", "p.b._state", "p.sub.c._f", "p.sub.c._g"],
                     "p.sub.c": [],                     # p's private submodule, used inside p
                     "p.sub.d": ["p.a._own"]}
