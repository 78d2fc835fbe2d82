"""The CI files pass a supply-chain audit and their schemas (they run on self-hosted GPU runners).

zizmor (offline) reports unpinned actions, credentials persisted into uploaded artifacts, excessive
permissions and template injection; check-jsonschema validates against its bundled GitHub-workflow and
Buildkite schemas.  Both come with the ``test`` extra; a finding fails the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # runs two external tools

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
PIPELINE = ROOT / ".buildkite" / "pipeline.yml"


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_zizmor_finds_nothing() -> None:
    proc = _run(str(BIN / "zizmor"), "--offline", "--format", "plain", str(WORKFLOW))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings to report" in proc.stdout + proc.stderr


def test_zizmor_catches_an_unpinned_action(tmp_path: Path) -> None:
    # The audit is live: the same workflow with one action back on a tag fails it.
    bad = tmp_path / ".github" / "workflows" / "nightly.yml"
    bad.parent.mkdir(parents=True)
    text = WORKFLOW.read_text()
    pinned = "actions/checkout@11d5960a326750d5838078e36cf38b85af677262  # v4.4.0"
    assert pinned in text
    bad.write_text(text.replace(pinned, "actions/checkout@v4", 1))
    proc = _run(str(BIN / "zizmor"), "--offline", "--format", "plain", str(bad))
    assert proc.returncode != 0 and "unpinned" in proc.stdout + proc.stderr


@pytest.mark.parametrize(("schema", "path"), [("vendor.github-workflows", WORKFLOW), ("vendor.buildkite", PIPELINE)])
def test_ci_files_match_their_schemas(schema: str, path: Path) -> None:
    proc = _run(str(BIN / "check-jsonschema"), "--builtin-schema", schema, str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
