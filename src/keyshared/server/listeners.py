"""Pulsar's advertised listeners: named sets of URLs a lookup can answer with.

``advertisedListeners=internal:pulsar://10.0.0.1:6650,external:pulsar+ssl://broker.example:6651``
gives each listener at most one ``pulsar://`` and one ``pulsar+ssl://`` URL;
``internalListenerName`` (default: the first listener) is what a lookup answers when the client
names no listener. A client that names a listener (``listener_name`` in the client, the lookup's
``advertised_listener_name``) gets that listener's URLs, and a lookup naming a listener this
broker does not have is refused, with Pulsar's message.
"""

from __future__ import annotations

from dataclasses import dataclass

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.config import BrokerConfig, ConfigError

_SCHEMES = ("pulsar", "pulsar+ssl")


@dataclass(frozen=True, slots=True)
class Listener:
    """One advertised listener's URLs (empty when it has none of that kind)."""

    name: str
    url: str = ""
    url_tls: str = ""


def parse_listeners(cfg: BrokerConfig) -> tuple[dict[str, Listener], str]:
    """The listeners of ``advertisedListeners`` and the internal listener's name."""
    text = cfg.advertisedListeners.strip()
    if not text:
        if cfg.internalListenerName:
            raise ConfigError("internalListenerName needs advertisedListeners")
        return {}, ""
    if "advertisedAddress" in cfg.explicit_keys:
        raise ConfigError("`advertisedListeners` and `advertisedAddress` must not appear together")
    urls: dict[str, dict[str, str]] = {}
    order: list[str] = []
    for item in text.split(","):
        name, sep, url = item.strip().partition(":")
        scheme = url.partition("://")[0]
        if not sep or not name or scheme not in _SCHEMES or "://" not in url:
            raise ConfigError(
                f"advertisedListeners: {item.strip()!r} is not name:pulsar://host:port "
                "or name:pulsar+ssl://host:port"
            )
        per = urls.setdefault(name, {})
        if name not in order:
            order.append(name)
        if scheme in per:
            raise ConfigError(f"advertisedListeners: listener {name} has two {scheme} URLs")
        per[scheme] = url
    internal = cfg.internalListenerName or order[0]
    if internal not in urls:
        raise ConfigError(f"internalListenerName {internal} is not in advertisedListeners")
    listeners = {
        n: Listener(n, urls[n].get("pulsar", ""), urls[n].get("pulsar+ssl", "")) for n in order
    }
    return listeners, internal


def listener_for(listeners: dict[str, Listener], internal: str, asked: str) -> Listener | None:
    """The listener a lookup answers with: the one asked for, else the internal one (None when
    no listeners are configured and none was asked for: answer with the broker's own URLs)."""
    if asked:
        found = listeners.get(asked)
        if found is None:
            raise BrokerError(
                ServerError.ServiceNotReady, f"the broker do not have {asked} listener"
            )
        return found
    return listeners.get(internal) if listeners else None
