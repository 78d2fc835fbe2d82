"""One ordering of vLLM version labels, for reports, history, comparisons and release lists."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# A local segment (+gabc1234, +cpu) does not change the order: ties break by name.
_VERSION_PARTS = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?(?:\+[\w.]+)?$")
_PRE_RANK = {"a": 0, "b": 1, "rc": 2}


def release_key(version: str) -> tuple[Any, ...]:
    """Sort key ordering release versions numerically (0.9 < 0.21 < 0.32; rc before final)."""
    m = _VERSION_PARTS.match(version.strip())
    if not m:
        return (1, (), (0, 0), -1, (1, 0), version)  # unparseable: after every release, by name
    rel, pre, pre_n, post, dev = m.groups()
    nums = [int(p) for p in rel.split(".")]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    if pre:
        pre_key = (_PRE_RANK[pre], int(pre_n))
    elif dev and post is None:
        pre_key = (-1, 0)  # X.dev1 comes before X.a1
    else:
        pre_key = (3, 0)
    dev_key = (0, int(dev)) if dev else (1, 0)
    return (0, tuple(nums), pre_key, int(post) if post else -1, dev_key, "" if "+" not in version else version)


def version_key(label: str, hint: str | None = None) -> tuple[Any, ...]:
    """Sort key of a version label; ``hint``: the vLLM version its engine reported (for commit labels)."""
    key = release_key(label)
    if key[0] == 1 and hint:
        # Not a release (a commit label): place it by the version its engine reported.
        hinted = release_key(hint)
        if hinted[0] == 0:
            return (*hinted[:-1], label)
    return key


def version_order(labels: Iterable[str], hints: dict[str, str] | None = None) -> list[str]:
    """Version labels in release order (0.9 < 0.10 < 0.21.0rc1 < 0.21.0).

    A label that is no version (a commit label) sorts by the vLLM version its engine reported (e.g.
    ``0.21.1.dev40+gabc``, so it lands between the releases around it), and labels with neither after every
    release, by name.
    """
    hints = hints or {}
    return sorted(set(labels), key=lambda label: version_key(label, hints.get(label)))
