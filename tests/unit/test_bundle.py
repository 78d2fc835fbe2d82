"""Where --with-harness finds vllm-repro's source (harness.bundle.harness_wheels.source_checkout)."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.bundle.harness_wheels as bundle
from harness.core.errors import BadInput

pytestmark = pytest.mark.unit


def test_the_checkout_this_code_runs_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An editable install (or a run from the checkout): the wheel is built from there, wherever the cwd is.
    checkout = tmp_path / "src"
    (checkout / "harness").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "vllm-repro"\n')
    monkeypatch.setattr(bundle, "__file__", str(checkout / "harness" / "bundle" / "harness_wheels.py"))
    assert bundle.source_checkout(tmp_path) == checkout.resolve()


def test_else_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `pip install . && vllm-repro wheelhouse --with-harness` runs the installed copy, inside the checkout.
    installed = tmp_path / "site-packages" / "harness"
    installed.mkdir(parents=True)
    monkeypatch.setattr(bundle, "__file__", str(installed / "bundle" / "harness_wheels.py"))
    checkout = tmp_path / "src"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "vllm-repro"\n')
    assert bundle.source_checkout(checkout) == checkout.resolve()
    with pytest.raises(BadInput, match="run it in a vllm-repro checkout"):
        bundle.source_checkout(tmp_path)


def test_the_bundle_carries_what_tox_post_resume_installs() -> None:
    # An air-gapped node installs `tox -e post-resume` from the bundle alone: the bundle downloads vllm-repro
    # with the extra that env installs, and the extra's pins are the test suite's own.
    import configparser
    import tomllib

    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras[bundle.EXTRA] and set(extras[bundle.EXTRA]) <= set(extras["test"])
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(root / "tox.ini")
    assert tox["testenv:post-resume"]["extras"].strip() == bundle.EXTRA
