"""Broker configuration: Pulsar's ``broker.conf`` key names and defaults.

A setting can come from, in increasing precedence: the defaults here, a ``key=value`` file
(``--config``), environment variables ``PULSAR_PREFIX_<key>`` (as Pulsar's container images
accept), and command-line flags. Unknown keys are collected and reported, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "PULSAR_PREFIX_"


class ConfigError(ValueError):
    """A configuration value could not be parsed."""


# Pulsar broker.conf keys accepted as no-ops, each with the reason it means nothing here. Set in
# a file, the environment or on the command line, they are reported at start-up by name, as
# unknown keys are: nothing a user sets is silently ignored.
NO_OP_KEYS: dict[str, str] = {
    "zookeeperServers": "metadata is embedded (no ZooKeeper)",
    "configurationStoreServers": "metadata is embedded (no ZooKeeper)",
    "metadataStoreUrl": "metadata is embedded in the data directory",
    "configurationMetadataStoreUrl": "metadata is embedded in the data directory",
    "managedLedgerDefaultEnsembleSize": "storage is embedded (no bookie ensembles)",
    "managedLedgerDefaultWriteQuorum": "storage is embedded (no bookie ensembles)",
    "managedLedgerDefaultAckQuorum": "storage is embedded (no bookie ensembles)",
    "numIOThreads": "one asyncio event loop serves every connection",
    "numHttpServerThreads": "one asyncio event loop serves every connection",
    "numWorkerThreadsForNonPersistentTopic": "one asyncio event loop serves every connection",
    "functionsWorkerEnabled": "Pulsar Functions are not part of keyshared",
    "webSocketServiceEnabled": "the WebSocket proxy is not part of keyshared",
    "brokerShutdownTimeoutMs": "shutdown closes topics without a timeout",
    "tlsEnabled": "deprecated in Pulsar: TLS is on where brokerServicePortTls/webServicePortTls are set",
    # Parsed (BrokerConfig has them) but not honoured yet.
    "allowAutoTopicCreationType": "auto-created topics are always non-partitioned",
    "defaultNumPartitions": "auto-created topics are always non-partitioned",
    "activeConsumerFailoverDelayTimeMillis": "failover switches the active consumer at once",
    "statsUpdateFrequencyInSecs": "stats are computed when asked for",
    "preciseTimeBasedBacklogQuotaCheck": "the time backlog quota is always checked precisely"
    " (the oldest unacked entry's publish time)",
    "brokerDeleteInactivePartitionedTopicMetadataEnabled": "a partitioned topic's metadata is"
    " kept when its partitions are deleted as inactive",
}
"""Known Pulsar keys this broker accepts and ignores, with the reason."""

NO_OP_PREFIXES: dict[str, str] = {
    "bookkeeper": "storage is embedded (no BookKeeper)",
    "zookeeper": "metadata is embedded (no ZooKeeper)",
    "metadataStore": "metadata is embedded in the data directory",
    "loadBalancer": "one broker owns every bundle (no load balancing)",
    "functions": "Pulsar Functions are not part of keyshared",
}
"""Families of Pulsar keys accepted as no-ops, by prefix, with the reason."""


SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
"""Pulsar's subscription type names, as ``subscriptionTypesEnabled`` and its policies list them."""


def parse_subscription_types(value: str | Iterable[str]) -> frozenset[str]:
    """Subscription type names from a comma-separated setting or a policy list.

    Raises ``ValueError`` naming the first unknown type.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip() for n in items if n.strip()]
    for n in names:
        if n not in SUBSCRIPTION_TYPES:
            raise ValueError(
                f"Unknown subscription type {n!r}; known: {', '.join(SUBSCRIPTION_TYPES)}"
            )
    return frozenset(names)


def no_op_reason(key: str) -> str | None:
    """Why ``key`` is accepted and ignored, or None when it is not a known no-op."""
    if key in NO_OP_KEYS:
        return NO_OP_KEYS[key]
    for prefix, reason in NO_OP_PREFIXES.items():
        if key.startswith(prefix):
            return reason
    return None


@dataclass(slots=True)
class BrokerConfig:
    """Every setting the broker honours, under Pulsar's ``broker.conf`` names."""

    # --- listeners -----------------------------------------------------------------------
    bindAddress: str = "0.0.0.0"
    advertisedAddress: str = "127.0.0.1"
    brokerServicePort: int = 6650
    brokerServicePortTls: int = 0
    webServicePort: int = 8080
    webServicePortTls: int = 0
    clusterName: str = "standalone"
    # name:pulsar://host:port[,name:pulsar+ssl://host:port,...] (server/listeners.py).
    advertisedListeners: str = ""
    internalListenerName: str = ""
    # --- storage -------------------------------------------------------------------------
    dataDir: str = "./data"
    journalSyncData: bool = True
    managedLedgerMaxEntriesPerLedger: int = 50000
    managedLedgerMaxSizePerLedgerMbytes: int = 2048
    managedLedgerCacheSizeMB: int = 256
    # Ours: open ledgers (one per loaded topic) whose files stay open; the least recently used
    # idle ones beyond it are closed until next used. 0: an eighth of the open-files limit.
    managedLedgerMaxOpenWritableLedgers: int = 0
    managedLedgerMaxUnackedRangesToPersist: int = 10000
    managedLedgerMaxUnackedRangesToPersistInMetadataStore: int = 1000
    managedLedgerMaxBatchDeletedIndexToPersist: int = 10000
    managedLedgerDefaultMarkDeleteRateLimit: float = 1.0
    managedLedgerCursorPositionFlushSeconds: int = 60
    acknowledgmentAtBatchIndexLevelEnabled: bool = True
    # BookKeeper's bookie settings for the data directory's file system (fractions of it):
    # warn above diskUsageWarnThreshold; refuse new entries (producers get PersistenceError)
    # above diskUsageThreshold, until usage is below diskUsageLwmThreshold. Checked every
    # diskCheckInterval milliseconds, and at once when a write fails with ENOSPC.
    diskUsageThreshold: float = 0.95
    diskUsageWarnThreshold: float = 0.95
    diskUsageLwmThreshold: float = 0.90
    diskCheckInterval: int = 10000
    # Publishes received and not yet stored, all connections together: above it the broker
    # stops reading from every connection until they drain to half (Pulsar's default is half
    # of the JVM's direct memory; ours is fixed, see server/publish_buffer.py). 0 disables it.
    maxMessagePublishBufferSizeInMB: int = 64
    # Sends in flight on one connection before the broker stops reading it (resumes at half).
    maxPendingPublishRequestsPerConnection: int = 1000
    # --- rate limits (broker/throttle.py); 0 means no limit ----------------------------------
    # The publishRate of a topic that neither it nor its namespace sets (messages, bytes / s).
    maxPublishRatePerTopicInMessages: int = 0
    maxPublishRatePerTopicInBytes: int = 0
    # Every topic's publishes together.
    brokerPublisherThrottlingMaxMessageRate: int = 0
    brokerPublisherThrottlingMaxByteRate: int = 0
    # The least a publish throttle lasts (the token buckets' resolution), topic and broker.
    topicPublisherThrottlingTickTimeMillis: int = 10
    brokerPublisherThrottlingTickTimeMillis: int = 50
    # dispatchRate / subscriptionDispatchRate of topics and namespaces that do not set them.
    dispatchThrottlingRatePerTopicInMsg: int = 0
    dispatchThrottlingRatePerTopicInByte: int = 0
    dispatchThrottlingRatePerSubscriptionInMsg: int = 0
    dispatchThrottlingRatePerSubscriptionInByte: int = 0
    # Every subscription's dispatch together.
    dispatchThrottlingRateInMsg: int = 0
    dispatchThrottlingRateInByte: int = 0
    # --- topics and messages -------------------------------------------------------------
    allowAutoTopicCreation: bool = True
    allowAutoTopicCreationType: str = "non-partitioned"
    # Subscription types topics accept (namespace and topic policies may narrow it).
    subscriptionTypesEnabled: str = "Exclusive,Shared,Failover,Key_Shared"
    defaultNumPartitions: int = 1
    maxMessageSize: int = 5 * 1024 * 1024
    brokerDeduplicationEnabled: bool = False
    # Schemas (broker/schema/): the compatibility strategy of new versions, whether producers
    # may add versions, and whether a producer without a schema is refused on a topic with one.
    schemaCompatibilityStrategy: str = "FULL"
    isAllowAutoUpdateSchema: bool = True
    isSchemaValidationEnforced: bool = False
    # Names kept per topic for deduplication (Pulsar bounds its snapshot with it; here the state).
    brokerDeduplicationMaxNumberOfProducers: int = 10000
    # A producer name with no producer connected this long is forgotten. Pulsar's is whole
    # minutes; fractions are accepted here (tests use seconds).
    brokerDeduplicationProducerInactivityTimeoutMinutes: float = 360.0
    defaultRetentionTimeInMinutes: int = 0
    defaultRetentionSizeInMB: int = 0
    ttlDurationDefaultInSeconds: int = 0
    # Pulsar's is whole minutes; fractions are accepted here (tests use seconds).
    messageExpiryCheckIntervalInMinutes: float = 5.0
    # Topic compaction: bytes after the last compaction horizon that trigger one (0 = off),
    # how often that is checked, and whether messages without a key survive compaction.
    brokerServiceCompactionThresholdInBytes: int = 0
    brokerServiceCompactionMonitorIntervalInSeconds: int = 60
    topicCompactionRetainNullKey: bool = False
    # Limits (0 = unlimited); namespace and topic policies override them.
    maxProducersPerTopic: int = 0
    maxConsumersPerTopic: int = 0
    maxConsumersPerSubscription: int = 0
    maxSubscriptionsPerTopic: int = 0
    maxTopicsPerNamespace: int = 0
    maxNumPartitionsPerPartitionedTopic: int = 0
    # Backlog quotas (broker/backlog_quota.py): the default quota of every topic (-1 = none),
    # what happens past it, and how often topics are checked. Namespace and topic policies
    # (backlogQuotaMap) override the defaults per quota type.
    backlogQuotaCheckEnabled: bool = True
    backlogQuotaCheckIntervalInSeconds: int = 60
    backlogQuotaDefaultLimitBytes: int = -1
    # Deprecated in Pulsar; used only while backlogQuotaDefaultLimitBytes is not set (-1).
    backlogQuotaDefaultLimitGB: float = -1.0
    backlogQuotaDefaultLimitSecond: int = -1
    backlogQuotaDefaultRetentionPolicy: str = "producer_request_hold"
    # Inactive topics (broker/inactive_topics.py): deleted once unused this long. -1 for the
    # duration means Pulsar's "not set": brokerDeleteInactiveTopicsFrequencySeconds applies.
    brokerDeleteInactiveTopicsEnabled: bool = True
    brokerDeleteInactiveTopicsFrequencySeconds: int = 60
    brokerDeleteInactiveTopicsMode: str = "delete_when_no_subscriptions"
    brokerDeleteInactiveTopicsMaxInactiveDurationSeconds: int = -1
    # --- dispatch ------------------------------------------------------------------------
    dispatcherMaxReadBatchSize: int = 100
    dispatcherMinReadBatchSize: int = 1
    dispatcherRetryBackoffInitialTimeInMs: int = 1
    dispatcherRetryBackoffMaxTimeInMs: int = 10
    maxUnackedMessagesPerConsumer: int = 50000
    maxUnackedMessagesPerSubscription: int = 200000
    subscriptionRedeliveryTrackerEnabled: bool = True
    subscriptionKeySharedUseConsistentHashing: bool = True
    subscriptionKeySharedConsistentHashingReplicaPoints: int = 100
    subscriptionKeySharedUseClassicPersistentImplementation: bool = False
    keySharedLookAheadMsgInReplayThresholdPerConsumer: int = 2000
    keySharedLookAheadMsgInReplayThresholdPerSubscription: int = 20000
    keySharedUnblockingIntervalMs: int = 10
    dispatcherPauseOnAckStatePersistentEnabled: bool = False
    delayedDeliveryEnabled: bool = True
    delayedDeliveryTickTimeMillis: int = 1000
    activeConsumerFailoverDelayTimeMillis: int = 1000
    # --- connections (server/connection_limits.py, server/keepalive.py) -------------------
    # A silent client is pinged after this long and closed after as long again; 0: never.
    keepAliveIntervalSeconds: int = 30
    # Connections refused at accept above these (both listeners together); 0: unlimited.
    brokerMaxConnections: int = 0
    brokerMaxConnectionsPerIp: int = 0
    # --- security ------------------------------------------------------------------------
    authenticationEnabled: bool = False
    # How often a connection checks whether its credentials expired (then asks for new ones).
    authenticationRefreshCheckSeconds: int = 60
    authenticationProviders: str = ""
    authorizationEnabled: bool = False
    superUserRoles: str = ""
    tokenSecretKey: str = ""
    tokenPublicKey: str = ""
    tokenPublicAlg: str = "RS256"
    tokenAuthClaim: str = "sub"
    tokenAudienceClaim: str = "aud"
    tokenAudience: str = ""
    tokenAllowedClockSkewSeconds: int = 0
    # Pulsar's default is false; ours is true because /metrics names every topic and subscription.
    authenticateMetricsEndpoint: bool = True
    tlsCertificateFilePath: str = ""
    tlsKeyFilePath: str = ""
    tlsTrustCertsFilePath: str = ""
    tlsRequireTrustedClientCertOnConnect: bool = False
    # Pulsar's: accept client certificates that do not chain to tlsTrustCertsFilePath. Python's
    # TLS stack cannot take an untrusted certificate and still show it, so true is refused.
    tlsAllowInsecureConnection: bool = False
    # Comma-separated, Pulsar's names (TLSv1.2, TLSv1.3); empty: TLS 1.2 and newer.
    tlsProtocols: str = ""
    # Comma-separated TLS 1.2 cipher suites in OpenSSL's names; empty: OpenSSL's defaults.
    tlsCiphers: str = ""
    # The role of a client that presents no credentials (or a method no provider serves).
    anonymousUserRole: str = ""
    # htpasswd lines for AuthenticationProviderBasic: a path, file:/data: URL or base64.
    basicAuthConf: str = ""
    # The broker's own client (server/broker_client_auth.py): Pulsar's plugin class and its
    # parameters. The standalone creates public/default only when these authenticate as a
    # super user (or authentication is off), as Pulsar's standalone does.
    brokerClientAuthenticationPlugin: str = ""
    brokerClientAuthenticationParameters: str = ""
    # Replicated subscriptions (broker/replication/subscriptions.py): snapshot markers every
    # ...FrequencyMillis, pending ones given up after ...TimeoutSeconds, at most
    # ...MaxCachedPerSubscription snapshots kept per subscription.
    enableReplicatedSubscriptions: bool = True
    replicatedSubscriptionsSnapshotFrequencyMillis: int = 1000
    replicatedSubscriptionsSnapshotTimeoutSeconds: int = 30
    replicatedSubscriptionsSnapshotMaxCachedPerSubscription: int = 10
    # --- geo-replication (broker/replication/) --------------------------------------------
    # The replicator makes the topic exist on the remote cluster, shaped as here (Pulsar's
    # GeoPersistentReplicator.prepareCreateProducer, through the remote's admin API).
    createTopicToRemoteClusterForReplication: bool = True
    # TLS towards other clusters: brokerServiceUrlTls / serviceUrlTls, verified against
    # brokerClientTrustCertsFilePath (empty: the system's CAs).
    brokerClientTlsEnabled: bool = False
    brokerClientTrustCertsFilePath: str = ""
    # The client certificate and key (PEM) presented over that TLS when the authentication
    # plugin is not AuthenticationTls (whose own certificate wins, as in Pulsar).
    brokerClientCertificateFilePath: str = ""
    brokerClientKeyFilePath: str = ""
    # Check the remote's host name too (Pulsar's default: the chain only).
    tlsHostnameVerificationEnabled: bool = False
    # --- stats ---------------------------------------------------------------------------
    statsUpdateFrequencyInSecs: int = 60
    exposeConsumerLevelMetricsInPrometheus: bool = False
    exposeProducerLevelMetricsInPrometheus: bool = False

    unknown_keys: list[str] = field(default_factory=list)
    # Keys set by the user that are accepted as no-ops (see NO_OP_KEYS), in the order set.
    ignored_keys: list[str] = field(default_factory=list)
    # Keys the user set (file, environment or flags), whatever their value.
    explicit_keys: set[str] = field(default_factory=set)

    @property
    def max_frame_size(self) -> int:
        """Largest frame accepted: ``maxMessageSize`` plus Pulsar's 10 KiB padding for headers."""
        return self.maxMessageSize + 10 * 1024

    def set(self, key: str, raw: str) -> bool:
        """Set ``key`` from its text form. Returns False (and records it) when the key is unknown."""
        fields = {f.name: f for f in dataclasses.fields(self) if f.name not in _BOOKKEEPING}
        f = fields.get(key)
        if no_op_reason(key) is not None and key not in self.ignored_keys:
            self.ignored_keys.append(key)
        if f is None:
            if no_op_reason(key) is None and key not in self.unknown_keys:
                self.unknown_keys.append(key)
            return False
        value = _parse(key, raw, getattr(self, key))
        if key in _POSITIVE and not (isinstance(value, int | float) and value > 0):
            raise ConfigError(f"{key}: must be greater than 0, got {raw.strip()!r}")
        if key in _NON_NEGATIVE and not (isinstance(value, int) and value >= 0):
            raise ConfigError(f"{key}: must be 0 (off) or more, got {raw.strip()!r}")
        if key == "subscriptionTypesEnabled":
            try:
                parse_subscription_types(str(value))
            except ValueError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        if key == "schemaCompatibilityStrategy" and value not in _SCHEMA_STRATEGIES:
            raise ConfigError(f"{key}: expected one of {', '.join(_SCHEMA_STRATEGIES)}")
        allowed = _CHOICES.get(key)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{key}: expected one of {', '.join(allowed)}, got {raw.strip()!r}")
        setattr(self, key, value)
        self.explicit_keys.add(key)
        return True

    def update(self, values: Mapping[str, str]) -> None:
        """Apply many ``key -> text`` settings."""
        for key, raw in values.items():
            self.set(key, raw)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (for the admin API)."""
        d = dataclasses.asdict(self)
        for name in _BOOKKEEPING:
            d.pop(name, None)
        return d

    def warnings(self) -> list[str]:
        """What start-up reports: every key set that is unknown or accepted as a no-op."""
        out = [f"unknown configuration key {k!r} (ignored)" for k in self.unknown_keys]
        out += [
            f"configuration key {k!r} is accepted but ignored: {no_op_reason(k)}"
            for k in self.ignored_keys
        ]
        return out


_BOOKKEEPING = frozenset({"unknown_keys", "ignored_keys", "explicit_keys"})


# Pulsar's SchemaCompatibilityStrategy values (broker/schema/compatibility.py applies them).
SCHEMA_STRATEGIES = (
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)
_SCHEMA_STRATEGIES = SCHEMA_STRATEGIES

BACKLOG_QUOTA_RETENTION_POLICIES = (
    "producer_request_hold",
    "producer_exception",
    "consumer_backlog_eviction",
)
"""Pulsar's ``BacklogQuota.RetentionPolicy`` values."""

INACTIVE_TOPIC_DELETE_MODES = (
    "delete_when_no_subscriptions",
    "delete_when_subscriptions_caught_up",
)
"""Pulsar's ``InactiveTopicDeleteMode`` values."""

# Settings that take one of a few names.
_CHOICES: dict[str, tuple[str, ...]] = {
    "backlogQuotaDefaultRetentionPolicy": BACKLOG_QUOTA_RETENTION_POLICIES,
    "brokerDeleteInactiveTopicsMode": INACTIVE_TOPIC_DELETE_MODES,
}

# Settings whose zero or negative value has no meaning (Pulsar would fail to schedule it).
_POSITIVE = frozenset(
    (
        "brokerDeduplicationMaxNumberOfProducers",
        "brokerDeduplicationProducerInactivityTimeoutMinutes",
        "backlogQuotaCheckIntervalInSeconds",
        "brokerDeleteInactiveTopicsFrequencySeconds",
        "replicatedSubscriptionsSnapshotFrequencyMillis",
        "replicatedSubscriptionsSnapshotTimeoutSeconds",
        "replicatedSubscriptionsSnapshotMaxCachedPerSubscription",
    )
)


# Settings where 0 means "off" or "unlimited" and a negative value means nothing.
_NON_NEGATIVE = frozenset(
    ("brokerMaxConnections", "brokerMaxConnectionsPerIp", "keepAliveIntervalSeconds")
)


def _parse(key: str, raw: str, current: object) -> object:
    text = raw.strip()
    try:
        if isinstance(current, bool):
            low = text.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            return float(text)
    except ValueError as exc:
        raise ConfigError(f"{key}: cannot parse {raw!r} as {type(current).__name__}") from exc
    return text


def read_conf_file(path: Path) -> dict[str, str]:
    """Read a broker.conf-style file: ``key=value`` lines, ``#`` comments, blank lines."""
    values: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "=" not in stripped:
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {stripped!r}")
        key, _, value = stripped.partition("=")
        values[key.strip()] = value.strip()
    return values


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settings given as ``PULSAR_PREFIX_<key>`` environment variables."""
    env = os.environ if environ is None else environ
    return {k[len(ENV_PREFIX) :]: v for k, v in env.items() if k.startswith(ENV_PREFIX)}


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Build the configuration from defaults, a file, the environment and explicit overrides."""
    cfg = BrokerConfig()
    if path is not None:
        cfg.update(read_conf_file(path))
    cfg.update(env_overrides(environ))
    if overrides:
        cfg.update(overrides)
    return cfg
