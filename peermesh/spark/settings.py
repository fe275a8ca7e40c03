"""The read and write options of the ``peermesh`` format, parsed (``SourceOptions``,
``WriteOptions``); ``options`` checks each option's name and value first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from .options import Use, check_use, parsed

if TYPE_CHECKING:
    from .executor import GatewaySettings
    from .service import MeshSettings

__all__ = ["GROUP_COLUMN", "SourceOptions", "WriteOptions"]


#: the column a write without option ``group`` takes each row's group from (Kafka's ``topic``)
GROUP_COLUMN = "group"


def _groups(options: Mapping[str, str]) -> list[str]:
    raw = options.get("group") or options.get("groups") or ""
    groups = [g.strip() for g in raw.split(",") if g.strip()]
    return list(dict.fromkeys(groups))


@dataclass(frozen=True)
class SourceOptions:
    """Read options, parsed (keys arrive lower-cased, values as strings)."""

    endpoint: str
    groups: tuple[str, ...]
    token: Optional[str] = None
    #: the log service's CURVE public key (``DriverService.server_key``), if it has keys
    server_key: Optional[str] = None
    partitions: int = 1
    starting: str = "latest"
    ending: str = "latest"
    max_offsets: Optional[int] = None
    fail_on_data_loss: bool = True
    decode: str = "auto"
    auto_join: bool = True
    #: where single groups start, as ``startingOffsets`` allows per group
    starting_by_group: Mapping[str, str] = field(default_factory=dict)
    #: epoch seconds per group: start at the first message received then or later
    starting_times: Mapping[str, float] = field(default_factory=dict)
    min_offsets: Optional[int] = None
    max_trigger_delay: float = 15 * 60.0
    consumer_name: Optional[str] = None
    #: a group with no message at or after its starting time: ``error`` or ``latest``
    timestamp_strategy: str = "error"

    @classmethod
    def parse(cls, options: Mapping[str, str], batch: bool) -> "SourceOptions":
        """From data source options; ``ValueError`` naming the bad option."""
        endpoint = options.get("endpoint")
        if not endpoint:
            raise ValueError(
                "option 'endpoint' (the driver's log service, tcp://HOST:PORT) is missing: "
                "start it with peermesh.spark.start_service(spark, groups=[...]), which "
                "registers the source with the endpoint, or pass .option('endpoint', ...)")
        groups = _groups(options)
        if not groups:
            raise ValueError("option 'group' is missing: name one group, or several "
                             "separated by commas")
        check_use(options, Use.BATCH_READ if batch else Use.STREAM_READ)
        default = "earliest" if batch else "latest"
        starting = parsed(options, "startingOffsets", default)
        by_group = starting if isinstance(starting, dict) else {}
        at = parsed(options, "startingTimestamp")
        named_times = parsed(options, "startingOffsetsByTimestamp", {})
        # startingOffsetsByTimestamp wins for the groups it names, startingTimestamp holds
        # for the others
        times = {**({g: at for g in groups} if at is not None else {}), **named_times}
        for name, named in (("startingOffsets", by_group),
                            ("startingOffsetsByTimestamp", named_times)):
            stray = sorted(set(named) - set(groups))
            if stray:
                raise ValueError(f"option {name} names group(s) {', '.join(stray)} that the "
                                 f"read does not include (groups: {', '.join(groups)})")
        ending = parsed(options, "endingOffsets", "latest")
        if batch:  # as Kafka's source: a batch reads a range that is there
            if "latest" in ([starting] if isinstance(starting, str) else starting.values()):
                raise ValueError("option startingOffsets: latest (-1) is not valid for a "
                                 "batch read (spark.read), as in Kafka's source: start at "
                                 "earliest, an offset, or use spark.readStream")
            if ending == "earliest":
                raise ValueError("option endingOffsets: earliest (-2) is not valid for a "
                                 "batch read, as in Kafka's source: end at latest or an offset")
        least, most = (parsed(options, "minOffsetsPerTrigger"),
                       parsed(options, "maxOffsetsPerTrigger"))
        if least is not None and most is not None and least > most:
            raise ValueError(f"option minOffsetsPerTrigger ({least}) must not be greater than "
                             f"maxOffsetsPerTrigger ({most}), as in Kafka's source")
        return cls(endpoint=endpoint, groups=tuple(groups), token=options.get("token") or None,
                   server_key=options.get("serverkey") or None,
                   partitions=parsed(options, "partitions", 1),
                   starting=default if by_group else starting,
                   starting_by_group=by_group, starting_times=times,
                   min_offsets=least,
                   max_trigger_delay=parsed(options, "maxTriggerDelay", 15 * 60.0),
                   consumer_name=parsed(options, "consumerName"),
                   ending=ending, max_offsets=most,
                   timestamp_strategy=parsed(options, "startingOffsetsByTimestampStrategy",
                                             "error"),
                   fail_on_data_loss=parsed(options, "failOnDataLoss", True),
                   decode=parsed(options, "decode", "auto"),
                   auto_join=parsed(options, "autoJoin", True))


@dataclass(frozen=True)
class WriteOptions:
    """Write options, parsed."""

    group: Optional[str]
    service: Optional[str]
    action: Optional[str]
    version: Optional[str]
    category: str
    column: Optional[str]
    mesh: MeshSettings
    peers: int = 1
    discovery_timeout: float = 10.0
    require_delivery: bool = True
    timeout: Optional[float] = None
    max_in_flight: int = 64
    retries: int = 0
    #: shout each row to the group its ``group`` column names (no option ``group``)
    group_column: bool = False
    #: write through the driver's MTL gateway (option ``gateway``) instead of a mesh node
    gateway: Optional[GatewaySettings] = None

    @classmethod
    def parse(cls, options: Mapping[str, str], columns: Sequence[str] = ()) -> "WriteOptions":
        """From data source options (and the data's column names); ``ValueError`` naming
        the bad option."""
        from .executor import GatewaySettings
        from .service import MeshSettings

        check_use(options, Use.WRITE)
        group, service = options.get("group") or None, options.get("service") or None
        by_column = group is None and service is None and GROUP_COLUMN in columns
        if (group is None) == (service is None) and not by_column:
            raise ValueError("a peermesh write needs exactly one of option 'group' (shout each "
                             "row), a 'group' column (shout each row to the group it names) "
                             "or option 'service' (send each row as a Safir-Darbaan "
                             "request, with option 'action')")
        if service is not None and not options.get("action"):
            raise ValueError("option 'service' needs option 'action'")
        gateway = GatewaySettings.from_options(options)
        if options.get("serverkey") and not options.get("keyfile") and gateway is None:
            raise ValueError("the mesh has keys (option serverKey is set): a write needs "
                             "option keyFile, the secret certificate of the workers' hosts "
                             "(and allowedKeys, the directory of the keys they admit)")
        return cls(group=group, service=service, action=options.get("action") or None,
                   version=options.get("version") or None,
                   category=options.get("category") or "",
                   column=options.get("column") or None,
                   mesh=MeshSettings.from_options(options),
                   peers=parsed(options, "peers", 1),
                   discovery_timeout=parsed(options, "discoveryTimeout", 10.0),
                   require_delivery=parsed(options, "requireDelivery", True),
                   timeout=parsed(options, "timeout"),
                   max_in_flight=parsed(options, "maxInFlight", 64),
                   retries=parsed(options, "retries", 0), group_column=by_column,
                   gateway=gateway)
