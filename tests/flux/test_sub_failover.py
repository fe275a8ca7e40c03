"""``peermesh flux sub`` carries on through another member when its member leaves, with the
events published meanwhile (real processes on loopback)."""

from __future__ import annotations

import signal

from cliprocess import Cli, _report

from .test_commands import cli, flux, member  # noqa: F401 (the fixture)


def test_sub_carries_on_through_another_member(cli: Cli) -> None:  # noqa: F811
    root, root_endpoint = member(cli, "--root")
    one, one_endpoint = member(cli, "--parent", root_endpoint)
    sub = cli.start("flux", "sub", "ev.", "--json", "--wait", "2", "--parent", one_endpoint,
                    "--parent", root_endpoint)
    sub.expect_line(lambda s: "subscribed to 'ev.' events through rank 1" in s, "subscribed",
                    "err")
    assert flux(cli, "pub", "ev.a", parent=root_endpoint).returncode == 0
    assert sub.expect_event(topic="ev.a")["seq"] == 1
    assert one.stop(signal.SIGTERM) == 0          # its member leaves the tree
    result = flux(cli, "pub", "ev.b", parent=root_endpoint)
    assert result.returncode == 0, _report(result)
    sub.expect_line(lambda s: "carrying on through rank 0" in s, "failover", "err")
    assert sub.expect_event(topic="ev.b")["seq"] == 2
    assert flux(cli, "pub", "ev.c", parent=root_endpoint).returncode == 0
    assert sub.expect_event(topic="ev.c")["seq"] == 3
    assert sub.popen.poll() is None, sub.describe()
    assert root.stop(signal.SIGTERM) == 0         # no member left: it says so and exits 1
    sub.expect_line(lambda s: "no member took over" in s, "failover given up", "err", 15)
    assert sub.popen.wait(10) == 1, sub.describe()


def test_sub_found_on_the_mesh_carries_on_through_a_member_that_came_later(
        cli: Cli) -> None:  # noqa: F811
    root, _ = member(cli, "--priority", "5")      # on the mesh: rank 0, the only member
    sub = cli.start("flux", "sub", "ev.", "--json", "--wait", "15")
    sub.expect_line(lambda s: "subscribed to 'ev.' events through rank 0" in s, "subscribed",
                    "err")
    later, later_endpoint = member(cli)           # joins after the client connected
    assert flux(cli, "pub", "ev.a", parent=later_endpoint).returncode == 0
    assert sub.expect_event(topic="ev.a")["seq"] == 1
    assert root.stop(signal.SIGTERM) == 0         # the one member the client knew leaves
    # the failover looks on the mesh again and finds the newcomer (rank 0 now)
    sub.expect_line(lambda s: f"carrying on through rank 0 at {later_endpoint}" in s,
                    "failover to the newcomer", "err", 20)
    result = flux(cli, "pub", "ev.b", parent=later_endpoint)
    assert result.returncode == 0, _report(result)
    assert sub.expect_event(topic="ev.b")["seq"] == 2
    assert sub.popen.poll() is None, sub.describe()
    assert later.stop(signal.SIGTERM) == 0
