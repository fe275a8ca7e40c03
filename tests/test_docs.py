"""The README and the manual in docs/: the site builds clean, and every example runs.

* ``mkdocs build --strict`` (warnings are errors: a broken link, a missing
  page, an API name that no longer exists) into a temporary directory; the
  CLI reference it generates names every command of the real parser.
* Every fenced ``python`` block of README.md and docs/ runs as a script in a
  process of its own, on interface ``lo`` with a free beacon port
  (``PEERMESH_INTERFACE`` / ``PEERMESH_PORT``) and a temporary working
  directory. A block preceded by ``<!-- test: needs spark -->`` runs only where
  pyspark and Java are installed; ``<!-- test: skip REASON -->`` skips it with
  that reason. No block is left out silently.
  An example fails when it exits non-zero or logs a traceback.
* The README's two commands: the first one's ``peermesh`` part starts a peer
  that stops cleanly on Ctrl-C; the second is exactly what ``.ci/run`` runs.
  The tour's two terminals: every command of the second reaches the first.
* Every ``peermesh ...`` line of the ``sh`` blocks parses with the real parser.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from cliprocess import Cli, CliProcess, _report

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
DIRECTIVE = re.compile(r"<!--\s*test:\s*(.*?)\s*-->\s*$")
EXAMPLE_TIMEOUT = 90.0  # a generous bound; the examples take a second or two each
SPARK_TIMEOUT = 300.0   # a local Spark session alone takes 10-25 s to start


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    code: str
    directive: Optional[str]  # "needs spark", "skip REASON" or None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fenced(path: Path) -> list[tuple[str, int, str, Optional[str]]]:
    """(language, first line of the code, code, test directive) of each fenced block."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 2
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directive = DIRECTIVE.search(before)
        blocks.append((match.group(1), line, match.group(2),
                       directive.group(1) if directive else None))
    return blocks


def examples() -> list[Example]:
    return [Example(page, line, code, directive)
            for page in PAGES for lang, line, code, directive in fenced(page)
            if lang == "python"]


def test_every_page_has_runnable_examples_or_says_why_not() -> None:
    found = examples()
    assert any(e.page.name == "README.md" for e in found)
    for example in found:
        directive = example.directive
        assert directive is None or directive == "needs spark" or (
            directive.startswith("skip ") and len(directive) > 10), \
            f"{example.id}: unknown test directive {directive!r}"


# --------------------------------------------------------------------------
# The site


def test_docs_build_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f"{module} is not installed (pip install '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"

    from peermesh.cli.commands import build_parser

    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "peermesh-cli-reference" not in cli, "the CLI reference was not generated"
    (subcommands,) = [a for a in build_parser()._actions
                      if isinstance(a, argparse._SubParsersAction)]
    for name, parser in subcommands.choices.items():
        assert f"peermesh {name}" in cli, f"'peermesh {name}' is missing from the CLI reference"
        # every option of every command, as --help shows it
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in cli, f"{flag} of 'peermesh {name}' is missing"
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "ThreadedNode" in api and "whisper" in api

    import dataclasses

    from peermesh.config import NodeConfig

    config = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "peermesh-config-table" not in config, "the settings table was not generated"
    for field in dataclasses.fields(NodeConfig):
        assert f"PEERMESH_{field.name.upper()}" in config, field.name


def test_nav_lists_every_page() -> None:
    """Pages outside the nav are published unreachable; docs/overlays.md is added at merge."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
             if "hooks" not in p.parts}
    assert pages - {"overlays.md"} <= listed, pages - listed
    assert listed <= pages, listed - pages


def test_readme_and_the_home_page_link_every_page_of_the_manual() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M)) - {"index.md"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documentation = readme[readme.index("## Documentation"):]
    features = readme[readme.index("## What it does"):readme.index("## Documentation")]
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for page in sorted(listed):
        assert f"(docs/{page})" in documentation, f"README's Documentation misses {page}"
    for page in ("mtl.md", "curve.md", "security.md"):
        assert f"(docs/{page})" in features, f"README's feature table misses {page}"
        assert f"]({page})" in home, f"docs/index.md misses {page}"


def test_readme_tour_says_the_agent_socket_directory_is_private() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = readme[readme.index("## A five-minute tour"):readme.index("## What it does")]
    agent = " ".join(tour[tour.index("`peermesh agent`"):].split())
    assert "directory only its user may enter (mode 0700" in agent


def test_config_help_names_every_table() -> None:
    from peermesh.config import TABLES

    done = subprocess.run([sys.executable, "-m", "peermesh", "config", "--help"],
                          capture_output=True, encoding="utf-8", timeout=30,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    for table in TABLES:
        assert f"[{table}]" in done.stdout, table


def test_the_example_config_points_at_pages_that_exist() -> None:
    text = (ROOT / "peermesh" / "cli" / "peermesh.example.toml").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#+ (.+)$", (ROOT / "README.md").read_text(encoding="utf-8"),
                              re.M))
    for section in re.findall(r'README, "([^"]+)"', text):
        assert section in headings, f"the README has no section {section!r}"
    pointers = re.findall(r"\b(docs/[\w/.-]+\.md)\b", text)
    assert pointers
    for pointer in pointers:
        assert (ROOT / pointer).is_file(), pointer


#: constructors of nodes on a real network, and what may name the interface instead
NODE_CALL = re.compile(r"\b(?:Node|ThreadedNode|AsyncNode)\((.*)")


def test_python_examples_name_their_interface() -> None:
    """Copied literally, an example stays on this host: the suite runs them with
    PEERMESH_INTERFACE=lo, which would hide a node that joins the LAN."""
    missing = []
    for page in PAGES:
        for lang, line, code, _ in fenced(page):
            if lang != "python":
                continue
            for offset, text in enumerate(code.splitlines()):
                call = NODE_CALL.search(text)
                if call and "interface=" not in call.group(1) and "config=" not in call.group(1):
                    missing.append(f"{page.relative_to(ROOT)}:{line + offset}: {text.strip()}")
    assert missing == []


# --------------------------------------------------------------------------
# The examples


def _spark_ready() -> Optional[str]:
    """None when a local Spark session can start here, else why not."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install '.[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java (Spark needs OpenJDK 17)"
    return None


def _example_params() -> list[Any]:
    """Spark examples are slow (a JVM and a local session of their own): their bound is theirs."""
    return [pytest.param(e, id=e.id, marks=[pytest.mark.slow,
                                           pytest.mark.timeout(SPARK_TIMEOUT + 30)])
            if e.directive == "needs spark" else pytest.param(e, id=e.id)
            for e in examples()]


@pytest.mark.parametrize("example", _example_params())
def test_example_runs(example: Example, tmp_path: Path, free_udp_port: int) -> None:
    timeout = EXAMPLE_TIMEOUT
    if example.directive and example.directive.startswith("skip "):
        pytest.skip(example.directive[5:])
    if example.directive == "needs spark":
        reason = _spark_ready()
        if reason:
            pytest.skip(reason)
        timeout = SPARK_TIMEOUT
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    # what the example makes with tempfile goes there, removed after (a short path: sockets)
    scratch = tempfile.mkdtemp(prefix="pm-example-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}
    env.update(PEERMESH_INTERFACE="lo", PEERMESH_PORT=str(free_udp_port),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, TMPDIR=scratch)
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{example.id} still ran after {timeout} s:\n{exc.stdout!r}\n{exc.stderr!r}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = f"{example.id} exited {done.returncode}:\n{example.code}\n" \
             f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, report
    assert "Traceback" not in done.stderr, report  # an example that logs a crash is broken too


# --------------------------------------------------------------------------
# The README's two commands


def _readme_commands() -> list[str]:
    blocks = [code.strip() for lang, _, code, _ in fenced(ROOT / "README.md") if lang == "sh"]
    return blocks[:2]


def test_readme_test_command_is_what_ci_runs() -> None:
    _, test_command = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci
    assert ci.strip().splitlines()[-1] == test_command


def test_readme_run_command_starts_a_peer_on_loopback(free_udp_port: int) -> None:
    run_command, _ = _readme_commands()
    install, sep, run = run_command.partition(" && ")
    assert install == "pip install ." and sep, run_command
    argv = shlex.split(run)
    assert argv[:2] == ["peermesh", "run"] and "--interface" in argv
    assert argv[argv.index("--interface") + 1] == "lo"  # alone and on loopback
    process = CliProcess([*argv[1:], "--port", str(free_udp_port)])
    try:
        process.started()
        assert process.stop(signal.SIGINT) == 0, process.describe()
    finally:
        process.kill()


def test_readme_tour_two_peers_talk(free_udp_port: int) -> None:
    """The tour's first terminal runs alice; every command of the second reaches her."""
    blocks = [code for lang, _, code, _ in fenced(ROOT / "README.md") if lang == "sh"]
    first, second = blocks[2], blocks[3]
    cli = Cli(free_udp_port)  # the same loopback mesh, on a beacon port of its own
    try:
        alice = cli.start(*shlex.split(first, comments=True)[1:])
        alice.started()
        for line in second.splitlines():
            argv = shlex.split(line, comments=True)
            result = cli.call(*argv[1:])
            assert result.returncode == 0, f"{line}\n{_report(result)}"
        alice.expect_line(lambda text: "SHOUT" in text and text.endswith("hello"), "the shout")
        alice.expect_line(lambda text: "WHISPER" in text and text.endswith("hi"), "the whisper")
    finally:
        cli.close()


# --------------------------------------------------------------------------
# Shell examples: every `peermesh ...` command line parses with the real parser


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv) of every ``peermesh`` invocation in the ``sh`` blocks."""
    found = []
    for page in PAGES:
        for lang, line, code, _ in fenced(page):
            if lang != "sh":
                continue
            for offset, text in enumerate(code.splitlines()):
                lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
                lexer.whitespace_split = True  # keeps '{"a": 1}' and nf://x/y.txt whole
                command: list[str] = []
                for word in [*lexer, ";"]:
                    if word.strip("&|;"):
                        command.append(word)
                        continue
                    if command[:1] == ["peermesh"]:
                        found.append((f"{page.relative_to(ROOT)}:{line + offset}", command))
                    command = []
    return found


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from peermesh.cli.commands import build_parser

    return build_parser()


@pytest.mark.parametrize("where,argv", command_lines(), ids=lambda v: v if isinstance(v, str)
                         else None)
def test_shell_example_parses(where: str, argv: list[str]) -> None:
    try:
        args = _parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{where}: {' '.join(argv)} is refused by the parser (exit {exc.code})")
    assert args.command == argv[1]
