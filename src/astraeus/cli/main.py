"""`astra`'s entry point: the most used commands without typer, everything else through typer's app.

A command line that astraeus.cli.fastargs reads whole (astraeus run|runs|logs, slurm sbatch|squeue, see
fastargs.HOT) runs astraeus.cli.commands' function directly, from the options table in astraeus.cli.hot_table,
so that neither typer, click, rich nor pydantic is imported; `astra`, `astra --help` and the groups' and HOT
commands' --help print typer's own help as hot_table keeps it (fastargs.help_cached says where that is exact). Anything else, and ASTRA_NO_FASTARGS=1, goes to
astraeus.cli.astra's typer app, as before. Standard library only at import.
"""

from __future__ import annotations

import sys

from astraeus import envvars


def _terminal_columns() -> int | None:
    """The width of the terminal stdout is, None when it is not one."""
    import os

    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def app() -> None:
    argv = sys.argv[1:]
    if (len(argv) <= 3 and (not argv or argv[-1] == "--help") and not envvars.get("ASTRA_NO_FASTARGS")
            and not envvars.get("_ASTRA_COMPLETE")):  # shell completion asks with no arguments: typer answers
        from astraeus.cli.fastargs import help_cached
        from astraeus.cli.hot_table import HELP

        hit = help_cached(HELP, argv, envvars.get("COLUMNS"), _terminal_columns())
        if hit is not None:
            sys.stdout.write(hit[1])
            sys.stdout.flush()
            sys.exit(hit[0])
    if len(argv) >= 2 and not envvars.get("ASTRA_NO_FASTARGS"):
        from astraeus.cli.fastargs import HOT

        if (argv[0], argv[1]) in HOT:
            from astraeus.cli import commands, fastargs
            from astraeus.cli.hot_table import TABLES

            try:
                if fastargs.run_cached(TABLES, argv, commands):
                    return
            except SystemExit:
                raise
            except KeyboardInterrupt:
                sys.exit(130)
            except Exception as e:  # noqa: BLE001 - one line, as astra.py's app says it
                if envvars.get("ASTRA_DEBUG"):
                    raise
                from astraeus.cli.format import terminal_safe

                commands.echo(terminal_safe(f"error: {type(e).__name__}: {e} (set ASTRA_DEBUG=1 for details)"),
                              err=True)
                sys.exit(1)
    from astraeus.cli.astra import app as typer_app

    typer_app()


if __name__ == "__main__":
    app()
