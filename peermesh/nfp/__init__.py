"""NFP (NORFAB Protocol) on the peermesh: jobs for services, brokerless or brokered.

Workers serve a named service and run tasks by name, one job at a time, with
jobs and results kept in SQLite; clients post jobs to ``any``, ``all`` or
named workers and fetch results later, possibly from another client or after
restarts. Without a broker, clients find workers through HELLO headers and
talk NFP to them directly; nodes that opt in elect one broker (highest
priority, then UUID; the neutral election of ``peermesh.overlay``) which
queues, re-dispatches and hosts the MMI, SID and FSS services. The wire codec
is ``peermesh.wire.nfp``. ``NfpNode`` and its parts (``Worker``, ``Client``,
``Broker``) are overlays (``peermesh.overlay.Overlay``).

```python
node = peermesh.Node("w1", interface="lo")
nfp = NfpNode(node, data_dir="/var/lib/peermesh", broker="auto")
tasks = Tasks()

@tasks.task()
def add(job, a, b):
    return a + b

nfp.add_worker("maths", tasks=tasks)
node.start(); nfp.start()
reply = nfp.client.run("maths", "add", [1, 2], target="any")
```

Threaded programs (no gevent of their own) use ``ThreadedNfp``: an
``NfpNode`` riding on a ``ThreadedNode(overlays=[...])``.
"""

from typing import TYPE_CHECKING

from ..errors import StoreError
from ..overlay.broker import BrokerChanged
from .broker import Broker
from .client import Client, JobEvent
from .dispatch import Dispatcher, Reply
from .mesh import NFP_BROKER_HEADER, WORKER_HEADER, NfpCandidate, NfpNode, default_data_dir
from .store import ClientJob, JobStore, WorkerJob
from .worker import JobCancelled, JobContext, Tasks, Worker

__all__ = [
    "NfpNode", "Worker", "Client", "Broker", "Tasks", "JobContext", "JobCancelled", "JobEvent",
    "Reply", "JobStore", "StoreError", "WorkerJob", "ClientJob", "Dispatcher", "NfpCandidate",
    "BrokerChanged", "NFP_BROKER_HEADER", "WORKER_HEADER", "default_data_dir", "ThreadedNfp",
]


if TYPE_CHECKING:
    from .threaded import ThreadedNfp


def __getattr__(name: str) -> object:
    if name == "ThreadedNfp":   # imported on first use: plain gevent programs never need it
        from .threaded import ThreadedNfp
        return ThreadedNfp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
