"""Static validation of the CI definitions (.github/workflows/nightly.yml, .buildkite/pipeline.yml).

Both files are expanded the way their CI would expand them (GitHub matrix with include/exclude and
``${{ matrix.* }}``; Buildkite matrix with adjustments, ``{{matrix}}`` and upload-time ``$NAME``
interpolation), every shell command they run is extracted, and each is checked against what exists here:
``tox -e NAME`` against tox.ini (and through it the env's own commands, with ``{posargs}`` filled in),
``vllm-repro ...`` against ``harness.cli.build_parser()`` plus the value parsers the CLI applies later,
``pip``/``uv`` installs of ``.[extra]`` against pyproject.toml, and everything else against a short list
of known programs, so a typo in a program name fails too.

The shell reader understands what the CI files use: quotes, comments, ``\\``-continued lines, ``;``,
``&&``, ``||``, ``|``, newlines, redirections, ``if``/``then``/``fi``, ``for``/``do``/``done`` and leading
``NAME=value`` assignments. Command substitutions are not looked into when double-quoted and are refused
unquoted (so nothing goes unchecked silently); here-documents are refused.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import io
import itertools
import os
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.cli import build_parser
from harness.commands.matrix import matrix_axes
from harness.errors import BadInput, ReproError
from harness.faults import parse_inject
from harness.matrix import EXECUTORS, MODES, ON_OFF, PLATFORMS, TRUE_FALSE, parse_bools, parse_choices, parse_versions
from harness.versions import Release

# Programs the CI files may call besides tox and vllm-repro; anything else is reported, so that a typo
# ("vlm-repro", "toxx") cannot pass as "some other tool".
KNOWN_PROGRAMS = frozenset({
    "[", "test", "echo", "cat", "cp", "mkdir", "exit", "shopt", "true", "date",
    "nvidia-smi", "pip", "uv", "buildkite-agent",
})
# vllm-repro commands whose --versions/--executor/--mode/... select cells (and are validated like the CLI does).
RUN_COMMANDS = frozenset({"matrix", "bisect", "plan", "workarounds", "envs"})
BUILDKITE_AGENT_COMMANDS = frozenset({"annotate", "artifact", "meta-data", "pipeline"})
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_RESERVED_PREFIX = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time"})
_RESERVED_SKIP = frozenset({"fi", "done", "esac", "for", "case", "function"})
_SEPARATORS = frozenset({";", "&", "&&", "||", "|", "(", ")", ";;", "\n"})
_REDIRECTS = frozenset({"<", ">", ">>", ">&", "&>", "<&", ">|"})
_OPERATORS = ("&&", "||", ";;", ">>", "<<", ">&", "&>", "<&", ">|", ";", "&", "|", "(", ")", "<", ">")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_GH_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_BK_MATRIX = re.compile(r"\{\{\s*matrix(?:\.([A-Za-z0-9_-]+))?\s*\}\}")
_CRON_NAMES = {
    3: ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
    4: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
}
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
_CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")


@dataclass(frozen=True)
class Script:
    """One shell script a job runs (a GitHub ``run:`` or a Buildkite step's joined commands)."""

    where: str
    text: str


@dataclass(frozen=True)
class Job:
    """One concrete job after matrix expansion."""

    ci: str  # "github" or "buildkite"
    name: str  # job id / step key
    combo: Mapping[str, Any]  # its matrix values ({"matrix": v} for a Buildkite one-dimension matrix)
    runner: tuple[str, ...]  # GitHub runs-on labels; Buildkite agent tags as "key=value"
    scripts: tuple[Script, ...]
    steps: tuple[Mapping[str, Any], ...]  # GitHub steps whose `if:` is not false for this combo
    spec: Mapping[str, Any]  # the raw job (GitHub) or step (Buildkite)


@dataclass(frozen=True)
class Invocation:
    """A ``vllm-repro`` command line (reached directly or through tox) that parsed."""

    where: str
    argv: tuple[str, ...]
    args: argparse.Namespace


@dataclass(frozen=True)
class Report:
    """What validating a CI file found."""

    jobs: tuple[Job, ...]
    problems: tuple[str, ...]
    invocations: tuple[Invocation, ...]
    commands: tuple[tuple[str, tuple[str, ...]], ...]  # (where, argv) of every simple command


@dataclass(frozen=True)
class ToxConfig:
    root: Path
    envs: Mapping[str, tuple[str, ...]]  # env name -> its command lines (raw, with {posargs} etc.)
    envlist: tuple[str, ...]


# ---------------------------------------------------------------------------------------------- loading


def load_yaml(path: Path) -> dict[str, Any]:
    """A CI file as a mapping; BadInput when it is not YAML or not a mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BadInput(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInput(f"{path} must hold a YAML mapping at the top, got {type(data).__name__}")
    return data


def load_tox(tox_ini: Path) -> ToxConfig:
    """Env names (``[testenv:NAME]`` sections and ``envlist``) and each env's commands from tox.ini."""
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.read_string(tox_ini.read_text())
    envlist = tuple(e for e in re.split(r"[\s,]+", cp.get("tox", "envlist", fallback="")) if e)
    base = cp.get("testenv", "commands", fallback="") if cp.has_section("testenv") else ""
    envs: dict[str, tuple[str, ...]] = {}
    for name in envlist:
        envs[name] = _tox_command_lines(base)
    for section in cp.sections():
        if section.startswith("testenv:"):
            envs[section.partition(":")[2]] = _tox_command_lines(cp.get(section, "commands", fallback=base))
    return ToxConfig(root=tox_ini.parent.resolve(), envs=envs, envlist=envlist)


def _tox_command_lines(raw: str) -> tuple[str, ...]:
    text = raw.replace("\\\n", " ")
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


# ---------------------------------------------------------------------------------------------- cron


def cron_problems(expr: str) -> list[str]:
    """Problems with a 5-field cron expression (GitHub's syntax: numbers, names, *, ranges, steps, lists)."""
    fields = expr.split()
    if len(fields) != 5:
        return [f"cron {expr!r} has {len(fields)} fields; it needs 5 (minute hour day-of-month month day-of-week)"]
    problems = []
    for idx, field in enumerate(fields):
        lo, hi = _CRON_RANGES[idx]
        for part in field.split(","):
            if not _cron_part_ok(part, idx, lo, hi):
                problems.append(f"cron {expr!r}: bad {_CRON_FIELDS[idx]} field {field!r} (allowed {lo}-{hi})")
                break
    return problems


def _cron_part_ok(part: str, idx: int, lo: int, hi: int) -> bool:
    base, _, step = part.partition("/")
    if step and (not step.isdigit() or int(step) < 1):
        return False
    if base == "*":
        return True
    bounds = base.split("-")
    if len(bounds) > 2:
        return False
    values = []
    for b in bounds:
        names = _CRON_NAMES.get(idx, [])
        if b.lower() in names:
            values.append(names.index(b.lower()) + (1 if idx == 3 else 0))
        elif b.isdigit():
            values.append(int(b))
        else:
            return False
    if any(not lo <= v <= hi for v in values):
        return False
    return len(values) == 1 or values[0] <= values[1]


# ---------------------------------------------------------------------------------------------- GitHub


def github_triggers(workflow: Mapping[Any, Any]) -> dict[str, Any]:
    """The workflow's ``on:`` as a mapping (YAML 1.1 reads a bare ``on`` key as True)."""
    raw = workflow.get("on", workflow.get(True))
    if isinstance(raw, str):
        return {raw: None}
    if isinstance(raw, list):
        return dict.fromkeys(raw)
    return dict(raw or {})


def expand_github_matrix(matrix: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The job combinations of ``strategy.matrix``, with GitHub's include/exclude rules.

    An include entry is merged into every base combination whose *original* values it does not contradict
    (values added by earlier includes may be overwritten); one that fits none becomes a combination of its
    own. Exclude entries remove the base combinations they match.
    """
    if not matrix:
        return [{}]
    if not isinstance(matrix, Mapping):
        raise BadInput(f"strategy.matrix must be a mapping to be checked statically, got {matrix!r}")
    dims = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    for key, values in dims.items():
        if not isinstance(values, list):
            raise BadInput(f"matrix dimension {key!r} must be a list to be checked statically, got {values!r}")
    base = [dict(zip(dims, combo, strict=True)) for combo in itertools.product(*dims.values())] if dims else []
    for ex in matrix.get("exclude") or []:
        base = [c for c in base if not all(c.get(k) == v for k, v in ex.items())]
    originals = [dict(c) for c in base]
    extra: list[dict[str, Any]] = []
    for inc in matrix.get("include") or []:
        matched = False
        for orig, combo in zip(originals, base, strict=True):
            if all(k not in orig or orig[k] == v for k, v in inc.items()):
                combo.update(inc)
                matched = True
        if not matched:
            extra.append(dict(inc))
    return base + extra


def _gh_value(expr: str, combo: Mapping[str, Any]) -> Any:
    m = re.fullmatch(r"matrix\.([A-Za-z0-9_-]+)", expr)
    if not m:
        raise KeyError(expr)
    if m.group(1) not in combo:
        raise LookupError(f"${{{{ {expr} }}}} names no matrix key (keys: {', '.join(sorted(combo)) or 'none'})")
    return combo[m.group(1)]


def github_substitute(value: Any, combo: Mapping[str, Any], problems: list[str], where: str) -> Any:
    """``${{ matrix.KEY }}`` replaced by the combination's value; a lone expression keeps its type.

    Other expressions (github.*, steps.*, env.*) are left as they are: they do not change which commands
    run. A matrix key that does not exist is a problem.
    """
    if not isinstance(value, str):
        return value
    lone = _GH_EXPR.fullmatch(value.strip())
    if lone:
        try:
            return _gh_value(lone.group(1), combo)
        except KeyError:
            return value
        except LookupError as exc:
            problems.append(f"{where}: {exc}")
            return value

    def repl(m: re.Match[str]) -> str:
        try:
            v = _gh_value(m.group(1), combo)
        except KeyError:
            if "matrix." in m.group(1):
                problems.append(f"{where}: cannot evaluate {m.group(0)} statically; use a plain ${{{{ matrix.KEY }}}}")
            return m.group(0)
        except LookupError as exc:
            problems.append(f"{where}: {exc}")
            return m.group(0)
        return v if isinstance(v, str) else " ".join(map(str, v)) if isinstance(v, list) else str(v)

    return _GH_EXPR.sub(repl, value)


def github_condition(expr: Any, combo: Mapping[str, Any]) -> bool | None:
    """An ``if:`` made of ``&&``-joined status functions and ``matrix.K ==/!= 'v'`` terms; None if other."""
    if expr is None:
        return True
    text = str(expr).strip()
    m = _GH_EXPR.fullmatch(text)
    if m:
        text = m.group(1)
    if "||" in text or "(" in text.replace("()", ""):
        return None
    result = True
    for term in (t.strip() for t in text.split("&&")):
        if term in ("always()", "success()", "!cancelled()"):
            continue
        cmp = re.fullmatch(r"matrix\.([A-Za-z0-9_-]+)\s*(==|!=)\s*'([^']*)'", term)
        if not cmp or cmp.group(1) not in combo:
            return None
        equal = str(combo[cmp.group(1)]) == cmp.group(3)
        result = result and (equal if cmp.group(2) == "==" else not equal)
    return result


def github_jobs(workflow: Mapping[Any, Any], file: str = "nightly.yml") -> tuple[list[Job], list[str]]:
    """Every (job, matrix combination) with its run scripts substituted; problems found on the way."""
    problems: list[str] = []
    jobs: list[Job] = []
    for job_id, job in (workflow.get("jobs") or {}).items():
        try:
            combos = expand_github_matrix((job.get("strategy") or {}).get("matrix"))
        except ReproError as exc:
            problems.append(f"{file}: job {job_id}: {exc}")
            continue
        for combo in combos:
            label = ", ".join(f"{k}={v}" for k, v in combo.items() if not isinstance(v, list | dict))
            where_job = f"{file}: job {job_id}" + (f" [{label}]" if label else "")
            runs_on = github_substitute(job.get("runs-on"), combo, problems, f"{where_job} runs-on")
            runner = tuple(runs_on) if isinstance(runs_on, list) else (str(runs_on),)
            scripts: list[Script] = []
            steps: list[Mapping[str, Any]] = []
            for n, step in enumerate(job.get("steps") or [], 1):
                where = f"{where_job}, step {n} ({step.get('name') or step.get('uses') or 'run'})"
                cond = github_condition(step.get("if"), combo)
                if cond is False:
                    continue
                steps.append({k: github_substitute(v, combo, problems, where) for k, v in step.items()})
                if "run" in step:
                    scripts.append(Script(where, str(github_substitute(step["run"], combo, problems, where))))
            jobs.append(Job("github", job_id, combo, runner, tuple(scripts), tuple(steps), job))
    return jobs, problems


# ---------------------------------------------------------------------------------------------- Buildkite


def buildkite_steps(pipeline: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every step, with ``group`` steps flattened."""
    out: list[Mapping[str, Any]] = []

    def walk(steps: Sequence[Any]) -> None:
        for step in steps or []:
            if isinstance(step, Mapping) and "group" in step:
                walk(step.get("steps") or [])
            elif isinstance(step, Mapping):
                out.append(step)

    walk(pipeline.get("steps") or [])
    return out


def expand_buildkite_matrix(matrix: Any) -> list[Any]:
    """Matrix values of a Buildkite step: scalars for the one-dimension forms, dicts for ``setup`` dims.

    ``adjustments`` add combinations (``with`` not in the matrix) or remove them (``skip``).
    """
    if matrix is None:
        return [None]
    if isinstance(matrix, list):
        return list(matrix)
    setup = matrix.get("setup")
    if isinstance(setup, list):
        values: list[Any] = list(setup)
    elif isinstance(setup, Mapping):
        values = [dict(zip(setup, c, strict=True)) for c in itertools.product(*setup.values())]
    else:
        raise BadInput(f"matrix.setup must be a list or a mapping, got {setup!r}")
    for adj in matrix.get("adjustments") or []:
        target = adj.get("with")
        if adj.get("skip"):
            values = [v for v in values if v != target]
        elif target not in values:
            values.append(target)
    return values


def buildkite_interpolate_matrix(text: str, value: Any, problems: list[str], where: str) -> str:
    """``{{matrix}}`` / ``{{matrix.KEY}}`` replaced by the job's matrix value."""

    def repl(m: re.Match[str]) -> str:
        key = m.group(1)
        if value is None:
            problems.append(f"{where}: {m.group(0)} in a step without a matrix")
        elif key is None and not isinstance(value, Mapping):
            return str(value)
        elif key is not None and isinstance(value, Mapping) and key in value:
            return str(value[key])
        else:
            problems.append(f"{where}: {m.group(0)} does not match the matrix value {value!r}")
        return m.group(0)

    return _BK_MATRIX.sub(repl, text)


def buildkite_upload_interpolate(text: str, top_env: Mapping[str, Any], problems: list[str], where: str) -> str:
    """What ``buildkite-agent pipeline upload`` leaves of a command: ``$$`` -> ``$``, ``$NAME`` expanded.

    ``$NAME`` is replaced at upload time from the uploading agent's environment and the pipeline's
    top-level env, not by the step's shell: a shell variable written that way is a problem (write
    ``$$NAME``); so is a ``$`` before anything but a name (upload rejects it).
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        m = re.match(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)", text[i:])
        if not m:
            problems.append(f"{where}: unescaped '${nxt}' — buildkite-agent pipeline upload interpolates '$'; "
                            f"write '$${nxt}' for the shell")
            out.append("$")
            i += 1
            continue
        name = m.group(1) or m.group(2)
        if name in top_env:
            out.append(str(top_env[name]))
        elif name.startswith("BUILDKITE"):
            out.append(f"<{name}>")
        else:
            problems.append(f"{where}: '{m.group(0)}' is replaced by buildkite-agent pipeline upload (from the "
                            f"uploading agent's environment), not by the step's shell; write '$${m.group(0)[1:]}'")
            out.append(m.group(0))
        i += len(m.group(0))
    return "".join(out)


def buildkite_jobs(pipeline: Mapping[str, Any], file: str = "pipeline.yml") -> tuple[list[Job], list[str]]:
    """Every (command step, matrix value) with its commands joined into one script; problems found."""
    problems: list[str] = []
    jobs: list[Job] = []
    top_env = pipeline.get("env") or {}
    for step in buildkite_steps(pipeline):
        raw = step.get("commands", step.get("command"))
        if raw is None:
            continue
        lines = [raw] if isinstance(raw, str) else [str(c) for c in raw]
        name = str(step.get("key") or step.get("label") or "step")
        try:
            values = expand_buildkite_matrix(step.get("matrix"))
        except ReproError as exc:
            problems.append(f"{file}: step {name}: {exc}")
            continue
        for value in values:
            where = f"{file}: step {name}" + ("" if value is None else f" [matrix={value}]")
            text = "\n".join(lines)
            text = buildkite_upload_interpolate(text, top_env, problems, where)
            text = buildkite_interpolate_matrix(text, value, problems, where)
            agents = step.get("agents") or {}
            if isinstance(agents, Mapping):
                runner = tuple(f"{k}={buildkite_interpolate_matrix(str(v), value, problems, where)}"
                               for k, v in agents.items())
            else:
                runner = tuple(str(a) for a in agents)
            combo = value if isinstance(value, Mapping) else ({} if value is None else {"matrix": value})
            jobs.append(Job("buildkite", name, combo, runner, (Script(where, text),), (), step))
    return jobs, problems


# ---------------------------------------------------------------------------------------------- shell


def shell_commands(script: str) -> list[tuple[str, ...]]:
    """The simple commands of a shell script, as argv tuples (quotes removed, redirections dropped).

    BadInput for constructs whose commands cannot be read statically (unquoted command substitution,
    here-documents, unterminated quotes).
    """
    commands: list[tuple[str, ...]] = []
    current: list[str] = []
    tokens = list(_lex(script))
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "op" and text in _SEPARATORS:
            _flush(current, commands)
            current = []
        elif kind == "op" and text in _REDIRECTS:
            i += 1  # the redirection's target is not an argument
        elif kind == "op":
            raise BadInput(f"shell operator {text!r} (here-document) is not supported by the CI file checker")
        else:
            current.append(text)
        i += 1
    _flush(current, commands)
    return commands


def _flush(words: list[str], commands: list[tuple[str, ...]]) -> None:
    while words and (words[0] in _RESERVED_PREFIX or _ASSIGNMENT.match(words[0])):
        words = words[1:]
    if words and words[0] not in _RESERVED_SKIP:
        commands.append(tuple(words))


def _lex(s: str) -> Iterator[tuple[str, str]]:
    """("word", text) and ("op", text) tokens of a bash script; newlines are "op" tokens."""
    word: list[str] = []
    started = quoted = False
    i, n = 0, len(s)

    def end() -> Iterator[tuple[str, str]]:
        nonlocal word, started, quoted
        if started:
            yield "word", "".join(word)
        word, started, quoted = [], False, False

    while i < n:
        c = s[i]
        if c == "\\" and s[i + 1 : i + 2] == "\n":
            i += 2
        elif c in " \t\r":
            yield from end()
            i += 1
        elif c == "\n":
            yield from end()
            yield "op", "\n"
            i += 1
        elif c == "#" and not started:
            while i < n and s[i] != "\n":
                i += 1
        elif c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                raise BadInput(f"unterminated single quote in {s[i:i + 40]!r}")
            word.append(s[i + 1 : j])
            started = quoted = True
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n and s[j] != '"':
                if s[j] == "\\" and s[j + 1 : j + 2] in ('"', "\\", "$", "`", "\n"):
                    word.append(s[j + 1] if s[j + 1] != "\n" else "")
                    j += 2
                    continue
                word.append(s[j])
                j += 1
            if j >= n:
                raise BadInput(f"unterminated double quote in {s[i:i + 40]!r}")
            started = quoted = True
            i = j + 1
        elif c == "\\":
            word.append(s[i + 1 : i + 2])
            started = True
            i += 2
        elif c == "`" or (c == "$" and s[i + 1 : i + 2] == "("):
            raise BadInput(f"unquoted command substitution at {s[i:i + 40]!r} cannot be checked; "
                           "quote it or move the command onto its own line")
        elif c in ";&|()<>":
            if c in "<>" and started and not quoted and "".join(word).isdigit():
                word, started = [], False  # `2>&1`: the digits are a file descriptor
            yield from end()
            op = next(o for o in _OPERATORS if s.startswith(o, i))
            yield "op", op
            i += len(op)
        else:
            word.append(c)
            started = True
            i += 1
    yield from end()


# ---------------------------------------------------------------------------------------------- checks


def _fake_releases(package: str, index_url: str | None) -> list[Release]:
    tags = ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64")
    return [Release(v, tags, ">=3.10", False) for v in ("0.17.0", "0.21.0", "0.22.0", "0.32.0")]


def _value_problems(args: argparse.Namespace) -> list[str]:
    """The checks the CLI applies after argparse (choices, versions syntax, fault ids), offline.

    Only for the commands that run cells: elsewhere (``history show --versions``) the same option names
    are free-form filters.
    """
    if args.command not in RUN_COMMANDS:
        return []
    def static(name: str) -> Any:
        v = getattr(args, name, None)
        return None if v is None or (isinstance(v, str) and "$" in v) else v

    problems: list[str] = []
    platform = static("platform")
    if platform is not None and platform not in PLATFORMS:
        problems.append(f"unknown platform {platform!r}; valid choices: {', '.join(PLATFORMS)}")
    if args.command == "matrix":
        # Exactly the CLI's own axis parsing, on the values fixed in the file (a $VAR is left to run time).
        fixed = argparse.Namespace(**{k: static(k) for k in vars(args)})
        try:
            matrix_axes(fixed, platform if platform in PLATFORMS else "cpu")
        except ReproError as exc:
            problems.append(str(exc))
    axes = [] if args.command == "matrix" else [
        ("executor", lambda v: parse_choices("executor", v, EXECUTORS, EXECUTORS)),
        ("mode", lambda v: parse_choices("mode", v, MODES, MODES)),
        ("async_", lambda v: parse_bools("async setting", v, ON_OFF, (False, True))),
        ("clear_cache", lambda v: parse_bools("clear-cache value", v, TRUE_FALSE, (True, False))),
    ]
    checks = [
        *axes,
        ("versions", lambda v: parse_versions(v, platform if platform in PLATFORMS else "cpu",
                                              None, bool(getattr(args, "pre", False)), fetch=_fake_releases)),
    ]
    for name, check in checks:
        value = static(name)
        if isinstance(value, str):
            try:
                check(value)
            except ReproError as exc:
                problems.append(str(exc))
    inject = getattr(args, "inject", None)
    if inject:
        try:
            parse_inject([inject] if isinstance(inject, str) else list(inject))
        except ReproError as exc:
            problems.append(str(exc))
    return problems


def parse_vllm_repro(argv: Sequence[str]) -> tuple[argparse.Namespace | None, str | None]:
    """``vllm-repro ARGV`` through ``harness.cli.build_parser()``: (namespace, None) or (None, error)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(list(argv))
    except SystemExit as exc:
        if exc.code in (0, None):
            return None, None  # --help / --version
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, lines[-1] if lines else f"argparse exit {exc.code}"
    return args, None


def _extras_problems(argv: Sequence[str], root: Path) -> list[str]:
    wanted = [m.group(1) for a in argv if (m := re.fullmatch(r"\.\[([A-Za-z0-9_,-]+)\]", a))]
    if not wanted:
        return []
    data = tomllib.loads((root / "pyproject.toml").read_text())
    have = set((data.get("project") or {}).get("optional-dependencies") or {})
    return [f"extra {e!r} is not in pyproject.toml's optional-dependencies ({', '.join(sorted(have))})"
            for group in wanted for e in group.split(",") if e not in have]


def _tox_targets(argv: Sequence[str], tox: ToxConfig) -> tuple[list[str], list[str], list[str]]:
    """(env names, posargs, problems) of a tox command line."""
    args = list(argv[1:])
    posargs: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, posargs = args[:cut], args[cut + 1 :]
    envs: list[str] = []
    problems: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-e", "--env"):
            if i + 1 >= len(args):
                problems.append("tox -e needs an env name")
                break
            envs += args[i + 1].split(",")
            i += 2
            continue
        if a.startswith("-e") and len(a) > 2:
            envs += a[2:].lstrip("=").split(",")
        i += 1
    if not envs:
        envs = list(tox.envlist)
    return envs, posargs, problems


def _tox_expand(line: str, posargs: Sequence[str], root: Path) -> tuple[str, ...]:
    out: list[str] = []
    for tok in shlex.split(line.replace("{toxinidir}", str(root))):
        m = re.fullmatch(r"\{posargs(?::(.*))?\}", tok)
        if m:
            out += list(posargs) if posargs else (shlex.split(m.group(1)) if m.group(1) else [])
        else:
            out.append(tok)
    return tuple(out)


def check_command(argv: Sequence[str], where: str, tox: ToxConfig) -> tuple[list[str], list[Invocation]]:
    """Problems with one simple command, and the vllm-repro invocations it makes (directly or via tox)."""
    shown = " ".join(shlex.quote(a) for a in argv)
    prog = os.path.basename(argv[0])
    if prog == "tox" or (_PYTHON.match(prog) and list(argv[1:3]) == ["-m", "tox"]):
        rest = argv if prog == "tox" else ("tox", *argv[3:])
        envs, posargs, problems = _tox_targets(rest, tox)
        problems = [f"{where}: `{shown}`: {p}" for p in problems]
        invocations: list[Invocation] = []
        for env in envs:
            if env not in tox.envs:
                problems.append(f"{where}: `{shown}`: tox env {env!r} is not defined in tox.ini "
                                f"(defined: {', '.join(sorted(tox.envs))})")
                continue
            for line in tox.envs[env]:
                inner = _tox_expand(line, posargs, tox.root)
                if inner and os.path.basename(inner[0]) == "vllm-repro":
                    p, inv = check_command(inner, f"{where} (tox env {env})", tox)
                    problems += p
                    invocations += inv
        return problems, invocations
    if prog == "vllm-repro":
        args, error = parse_vllm_repro(argv[1:])
        if error:
            return [f"{where}: `{shown}` does not parse: {error}"], []
        if args is None:
            return [], []
        values = _value_problems(args)
        return [f"{where}: `{shown}`: {p}" for p in values], [Invocation(where, tuple(argv), args)]
    if _PYTHON.match(prog) or prog in ("pip", "uv"):
        return [f"{where}: `{shown}`: {p}" for p in _extras_problems(argv, tox.root)], []
    if prog == "buildkite-agent":
        if len(argv) < 2 or argv[1] not in BUILDKITE_AGENT_COMMANDS:
            return [f"{where}: `{shown}`: unknown buildkite-agent command"], []
        return [], []
    if prog not in KNOWN_PROGRAMS:
        return [f"{where}: `{shown}`: unknown program {argv[0]!r} (not tox, vllm-repro or one of "
                f"{', '.join(sorted(KNOWN_PROGRAMS))})"], []
    return [], []


def check_jobs(jobs: Sequence[Job], tox: ToxConfig, problems: Sequence[str] = ()) -> Report:
    """Every command of every job checked; the vllm-repro invocations collected."""
    found = list(problems)
    invocations: list[Invocation] = []
    commands: list[tuple[str, tuple[str, ...]]] = []
    for job in jobs:
        for script in job.scripts:
            try:
                argvs = shell_commands(script.text)
            except ReproError as exc:
                found.append(f"{script.where}: {exc}")
                continue
            for argv in argvs:
                commands.append((script.where, argv))
                p, inv = check_command(argv, script.where, tox)
                found += p
                invocations += inv
    return Report(tuple(jobs), tuple(dict.fromkeys(found)), tuple(invocations), tuple(commands))


def validate_github(workflow_file: Path, tox_ini: Path) -> Report:
    """Load, expand and check a GitHub Actions workflow."""
    jobs, problems = github_jobs(load_yaml(workflow_file), workflow_file.name)
    return check_jobs(jobs, load_tox(tox_ini), problems)


def validate_buildkite(pipeline_file: Path, tox_ini: Path) -> Report:
    """Load, expand and check a Buildkite pipeline."""
    jobs, problems = buildkite_jobs(load_yaml(pipeline_file), pipeline_file.name)
    return check_jobs(jobs, load_tox(tox_ini), problems)
