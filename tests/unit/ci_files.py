"""Static checks of the CI files (.github/workflows/nightly.yml, .buildkite/pipeline.yml).

Each file is read with pyyaml and expanded as its CI would (GitHub: matrix with include/exclude,
``${{ matrix.KEY }}``, steps whose ``if:`` is false for the combination dropped; Buildkite: matrix with
adjustments, ``{{matrix}}``, the ``$NAME``/``$$`` interpolation of ``buildkite-agent pipeline upload``).
Each script is split into simple commands with :mod:`shlex`, and each command is checked: ``tox -e ENV``
against tox.ini (followed into the env's commands with ``{posargs}`` filled in), ``vllm-repro ...``
against ``harness.frontends.cli.build_parser()`` and, for ``matrix``, the CLI's own value parsers
(``matrix_axes``, versions, ``--inject``), ``.[extra]`` installs against pyproject.toml, and anything
else against a short list of known programs so that a typo in a program name fails too.

The shell reading covers what the CI files use (quotes, comments, ``\\``-continued lines, ``;``, ``&&``,
``||``, ``|``, newlines, redirections, ``if``/``for`` and leading ``NAME=value``); unquoted command
substitution, subshells and here-documents are refused, so nothing goes unchecked silently.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import functools
import io
import itertools
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.core.errors import BadInput, ReproError
from harness.envbuild.index_releases import Release
from harness.frontends.cli import build_parser
from harness.frontends.commands.matrix import matrix_axes
from harness.plan.faults import parse_inject
from harness.plan.matrix import PLATFORMS, parse_versions
from harness.plan.platforms import choose_wheels

# ("vlm-repro", "toxx") cannot pass as "some other tool".
KNOWN_PROGRAMS = frozenset({"[", "test", "echo", "cat", "cp", "mkdir", "exit", "shopt", "true", "date",
                            "nvidia-smi", "pip", "uv", "buildkite-agent"})
BUILDKITE_AGENT_COMMANDS = frozenset({"annotate", "artifact", "meta-data", "pipeline"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_PREFIX_WORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time"})
_SKIP_WORDS = frozenset({"fi", "done", "esac", "for", "case", "function"})
_PUNCTUATION = ";&|()<>\n"
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=.*", re.S)
# Quoted strings (kept), comments (dropped), and what cannot be read statically (refused), left to right.
_SHELL_SCAN = re.compile(r"""'[^']*'|"(?:\\[\s\S]|[^"\\])*"|(?:^|(?<=\s))#[^\n]*|`|\$\(|<<""", re.M)
_GH_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_BK_MATRIX = re.compile(r"\{\{\s*matrix(?:\.([\w-]+))?\s*\}\}")
_BK_DOLLAR = re.compile(r"\$(\$|\{([A-Za-z_]\w*)[^}]*\}|([A-Za-z_]\w*)|.?)")
_CRON_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
                ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
                ("day of week", 0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")))


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
    """Env names (``[testenv:NAME]`` sections and ``envlist``) and each env's command lines."""
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.read_string(tox_ini.read_text())
    envlist = tuple(e for e in re.split(r"[\s,]+", cp.get("tox", "envlist", fallback="")) if e)
    base = cp.get("testenv", "commands", fallback="")

    def lines(raw: str) -> tuple[str, ...]:
        return tuple(ln.strip() for ln in raw.replace("\\\n", " ").splitlines() if ln.strip()[:1] not in ("", "#"))

    envs = {name: lines(base) for name in envlist}
    envs |= {s.partition(":")[2]: lines(cp.get(s, "commands", fallback=base))
             for s in cp.sections() if s.startswith("testenv:")}
    return ToxConfig(root=tox_ini.parent.resolve(), envs=envs, envlist=envlist)


def cron_problems(expr: str) -> list[str]:
    """Problems with a 5-field cron expression (GitHub's syntax: numbers, names, *, ranges, steps, lists)."""
    fields = expr.split()
    if len(fields) != 5:
        return [f"cron {expr!r} has {len(fields)} fields; it needs 5 (minute hour day-of-month month day-of-week)"]
    return [f"cron {expr!r}: bad {name} field {field!r} (allowed {lo}-{hi})"
            for field, (name, lo, hi, names) in zip(fields, _CRON_FIELDS, strict=True)
            if not all(_cron_part_ok(part, lo, hi, names) for part in field.split(","))]


def _cron_part_ok(part: str, lo: int, hi: int, names: Sequence[str]) -> bool:
    m = re.fullmatch(r"(\*|\w+(?:-\w+)?)(?:/(\d+))?", part)
    if not m or (m.group(2) is not None and int(m.group(2)) < 1):
        return False
    if m.group(1) == "*":
        return True
    try:  # a name counts from the field's lowest value: jan=1, sun=0
        values = [int(b) if b.isdigit() else names.index(b.lower()) + lo for b in m.group(1).split("-")]
    except ValueError:
        return False
    return all(lo <= v <= hi for v in values) and values == sorted(values)


# ---------------------------------------------------------------------------------------------- GitHub


def github_triggers(workflow: Mapping[Any, Any]) -> dict[str, Any]:
    """The workflow's ``on:`` as a mapping (YAML 1.1 reads a bare ``on`` key as True)."""
    raw = workflow.get("on", workflow.get(True))
    return {raw: None} if isinstance(raw, str) else dict.fromkeys(raw) if isinstance(raw, list) else dict(raw or {})


def expand_github_matrix(matrix: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The job combinations of ``strategy.matrix``, with GitHub's include/exclude rules.

    An include entry is merged into every base combination whose *original* values it does not contradict
    (values added by earlier includes may be overwritten); one that fits none becomes a combination of its
    own. Exclude entries remove the base combinations they match.
    """
    if not matrix:
        return [{}]
    dims = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    for key, values in dims.items():
        if not isinstance(values, list):
            raise BadInput(f"matrix dimension {key!r} must be a list to be checked statically, got {values!r}")
    base = [dict(zip(dims, combo, strict=True)) for combo in itertools.product(*dims.values())] if dims else []
    base = [c for c in base if not any(all(c.get(k) == v for k, v in ex.items()) for ex in matrix.get("exclude") or [])]
    originals = [dict(c) for c in base]
    extra: list[dict[str, Any]] = []
    for inc in matrix.get("include") or []:
        fits = [c for orig, c in zip(originals, base, strict=True) if all(orig.get(k, v) == v for k, v in inc.items())]
        for combo in fits:
            combo.update(inc)
        extra += [] if fits else [dict(inc)]
    return base + extra


def github_substitute(value: Any, combo: Mapping[str, Any], problems: list[str], where: str) -> Any:
    """``${{ matrix.KEY }}`` replaced by the combination's value (a lone expression keeps its type), in
    strings, lists and mappings. Other expressions (github.*, steps.*) do not change which commands run and
    are left as they are; a matrix key that does not exist is a problem."""
    if isinstance(value, Mapping):
        return {k: github_substitute(v, combo, problems, where) for k, v in value.items()}
    if isinstance(value, list):
        return [github_substitute(v, combo, problems, where) for v in value]
    if not isinstance(value, str):
        return value

    def lookup(m: re.Match[str]) -> Any:
        key = re.fullmatch(r"matrix\.([\w-]+)", m.group(1))
        if key and key.group(1) in combo:
            return combo[key.group(1)]
        if key:
            problems.append(f"{where}: {m.group(0)} names no matrix key (keys: {', '.join(sorted(combo)) or 'none'})")
        elif "matrix." in m.group(1):
            problems.append(f"{where}: cannot evaluate {m.group(0)} statically; use a plain ${{{{ matrix.KEY }}}}")
        return m.group(0)

    lone = _GH_EXPR.fullmatch(value.strip())
    if lone:
        return lookup(lone)
    return _GH_EXPR.sub(lambda m: " ".join(map(str, v)) if isinstance(v := lookup(m), list) else str(v), value)


def github_condition(expr: Any, combo: Mapping[str, Any]) -> bool | None:
    """An ``if:`` made of ``&&``-joined status functions and ``matrix.K ==/!= 'v'`` terms; None if other."""
    text = str(expr).strip() if expr is not None else "always()"
    text = m.group(1) if (m := _GH_EXPR.fullmatch(text)) else text
    if "||" in text or "(" in text.replace("()", ""):
        return None
    result = True
    for term in (t.strip() for t in text.split("&&")):
        if term in ("always()", "success()", "!cancelled()"):
            continue
        cmp = re.fullmatch(r"matrix\.([\w-]+)\s*(==|!=)\s*'([^']*)'", term)
        if not cmp or cmp.group(1) not in combo:
            return None
        result = result and (str(combo[cmp.group(1)]) == cmp.group(3)) == (cmp.group(2) == "==")
    return result


def github_jobs(workflow: Mapping[Any, Any], file: str = "nightly.yml") -> tuple[list[Job], list[str]]:
    """Every (job, matrix combination) with its steps substituted; problems found on the way."""
    problems: list[str] = []
    jobs: list[Job] = []
    for job_id, job in (workflow.get("jobs") or {}).items():
        for combo in expand_github_matrix((job.get("strategy") or {}).get("matrix")):
            label = ", ".join(f"{k}={v}" for k, v in combo.items() if not isinstance(v, list | dict))
            where_job = f"{file}: job {job_id}" + (f" [{label}]" if label else "")
            runs_on = github_substitute(job.get("runs-on"), combo, problems, f"{where_job} runs-on")
            scripts: list[Script] = []
            steps: list[dict[str, Any]] = []
            for n, raw in enumerate(job.get("steps") or [], 1):
                where = f"{where_job}, step {n} ({raw.get('name') or raw.get('uses') or 'run'})"
                if github_condition(raw.get("if"), combo) is not False:
                    steps.append(github_substitute(raw, combo, problems, where))
                    scripts += [Script(where, str(steps[-1]["run"]))] if "run" in raw else []
            runner = tuple(runs_on) if isinstance(runs_on, list) else (str(runs_on),)
            jobs.append(Job("github", job_id, combo, runner, tuple(scripts), tuple(steps), job))
    return jobs, problems


# ---------------------------------------------------------------------------------------------- Buildkite


def buildkite_steps(pipeline: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every step, with ``group`` steps flattened."""
    steps = [s for s in pipeline.get("steps") or [] if isinstance(s, Mapping)]
    return [inner for s in steps for inner in (buildkite_steps(s) if "group" in s else [s])]


def expand_buildkite_matrix(matrix: Any) -> list[Any]:
    """Matrix values of a Buildkite step: scalars for the one-dimension forms, dicts for ``setup`` dims.

    ``adjustments`` add combinations (``with`` not in the matrix) or remove them (``skip``).
    """
    if matrix is None or isinstance(matrix, list):
        return [None] if matrix is None else list(matrix)
    setup = matrix.get("setup")
    values = list(setup) if isinstance(setup, list) else [
        dict(zip(setup, c, strict=True)) for c in itertools.product(*setup.values())]
    for adj in matrix.get("adjustments") or []:
        if adj.get("skip"):
            values = [v for v in values if v != adj["with"]]
        elif adj["with"] not in values:
            values.append(adj["with"])
    return values


def buildkite_interpolate_matrix(text: str, value: Any, problems: list[str], where: str) -> str:
    """``{{matrix}}`` / ``{{matrix.KEY}}`` replaced by the job's matrix value."""

    def repl(m: re.Match[str]) -> str:
        key, is_map = m.group(1), isinstance(value, Mapping)
        if value is not None and (key is None) != is_map and (key is None or key in value):
            return str(value if key is None else value[key])
        problems.append(f"{where}: {m.group(0)} does not match the matrix value {value!r}")
        return m.group(0)

    return _BK_MATRIX.sub(repl, text)


def buildkite_upload_interpolate(text: str, top_env: Mapping[str, Any], problems: list[str], where: str) -> str:
    """What ``buildkite-agent pipeline upload`` leaves of a command: ``$$`` -> ``$``, ``$NAME`` expanded.

    ``$NAME`` is replaced at upload time from the uploading agent's environment and the pipeline's
    top-level env, not by the step's shell: a shell variable written that way is a problem (write
    ``$$NAME``); so is a ``$`` before anything but a name (upload rejects it).
    """

    def repl(m: re.Match[str]) -> str:
        name = m.group(2) or m.group(3)
        if m.group(1) == "$" or (name and name in top_env):
            return "$" if m.group(1) == "$" else str(top_env[name])
        if name and name.startswith("BUILDKITE"):
            return f"<{name}>"
        if name:
            problems.append(f"{where}: '{m.group(0)}' is replaced by buildkite-agent pipeline upload (from the "
                            f"uploading agent's environment), not by the step's shell; write '$${m.group(0)[1:]}'")
        else:
            problems.append(f"{where}: unescaped '{m.group(0)}' — buildkite-agent pipeline upload interpolates "
                            f"'$'; write '$${m.group(1)}' for the shell")
        return m.group(0)

    return _BK_DOLLAR.sub(repl, text)


def buildkite_jobs(pipeline: Mapping[str, Any], file: str = "pipeline.yml") -> tuple[list[Job], list[str]]:
    """Every (command step, matrix value) with its commands joined into one script; problems found."""
    problems: list[str] = []
    jobs: list[Job] = []
    for step in buildkite_steps(pipeline):
        raw = step.get("commands", step.get("command"))
        if raw is None:
            continue
        name = str(step.get("key") or step.get("label") or "step")
        for value in expand_buildkite_matrix(step.get("matrix")):
            where = f"{file}: step {name}" + ("" if value is None else f" [matrix={value}]")

            def expand(text: str, where: str = where, value: Any = value) -> str:
                text = buildkite_upload_interpolate(text, pipeline.get("env") or {}, problems, where)
                return buildkite_interpolate_matrix(text, value, problems, where)

            script = expand("\n".join([raw] if isinstance(raw, str) else map(str, raw)))
            agents = step.get("agents") or {}
            runner = tuple(f"{k}={expand(str(v))}" for k, v in agents.items()) if isinstance(agents, Mapping) \
                else tuple(map(str, agents))
            combo = value if isinstance(value, Mapping) else ({} if value is None else {"matrix": value})
            jobs.append(Job("buildkite", name, combo, runner, (Script(where, script),), (), step))
    return jobs, problems


# ---------------------------------------------------------------------------------------------- shell


def shell_commands(script: str) -> list[tuple[str, ...]]:
    """The simple commands of a shell script, as argv tuples (quotes removed, redirections dropped).

    BadInput for what cannot be read statically: unquoted command substitution, subshells,
    here-documents, unterminated quotes.
    """

    def scan(m: re.Match[str]) -> str:
        if m.group(0) in ("`", "$(", "<<"):
            raise BadInput(f"{m.group(0)!r} (command substitution or here-document) at "
                           f"{m.string[m.start():m.start() + 40]!r} cannot be checked; quote it or "
                           "move the command onto its own line")
        return "" if m.group(0).startswith("#") else m.group(0)

    lexer = shlex.shlex(_SHELL_SCAN.sub(scan, script.replace("\\\n", "")), posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
    try:
        tokens = list(lexer)
    except ValueError as exc:  # "No closing quotation"
        raise BadInput(f"{exc} in {script[:60]!r}") from exc
    commands: list[tuple[str, ...]] = []
    words: list[str] = []
    skip = False  # the word after a redirection is its target, not an argument
    for tok in tokens:
        if skip or not set(tok) <= set(_PUNCTUATION):
            words += [] if skip else [tok]
            skip = False
        elif "(" in tok or ")" in tok:
            raise BadInput(f"subshell {tok!r} in {script[:60]!r} is not supported by the CI file checker")
        elif "<" in tok or ">" in tok:
            skip = True
            if words and words[-1].isdigit():
                words.pop()  # `2>&1`: the digits are a file descriptor (shlex does not keep adjacency)
        else:
            _flush(words, commands)
            words = []
    _flush(words, commands)
    return commands


def _flush(words: list[str], commands: list[tuple[str, ...]]) -> None:
    while words and (words[0] in _PREFIX_WORDS or _ASSIGNMENT.fullmatch(words[0])):
        words = words[1:]
    if words and words[0] not in _SKIP_WORDS:
        commands.append(tuple(words))


# ---------------------------------------------------------------------------------------------- checks


def _fake_releases(package: str, index_url: str | None) -> list[Release]:
    tags = ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64")
    return [Release(v, tags, ">=3.10", False) for v in ("0.17.0", "0.21.0", "0.22.0", "0.32.0")]


def _matrix_value_problems(args: argparse.Namespace) -> list[str]:
    """The checks ``vllm-repro matrix`` applies after argparse (axes, versions, fault ids), offline.

    Values that hold a ``$VAR`` are left to run time. Other commands take the same option names as
    free-form filters (``history show --versions``), so only ``matrix`` is checked.
    """
    fixed = argparse.Namespace(**{k: None if isinstance(v, str) and "$" in v else v for k, v in vars(args).items()})
    platform = fixed.platform if fixed.platform in PLATFORMS else "cpu"
    checks: list[Callable[[], object]] = [
        lambda: matrix_axes(fixed, platform),
        lambda: fixed.versions is None or parse_versions(fixed.versions, platform, None, fixed.pre, _fake_releases),
        lambda: not fixed.inject or parse_inject(list(fixed.inject)),
    ]
    problems = [] if fixed.platform in (None, *PLATFORMS) else [
        f"unknown platform {fixed.platform!r}; valid choices: {', '.join(PLATFORMS)}"]
    for check in checks:
        try:
            check()
        except ReproError as exc:
            problems.append(str(exc))
    return problems


def _watch_value_problems(args: argparse.Namespace, root: Path) -> list[str]:
    """The checks ``vllm-repro releases watch`` applies before it lists the index, offline: platform and wheels,
    and that the history it judges from is a committed file (a nightly that pointed it at a missing one would
    exit 2 every night)."""
    fixed = {k: None if isinstance(v, str) and "$" in v else v for k, v in vars(args).items()}
    problems = [] if fixed["platform"] in (None, *PLATFORMS) else [
        f"unknown platform {fixed['platform']!r}; valid choices: {', '.join(PLATFORMS)}"]
    try:
        choose_wheels(fixed["platform"] if fixed["platform"] in PLATFORMS else "cpu", fixed["wheels"])
    except ReproError as exc:
        problems.append(str(exc))
    history = Path(str(args.history))
    if "$" not in str(history) and not (history if history.is_absolute() else root / history).is_file():
        problems.append(f"--history {history} is not a file in the repository")
    return problems


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()  # one parser for every command line: parse_args does not change it


def parse_vllm_repro(argv: Sequence[str]) -> tuple[argparse.Namespace | None, str | None]:
    """``vllm-repro ARGV`` through ``harness.frontends.cli.build_parser()``: (namespace, None) or (None, error)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return _parser().parse_args(list(argv)), None
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, None if exc.code in (0, None) else (lines[-1] if lines else f"argparse exit {exc.code}")


def _extras_problems(argv: Sequence[str], root: Path) -> list[str]:
    wanted = [e for a in argv if (m := re.fullmatch(r"\.\[([\w,-]+)\]", a)) for e in m.group(1).split(",")]
    have = set(tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    return [f"extra {e!r} is not in pyproject.toml's optional-dependencies ({', '.join(sorted(have))})"
            for e in wanted if e not in have]


def _tox_env_commands(argv: Sequence[str], tox: ToxConfig) -> tuple[list[str], list[tuple[str, tuple[str, ...]]]]:
    """(undefined envs, (env, vllm-repro command line)s) of ``tox [-e ENVS] [-- POSARGS]``."""
    args, posargs = (list(argv), []) if "--" not in argv else (list(argv[: argv.index("--")]),
                                                               list(argv[argv.index("--") + 1 :]))
    envs = [e for i, a in enumerate(args) if a in ("-e", "--env") and i + 1 < len(args) for e in args[i + 1].split(",")]
    missing = [e for e in envs or tox.envlist if e not in tox.envs]
    lines = [(e, _tox_expand(line, posargs, tox.root)) for e in envs or tox.envlist for line in tox.envs.get(e, ())]
    return missing, [(e, line) for e, line in lines if line and os.path.basename(line[0]) == "vllm-repro"]


def _tox_expand(line: str, posargs: Sequence[str], root: Path) -> tuple[str, ...]:
    """A tox command line with ``{toxinidir}`` and ``{posargs}`` (or ``{posargs:DEFAULT}``) filled in."""
    out: list[str] = []
    for tok in shlex.split(line.replace("{toxinidir}", str(root))):
        m = re.fullmatch(r"\{posargs(?::(.*))?\}", tok)
        out += (list(posargs) or shlex.split(m.group(1) or "")) if m else [tok]
    return tuple(out)


def check_command(argv: Sequence[str], where: str, tox: ToxConfig) -> tuple[list[str], list[Invocation]]:
    """Problems with one simple command, and the vllm-repro invocations it makes (directly or via tox)."""
    shown = " ".join(shlex.quote(a) for a in argv)
    prog = os.path.basename(argv[0])
    if prog == "tox" or (_PYTHON.fullmatch(prog) and list(argv[1:3]) == ["-m", "tox"]):
        missing, lines = _tox_env_commands(argv[1:] if prog == "tox" else argv[3:], tox)
        problems = [f"{where}: `{shown}`: tox env {e!r} is not defined in tox.ini (defined: "
                    f"{', '.join(sorted(tox.envs))})" for e in missing]
        invocations: list[Invocation] = []
        for env, line in lines:
            p, inv = check_command(line, f"{where} (tox env {env})", tox)
            problems, invocations = problems + p, invocations + inv
        return problems, invocations
    if prog == "vllm-repro":
        args, error = parse_vllm_repro(argv[1:])
        if error or args is None:
            return ([f"{where}: `{shown}` does not parse: {error}"] if error else []), []
        values = _matrix_value_problems(args) if args.command == "matrix" else \
            _watch_value_problems(args, tox.root) if getattr(args, "releases_command", None) == "watch" else []
        return [f"{where}: `{shown}`: {p}" for p in values], [Invocation(where, tuple(argv), args)]
    if _PYTHON.fullmatch(prog) or prog in ("pip", "uv"):
        return [f"{where}: `{shown}`: {p}" for p in _extras_problems(argv, tox.root)], []
    if prog == "buildkite-agent" and argv[1:2] and argv[1] not in BUILDKITE_AGENT_COMMANDS:
        return [f"{where}: `{shown}`: unknown buildkite-agent command"], []
    if prog not in KNOWN_PROGRAMS:
        return [f"{where}: `{shown}`: unknown program {argv[0]!r} (not tox, vllm-repro or one of "
                f"{', '.join(sorted(KNOWN_PROGRAMS))})"], []
    return [], []


def check_jobs(jobs: Sequence[Job], tox: ToxConfig, problems: Sequence[str] = ()) -> Report:
    """Every command of every job checked; the vllm-repro invocations collected."""
    found = list(problems)
    invocations: list[Invocation] = []
    commands: list[tuple[str, tuple[str, ...]]] = []
    for script in (s for job in jobs for s in job.scripts):
        try:
            argvs = shell_commands(script.text)
        except ReproError as exc:
            found.append(f"{script.where}: {exc}")
            continue
        for argv in argvs:
            commands.append((script.where, argv))
            p, inv = check_command(argv, script.where, tox)
            found, invocations = found + p, invocations + inv
    return Report(tuple(jobs), tuple(dict.fromkeys(found)), tuple(invocations), tuple(commands))


def validate_github(workflow_file: Path, tox_ini: Path) -> Report:
    """Load, expand and check a GitHub Actions workflow."""
    jobs, problems = github_jobs(load_yaml(workflow_file), workflow_file.name)
    return check_jobs(jobs, load_tox(tox_ini), problems)


def validate_buildkite(pipeline_file: Path, tox_ini: Path) -> Report:
    """Load, expand and check a Buildkite pipeline."""
    jobs, problems = buildkite_jobs(load_yaml(pipeline_file), pipeline_file.name)
    return check_jobs(jobs, load_tox(tox_ini), problems)
