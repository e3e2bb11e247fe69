"""The simulator: the real scheduler driven by a virtual clock over a trace (see engine.py)."""

from astraeus.sim.cli import simulate_command, simulate_main
from astraeus.sim.engine import SimOptions, SimResult, Simulator, simulate
from astraeus.sim.report import build_report, format_report, plot_utilisation
from astraeus.sim.trace import QOS_PRIORITY, Task, Trace, load_trace, read_alibaba_tasks, read_machines

__all__ = [
    "QOS_PRIORITY",
    "SimOptions",
    "SimResult",
    "Simulator",
    "Task",
    "Trace",
    "build_report",
    "format_report",
    "load_trace",
    "plot_utilisation",
    "read_alibaba_tasks",
    "read_machines",
    "simulate",
    "simulate_command",
    "simulate_main",
]
