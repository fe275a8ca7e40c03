"""Interface selection by name, address and CIDR."""

import pytest

from peermesh.errors import InterfaceError
from peermesh.interfaces import list_interfaces, select_interface


@pytest.mark.parametrize("choice", ["lo", "127.0.0.1", "127.0.0.0/8", "127.0.0.1/32"])
def test_loopback_by_name_address_or_cidr(choice):
    itf = select_interface(choice)
    assert itf.name == "lo" and itf.address == "127.0.0.1"
    assert itf.broadcast == "127.255.255.255"
    assert "127.0.0.9" in itf and "10.0.0.1" not in itf and "not-an-ip" not in itf


def test_environment_variable_chooses(monkeypatch):
    monkeypatch.setenv("PEERMESH_INTERFACE", "lo")
    assert select_interface().name == "lo"


def test_default_is_up_and_prefers_non_loopback(monkeypatch):
    monkeypatch.delenv("PEERMESH_INTERFACE", raising=False)
    chosen = select_interface()
    assert chosen.up
    others = [i for i in list_interfaces() if i.up and i.can_broadcast and not i.loopback]
    assert chosen.loopback == (not others)


@pytest.mark.parametrize("choice", ["nosuch0", "203.0.113.77", "198.51.100.0/24"])
def test_unknown_interface_is_a_clear_error(choice):
    with pytest.raises(InterfaceError, match="available: .*lo"):
        select_interface(choice)
