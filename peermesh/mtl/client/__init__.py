"""``peermesh.mtl.Client``: an 11/MTL client for programs off the LAN, on plain pyzmq.

How it works
------------
A client is not a mesh node: it needs no beacons and no gevent hub. It
talks to a gateway with two kinds of socket (made by ``peermesh.io``), in
the caller's thread:

* the control flow, a REQ socket to the gateway's control endpoint:
  ``Connection.Open``, SASL (SCRAM-SHA-256 through ``scramp``: the client
  checks the server's signature in the 201's ``additional`` data, so a
  gateway that does not hold the user's verifier is refused; PLAIN when
  asked for; ANONYMOUS without a user), ``Connection.Profile``, then one
  ``Connection.Reader`` or ``Connection.Writer`` per lease. A request not
  answered within ``timeout`` closes the socket (a REQ socket cannot send
  again before it has a reply) and counts the gateway as gone. A 401 to
  any other request (the user's credentials changed or expired) is
  answered by authenticating again and selecting the profile again, then
  the request is sent once more.
* one DEALER per lease (``Reader``, ``Writer``) to the data port the 202
  named, on the control endpoint's host: ``Lease``, then ``Summon`` and
  ``Dismiss`` (each waits for its ``Response``), ``Content``, ``Confirm``,
  ``Reject``, ``Ping`` / ``Pong``.

Heartbeats and failover: while it is called (``receive``, ``send``,
``wait``), a lease pings the gateway after ``heartbeat`` seconds without
hearing from it, answers its Pings, and presents its lease again every
``heartbeat * liveness * 2`` seconds (a second ``Lease``: 400 means it is
still bound; 200 that the gateway had unbound the link and bound it again:
the lease then restores what it had, as after a reconnection (a reader
summons again; content the unbound link brought counts as an earlier
connection's); 403 that the gateway revoked it: then it asks for a new
one). A lease nobody called for ``heartbeat * liveness`` seconds may have
been unbound by the gateway while its Pings queued up (they prove nothing):
a reader presents its lease again on its next call, a writer binds again
before it sends. Each data connection has a socket monitor: once ZeroMQ
reports it disconnected (the gateway stopped or restarted), the lease
reconnects on its next call, whatever was queued on it before (a writer
checks every 256 sends and in ``wait``). When the gateway stays silent for
``heartbeat * liveness`` seconds, or a command's Response does not come
within ``timeout``, the lease reconnects: first a new DEALER with the same lease (the gateway keeps
an unbound lease for a while), else a new control session on the same
gateway or the next one in ``gateways`` (also those a 201 named; a standby
gateway's 503 names the elected one, which is tried first), a new lease with
the same resources, the same Summons again. A writer with
``confirm: full`` keeps each content until the gateway confirms it (at most
``window`` at a time; ``send`` waits for room) and sends the unconfirmed
ones again after a reconnection: delivery is at least once. A reader's
``Received`` remembers which connection brought it; confirming one that an
earlier connection brought does nothing (the gateway hands it out again).
A closed lease is forgotten by its client.

On keys: a gateway on a node with keys speaks CURVE on both flows; give the
client its public key (``server_key``: Z85, one for every gateway, or
``{control endpoint: key}`` when the gateways hold different keys; a
gateway without a key is then not tried). The client makes a keypair of its
own for its connections (the gateway admits any client key: SASL says who
the user is).

Bounds: a control reply is at most the codec's ``MAX_REQUEST`` + 1 KiB and a
data command ``MAX_CONTENT`` bytes (libzmq drops a gateway that sends more); a
reader takes content off its socket only when its queue is empty (or while
a Summon or Dismiss waits for its Response), at most 1,000 commands a read,
so the rest waits in the socket, bounded by its ``RCVHWM``; a writer with
``confirm: full`` keeps at most ``window`` contents.

Threads and asyncio: a ``Client`` serialises its control requests with a
lock, and each ``Reader`` and ``Writer`` owns its socket, so different
threads may use different leases of one client; one lease must be used by
one thread at a time. ``AsyncClient`` gives the same API as coroutines for
asyncio programs: each lease runs its blocking calls on a thread of its own.

The code is split by concern: ``control`` (``Client``: the control
session and failover), ``leases`` (``Reader``, ``Writer``) and ``aio``
(the asyncio classes); every name is importable from here.

    with Client(["tcp://gw1:5560", "tcp://gw2:5560"], "alice", password) as client:
        reader = client.reader(["chat"], confirm="full")
        reader.summon("chat")
        for received in reader:
            print(received.body)
            reader.confirm(received)
"""

from __future__ import annotations

from ..errors import AuthenticationFailed, ClientError, GatewayUnavailable, RequestRefused
from .aio import AsyncClient, AsyncReader, AsyncWriter
from .control import Client
from .leases import MAX_CONTENT, Reader, Received, Writer

__all__ = ["Client", "Reader", "Writer", "Received", "AsyncClient", "AsyncReader",
           "AsyncWriter", "ClientError", "GatewayUnavailable", "AuthenticationFailed",
           "RequestRefused", "MAX_CONTENT"]
