"""The quick tier stays quick: every fixture or test under tests/ that starts a process or a server is
marked ``proc`` through the one list in tests/conftest.py (``PROC_FIXTURES``, ``PROC_TESTS``).

Read from the source, not run: a function starts something when it calls one of ``STARTS`` (a child
process or a listening server), or calls a function of the test tree that does, or builds an object of a class of it one of whose methods does —
followed through imports between test modules. A fixture built on another fixture needs no entry:
pytest marks every test whose fixture closure holds a listed one. A module marked ``e2e`` as a whole
(``pytestmark``), and a test marked ``e2e``, are out of the quick tier already and need none."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import PROC_FIXTURES, PROC_TESTS, REPO

TESTS = REPO / "tests"

# The calls that start a child process or a server on a socket, by their last name or module.name.
STARTS = {
    "subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "os.fork", "os.system", "os.popen", "os.posix_spawn", "os.spawnv",
    "os.execv", "os.execvp", "multiprocessing.Process", "multiprocessing.Pool", "mp.Process",
    "mp.spawn", "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
    "Popen", "ThreadedMotoServer", "HTTPServer", "ThreadingHTTPServer", "TCPServer",
    "ThreadingTCPServer", "serve_forever", "uvicorn_server", "RuntimeServer", "listen", "create_server",
}  # fmt: skip


def _dotted(node: ast.AST) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def _starts(call: ast.Call) -> str | None:
    names = _dotted(call.func)
    if not names:
        return None
    if names[-1] in STARTS:
        return ".".join(names)
    if len(names) > 1 and ".".join(names[-2:]) in STARTS:
        return ".".join(names)
    return None


def _marks_e2e(node: ast.AST) -> bool:
    return any(_dotted(n)[-2:] == ["mark", "e2e"] for n in ast.walk(node) if isinstance(n, ast.Attribute))


def e2e_module(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and _marks_e2e(node.value)
        for node in tree.body
    )


def fixture_name(node: ast.AST) -> str | None:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if _dotted(target)[-1:] == ["fixture"]:
            for keyword in decorator.keywords if isinstance(decorator, ast.Call) else ():
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
            return node.name
    return None


@dataclass
class Module:
    path: Path
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # module-level functions and classes
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # from m import n: name -> (m, n)
    modules: dict[str, str] = field(default_factory=dict)  # import m as a: a -> m


class Tree:
    """Every module under tests/, and which of their functions and classes start something."""

    def __init__(self, root: Path = TESTS) -> None:
        self.base = root.parent  # names are relative to it: tests/... for the repository
        self.modules: dict[Path, Module] = {}
        for path in sorted(root.rglob("*.py")):
            module = Module(path, ast.parse(path.read_text(), str(path)))
            for node in module.tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    module.defs[node.name] = node
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for alias in node.names:
                        module.names[alias.asname or alias.name] = (node.module, alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        module.modules[alias.asname or alias.name] = alias.name
            self.modules[path] = module
        self._memo: dict[tuple[Path, str], str | None] = {}

    def _module(self, importer: Path, dotted: str) -> Module | None:
        """A module of the test tree by its import name: ``tests.gateway.harness``, or a bare
        ``harness`` beside the importer (pytest puts a test's folder on the path)."""
        relative = Path(*dotted.split("."))
        for candidate in (
            self.base / relative.with_suffix(".py"),
            importer.parent / relative.with_suffix(".py"),
        ):
            if candidate in self.modules:
                return self.modules[candidate]
        return None

    def _resolve(
        self, module: Module, names: list[str], owner: ast.ClassDef | None
    ) -> tuple[Module, str] | None:
        if not names:
            return None
        head = names[0]
        if len(names) == 1:
            if head in module.defs:
                return module, head
            if head in module.names:
                source, name = module.names[head]
                found = self._module(module.path, source)
                return (found, name) if found and name in found.defs else None
            return None
        if head == "self" and owner is not None and len(names) == 2:
            return module, f"{owner.name}.{names[1]}"
        if head in module.defs and len(names) == 2:  # Class.method
            return module, f"{head}.{names[1]}"
        if head in module.modules or head in module.names:
            dotted = module.modules.get(head) or ".".join(module.names[head])
            found = self._module(module.path, dotted)
            if found and len(names) == 2 and names[1] in found.defs:
                return found, names[1]
        return None

    def _node(self, module: Module, name: str) -> tuple[ast.AST, ast.ClassDef | None] | None:
        if "." in name:
            cls_name, method = name.split(".", 1)
            cls = module.defs.get(cls_name)
            if isinstance(cls, ast.ClassDef):
                for node in cls.body:
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == method:
                        return node, cls
            return None
        node = module.defs.get(name)
        return (node, None) if node is not None else None

    def starts(self, module: Module, name: str) -> str | None:
        """What the module's function or class ``name`` starts (``via`` a chain), or None."""
        key = (module.path, name)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # recursion guard
        found = self._node(module, name)
        result = None
        if found is not None:
            node, owner = found
            if isinstance(node, ast.ClassDef):
                result = next(
                    (
                        b
                        for base in node.bases
                        if (b := ".".join(_dotted(base))) and b.split(".")[-1] in STARTS
                    ),
                    None,
                )
                # a class whose object can start something: a server, or any method that starts one
                for method in (m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)):
                    result = result or self.starts(module, f"{node.name}.{method.name}")
            else:
                result = self.body_starts(module, node, owner)
        self._memo[key] = result
        return result

    def body_starts(self, module: Module, node: ast.AST, owner: ast.ClassDef | None = None) -> str | None:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            if direct := _starts(call):
                return direct
            target = self._resolve(module, _dotted(call.func), owner)
            if target and (chain := self.starts(*target)):
                return f"{target[1]} -> {chain}"
        return None

    def starters(self) -> tuple[dict[str, str], dict[str, str]]:
        """``(fixtures, tests)`` that start something themselves, by ``path::name``."""
        fixtures: dict[str, str] = {}
        tests: dict[str, str] = {}
        for path, module in self.modules.items():
            rel = path.relative_to(self.base).as_posix()
            if e2e_module(module.tree):
                continue
            for node in module.tree.body:
                functions = (
                    [(node, None)] if not isinstance(node, ast.ClassDef) else [(m, node) for m in node.body]
                )
                for function, owner in functions:
                    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                        continue
                    name = fixture_name(function)
                    if name is None and not function.name.startswith("test"):
                        continue
                    if name is None and any(_marks_e2e(d) for d in function.decorator_list):
                        continue
                    if not (what := self.body_starts(module, function, owner)):
                        continue
                    if name is not None:
                        fixtures[f"{rel}::{name}"] = what
                    else:
                        prefix = f"{rel}::{owner.name}::" if owner else f"{rel}::"
                        tests[prefix + function.name] = what
        return fixtures, tests


def _covered(test: str, test_arguments: set[str]) -> bool:
    module = test.split("::")[0]
    return (
        test in PROC_TESTS
        or module in PROC_TESTS
        or bool(test_arguments & {k.split("::")[1] for k in PROC_FIXTURES})
    )


@pytest.mark.slow
def test_every_fixture_that_starts_a_process_or_a_server_is_in_the_proc_list() -> None:
    fixtures, _ = Tree().starters()
    missing = {name: what for name, what in fixtures.items() if name not in PROC_FIXTURES}
    assert not missing, (
        "these fixtures start a process or a server but are not in tests/conftest.py's PROC_FIXTURES "
        f"(their tests would run in the quick tier): {missing}"
    )


@pytest.mark.slow
def test_every_test_that_starts_a_process_or_a_server_itself_is_marked_proc() -> None:
    tree = Tree()
    _, tests = tree.starters()
    missing = {}
    for test, what in tests.items():
        path, *names = test.split("::")
        node = tree.modules[REPO / path].defs.get(names[0])
        if len(names) == 2 and isinstance(node, ast.ClassDef):
            node = next(m for m in node.body if getattr(m, "name", None) == names[1])
        arguments = (
            {a.arg for a in node.args.args}
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            else set()
        )
        if not _covered(test, arguments):
            missing[test] = what
    assert not missing, (
        "these tests start a process or a server but are neither in tests/conftest.py's PROC_TESTS nor "
        f"given a fixture of PROC_FIXTURES: {missing}"
    )


@pytest.mark.slow
def test_every_entry_of_the_proc_lists_names_a_fixture_or_a_test_that_exists() -> None:
    tree = Tree()
    stale = []
    for entry in [*PROC_FIXTURES, *PROC_TESTS]:
        path, *names = entry.split("::")
        module = tree.modules.get(REPO / path)
        if module is None:
            stale.append(entry)
        elif names and entry in PROC_FIXTURES:
            if not any(fixture_name(n) == names[0] for n in ast.walk(module.tree)):
                stale.append(entry)
        elif names and names[0] not in module.defs:
            stale.append(entry)
    assert not stale, f"entries of tests/conftest.py's proc lists that name nothing: {stale}"


def test_the_reader_sees_a_server_started_through_a_helper_of_another_module(tmp_path: Path) -> None:
    (tmp_path / "harness.py").write_text(
        "import subprocess\nclass Box:\n    def __init__(self):\n        self.p = subprocess.Popen(['true'])\n"
        "def boot():\n    return Box()\n"
    )
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom harness import boot\n@pytest.fixture(name='box')\ndef _box():\n    yield boot()\n"
        "@pytest.fixture\ndef pure():\n    return 1\n"
    )
    (tmp_path / "test_x.py").write_text(
        "import harness, pytest\ndef test_a():\n    harness.boot()\ndef test_b(pure):\n    pass\n"
        "@pytest.mark.e2e\ndef test_c():\n    harness.boot()\n"
    )
    (tmp_path / "test_y.py").write_text(
        "import pytest, harness\npytestmark = [pytest.mark.e2e]\ndef test_d():\n    harness.boot()\n"
    )
    fixtures, tests = Tree(tmp_path).starters()
    assert [k.split("::", 1)[1] for k in fixtures] == ["box"]
    assert [k.split("::", 1)[1] for k in tests] == ["test_a"]
