"""Which interpreter a wheelhouse install layers vLLM onto (harness.envbuild.from_wheelhouse.find_base_python).

On an air-gapped GPU node the README's `tox -e repro -- --wheelhouse wh/` ran under tox's venv, which has no
torch, and every version was BUILD-FAILED; the base must be found, or refused before anything is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import harness.envbuild.from_wheelhouse as whb
from harness.core.errors import BadInput

pytestmark = pytest.mark.unit

TORCH = {"python": "3.12", "torch": True, "site": []}
FAKE = {
    "/tox/venv/bin/python": {"python": "3.12", "torch": False, "canonical": "/tox/venv/bin/python3.12"},
    "/usr/bin/python3": {**TORCH, "canonical": "/usr/bin/python3.12"},
    "/usr/bin/python3.12": {**TORCH, "canonical": "/usr/bin/python3.12"},
    "/opt/py311/bin/python": {"python": "3.11", "torch": True, "canonical": "/opt/py311/bin/python3.11"},
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    def info(path: str) -> dict[str, Any]:
        if path not in FAKE:
            raise BadInput(f"cannot run base interpreter {path}: No such file or directory; give --base-python PATH")
        return FAKE[path]

    monkeypatch.setattr(whb, "base_info", info)
    monkeypatch.delenv(whb.BASE_PYTHON_ENV, raising=False)
    monkeypatch.setattr(sys, "executable", "/tox/venv/bin/python")
    monkeypatch.setattr(sys, "_base_executable", "/usr/bin/python3", raising=False)
    monkeypatch.setattr(whb, "_path_pythons", lambda python: [])


def test_under_tox_the_interpreter_the_venv_was_made_from_is_found(fake: None) -> None:
    assert whb.find_base_python("3.12") == "/usr/bin/python3.12"


def test_one_canonical_path_whatever_the_spelling(fake: None) -> None:
    # The canonical path keys the env cache: `envs build` and `tox -e repro` must find the same envs.
    assert whb.find_base_python("3.12", "/usr/bin/python3") == whb.find_base_python("3.12", "/usr/bin/python3.12")


def test_the_variable_names_it_once(fake: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(whb.BASE_PYTHON_ENV, "/usr/bin/python3")
    monkeypatch.setattr(sys, "_base_executable", "/nowhere", raising=False)
    assert whb.find_base_python("3.12") == "/usr/bin/python3.12"


@pytest.mark.parametrize(("given", "needle"), [
    ("/tox/venv/bin/python", "has no torch: a wheelhouse install layers vLLM onto an interpreter that already "
                             "holds torch; pass --base-python PATH or set VLLM_REPRO_BASE_PYTHON=PATH"),
    ("/opt/py311/bin/python", "is for Python 3.12 but /opt/py311/bin/python is Python 3.11"),
    ("/no/python", "cannot run base interpreter /no/python"),
])
def test_a_named_interpreter_that_does_not_fit_is_refused(fake: None, given: str, needle: str) -> None:
    with pytest.raises(BadInput) as exc:
        whb.find_base_python("3.12", given)
    assert needle in str(exc.value)


def test_nothing_found_names_every_try_and_the_fix(fake: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "_base_executable", "/opt/py311/bin/python", raising=False)
    with pytest.raises(BadInput) as exc:
        whb.find_base_python("3.12")
    assert str(exc.value) == (
        "no Python 3.12 interpreter holding torch found for the wheelhouse (tried /tox/venv/bin/python: no torch; "
        "/opt/py311/bin/python: Python 3.11); pass --base-python PATH or set VLLM_REPRO_BASE_PYTHON=PATH")


def test_every_python_on_path_is_a_candidate(fake: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # tox puts its venv first on PATH; the node's torch venv comes later (/opt/torch/.venv/bin on the H200s).
    monkeypatch.setattr(sys, "_base_executable", "/opt/py311/bin/python", raising=False)
    monkeypatch.setattr(whb, "_path_pythons", lambda python: ["/tox/venv/bin/python", "/usr/bin/python3"])
    assert whb.find_base_python("3.12") == "/usr/bin/python3.12"


def test_path_pythons_lists_executables_in_path_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    for rel in ("a/python3", "b/python3.12", "b/python3"):
        (tmp_path / rel).write_text("")
        (tmp_path / rel).chmod(0o755)
    (tmp_path / "a" / "python3.12").write_text("")  # not executable: left out
    monkeypatch.setenv("PATH", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert whb._path_pythons("3.12") == [str(tmp_path / "a/python3"), str(tmp_path / "b/python3"),
                                          str(tmp_path / "b/python3.12")]
