"""Issue 46: what users see of MIG devices, through the API of an in-process control plane (a machine registered by
the test with its MIG devices, no agents): a MIG worker's devices (`mig_devices`) and a machine's (`gpu_mig`, held:
`gpu_mig_used`) in the API's answers; `astra astraeus describe`, `runs -o wide` and `machines` as the CLI prints
those answers (`2 × MIG 1g.10gb`, `GPU 0: 1g.10gb 4/7 free`); the console's run, runs and machines pages."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import urlsplit

from astraeus.cli import format as fmt
from tests.api.test_mig import mig, register
from tests.api.test_whatif import placed, submit


def _run(app, name: str) -> dict:
    return app.client.get(app.api + f"/runs/{name}", headers=app.h()).json()


def _text(html: str) -> str:
    """The page's text as a reader sees it: tags gone, entities read, spaces collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def test_a_mig_workers_devices_and_the_machines_in_the_api_the_cli_and_the_console(app):
    assert register(app, "a100", 2, [{"1g.10gb": 7}, {}]).status_code == 200
    submit(app, mig("two", {"count": 2, "mig": "1g.10gb"}))
    submit(app, mig("one", {"count": 1, "mig": "1g.10gb"}))
    w = placed(app, "two-0")
    assert w["mig_devices"] == [[0, "1g.10gb", 0], [0, "1g.10gb", 1]] and "gpu_fraction" not in w
    placed(app, "one-0")

    (m,) = app.client.get(app.api + "/machines", headers=app.h()).json()["items"]
    assert (m["gpu_mig"], m["gpu_mig_used"]) == ([{"1g.10gb": 7}, {}], [{"1g.10gb": 3}, {}])
    assert (m["gpu_allocated"], m["gpus_allocated"]) == ([0.429, 0], 0.429)  # three 1g devices: 3/7 of GPU 0
    assert fmt.machine_mig(m) == "GPU 0: 1g.10gb 4/7 free"
    table = fmt.machines_table([m]).splitlines()
    assert re.search(r"GPUS FREE +MIG +CPUS", table[0]), table[0]  # the column after GPUS FREE
    assert "GPU 0: 1g.10gb 4/7 free" in table[1]

    run = _run(app, "two")
    described = fmt.describe_run(run)
    assert "Resources:      2 × MIG 1g.10gb, 1 CPU cores, 1 GiB memory" in described, described
    assert re.search(r"two-0 +\w+ +0 +0 +a100 +2 × MIG 1g\.10gb on GPU 0 ", described), described
    wide = fmt.runs_wide_table([run, _run(app, "one")]).splitlines()
    gpus_at = wide[0].index("GPUS")
    assert [line[gpus_at:].split("  ")[0] for line in wide[1:]] == ["2 × MIG 1g.10gb", "1 × MIG 1g.10gb"]

    base = app.client.get(app.api + "/runs/two", headers=app.h()).json()["status"]["console_url"]
    page = app.client.get(urlsplit(base).path, headers=app.h())
    assert page.status_code == 200, page.text
    assert re.search(r"two-0 \w+ .*a100 2 × MIG 1g\.10gb on GPU 0", _text(page.text)), _text(page.text)
    org, ws = app.boot["org"], app.boot["workspace"]
    runs = app.client.get(f"/o/{org}/w/{ws}/runs", headers=app.h())
    assert "2 × MIG 1g.10gb" in _text(runs.text) and "1 × MIG 1g.10gb" in _text(runs.text)
    machines = app.client.get(f"/o/{org}/w/{ws}/machines", headers=app.h())
    assert machines.status_code == 200
    assert "GPU 0: 1g.10gb 4/7 free" in _text(machines.text)


def test_a_machine_without_mig_shows_none(app):
    assert register(app, "plain", 2, []).status_code == 200
    (m,) = app.client.get(app.api + "/machines", headers=app.h()).json()["items"]
    assert (m["gpu_mig"], m["gpu_mig_used"]) == ([], [])
    assert "MIG" not in fmt.machines_table([m])
