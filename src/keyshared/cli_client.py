"""``keyshared client produce | consume``: pulsar-client's commands, on the official client."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from keyshared.admin_cli.http import parse_auth_params

DEFAULT_URL = "pulsar://localhost:6650"
_TYPES = {"exclusive": "Exclusive", "shared": "Shared", "failover": "Failover"}
_TYPES.update({"key_shared": "KeyShared", "keyshared": "KeyShared", "key-shared": "KeyShared"})

app = typer.Typer(
    name="keyshared client",
    help="Produce and consume messages with the official Pulsar client.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    url: str = typer.Option(DEFAULT_URL, "--url", envvar="KEYSHARED_URL", help="Broker URL."),
    auth_plugin: str = typer.Option("", "--auth-plugin", help="Only token auth is supported."),
    auth_params: str = typer.Option(
        "", "--auth-params", envvar="KEYSHARED_AUTH_PARAMS", help="token:XXX or file:/path"
    ),
    tls_trust_cert_path: str = typer.Option(
        "", "--tls-trust-cert-path", help="CA certificates for pulsar+ssl://"
    ),
) -> None:
    """Global options, given before the command (as with pulsar-client)."""
    if auth_plugin and "token" not in auth_plugin.lower():
        raise typer.BadParameter(
            "only token authentication is supported", param_hint="--auth-plugin"
        )
    ctx.obj = {
        "url": url,
        "token": parse_auth_params(auth_params),
        "tls_trust": tls_trust_cert_path or None,
    }


def _client(opts: dict[str, Any]) -> Any:
    import pulsar

    # The client's own C++ console logger: a Python logger callback can abort the process at
    # exit ("terminate called without an active exception") with pulsar-client 3.x.
    kwargs: dict[str, Any] = {"logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)}
    if opts["token"]:
        kwargs["authentication"] = pulsar.AuthenticationToken(opts["token"])
    if opts["tls_trust"]:
        kwargs["tls_trust_certs_file_path"] = opts["tls_trust"]
    return pulsar.Client(opts["url"], **kwargs)


class _Pacer:
    """Spaces operations to at most ``rate`` per second (0: no limit)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next > now:
            time.sleep(self.next - now)
        self.next = max(self.next, now) + self.interval


@app.command("produce")
def produce(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="topic name"),
    messages: Annotated[
        list[str] | None, typer.Option("--messages", "-m", help="messages to send")
    ] = None,
    files: Annotated[
        list[Path] | None, typer.Option("--files", "-f", help="files whose bytes to send")
    ] = None,
    num_produce: int = typer.Option(1, "--num-produce", "-n", help="times to send them"),
    rate: float = typer.Option(0.0, "--rate", "-r", help="messages per second (0: no limit)"),
    key: str = typer.Option("", "--key", "-k", help="message key"),
    properties: Annotated[
        list[str] | None, typer.Option("--properties", "-p", help="key=value")
    ] = None,
    separator: str = typer.Option(",", "--separator", "-s", help="splits --messages"),
    disable_batching: bool = typer.Option(False, "--disable-batching", "-db"),
    chunking: bool = typer.Option(False, "--chunking", "-c", help="split large messages"),
) -> None:
    """Send messages to a topic."""
    bodies: list[bytes] = []
    for m in messages or []:
        bodies.extend(part.encode() for part in (m.split(separator) if separator else [m]))
    bodies.extend(f.read_bytes() for f in files or [])
    if not bodies:
        raise typer.BadParameter("give at least one message (-m) or file (-f)")
    props = {}
    for p in properties or []:
        k, sep, v = p.partition("=")
        if not sep:
            raise typer.BadParameter(f"property {p!r} is not key=value", param_hint="-p")
        props[k] = v
    client = _client(ctx.obj)
    sent = 0
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=not disable_batching and not chunking,
            chunking_enabled=chunking,
        )
        pacer = _Pacer(rate)
        for _ in range(num_produce):
            for body in bodies:
                pacer.wait()
                producer.send(body, properties=props or None, partition_key=key or None)
                sent += 1
        producer.flush()
        producer.close()
    finally:
        client.close()
    print(f"{sent} messages successfully produced")


@app.command("consume")
def consume(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="topic name"),
    subscription: str = typer.Option(..., "--subscription-name", "-s", help="subscription"),
    sub_type: str = typer.Option(
        "Exclusive", "--subscription-type", "-t", help="Exclusive, Shared, Failover, Key_Shared"
    ),
    position: str = typer.Option(
        "Latest", "--subscription-position", "-p", help="Latest or Earliest (new subscriptions)"
    ),
    num_messages: int = typer.Option(1, "--num-messages", "-n", help="0 consumes forever"),
    rate: float = typer.Option(0.0, "--rate", "-r", help="messages per second (0: no limit)"),
    hide_content: bool = typer.Option(False, "--hide-content", help="do not print payloads"),
    timeout: float = typer.Option(
        0.0, "--timeout", help="stop after this many seconds without a message (0: never)"
    ),
) -> None:
    """Receive (and acknowledge) messages from a subscription."""
    import pulsar

    kind = _TYPES.get(sub_type.lower())
    if kind is None:
        raise typer.BadParameter(f"unknown subscription type {sub_type!r}", param_hint="-t")
    if position.lower() not in ("latest", "earliest"):
        raise typer.BadParameter(f"unknown position {position!r}", param_hint="-p")
    initial = pulsar.InitialPosition.Earliest if position.lower() == "earliest" else None
    client = _client(ctx.obj)
    got = 0
    try:
        consumer = client.subscribe(
            topic,
            subscription,
            consumer_type=getattr(pulsar.ConsumerType, kind),
            initial_position=initial or pulsar.InitialPosition.Latest,
        )
        pacer = _Pacer(rate)
        wait_ms = int(timeout * 1000) if timeout > 0 else None
        while num_messages <= 0 or got < num_messages:
            pacer.wait()
            try:
                msg = consumer.receive(wait_ms) if wait_ms else consumer.receive()
            except pulsar.Timeout:
                break
            got += 1
            _print_message(msg, hide_content)
            consumer.acknowledge(msg)
        consumer.close()
    finally:
        client.close()
    print(f"{got} messages successfully consumed")


def _print_message(msg: Any, hide_content: bool) -> None:
    key = msg.partition_key() or "null"
    props = ", ".join(f"{k}={v}" for k, v in msg.properties().items())
    line = f"key:[{key}], properties:[{props}]"
    if not hide_content:
        line += f", content:{msg.data().decode(errors='replace')}"
    sys.stdout.write("----- got message -----\n" + line + "\n")


def main(argv: list[str]) -> int:
    """Run ``keyshared client`` with ``argv``; returns the exit status."""
    try:
        app(args=argv, prog_name="keyshared client", standalone_mode=True)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception as err:  # the client library's errors: say what failed, no traceback
        sys.stderr.write(f"{type(err).__name__}: {err}\n")
        return 1
    return 0
