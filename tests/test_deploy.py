"""deploy/: the example config, the systemd unit, the container files, and their docs page.

Nothing here runs systemd or Docker: the files are parsed and the commands
they name are checked against the real argument parser.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from peermesh.cli.commands import build_config, build_parser, cmd_agent
from peermesh.config import NodeConfig

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
EXAMPLE = DEPLOY / "peermesh.example.toml"
UNIT = DEPLOY / "peermesh-agent.service"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"


# --------------------------------------------------------------------------
# The example configuration


def test_example_config_loads() -> None:
    config = NodeConfig.load(EXAMPLE, environ={})
    defaults = NodeConfig()
    for field in dataclasses.fields(NodeConfig):
        if field.name == "interface":
            continue  # the example keeps the mesh on loopback until an operator sets it
        assert getattr(config, field.name) == getattr(defaults, field.name), field.name


def test_example_config_documents_every_field() -> None:
    lines = EXAMPLE.read_text().splitlines()
    table = tomllib.loads(EXAMPLE.read_text())["node"]
    for field in dataclasses.fields(NodeConfig):
        pattern = re.compile(rf"^#?\s*{field.name}\s*=")
        found = [i for i, line in enumerate(lines) if pattern.match(line)]
        assert found, f"{field.name} is not in {EXAMPLE.name}"
        above = lines[found[0] - 1].strip()
        assert above.startswith("#") and len(above) > 2, \
            f"{field.name} has no comment above it"
        assert field.name in table or lines[found[0]].lstrip().startswith("#")


# --------------------------------------------------------------------------
# The systemd unit


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file: {section: {key: [values in order]}}."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{raw!r} before the first section"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _exec_argv(value: str) -> list[str]:
    argv = shlex.split(value.replace("%t", "/run").replace("%S", "/var/lib"))
    argv[0] = argv[0].lstrip("@-:+!")
    return argv


def test_unit_execstart_runs_the_agent_command() -> None:
    service = _unit(UNIT)["Service"]
    (exec_start,) = service["ExecStart"]
    argv = _exec_argv(exec_start)
    assert Path(argv[0]).name == "peermesh"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["peermesh"] == "peermesh.cli:main"  # the command the unit names exists

    args = build_parser().parse_args(argv[1:])
    assert args.command == "agent" and args.handler is cmd_agent
    assert args.config == "/etc/peermesh/peermesh.toml"
    assert args.agent == "/run/peermesh/agent.sock"
    # the directories the unit creates are the ones the command uses
    assert service["ConfigurationDirectory"] == ["peermesh"]
    assert service["RuntimeDirectory"] == ["peermesh"]
    assert service["StateDirectory"] == ["peermesh"]
    # and its options make a valid configuration (with the example as the file)
    args.config = str(EXAMPLE)
    assert isinstance(build_config(args), NodeConfig)


def test_unit_is_sandboxed_and_restarts() -> None:
    unit = _unit(UNIT)
    service = unit["Service"]

    def one(key: str) -> str:
        (value,) = service[key]
        return value

    assert one("DynamicUser") == "yes" or one("User") not in ("", "root")
    assert one("ProtectSystem") == "strict"
    assert one("ProtectHome") in ("yes", "read-only", "tmpfs")
    assert one("PrivateTmp") == "yes"
    assert one("NoNewPrivileges") == "yes"
    assert set(one("RestrictAddressFamilies").split()) == {"AF_INET", "AF_UNIX", "AF_NETLINK"}
    assert one("Restart") == "on-failure"
    assert float(one("RestartSec").rstrip("s")) > 0
    assert int(unit["Unit"]["StartLimitBurst"][0]) > 0
    assert unit["Unit"]["StartLimitIntervalSec"]
    assert "multi-user.target" in unit["Install"]["WantedBy"][0]


# --------------------------------------------------------------------------
# The container files


def _dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, rest = whole.partition(" ")
        assert keyword.isalpha(), f"not an instruction: {whole!r}"
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def _exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def test_dockerfile_builds_a_non_root_agent_image() -> None:
    instructions = _dockerfile(DOCKERFILE)
    kinds = [kind for kind, _ in instructions]
    known = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "HEALTHCHECK",
             "ENTRYPOINT", "CMD", "ARG", "LABEL"}
    assert set(kinds) <= known, set(kinds) - known
    assert instructions[0] == ("FROM", "python:3.11-slim")

    def last(kind: str) -> str:
        return [rest for k, rest in instructions if k == kind][-1]

    user = last("USER").split(":")[0]
    assert user not in ("root", "0")
    assert "5670/udp" in last("EXPOSE").split()
    entrypoint = _exec_form(last("ENTRYPOINT"))
    assert entrypoint == ["peermesh", "agent"]
    args = build_parser().parse_args([*entrypoint[1:], *_exec_form(last("CMD"))])
    assert args.command == "agent"
    health = last("HEALTHCHECK")
    assert build_parser().parse_args(_exec_form(health[health.index("CMD") + 3:])[1:]).command \
        == "status"
    assert any("pip install" in rest for kind, rest in instructions if kind == "RUN")
    for kind, rest in instructions:  # what it copies exists, and the ignore file lets it in
        if kind == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), source
    allowed = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "peermesh/"):
        assert f"!{name}" in allowed


def test_dockerfile_builds_the_c_extension() -> None:
    """The image gets the extension: setup.py (which declares it) is copied, a compiler is
    there while pip builds, and the build fails if the extension cannot be imported."""
    instructions = _dockerfile(DOCKERFILE)
    copied = {source for kind, rest in instructions if kind == "COPY"
              for source in rest.split()[:-1]}
    assert {"setup.py", "pyproject.toml", "peermesh"} <= copied, copied
    declared = (ROOT / "setup.py").read_text()
    assert "peermesh.io._zmqbatch" in declared
    (install,) = [rest for kind, rest in instructions if kind == "RUN" and "pip install" in rest]
    steps = [step.strip() for step in install.split("&&")]
    pip = next(i for i, step in enumerate(steps) if step.startswith("pip install"))
    compiler = next(i for i, step in enumerate(steps) if "apt-get install" in step)
    check = next(i for i, step in enumerate(steps) if "import peermesh.io._zmqbatch" in step)
    assert "gcc" in steps[compiler] and compiler < pip < check


def _compose_commands() -> dict[str, list[str]]:
    """Each compose service's argv, with the image's entrypoint where it keeps it."""
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load(COMPOSE.read_text())
    entrypoint = _exec_form([r for k, r in _dockerfile(DOCKERFILE) if k == "ENTRYPOINT"][-1])
    networks = data["networks"]
    assert all(net.get("driver", "bridge") == "bridge" for net in networks.values())
    commands = {}
    for name, service in data["services"].items():
        assert set(service["networks"]) <= set(networks), name
        build = service["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        commands[name] = [*service.get("entrypoint", entrypoint), *service.get("command", [])]
    return commands


def test_compose_runs_three_agents_and_a_shouter() -> None:
    text = COMPOSE.read_text()
    # Structural checks that need no YAML parser
    assert re.search(r"^services:\s*$", text, re.M) and re.search(r"^networks:\s*$", text, re.M)
    assert "driver: bridge" in text and "\t" not in text
    for name in ("host1", "host2", "host3", "shouter"):
        assert re.search(rf"^  {name}:\s*$", text, re.M), name
    assert "shout" in text and "deploy/Dockerfile" in text
    try:
        import yaml  # noqa: F401
    except ImportError:
        return
    commands = _compose_commands()
    agents = [name for name, argv in commands.items() if argv[:2] == ["peermesh", "agent"]]
    assert len(agents) == 3
    parser = build_parser()
    for name, argv in commands.items():
        assert argv[0] == "peermesh", name
        args = parser.parse_args(argv[1:])
        if name in agents:
            assert args.command == "agent" and args.groups == ["demo"]
        else:
            assert args.command == "shout" and args.target == "demo"


def test_deploy_docs_cover_firewall_and_checks() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for needle in ("UDP 5670", "49152-65535", "5353", "peermesh status", "journalctl",
                   "/etc/peermesh", "/var/lib/peermesh", "/run/peermesh/agent.sock",
                   "broadcast"):
        assert needle in text, needle
    readme = (DEPLOY / "README.md").read_text()
    for name in ("peermesh.example.toml", "peermesh-agent.service", "Dockerfile", "compose.yaml",
                 "docs/deploy.md"):
        assert name in readme, name


# --------------------------------------------------------------------------
# Packaging metadata


def test_packaging_metadata_is_consistent() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = project["project"]
    # the licence text shipped is the one the SPDX identifier names
    assert meta["license"] == "MPL-2.0"
    assert (ROOT / "LICENSE").read_text().startswith("Mozilla Public License Version 2.0\n")
    # the version lives in one place: peermesh.__version__, read by setuptools
    assert "version" not in meta and "version" in meta["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "peermesh.__version__"}
    import peermesh

    assert re.fullmatch(r"\d+\.\d+\.\d+", peermesh.__version__)
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(meta["urls"])
    extras = meta["optional-dependencies"]
    assert any(r.startswith("PyYAML") for r in extras["yaml"])  # YAML inventories (NFP SID)
    # the suite builds the docs, so the test extra brings everything the docs extra does
    assert set(extras["docs"]) <= set(extras["test"])
