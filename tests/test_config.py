"""NodeConfig: defaults, TOML file, environment, validation."""

from pathlib import Path

import pytest

from peermesh.config import NodeConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "peermesh.example.toml"


def test_defaults_follow_zyre():
    cfg = NodeConfig()
    assert (cfg.port, cfg.interval, cfg.evasive, cfg.silent, cfg.expired) == (5670, 1.0, 5.0, 10.0, 30.0)


def test_example_config_documents_every_key_and_loads():
    text = EXAMPLE.read_text()
    for name in NodeConfig.__dataclass_fields__:
        assert f"{name} =" in text, f"{name} is not in the example config"
    cfg = NodeConfig.load(EXAMPLE, environ={})
    assert cfg.interface == "lo" and cfg.port == 5670 and cfg.groups == ()


def test_precedence_file_then_env_then_arguments(tmp_path):
    path = tmp_path / "pm.toml"
    path.write_text('[node]\nname = "file"\nport = 6000\ninterval = 0.5\ngroups = ["a"]\n')
    env = {"PEERMESH_PORT": "6001", "PEERMESH_GROUPS": "x,y", "PEERMESH_HEADERS": "k=v,é=ü"}
    cfg = NodeConfig.load(path, environ=env, interval=0.25)
    assert cfg.name == "file"
    assert cfg.port == 6001
    assert cfg.interval == 0.25
    assert cfg.groups == ("x", "y")
    assert dict(cfg.headers) == {"k": "v", "é": "ü"}


@pytest.mark.parametrize("text, message", [
    ("[node]\nport = 0\n", "port"),
    ("[node]\nevasive = 40.0\n", "evasive <= silent <= expired"),
    ("[node]\nbogus = 1\n", "unknown key"),
    ("[node\n", "not valid TOML"),
    ("node = 3\n", "must be a table"),
    # a mistake must never leave the node on the default (real) interface unnoticed
    ('[nodes]\ninterface = "lo"\n', r"unknown table\(s\) \[nodes\]; known: \[node\], \[nfp\]"),
    ('interface = "lo"\nport = 5999\n[node]\n',
     r"key\(s\) outside any table: interface, port \(node settings go under \[node\]\)"),
])
def test_bad_files_say_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        NodeConfig.load(path, environ={})


def test_a_file_that_is_not_utf8_says_so(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[node]\nname = "Zoë"\n'.encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        NodeConfig.load(path, environ={})
    path.write_text('[node]\nname = "Zoë"\n', encoding="utf-8")
    assert NodeConfig.load(str(path), environ={}).name == "Zoë"


def test_missing_file_and_bad_environment():
    with pytest.raises(ValueError, match="cannot read config file"):
        NodeConfig.load("/nonexistent/peermesh.toml", environ={})
    with pytest.raises(ValueError, match="PEERMESH_PORT"):
        NodeConfig.load(environ={"PEERMESH_PORT": "many"})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        NodeConfig.load(environ={"PEERMESH_HEADERS": "novalue"})


def test_replace_rejects_unknown_settings():
    with pytest.raises(TypeError, match="unknown setting"):
        NodeConfig().replace(colour="blue")


@pytest.mark.parametrize("line, message", [
    ('groups = "chat"', "groups must be a list of non-empty strings"),
    ('groups = [1]', "groups must be a list of non-empty strings"),
    ('groups = [""]', "groups must be a list of non-empty strings"),
    ('seeds = [""]', "seeds must be a list of non-empty strings"),
    ('interface = ""', "interface must be a non-empty string"),
    ('name = " "', "name must be a non-empty string"),
    ('port = "x"', "port must be an integer"),
    ('interval = "fast"', "interval must be a number"),
    ('headers = {k = 1}', "headers must be a table of strings"),
    ('name = 5', "name must be a non-empty string"),
])
def test_wrong_types_are_clear_errors(tmp_path, line, message):
    path = tmp_path / "typed.toml"
    path.write_text(f"[node]\n{line}\n")
    with pytest.raises(ValueError, match=message):
        NodeConfig.load(path, environ={})


def test_config_example_prints_the_example_the_package_ships(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "peermesh", "config", "example"],
                          capture_output=True, encoding="utf-8", timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXAMPLE.read_text()
    path = tmp_path / "printed.toml"
    path.write_text(done.stdout)
    assert NodeConfig.load(path, environ={}).interface == "lo"
    # the wording says which value is not the default
    assert "Each value shown\n# is the default, except `interface`" in done.stdout
    done = subprocess.run([sys.executable, "-m", "peermesh", "run", "--help"],
                          capture_output=True, encoding="utf-8", timeout=20)
    assert "`peermesh config example` prints one to start from" in " ".join(done.stdout.split())
