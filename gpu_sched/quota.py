"""GPU quotas per group, so a few users cannot hold the whole pool.

Schema (YAML):

    groups:
      team-a: {gpus: 16}
      team-b: {gpus: 8}
      default: {gpus: 4}

A pod belongs to the group named by its label gpu-sched/group. Pods without the label, and pods
naming a group that is not listed, are counted together under `default`; without a `default` entry
they are not limited. `default: {gpus: 0}` therefore admits only the listed groups. Shared-GPU pods
count as their fraction of a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_GROUP = "default"


class QuotaError(ValueError):
    """A quota file that cannot be used as written."""


def format_gpus(value: float) -> str:
    """GPU amounts as people write them: 14, 2.5, 0.25."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class QuotaBook:
    limits: dict[str, float]

    def accounting_group(self, label: str | None) -> str | None:
        """The group whose limit applies to a pod with this label; None when nothing limits it."""
        if label is not None and label in self.limits and label != DEFAULT_GROUP:
            return label
        return DEFAULT_GROUP if DEFAULT_GROUP in self.limits else None

    def refusal(self, label: str | None, asks: float,
                usage_of: Callable[[str], float]) -> str | None:
        """Why the pod would exceed its group's quota, or None when it fits.

        usage_of(group) gives the GPUs the group holds now, not counting this pod.
        """
        group = self.accounting_group(label)
        if group is None or asks <= 0:
            return None
        limit = self.limits[group]
        used = usage_of(group)
        if used + asks <= limit + 1e-9:
            return None
        return (f'quota exceeded for group "{group}": {format_gpus(used)} of {format_gpus(limit)} '
                f"GPUs in use, pod asks {format_gpus(asks)}")


def parse_quota(text: str, source: str = "quota file") -> QuotaBook:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise QuotaError(f"{source}: not valid YAML{where}") from exc
    if not isinstance(data, dict) or set(data) != {"groups"} or not isinstance(data["groups"], dict):
        raise QuotaError(f"{source}: expected a mapping with one key, groups: {{NAME: {{gpus: N}}}}")
    limits: dict[str, float] = {}
    for name, entry in data["groups"].items():
        if not isinstance(name, str) or not name:
            raise QuotaError(f"{source}: group names must be non-empty strings, got {name!r}")
        if not isinstance(entry, dict) or set(entry) != {"gpus"}:
            raise QuotaError(f"{source}: group {name!r} must be {{gpus: N}}, got {entry!r}")
        gpus = entry["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int | float) or gpus < 0:
            raise QuotaError(f"{source}: group {name!r} gpus must be a number >= 0, got {gpus!r}")
        limits[name] = float(gpus)
    return QuotaBook(limits)


def load_quota(path: str | Path) -> QuotaBook:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise QuotaError(f"cannot read quota file {path}: {exc.strerror}") from exc
    return parse_quota(text, str(path))
