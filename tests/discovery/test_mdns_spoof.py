"""A made-up mDNS record for a live peer's UUID cannot take the peer away when it goes."""

from __future__ import annotations

import uuid as uuid_module

from test_mdns import (_txt, entered, good_txt, make_node, publisher,  # noqa: F401
                                       wait_all, wait_until)


def test_a_goodbye_for_a_record_at_another_address_leaves_the_peer_alone(make_node, publisher):
    # alice hears beacons and mDNS; bob only beacons, so no real record of his exists
    alice = make_node("alice", discovery=("beacon", "mdns"))
    bob = make_node("bob", discovery=("beacon",))
    carol = make_node("carol", discovery=())
    wait_all(alice, [entered(bob)])
    tag = uuid_module.uuid4().hex[:6]
    port = bob.endpoint.rpartition(":")[2]
    forged = publisher.info(f"forged-{tag}", _txt(*good_txt(
        bob.uuid.hex, f"tcp://127.0.0.2:{port}", "bob")))
    honest = publisher.info(f"carol-{tag}", _txt(*good_txt(carol.uuid.hex, carol.endpoint,
                                                           "carol")))
    publisher.publish(forged, honest)
    wait_all(alice, [entered(carol)])
    wait_until(lambda: alice.stats()["reports_ignored"] >= 1, what="forged record seen")
    publisher.withdraw(forged)
    wait_until(lambda: alice.stats()["leaves_ignored"] >= 1, what="forged goodbye ignored")
    assert bob.uuid in alice.peers()
    # a goodbye from the address the peer lives at still counts, once the peer's link
    # confirms it (carol leaves: her links close)
    publisher.withdraw(honest)
    carol.stop()
    wait_until(lambda: carol.uuid not in alice.peers(), what="carol gone")
