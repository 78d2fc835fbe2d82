"""A CUDA build of vLLM on a CPU-only machine, for the scheduler tier: a CPU torch and no CUDA libraries.

The ``vllm`` wheel pins a CUDA torch (0.21.0: ``torch==2.11.0``, which pulls 15 ``nvidia-*`` packages), and
that torch does not even import without them (measured: ``ImportError: libcudnn.so.9: cannot open shared
object file``).  The scheduler tier runs no model, so the env of a ``cpu_torch`` recipe gets instead:

* a CPU build of torch (a ``+cpu`` local version): the one vLLM pins (``torch==Y+cpu``) when a configured
  index or find-links folder has it (``--extra-index-url https://download.pytorch.org/whl/cpu`` has them
  all), else the nearest ``+cpu`` build found there, newer first.  The status file records both
  (``torch_pinned``, ``torch_override``); the scheduler tier's ``sched`` event reports the torch it ran;
* none of the CUDA libraries and GPU kernel packages of the resolution (``CUDA_ONLY``), recorded as
  ``left_out``.

The pin and the names come from a dry run of the same install (metadata only, seconds).  Whether a release
imports on that torch is what the smoke import checks (a failure is BUILD-FAILED, with uv's and Python's
words); whether its scheduler can be driven, the scheduler tier's adapter (UNSUPPORTED with the reason).
"""

from __future__ import annotations

import fnmatch
import platform as _platform
import re
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.core.errors import EnvBuildError
from harness.envbuild.backend import BuildStep
from harness.envbuild.index import IndexConfig
from harness.envbuild.tools import last_lines
from harness.envbuild.unresolvable import CPU_TORCH_REASON, ROUNDS, LeftOut, leave_out

# Never installed into a cpu_torch env: CUDA runtime libraries and GPU-only kernels (none is imported on the
# scheduler path; the CUDA torch that needs the nvidia-* libraries is replaced by a CPU one).
CUDA_ONLY = ("nvidia-*", "cuda-*", "cupy-*", "triton", "tokenspeed-*", "flashinfer-*", "xformers", "tilelang",
             "quack-kernels", "humming-kernels", "deep-gemm", "deep-ep")
_RESOLVED = re.compile(r"^\s*\+\s+([A-Za-z0-9._-]+)==(\S+)\s*$")
_HREF = re.compile(r"""href\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


@dataclass(frozen=True)
class CpuTorchPlan:
    """What the install of a cpu_torch env overrides: the torch build and the packages left out."""

    torch_pinned: str  # the torch version the resolution picked for vLLM (its pin)
    torch: str  # the +cpu build installed instead
    left_out: tuple[str, ...]  # canonical names, sorted
    # Pinned at a version no index holds (vLLM 0.34.0: flashinfer-python==0.7.3), so absent from the resolution.
    unresolvable: tuple[LeftOut, ...] = ()

    def overrides(self) -> list[str]:
        names = sorted({*self.left_out, *(u.name for u in self.unresolvable)})
        return [*(f"{n} ; sys_platform == 'never'" for n in names), f"torch=={self.torch}"]


def resolved(stderr: str) -> dict[str, str]:
    """``name -> version`` of every package a ``uv pip install --dry-run`` would install."""
    out = {}
    for line in stderr.splitlines():
        m = _RESOLVED.match(line)
        if m:
            out[str(canonicalize_name(m[1]))] = m[2]
    return out


def cuda_only(names: Iterable[str]) -> tuple[str, ...]:
    """The names (canonical) matching ``CUDA_ONLY``, sorted."""
    return tuple(sorted({n for n in names if any(fnmatch.fnmatch(n, p) for p in CUDA_ONLY)}))


def plan_cpu_torch(step: BuildStep, install: list[str], index: IndexConfig, python: str,
                   ovfile: Path, base: list[str]) -> CpuTorchPlan:
    """Dry-run ``install`` (a ``uv pip install`` command whose ``--override`` is ``ovfile``, holding ``base``), then
    choose the CPU torch and the packages left out."""
    packages, unresolvable = _dry_run(step, install, ovfile, base)
    pinned = packages.get("torch")
    if pinned is None:
        raise EnvBuildError("the resolution holds no torch, so there is no torch to replace by a CPU build")
    builds = cpu_torch_builds(index, python)
    chosen = pick_cpu_torch(pinned, builds)
    if chosen is None:
        raise EnvBuildError(
            f"no CPU build of torch (+cpu) found for Python {python} on the configured indexes and find-links "
            f"(vLLM pins torch=={pinned}); add --extra-index-url https://download.pytorch.org/whl/cpu, or "
            f"--find-links a folder holding torch-{Version(pinned).public}+cpu")
    step.logfile.write(f"# cpu torch: pinned {pinned}; +cpu builds found: {', '.join(map(str, builds)) or '-'}; "
                       f"chosen {chosen}\n")
    return CpuTorchPlan(pinned, str(chosen), cuda_only(packages), unresolvable)


def _dry_run(step: BuildStep, install: list[str], ovfile: Path,
             base: list[str]) -> tuple[dict[str, str], tuple[LeftOut, ...]]:
    """The resolution of ``install``, leaving out CUDA-only packages pinned at a version no index holds
    (harness.envbuild.unresolvable); any other failure is the build's."""
    never = {p: CPU_TORCH_REASON for p in CUDA_ONLY}
    left: list[LeftOut] = []
    for _ in range(ROUNDS):
        ovfile.write_text("\n".join(base + [f"{lo.name} ; sys_platform == 'never'" for lo in left]) + "\n")
        proc = step.run([*install, "--dry-run"], 600)
        if not proc.returncode:
            return resolved(proc.stderr), tuple(left)
        more = leave_out(proc.stderr, never, (lo.name for lo in left))
        if more is None:
            break
        step.logfile.write("".join(f"# {lo.name}=={lo.pinned} is on no configured index: left out\n" for lo in more))
        left += more
    raise EnvBuildError(f"uv pip install --dry-run failed: {last_lines(proc.stderr)}")


def pick_cpu_torch(pinned: str, builds: Iterable[Version]) -> Version | None:
    """The +cpu build of the pinned release if found, else the oldest newer one, else the newest older one."""
    try:
        want = Version(Version(pinned).public)
    except InvalidVersion:
        return None
    found = sorted(set(builds))
    exact = [b for b in found if Version(b.public) == want]
    newer = [b for b in found if Version(b.public) > want]
    older = [b for b in found if Version(b.public) < want]
    if exact:
        return exact[-1]
    if newer:
        return newer[0]
    return older[-1] if older else None


def cpu_torch_builds(index: IndexConfig, python: str) -> list[Version]:
    """Versions of the ``+cpu`` torch wheels for ``python`` on this machine that the index config offers:
    in find-links folders and pages, and on the ``torch`` page of each configured index (PyPI itself holds
    no local versions, so the default index is not asked)."""
    names: list[str] = []
    for link in index.find_links:
        names += _listing(link)
    for url in (index.index_url, *index.extra_index_urls):
        if url:
            names += _listing(url.rstrip("/") + "/torch/")
    return sorted({v for v in (_cpu_torch_version(n, python) for n in names) if v is not None})


def _listing(where: str) -> list[str]:
    """File names linked from a folder, a ``file://`` folder or an HTML page (nothing when unreadable)."""
    parsed = urllib.parse.urlparse(where)
    if parsed.scheme in ("", "file"):
        folder = Path(urllib.parse.unquote(parsed.path) if parsed.scheme else where)
        if (folder / "index.html").is_file():
            return _hrefs((folder / "index.html").read_text(errors="replace"))
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []
    if parsed.scheme not in ("http", "https"):
        return []
    try:
        with urllib.request.urlopen(where, timeout=30) as resp:
            return _hrefs(resp.read().decode(errors="replace"))
    except (OSError, ValueError):
        return []


def _hrefs(html: str) -> list[str]:
    return [urllib.parse.unquote(h.split("#", 1)[0].rsplit("/", 1)[-1]) for h in _HREF.findall(html)]


def _cpu_torch_version(filename: str, python: str) -> Version | None:
    """The version of a ``torch-V+cpu`` wheel installable by CPython ``python`` on this machine, else None."""
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    cp = "cp" + python.replace(".", "")
    machine = _platform.machine()
    fits = any(t.interpreter == cp and "linux" in t.platform and t.platform.endswith(machine) for t in tags)
    return version if name == "torch" and version.local == "cpu" and fits else None
