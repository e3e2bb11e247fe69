"""Run templates, the pure part: how a template's spec and a run's spec combine, and what a template may hold.

A template is any part of a run's spec (`priority`, `start`, `cluster`, `task_template.…`), kept under a name in
a workspace. A run that names one (`"spec": {"template": "ft", …}`) gets the template's spec with its own on top:
- the run's own fields override the template's, at every depth (`task_template.requested_resources.gpu_requests.
  count` in the run replaces only that count);
- `env` merges by name, and the run's labels with the template's (`metadata.labels`), by key;
- `datavolume_refs` merge by mount path, `configs` by their mount paths: the run's entry replaces the template's
  at the same path, and the others are kept;
- any other list (`args`, `node_selection.names`) is the run's when it gives one.
The result is then checked as a whole run spec, exactly as a run without a template is.
"""

from __future__ import annotations

import copy
from typing import Any

# Lists that merge by a key rather than being replaced: field name -> the key of an entry.
_KEYED_LISTS = {
    "datavolume_refs": lambda e: e.get("mount_path") if isinstance(e, dict) else repr(e),
    "configs": lambda e: tuple(e.get("mounts") or ()) if isinstance(e, dict) else repr(e),
}

# What a template's spec is completed with to be checked as a run spec (what only a run can say).
PLACEHOLDER_TASK = {"image": "placeholder.invalid/template-check:1", "command": "true"}


def merge(template: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The run's spec on top of the template's (see the module docstring); neither is changed."""
    return _merge(copy.deepcopy(template), run, "")


def _merge(base: Any, top: Any, field: str) -> Any:
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for k, v in top.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if field in _KEYED_LISTS and isinstance(base, list) and isinstance(top, list):
        key = _KEYED_LISTS[field]
        ours = {key(e) for e in top}
        return [copy.deepcopy(e) for e in base if key(e) not in ours] + copy.deepcopy(top)
    return copy.deepcopy(top)


def merge_labels(template_labels: dict[str, str] | None, run_labels: dict[str, str] | None) -> dict[str, str]:
    return {**(template_labels or {}), **(run_labels or {})}


def checkable(spec: dict[str, Any]) -> dict[str, Any]:
    """A template's spec completed with placeholders for what only a run gives (image, command), so that every
    field it does give is checked by the run spec's own rules. A spec that is not an object is returned as is (the
    check then says so)."""
    if not isinstance(spec, dict):
        return spec
    tt = spec.get("task_template", {})
    if not isinstance(tt, dict):
        return spec
    return {**spec, "task_template": {**PLACEHOLDER_TASK, **tt}}
