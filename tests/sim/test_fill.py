"""The FGD paper's protocol (`astraeus simulate --fill`): tasks of the trace arrive until their demand is 130 %
of GPU capacity and never leave; it prints the share of capacity allocated per seed and as a mean, beside the
paper's figures, and draws the plot. Runs the real command on the in-repository slice of the trace."""

from __future__ import annotations

import subprocess
import sys

import pytest

from astraeus.scheduler.fragments import WHOLE
from astraeus.sim.protocol import fill, read_requests, read_rooms


def simulate(trace_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraeus.main", "simulate", "--machines", str(trace_dir / "openb_fill_nodes.csv"),
         "--tasks", str(trace_dir / "openb_fill_pods.csv"), *args],
        capture_output=True, text=True, timeout=300,
    )


def test_the_protocol_prints_each_seed_the_mean_and_the_paper_and_draws_the_plot(trace_dir, tmp_path):
    svg = tmp_path / "fill.svg"
    r = simulate(trace_dir, "--fill", "1.3", "--seeds", "2", "--placement", "fgd,bestfit,random", "--plot", str(svg))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "placement fgd: GPU capacity allocated at   100% demand  130% demand" in lines
    assert any(line.startswith("  seed 0 ") for line in lines) and any(line.startswith("  seed 1 ") for line in lines)
    means = [line for line in lines if line.startswith("  mean")]
    assert len(means) == 3
    assert "(paper: 95.2% / 95.4%)" in means[0] and "(paper: 92.9% / 93.1%)" in means[1]
    assert "unallocated at 130%:" in means[0]
    assert f"Allocation plot: {svg}" in lines
    text = svg.read_text()
    assert text.startswith("<svg") and "fgd (Astraeus)" in text and "fgd (paper)" in text


def test_the_same_seed_gives_the_same_figures(trace_dir):
    rooms, requests = read_rooms(trace_dir / "openb_fill_nodes.csv"), read_requests(trace_dir / "openb_fill_pods.csv")
    a, b = fill(rooms, requests, "fgd", 3), fill(rooms, requests, "fgd", 3)
    assert a.at == b.at and a.curve == b.curve
    capacity = sum(len(r.free) for r in rooms) * WHOLE
    assert 0 < a.at[1.0] <= a.at[1.3] <= 100.0
    assert capacity > 0


def test_fgd_plus_is_a_placement_of_the_protocol(trace_dir):
    # fgd+ (FGD plus the GPU capacity CPU and memory strand) runs through the command like the others, and the
    # same seed gives the same figures.
    r = simulate(trace_dir, "--fill", "1.3", "--seeds", "1", "--placement", "fgd+,fgd")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "placement fgd+: GPU capacity allocated at   100% demand  130% demand" in lines
    means = [line for line in lines if line.startswith("  mean")]
    assert len(means) == 2 and "unallocated at 130%:" in means[0] and "paper" not in means[0]
    rooms, requests = read_rooms(trace_dir / "openb_fill_nodes.csv"), read_requests(trace_dir / "openb_fill_pods.csv")
    a, b = fill(rooms, requests, "fgd+", 1), fill(rooms, requests, "fgd+", 1)
    assert a.at == b.at and 0 < a.at[1.0] <= a.at[1.3] <= 100.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fill", "1.3", "--placement", "dotprod"], "--placement: use fgd, fgd+, bestfit, random, spread"),
        (["--fill", "0.5"], "--fill is the arrived demand as a share of GPU capacity, 1.0 to 5.0"),
        (["--fill", "1.3", "--seeds", "0"], "--seeds must be 1 to 1000, not 0"),
        (["--fill", "1.3", "--plot", "{tmp}/out.png"], "--plot with --fill writes an SVG: name it *.svg"),
    ],
)
def test_bad_protocol_options_say_what_to_change(trace_dir, args, message, tmp_path):
    r = simulate(trace_dir, *(a.format(tmp=tmp_path) for a in args))
    assert r.returncode == 2, r.stdout
    assert message in r.stderr
    assert not (tmp_path / "out.png").exists()


def test_a_task_file_without_gpu_tasks_is_refused(write_csv, trace_dir):
    tasks = write_csv("pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p0,1000,1024,0,0")
    r = subprocess.run([sys.executable, "-m", "astraeus.main", "simulate", "--machines",
                        str(trace_dir / "openb_fill_nodes.csv"), "--tasks", str(tasks), "--fill", "1.3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no task asks for a GPU" in r.stderr
