"""Recipe drift (issue 36 item 4): are a recipe's cited source lines still in the framework's newest release?

A recipe cites each vLLM call as ``path:line`` (``path:a-b``, ``path:a,b``) at a commit, with the cited line's
text (``quote``).  Given the framework's source tree (an unpacked release, or a checkout), each citation is:

* ``OK``: the quote is on a cited line (or inside a cited range);
* ``MOVED``: the quote is in the file, elsewhere (the new line is reported; the behaviour may be unchanged);
* ``CHANGED``: the quote is gone from the file, or the file is gone (the nearest line is reported): drift;
* ``UNQUOTED``: the recipe gives no quote, so nothing can be compared (not drift; say so).

Only ``CHANGED`` is drift, and a release whose metadata pins vllm otherwise than the recipe's ``pin``.
Comparison ignores leading/trailing whitespace and runs of blanks.  Nothing here touches the network:
:mod:`harness.verdicts.drift_fetch` brings the trees.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import BadInput
from harness.verdicts.frameworks import Recipe, RecipeCall

OK, MOVED, CHANGED, UNQUOTED = "OK", "MOVED", "CHANGED", "UNQUOTED"
STATUSES = (OK, MOVED, CHANGED, UNQUOTED)


@dataclass(frozen=True)
class Cited:
    """``path:80``, ``path:1113-1141`` or ``path:234,250``: the file and the cited lines (a range as its ends)."""

    path: str
    lines: tuple[int, ...]
    is_range: bool

    def covers(self, line: int) -> bool:
        if self.is_range:
            return self.lines[0] <= line <= self.lines[-1]
        return line in self.lines

    @property
    def first(self) -> int:
        return self.lines[0]


def parse_at(at: str) -> Cited:
    """Parse a recipe's ``at``; BadInput names a malformed one."""
    m = re.fullmatch(r"(.+):(\d+)(?:-(\d+)|((?:,\d+)+))?", at.strip())
    if not m:
        raise BadInput(f"citation {at!r} is not PATH:LINE, PATH:A-B or PATH:A,B")
    first = int(m.group(2))
    if m.group(3):
        return Cited(m.group(1), (first, int(m.group(3))), True)
    rest = tuple(int(x) for x in (m.group(4) or "").split(",") if x)
    return Cited(m.group(1), (first, *rest), False)


@dataclass(frozen=True)
class CitationCheck:
    """One call's citation against a tree: its status, where the quote is now, or the nearest line to it."""

    call: str
    at: str
    quote: str
    status: str  # one of STATUSES
    line: int | None = None  # where the quote is now (OK, MOVED)
    nearest: str = ""  # CHANGED: the most similar line of the file (or why there is none)
    nearest_line: int | None = None

    @property
    def drift(self) -> bool:
        return self.status == CHANGED


@dataclass(frozen=True)
class FrameworkDrift:
    """A recipe against one source tree (``source`` says which: ``trl 1.16.0 (index)``, a checkout path), or
    why it was skipped."""

    framework: str
    source: str
    checks: tuple[CitationCheck, ...] = ()
    skipped: str = ""
    pin: str = ""  # the recipe's vllm pin
    release_pins: tuple[str, ...] = ()  # what the release's metadata requires of vllm (empty when unknown)

    @property
    def pin_drift(self) -> bool:
        """The release requires vllm otherwise than the recipe's pin (unknown pins are no drift)."""
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            return bool(self.release_pins) and SpecifierSet(self.pin) not in [SpecifierSet(p) for p in
                                                                              self.release_pins]
        except InvalidSpecifier:
            return True

    @property
    def drift(self) -> bool:
        return self.pin_drift or any(c.drift for c in self.checks)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)


def _norm(text: str) -> str:
    return " ".join(text.split())


def _nearest(lines: list[str], quote: str) -> tuple[str, int | None]:
    best, best_i, want = 0.0, None, _norm(quote)
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(want)
    for i, line in enumerate(lines):
        norm = _norm(line)
        if not norm:
            continue
        matcher.set_seq1(norm)
        if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best and matcher.ratio() > best:
            best, best_i = matcher.ratio(), i
    if best_i is None:
        return "(the file has no text)", None
    return f"{lines[best_i].strip()} (similarity {best:.2f})", best_i + 1


def check_call(tree: Path, call: RecipeCall) -> CitationCheck:
    """One citation against ``tree`` (the root the recipe's paths are relative to)."""
    cited = parse_at(call.at)
    if not call.quote:
        return CitationCheck(call.call, call.at, "", UNQUOTED)
    path = tree / cited.path
    if not path.is_file():
        return CitationCheck(call.call, call.at, call.quote, CHANGED, nearest=f"{cited.path} is not in the source")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    want = _norm(call.quote)
    hits = [i + 1 for i, line in enumerate(lines) if _norm(line) == want]
    if not hits:
        text, where = _nearest(lines, call.quote)
        return CitationCheck(call.call, call.at, call.quote, CHANGED, nearest=text, nearest_line=where)
    inside = [h for h in hits if cited.covers(h)]
    if inside:
        return CitationCheck(call.call, call.at, call.quote, OK, line=inside[0])
    moved = min(hits, key=lambda h: abs(h - cited.first))
    return CitationCheck(call.call, call.at, call.quote, MOVED, line=moved)


def check_recipe(recipe: Recipe, tree: Path, source: str, release_pins: tuple[str, ...] = ()) -> FrameworkDrift:
    """Every citation of ``recipe`` against ``tree``, and its vllm pin against the release's."""
    return FrameworkDrift(recipe.name, source, tuple(check_call(tree, c) for c in recipe.calls), pin=recipe.pin,
                          release_pins=release_pins)


def skipped(recipe: Recipe, why: str) -> FrameworkDrift:
    return FrameworkDrift(recipe.name, "", skipped=why)


def any_drift(results: Iterable[FrameworkDrift]) -> bool:
    return any(r.drift for r in results)
