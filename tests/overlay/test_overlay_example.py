"""The example overlay of docs/overlays.md runs as printed (three nodes on loopback)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "overlays.md"


def example_source() -> str:
    """The page's ``python`` fenced block that writes an overlay (the other examples run
    in tests/test_docs.py)."""
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"),
                        re.MULTILINE | re.DOTALL)
    overlays = [b for b in blocks if "(Overlay)" in b]
    assert len(overlays) == 1, f"{DOC} should hold one overlay example, found {len(overlays)}"
    return overlays[0]


def test_the_documented_overlay_runs(free_udp_port: int,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    source = example_source()
    assert 'interface="lo"' in source
    namespace: dict[str, object] = {"__name__": "overlay_example"}
    exec(compile(source, str(DOC), "exec"), namespace)
    lines = namespace["main"](port=free_udp_port)    # type: ignore[operator]
    assert lines == [
        "n0: leader n2; n1 says 'motto of n1', n2 says 'motto of n2'",
        "n1: leader n2; n0 says 'motto of n0', n2 says 'motto of n2'",
        "n2: leader n2; n0 says 'motto of n0', n1 says 'motto of n1'",
    ]
    assert capsys.readouterr().out.splitlines() == lines
    printed = DOC.read_text(encoding="utf-8").split("It prints, for instance:", 1)[1]
    assert all(line in printed for line in lines)      # the page shows what it prints
