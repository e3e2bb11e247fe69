"""The refusals `astra`'s commands turn into one line on stderr, in a module of their own so that the shared error
handler (astraeus.cli.commands.handle_errors) catches them without importing the Slurm translation or views."""

from __future__ import annotations


class SbatchError(ValueError):
    """A user-facing refusal; the message is printed as it is (it starts with `sbatch: `)."""


class HelpRequested(Exception):
    """`--help` among sbatch's options."""


class ViewError(ValueError):
    """A bad option or value of a view command; str(e) is the one line to print (`sacct: error: …`)."""
