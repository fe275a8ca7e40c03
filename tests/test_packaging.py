"""The source distribution runs its own tests; the wheel's tag says what it holds.

The sdist is built with ``python -m build --sdist --no-isolation`` (no network:
the installed setuptools builds it) and unpacked; every test module, the
helpers beside them, the manual, the benchmarks and the deploy files must be
in it, and pytest must collect the whole suite from it. A wheel built from
that sdist where no C compiler works (``CC=false``) holds only Python and is
tagged ``py3-none-any``; with a compiler it holds the optional extension and
is tagged for this interpreter and platform.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what the sdist must carry besides the package
SHIPPED = ("tests", "docs", "scripts", "deploy")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("build") is None,
                       reason="needs the 'build' package (pip install -e '.[test]')"),
]


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}" \
        f"\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist built from this tree, unpacked."""
    out = tmp_path_factory.mktemp("sdist")
    _run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out),
         str(ROOT), cwd=out)
    (archive,) = out.glob("peermesh-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    (tree,) = [p for p in out.iterdir() if p.is_dir()]
    return tree


def _files(root: Path, folder: str) -> set[str]:
    return {str(p.relative_to(root)) for p in (root / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def test_the_sdist_holds_and_collects_its_own_test_suite(unpacked: Path) -> None:
    for folder in SHIPPED:
        missing = _files(ROOT, folder) - _files(unpacked, folder)
        assert missing == set(), f"not in the sdist: {sorted(missing)[:20]}"
    for name in ("mkdocs.yml", ".ci/run", "LICENSE", "README.md", "setup.cfg",
                 "peermesh/io/_zmqbatch.c", "peermesh/io/_zmqbatch.h", "peermesh/io/_zmqbatch_zre.c",
                 "peermesh/io/_zmqbatch_sada.c", "peermesh/io/_zmqbatch_flux.c",
                 "peermesh/io/_zmqbatch_shared.c"):
        assert (unpacked / name).is_file(), name
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}
    env["PYTHONPATH"] = str(unpacked)  # the sdist's own package, not this tree's
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=unpacked, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")}
    assert modules <= collected, sorted(modules - collected)


def _wheel_tag(tree: Path, out: Path, env: dict[str, str]) -> str:
    _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(tree), cwd=tree, env=env)
    (wheel,) = out.glob("*.whl")
    match = re.fullmatch(r"peermesh-[^-]+-(.+)\.whl", wheel.name)
    assert match, wheel.name
    return match.group(1)


def test_the_wheel_is_pure_unless_the_extension_was_built(unpacked: Path,
                                                          tmp_path: Path) -> None:
    pure = _wheel_tag(unpacked, tmp_path / "pure", {"CC": "false"})  # no working compiler
    assert pure == "py3-none-any"
    if not sysconfig.get_config_var("CC"):
        pytest.skip("no C compiler configured for this interpreter")
    built = _wheel_tag(unpacked, tmp_path / "built", {})
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert built.startswith(f"{tag}-{tag}-"), built
