"""The Dispatcher without sockets: targeting, folding, queueing, re-dispatch, retries."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from peermesh.nfp.dispatch import Dispatcher, Reply, overall_get_status, with_rid, without_rid
from peermesh.wire import nfp
from peermesh.wire.nfp import Status


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A dispatcher whose workers are lists of sent commands."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.d = Dispatcher(nfp.BROKER, request_timeout=2.0, queue_timeout=5.0, clock=self.clock,
                            on_job_event=lambda u, w, b, m: self.events.append((u, w, b)))
        self.sent: dict[str, list[nfp.Message]] = {}
        self.replies: list[Reply] = []

    def worker(self, name: str, service: str = "svc", up: bool = True) -> None:
        self.sent[name] = []

        def send(frames: list[bytes]) -> bool:
            self.sent[name].append(nfp.decode(frames))
            return up
        self.d.add_worker(name, service, send)

    def last(self, name: str) -> Any:
        return self.sent[name][-1]

    def answer(self, name: str, status: Status, extra: Optional[dict[str, Any]] = None,
               msg: Any = None) -> None:
        msg = msg or self.last(name)
        rid = nfp.decode_body(msg.body[0])["rid"]
        body = {"worker": name, "rid": rid, **(extra or {})}
        self.d.on_response(name, nfp.Response(nfp.WORKER, msg.service, msg.uuid, status,
                                              (nfp.encode_body(body),)))

    def done(self, reply: Reply) -> None:
        self.replies.append(reply)

    def event(self, name: str, uuid: str, body: dict[str, Any]) -> None:
        self.d.on_event(name, nfp.EventCommand(nfp.WORKER, "svc", uuid, Status.OK,
                                        (nfp.encode_body({"worker": name, **body}),)))


def job(task: str = "echo") -> dict[str, Any]:
    return {"task": task, "args": [], "kwargs": {}}


def test_all_goes_to_every_worker_and_folds_202() -> None:
    h = Harness()
    for name in ("w1", "w2", "w3"):
        h.worker(name)
    h.worker("x1", service="other")
    h.d.post("svc", "all", "J", job(), h.done)
    assert sorted(n for n, sent in h.sent.items() if sent) == ["w1", "w2", "w3"]
    post = h.last("w1")
    assert isinstance(post, nfp.Post) and post.role is nfp.BROKER and post.target == "w1"
    h.answer("w1", Status.ACCEPTED)
    h.answer("w2", Status.ERROR, {"error": "no task echo"})
    assert not h.replies
    h.answer("w3", Status.ACCEPTED)
    (reply,) = h.replies
    assert reply.status is Status.ACCEPTED
    assert sorted(reply.body["workers"]) == ["w1", "w3"]
    assert reply.body["errors"] == {"w2": "no task echo"}


def test_a_202_carrying_the_end_of_the_job_is_listed_under_finished() -> None:
    h = Harness()
    for name in ("w1", "w2"):
        h.worker(name)
    h.d.post("svc", "any", "J1", job(), h.done)
    (name,) = [n for n, sent in h.sent.items() if sent]
    h.answer(name, Status.ACCEPTED, {"state": "completed", "result": 5, "load": 0})
    (reply,) = h.replies
    assert reply.status is Status.ACCEPTED and reply.body["workers"] == [name]
    assert reply.body["finished"] == {name: {"worker": name, "state": "completed",
                                             "result": 5}}
    assert h.d.inflight() == {}                 # finished: nothing to re-dispatch
    # all: only the workers whose 202 said the job ended; the others stay in flight
    h.d.post("svc", "all", "J2", job(), h.done)
    h.answer("w1", Status.ACCEPTED, {"state": "failed", "errors": ["boom"]})
    h.answer("w2", Status.ACCEPTED, {"state": "pending"})
    reply = h.replies[-1]
    assert sorted(reply.body["workers"]) == ["w1", "w2"]
    assert reply.body["finished"] == {"w1": {"worker": "w1", "state": "failed",
                                             "errors": ["boom"]}}
    assert h.d.inflight() == {"J2": ["w2"]}
    # a plain 202 lists nothing
    h.d.post("svc", "w1", "J3", job(), h.done)
    h.answer("w1", Status.ACCEPTED, {"state": "pending"})
    assert "finished" not in h.replies[-1].body


def test_any_picks_the_least_loaded_then_least_recently_used() -> None:
    h = Harness()
    for name in ("w1", "w2"):
        h.worker(name)
    h.d.workers["w1"].load = 3
    h.d.post("svc", "any", "J1", job(), h.done)
    assert h.sent["w2"] and not h.sent["w1"]
    h.answer("w2", Status.ACCEPTED, {"load": 5})          # worker reports its queue
    h.d.post("svc", "any", "J2", job(), h.done)
    assert len(h.sent["w1"]) == 1
    h.answer("w1", Status.ACCEPTED, {"load": 1})
    h.d.workers["w2"].load = 1
    h.d.post("svc", "any", "J3", job(), h.done)            # tie: least recently used (w2)
    assert len(h.sent["w2"]) == 2


def test_named_targets_and_missing_names() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.post("svc", "w2,ghost", "J", job(), h.done)
    assert h.sent["w2"] and not h.sent["w1"]
    h.answer("w2", Status.ACCEPTED)
    (reply,) = h.replies
    assert reply.body["workers"] == ["w2"] and reply.body["errors"] == {"ghost": "no such worker"}


def test_queue_until_a_worker_arrives_then_expire() -> None:
    h = Harness()
    h.d.post("svc", "any", "J1", job(), h.done)
    h.d.post("svc", "w9", "J2", job(), h.done)
    assert h.d.queued() == {"svc": 2} and not h.replies
    h.clock.now += 1
    h.worker("w1")                                  # first worker of the service arrives
    assert [m.uuid for m in h.sent["w1"]] == ["J1"]  # J2 names w9: still waiting
    h.answer("w1", Status.ACCEPTED)
    assert h.replies[0].status is Status.ACCEPTED
    h.clock.now += 4.5
    h.d.tick(h.clock.now)
    assert len(h.replies) == 2 and h.replies[1].status is Status.REQUEST_TIMEOUT
    assert "w9" in h.replies[1].body["error"] or "svc" in h.replies[1].body["error"]
    assert h.d.queued() == {}


def test_a_withdrawn_post_is_never_sent_nor_answered() -> None:
    h = Harness()
    h.d.post("svc", "any", "J1", job(), h.done)
    h.d.post("svc", "any", "J2", job(), h.done)
    assert h.d.withdraw("J1") and not h.d.withdraw("J1") and not h.d.withdraw("nope")
    assert h.d.queued() == {"svc": 1}
    h.worker("w1")
    assert [m.uuid for m in h.sent["w1"]] == ["J2"]
    h.answer("w1", Status.ACCEPTED)
    h.d.post("svc", "w9", "J3", job(), h.done)
    assert h.d.withdraw("J3") and h.d.queued() == {}
    h.clock.now += 6
    h.d.tick(h.clock.now)
    assert [r.body["uuid"] for r in h.replies] == ["J2"]


def test_worker_silence_times_out_one_worker_only() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.get("svc", "all", "J", {}, h.done)
    h.answer("w1", Status.OK, {"state": "completed", "result": 1})
    h.clock.now += 2.5
    h.d.tick(h.clock.now)
    (reply,) = h.replies
    assert reply.status is Status.OK
    assert reply.body["workers"]["w1"]["result"] == 1
    assert reply.body["workers"]["w2"]["status"] == 408


def test_get_status_folding() -> None:
    S = Status
    assert overall_get_status([S.OK, S.PENDING]) is S.PENDING
    assert overall_get_status([S.OK, S.UNKNOWN]) is S.OK
    assert overall_get_status([S.UNKNOWN, S.UNKNOWN]) is S.UNKNOWN
    assert overall_get_status([S.UNKNOWN, S.REQUEST_TIMEOUT]) is S.REQUEST_TIMEOUT
    assert overall_get_status([]) is S.REQUEST_TIMEOUT


def test_any_job_is_redispatched_when_its_worker_dies_before_finishing() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.workers["w2"].load = 9
    h.d.post("svc", "any", "J", job(), h.done)
    h.answer("w1", Status.ACCEPTED)
    assert h.d.inflight() == {"J": ["w1"]}
    h.d.remove_worker("w1", "no keepalive")
    repost = h.last("w2")
    assert isinstance(repost, nfp.Post) and repost.uuid == "J"
    assert nfp.decode_body(repost.body[0])["redispatch"] is True
    h.answer("w2", Status.ACCEPTED)
    assert h.events[-1][2]["state"] == "redispatched" and h.events[-1][2]["to"] == "w2"
    assert h.d.inflight() == {"J": ["w2"]}
    h.event("w2", "J", {"state": "completed"})    # finished: nothing left to fail over
    assert h.d.inflight() == {}
    h.d.remove_worker("w2", "gone")
    assert h.events[-1][2]["state"] == "completed"


def test_named_and_all_jobs_say_why_when_their_worker_dies_before_finishing() -> None:
    h = Harness()
    for name in ("w1", "w2", "w3"):
        h.worker(name)
    h.d.post("svc", "all", "A", job(), h.done)
    for name in ("w1", "w2", "w3"):
        h.answer(name, Status.ACCEPTED, {"state": "pending"})
    h.d.post("svc", "w1", "N", job(), h.done)
    h.answer("w1", Status.ACCEPTED, {"state": "pending"})
    h.event("w2", "A", {"state": "completed"})
    assert h.d.inflight() == {"A": ["w1", "w3"], "N": ["w1"]}
    h.d.remove_worker("w1", "no keepalive for 0.3s")
    orphaned = {(u, w): b for u, w, b in h.events if b.get("state") == "orphaned"}
    assert set(orphaned) == {("A", "w1"), ("N", "w1")}          # no other worker ran them
    assert orphaned["N", "w1"]["status"] == 408
    assert "no keepalive" in orphaned["N", "w1"]["reason"]
    assert not any(isinstance(m, nfp.Post) and m.uuid == "N" for m in h.sent["w2"])
    assert h.d.inflight() == {"A": ["w3"]}
    h.d.get("svc", "w1", "N", {}, h.done)                        # while w1 is away: why
    away = h.replies[-1].body["workers"]["w1"]
    assert away["status"] == 408 and "went away before finishing" in away["error"]
    h.worker("w1")                                               # the same worker comes back
    h.d.get("svc", "w1", "N", {}, h.done)
    h.answer("w1", Status.OK, {"state": "completed", "result": 1})
    assert h.replies[-1].status is Status.OK


def test_a_retried_post_is_in_flight_again() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.post("svc", "any", "J", {**job(), "retry": True}, h.done)
    h.answer("w1", Status.UNKNOWN)
    h.answer("w2", Status.PENDING, {"state": "running"})
    assert h.replies[-1].body["states"] == {"w2": "running"}
    assert h.d.inflight() == {"J": ["w2"]}                       # its worker's death now counts
    h.d.remove_worker("w2", "gone")
    assert isinstance(h.last("w1"), nfp.Post) and h.last("w1").uuid == "J"
    h.d.post("svc", "w1", "K", {**job(), "retry": True}, h.done)   # accepted and finished
    h.answer("w1", Status.ACCEPTED, {"state": "completed", "duplicate": True})
    assert h.replies[-1].body["states"] == {"w1": "completed"} and "K" not in h.d.inflight()


def test_a_retry_waits_for_its_previous_worker_then_asks_the_others() -> None:
    h = Harness()
    h.worker("w2")
    h.d.post("svc", "any", "J", {**job(), "retry": True, "holders": ["w1"]}, h.done)
    assert not h.sent["w2"]                      # w1 (which has it) may be on its way here
    h.worker("w1")
    post = h.last("w1")
    assert isinstance(post, nfp.Post) and post.uuid == "J" and not h.sent["w2"]
    h.answer("w1", Status.ACCEPTED, {"state": "running", "duplicate": True})
    assert h.replies[-1].body["workers"] == ["w1"] and h.d.inflight() == {"J": ["w1"]}
    h.d.post("svc", "any", "K", {**job(), "retry": True, "holders": ["gone"]}, h.done)
    h.clock.now += 2.5
    h.d.tick(h.clock.now)                        # it never came: ask those that are here
    assert all(isinstance(h.last(n), nfp.Get) and h.last(n).uuid == "K" for n in ("w1", "w2"))


def test_finished_jobs_are_not_redispatched_and_lost_is_reported() -> None:
    h = Harness()
    h.worker("w1")
    h.d.post("svc", "any", "J", job(), h.done)
    h.answer("w1", Status.ACCEPTED)
    h.d.remove_worker("w1", "died")                 # no other worker: queued
    assert h.d.queued() == {"svc": 1}
    h.clock.now += 6
    h.d.tick(h.clock.now)
    assert h.events[-1][2]["state"] == "lost"


def test_any_post_fails_over_if_the_worker_vanishes_before_answering() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.workers["w2"].load = 5
    h.d.post("svc", "any", "J", job(), h.done)
    assert h.sent["w1"]
    h.d.remove_worker("w1", "gone")
    h.answer("w2", Status.ACCEPTED)
    assert h.replies[0].status is Status.ACCEPTED and h.replies[0].body["workers"] == ["w2"]


def test_retry_of_an_any_post_does_not_run_it_twice() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.post("svc", "any", "J", {**job(), "retry": True}, h.done)
    probes = [h.last("w1"), h.last("w2")]
    assert all(isinstance(p, nfp.Get) for p in probes)
    h.answer("w1", Status.UNKNOWN)
    h.answer("w2", Status.PENDING, {"state": "running"})   # w2 has it from before
    (reply,) = h.replies
    assert reply.status is Status.ACCEPTED and reply.body["workers"] == ["w2"]
    assert reply.body["duplicate"] is True
    assert not any(isinstance(m, nfp.Post) for sent in h.sent.values() for m in sent)
    h.d.post("svc", "any", "K", {**job(), "retry": True}, h.done)
    h.answer("w1", Status.UNKNOWN)
    h.answer("w2", Status.UNKNOWN)
    assert sum(isinstance(m, nfp.Post) for sent in h.sent.values() for m in sent) == 1


def test_delete_and_get_fan_out_and_fold() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("w2")
    h.d.delete("svc", "all", "J", {}, h.done)
    h.answer("w1", Status.OK, {"outcome": "cancelled", "was": "running"})
    h.answer("w2", Status.UNKNOWN)
    assert h.replies[0].status is Status.OK
    h.d.get("svc", "ghost", "J", {}, h.done)
    assert h.replies[1].status is Status.REQUEST_TIMEOUT
    assert h.replies[1].body["workers"]["ghost"]["error"] == "worker not connected"


def test_responses_that_answer_nothing_are_ignored() -> None:
    h = Harness()
    h.worker("w1")
    h.d.post("svc", "any", "J", job(), h.done)
    post = h.last("w1")
    for body in (b"not json", b"[]", nfp.encode_body({"rid": "nope"}), nfp.encode_body({})):
        h.d.on_response("w1", nfp.Response(nfp.WORKER, "svc", "J", Status.ACCEPTED, (body,)))
    h.d.on_response("w2", nfp.Response(nfp.WORKER, "svc", "J", Status.ACCEPTED,
                                       (nfp.encode_body({"rid": nfp.decode_body(post.body[0])
                                                         ["rid"]}),)))   # wrong worker
    h.d.on_event("w1", nfp.EventCommand(nfp.WORKER, "svc", "J", Status.OK, (b"{bad",)))
    assert not h.replies
    h.answer("w1", Status.ACCEPTED)
    assert h.replies[0].status is Status.ACCEPTED


def test_worker_mmi_reaches_every_worker_but_not_broker_services() -> None:
    h = Harness()
    h.worker("w1")
    h.worker("x1", service="other")
    h.worker("b.mmi", service="mmi.service.broker")
    h.d.post("mmi.service.worker", "all", "M", job("show_workers"), h.done)
    assert h.sent["w1"] and h.sent["x1"] and not h.sent["b.mmi"]


@pytest.mark.parametrize("status", [Status.OK, Status.PENDING])
def test_fail_all_answers_everything(status: Status) -> None:
    h = Harness()
    h.worker("w1")
    h.d.get("svc", "all", "J", {}, h.done)
    h.d.post("none", "any", "K", job(), h.done)
    h.d.fail_all(Status.ERROR, "broker stepped down")
    assert [r.status for r in h.replies] == [Status.ERROR, Status.ERROR]


@pytest.mark.parametrize("raw, rid, rest", [
    (b'{"task":"t","args":[1],"rid":"c1"}', "c1", b'{"task":"t","args":[1]}'),
    (b'{"rid":"c1"}', "c1", b"{}"),
    (b'{"rid":7}', 7, b"{}"),
    (b'{"a":1,"rid":"c2"}', "c1", None),             # another rid
    (b'{"rid":"c1","a":1}', "c1", None),             # not last
    (b'{"rid":"x","a":1,"rid":"c1"}', "c1", None),   # twice
    (b'{"a":{"rid":"c1"}}', "c1", None),             # nested, not a member
    (b'{"a": 1, "rid": "c1"}', "c1", None),          # not compact
])
def test_without_rid_only_cuts_a_last_compact_rid(raw: bytes, rid: Any,
                                                   rest: Optional[bytes]) -> None:
    assert without_rid(raw, rid) == rest
    if rest is not None:
        assert nfp.decode_body(with_rid(rest, "1f")) == {**nfp.decode_body(rest), "rid": "1f"}


def test_a_relayed_body_is_the_clients_with_the_dispatchers_rid() -> None:
    h = Harness()
    h.worker("w1")
    raw = rb'{"task":"t","args":["\u00e9"],"kwargs":{}}'
    h.d.post("svc", "any", "J1", nfp.decode_body(raw), h.replies.append, raw=raw)
    sent = h.sent["w1"][0]
    rid = nfp.decode_body(sent.body[0])["rid"]
    assert sent.body[0] == raw[:-1] + b',"rid":"%s"}' % rid.encode()
    h.answer("w1", Status.ACCEPTED)
    assert h.replies[0].status is Status.ACCEPTED and h.replies[0].body["workers"] == ["w1"]


@pytest.mark.parametrize("finished", [5, "x", [1], {"w1": "done"}, {"w1": {"state": 3}},
                                      {"w1": {"state": "weird"}}])
def test_a_client_ignores_a_finished_list_that_makes_no_sense(tmp_path: Any,
                                                              finished: Any) -> None:
    from peermesh.nfp.client import Client
    from peermesh.nfp.store import JobStore
    store = JobStore(tmp_path / "c.sqlite3")
    client = Client(store)
    events: list[Any] = []
    client.add_listener(events.append)

    def answered(*args: Any, **kwargs: Any) -> Reply:
        return Reply(Status.ACCEPTED, {"uuid": "u" * 32, "workers": ["w1"], "errors": {},
                                       "finished": finished})
    client._request = answered   # type: ignore[method-assign]
    try:
        reply = client.post("svc", "echo", target="w1", uuid="u" * 32)
        assert reply.status is Status.ACCEPTED and "finished" not in reply.body
        assert events == [] and list(client._open) == ["u" * 32]   # still waits for its end
    finally:
        store.close()


def test_the_core_contract_returns_sends_and_takes_frames() -> None:
    """A worker added without a send function is sent to through returned ``Send``
    outputs; ``receive`` takes its RESPONSE as frames and ``handle_timer`` times out."""
    from peermesh.core import Core, Send

    h = Harness()
    d = h.d
    assert isinstance(d, Core)
    d.add_worker("w1", "svc", link=b"\x00id1")
    d.add_worker("w2", "svc")
    d.post("svc", "all", "J", job(), h.done)
    sends = d.take()
    assert all(type(out) is Send for out in sends)
    assert {out.link for out in sends} == {b"\x00id1", "w2"}   # type: ignore[union-attr]
    assert d.take() == []
    posts = {out.link: nfp.decode(out.frames) for out in sends}  # type: ignore[union-attr]
    rid = nfp.decode_body(posts["w2"].body[0])["rid"]
    answer = nfp.response_frames(nfp.WORKER, "svc", "J", Status.ACCEPTED,
                                 (nfp.encode_body({"rid": rid}),))
    assert d.receive("w2", list(answer), h.clock.now) == []
    assert d.receive("w1", [b"garbage"], h.clock.now) == []     # dropped, no traceback
    assert not h.replies
    deadline = d.next_deadline()
    assert deadline is not None and deadline > h.clock.now
    assert d.handle_timer(deadline) == []
    (reply,) = h.replies
    assert reply.status is Status.ACCEPTED and reply.body["workers"] == ["w2"]
    assert "w1" in reply.body["errors"]
