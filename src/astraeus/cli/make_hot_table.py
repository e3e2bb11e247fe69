"""Writes the hot commands' option table from astra's typer app:
`python -m astraeus.cli.make_hot_table > src/astraeus/cli/hot_table.py` (tests/cli/test_cli_habits.py checks that
the file is current)."""

from astraeus.cli.astra import app
from astraeus.cli.fastargs import render_table

if __name__ == "__main__":
    print(render_table(app), end="")
