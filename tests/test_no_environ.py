"""Settings once (issue 43): the environment is read in astraeus.settings (and its pydantic-free half,
astraeus.envvars) only, settings imports no upper layer, the agent's runtime has no import cycle, and no comment in
src/ cites a measured time figure (measurements belong in benchmarks/README.md)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "astraeus"
# settings.py reads the configuration; envvars.py is the environment for what must not import pydantic (`astra`,
# a worker's supervisor and its launcher).
ALLOWED = {SRC / "settings.py", SRC / "envvars.py"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _sources():
    for path in sorted(SRC.rglob("*.py")):
        yield path, path.read_text()


def environment_uses(path: Path, text: str) -> list[str]:
    """`file:line` of each use of os.environ, os.getenv (and the like), or an import of them, in `text`."""
    where = path.relative_to(ROOT)
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name) \
                and node.value.id in ("os", "posix", "_os"):
            out.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "posix") \
                and any(a.name in ENV_NAMES for a in node.names):
            out.append(f"{where}:{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
    return out


def test_the_environment_is_read_in_settings_only():
    found = [use for path, text in _sources() if path not in ALLOWED for use in environment_uses(path, text)]
    assert not found, "read the environment through astraeus.settings (or astraeus.envvars):\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_use():
    text = "import os\nfrom os import environ\na = os.environ['X']\nb = os.getenv('Y')\nos.putenv('Z', '1')\n"
    assert [u.split(": ", 1)[1] for u in environment_uses(SRC / "x.py", text)] == [
        "from os import environ", "os.environ", "os.getenv", "os.putenv"]
    assert environment_uses(SRC / "x.py", '"""os.environ in a docstring"""\nx = "os.environ"\n') == []


def test_settings_imports_no_upper_layer():
    """astraeus.settings is a bottom module: importing it loads nothing of the agent, the server, the command lines
    or the console, and so can never be part of an import cycle with them."""
    code = ("import sys, astraeus.settings\n"
            "print(' '.join(m for m in sys.modules if m.startswith(('astraeus.agent', 'astraeus.server', "
            "'astraeus.cli', 'astraeus.console'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""
    tree = ast.parse((SRC / "settings.py").read_text())
    upper = sorted({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                    and n.module.startswith(("astraeus.agent", "astraeus.server", "astraeus.cli", "astraeus.console"))})
    assert not upper, upper


def _imports(path: Path, package: str) -> set[str]:
    """The astraeus modules `path` imports, at its top or in a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out |= {f"{base}.{a.name}" for a in node.names} | {base}
    return {m for m in out if m.startswith("astraeus.")}


def test_the_agent_runtime_has_no_import_cycle():
    """The runtime's modules form a DAG, counting the imports made inside functions (start-up speed is a reason to
    import late, never to import in a circle)."""
    runtime = SRC / "agent" / "runtime"
    names = {f"astraeus.agent.runtime.{p.stem}": p for p in runtime.glob("*.py") if p.stem != "__init__"}
    edges = {m: {t for t in _imports(p, "astraeus.agent.runtime") if t in names and t != m} for m, p in names.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [m, t]))
            if t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in sorted(names):
        if m not in state:
            visit(m, [])


# ------------------------------------------------------------------------------ comments cite no measured figure
# A time figure (`7 ms`, `0.27 ms`, `15 µs`) or a percentile (p95, p99) in a comment or docstring is a measurement,
# true of one machine on one day: it belongs in benchmarks/README.md, and the comment says what and why.
FIGURE = re.compile(r"\b\d+(\.\d+)?\s*(ms|µs|us|ns)\b|\bp9[59]\b", re.IGNORECASE)
# Units that are a real interface's values, not measurements: (file, the text around it).
NOT_MEASURED = {
    ("agent/runtime/cgroups.py", "per 100 ms period"),  # the kernel's CFS period (cpu.cfs_period_us)
}


def comments_and_docstrings(text: str):
    """(line, text) of every comment and docstring in a module's source."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                for i, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + i, line


def measured_figures(rel: str, text: str) -> list[str]:
    out = []
    for line, words in comments_and_docstrings(text):
        if FIGURE.search(words) and not any(rel == f and allowed in words for f, allowed in NOT_MEASURED):
            out.append(f"src/astraeus/{rel}:{line}: {words.strip()}")
    return out


def test_no_comment_cites_a_measured_time():
    found = [hit for path, text in _sources() for hit in measured_figures(str(path.relative_to(SRC)), text)]
    assert not found, ("say what and why without the figure (measurements: benchmarks/README.md):\n"
                       + "\n".join(found))


def test_the_figure_check_finds_comments_and_docstrings():
    text = ('"""Fast: ~7 ms here."""\n'
            "x = 1  # p99 was high\n"
            "def f():\n    '''Takes 0.27 ms.'''\n"
            "y = '5 ms in a string is code, not a comment'\n")
    assert sorted(h.split(":")[1] for h in measured_figures("x.py", text)) == ["1", "2", "4"]
    assert measured_figures("agent/runtime/cgroups.py", "# The CFS quota per 100 ms period\n") == []
