"""A light argument layer for `astra`'s most used commands: they run without click's parsing.

Typer checks each option's value through a pydantic TypeAdapter, so that any command costs pydantic's import and
the whole command tree's build. For the commands in HOT this module reads the same options (from the commands'
own signatures: their names, types and defaults) and calls the command's function itself. Anything it does not
read exactly as click would (--help, an unknown option, a value of the wrong type, a bound, a missing argument,
short options run together) goes to typer as before, so that help and usage errors stay typer's.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is read only to build the table (make_hot_table), never to run a command
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

HOT = (("astraeus", "run"), ("astraeus", "runs"), ("astraeus", "logs"), ("slurm", "sbatch"), ("slurm", "squeue"))


class Fallback(Exception):
    """Leave this command line to typer."""


class Context:
    """What a command taking typer.Context reads of it here: the arguments it did not declare."""

    def __init__(self, args: list[str]):
        self.args = args


def _command(group: Any, name: str) -> Any | None:
    """The CommandInfo named `name` in a typer app (its name, or its function's with - for _)."""
    for info in group.registered_commands:
        shown = info.name or info.callback.__name__.replace("_", "-")
        if shown == name:
            return info
    return None


def _group(app: Any, name: str) -> Any | None:
    for info in app.registered_groups:
        if info.name == name:
            return info.typer_instance
    return None


_BASES = {"str": str, "int": int, "float": float, "bool": bool}


class _Param:
    def __init__(self, name: str, kind: str, base: Any, many: bool, required: bool, names: dict[str, bool | None],
                 low: Any):
        # names: an option's names, each with the value it gives a flag (None: it takes a value); low: its min
        self.name, self.kind, self.base, self.many, self.required, self.names, self.low = (
            name, kind, base, many, required, names, low)

    def row(self) -> tuple:
        return (self.name, self.kind, self.base.__name__ if self.base else None, self.many, self.required,
                tuple(self.names.items()), self.low)

    @classmethod
    def from_row(cls, row: tuple) -> _Param:
        name, kind, base, many, required, names, low = row
        return cls(name, kind, _BASES.get(base), many, required, dict(names), low)


def _params(fn: Callable[..., Any]) -> list[_Param]:
    """The command's parameters as typer reads them: Annotated[T, typer.Option(...)] or typer.Argument(...)."""
    import inspect
    import types
    import typing

    from typer import Context as TyperContext
    from typer.models import ArgumentInfo, OptionInfo

    hints = typing.get_type_hints(fn, include_extras=True)
    out = []
    for p in inspect.signature(fn).parameters.values():
        hint = hints.get(p.name, typing.Any)
        info = None
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extra = typing.get_args(hint)
            info = next((x for x in extra if isinstance(x, OptionInfo | ArgumentInfo)), None)
        if hint is TyperContext:
            out.append(_Param(p.name, "context", None, False, False, {}, None))
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
            hint = args[0]
        many = typing.get_origin(hint) is list
        base = typing.get_args(hint)[0] if many else hint
        if base not in (str, int, float, bool):
            raise Fallback
        if info is not None and (info.callback or info.is_eager or info.envvar or getattr(info, "prompt", False)
                                 or getattr(info, "min", None) is not None and base is not int
                                 or getattr(info, "max", None) is not None):
            raise Fallback  # typer's own handling
        required = p.default is inspect.Parameter.empty
        kind = "argument" if isinstance(info, ArgumentInfo) or (info is None and required) else "option"
        if kind == "option" and required:
            raise Fallback  # a required option: typer says it is missing
        names: dict[str, bool | None] = {}
        if kind == "option":
            decls = list(info.param_decls or ()) if info is not None else []
            if info is not None and info.default is not ...:  # in Annotated, Option's first argument is a name
                decls.insert(0, info.default)
            if not decls:
                decls = ["--" + p.name.replace("_", "-")]
            for decl in decls:
                for i, n in enumerate(decl.split("/")):
                    names[n.strip()] = (i == 0) if base is bool else None
        out.append(_Param(p.name, kind, base, many, required, names, getattr(info, "min", None)))
    return out


def _convert(param: _Param, value: str) -> Any:
    try:
        v = param.base(value)
    except ValueError:
        raise Fallback from None  # typer says which option and why
    if param.low is not None and v < param.low:
        raise Fallback
    return v


def parse(params: list[_Param], argv: Sequence[str], settings: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for `argv`, as click would give them; Fallback where it cannot tell."""
    names = {n: (p, flag) for p in params for n, flag in p.names.items()}  # option → its parameter, a flag's value
    extra_ok = settings.get("allow_extra_args") and settings.get("ignore_unknown_options")
    interspersed = settings.get("allow_interspersed_args", True)
    help_names = settings.get("help_option_names", ["--help"])
    has_args = any(p.kind == "argument" for p in params)
    values: dict[str, Any] = {}
    positionals: list[str] = []
    extras: list[str] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            positionals += argv[i:]
            break
        if tok in help_names:
            raise Fallback
        if tok.startswith("-") and tok != "-":
            name, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
            if name not in names:
                if extra_ok:
                    extras.append(tok)
                    continue
                raise Fallback  # unknown (or run together, -ojson): typer's answer
            p, flag = names[name]
            if flag is not None:
                if eq:
                    raise Fallback
                values[p.name] = flag
                continue
            if not eq:
                if i >= len(argv):
                    raise Fallback
                inline = argv[i]
                i += 1
            v = _convert(p, inline)
            if p.many:
                values.setdefault(p.name, []).append(v)
            else:
                values[p.name] = v
            continue
        # a command without arguments of its own keeps the rest in ctx.args, in order, as click does
        rest = extras if extra_ok and not has_args else positionals
        rest.append(tok)
        if not interspersed:
            rest += argv[i:]
            break
    for p in params:
        if p.kind == "context":
            values[p.name] = Context(extras)
        elif p.kind == "argument":
            if p.many:
                got = [_convert(p, x) for x in positionals]
                positionals = []
                if not got and p.required:
                    raise Fallback  # a required argument missing
                if got:
                    values[p.name] = got
            elif positionals:
                values[p.name] = _convert(p, positionals.pop(0))
            elif p.required:
                raise Fallback
    if positionals:
        if not extra_ok:
            raise Fallback
        ctx = next((values[p.name] for p in params if p.kind == "context"), None)
        if ctx is None:
            raise Fallback
        ctx.args += positionals
    return values


def run(app: Any, argv: Sequence[str]) -> bool:
    """Run `argv` when it is one of the HOT commands that this layer reads whole; False: leave it to typer."""
    if len(argv) < 2 or (argv[0], argv[1]) not in HOT:
        return False
    group = _group(app, argv[0])
    info = _command(group, argv[1]) if group is not None else None
    if info is None:
        return False
    settings = info.context_settings or {}
    try:
        kwargs = parse(_params(info.callback), argv[2:], settings)
    except Fallback:
        return False
    info.callback(**kwargs)
    return True


def table(app: Any) -> dict[str, Any]:
    """What parse() needs of each HOT command, as plain data: astraeus.cli.hot_table keeps a copy, so that
    astraeus.cli.main reads the hot commands without typer (tests/cli/test_cli_habits.py checks the copy)."""
    out: dict[str, Any] = {}
    for group_name, name in HOT:
        info = _command(_group(app, group_name), name)
        settings = {k: v for k, v in (info.context_settings or {}).items() if k in _SETTINGS}
        try:
            rows = [p.row() for p in _params(info.callback)]
        except Fallback:
            rows = None  # always typer's
        out[f"{group_name} {name}"] = {"callback": info.callback.__name__, "settings": settings, "params": rows}
    return out


_SETTINGS = ("allow_extra_args", "ignore_unknown_options", "allow_interspersed_args", "help_option_names")


def run_cached(tables: dict[str, Any], argv: Sequence[str], functions: Any) -> bool:
    """As run(), from table()'s copy and the module holding the commands' functions: no typer."""
    entry = tables.get(" ".join(argv[:2])) if len(argv) >= 2 else None
    if entry is None or entry["params"] is None:
        return False
    try:
        kwargs = parse([_Param.from_row(r) for r in entry["params"]], argv[2:], entry["settings"])
    except Fallback:
        return False
    getattr(functions, entry["callback"])(**kwargs)
    return True


HELP_WIDTH = 80  # typer's help as rich renders it where stdout is not a terminal and COLUMNS is unset


def help_lines() -> list[list[str]]:
    """The help command lines kept as text: astra alone, --help of astra and of its two groups, of each HOT command."""
    return [[], ["--help"], ["astraeus", "--help"], ["slurm", "--help"]] + [[g, c, "--help"] for g, c in HOT]


def help_texts(app: Any) -> dict[str, tuple[int, str]]:
    """typer's own answer (exit code, stdout) to each of help_lines(), rendered at HELP_WIDTH without colour."""
    from typer.testing import CliRunner

    runner = CliRunner()
    out = {}
    for argv in help_lines():
        r = runner.invoke(app, argv, env={"COLUMNS": str(HELP_WIDTH), "NO_COLOR": "1"}, prog_name="astra")
        out[" ".join(argv)] = (r.exit_code, r.stdout)
    return out


def help_cached(helps: dict[str, tuple[int, str]], argv: Sequence[str], columns: str | None,
                terminal_columns: int | None) -> tuple[int, str] | None:
    """The kept help for `argv`, where it is what typer would print: COLUMNS unset or HELP_WIDTH, and on a terminal
    one at least HELP_WIDTH wide (there typer adds colour; the kept text is the same without it). None: typer's."""
    hit = helps.get(" ".join(argv))
    if hit is None or columns not in (None, "", str(HELP_WIDTH)):
        return None
    if terminal_columns is not None and terminal_columns < HELP_WIDTH:
        return None
    return hit


def render_table(app: Any) -> str:
    """The text of astraeus/cli/hot_table.py for `app`."""
    import pprint

    return ('"""Generated by `python -m astraeus.cli.make_hot_table > src/astraeus/cli/hot_table.py`: fastargs.table() of\n'
            "astra's typer app, for astraeus.cli.main, and typer's help of astra, its groups and the HOT commands\n"
            "(fastargs.help_texts); tests/cli/test_cli_habits.py checks that it is current.\"\"\"\n\n"
            "TABLES = " + pprint.pformat(table(app), width=116, sort_dicts=True) + "\n\n"
            "HELP = " + pprint.pformat(help_texts(app), width=116, sort_dicts=True) + "\n")

