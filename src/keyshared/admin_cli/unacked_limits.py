"""``keyshared admin namespaces|topics set-|get-|remove-max-unacked-messages-per-consumer`` and
``...-per-subscription``, as pulsar-admin names them.

Namespaces take the value with ``-c`` (``--max-unacked-messages-per-consumer`` /
``--max-unacked-messages-per-subscription``), topics with ``-m``/``--maxNum``; a topic's getter
takes ``-ap``/``--applied`` for the value in force. pulsar-admin also knows the topic commands
as ``...-on-consumer``/``...-on-subscription``; those names work too. The REST paths are in
``admin/routes_limits.py``.
"""

from __future__ import annotations

import typer

from keyshared.admin_cli.args import namespace_path, print_json, topic_path
from keyshared.admin_cli.http import AdminHttp

# what (in command names) -> (namespace path, topic path, namespace option)
_LIMITS: dict[str, tuple[str, str, str]] = {
    "consumer": (
        "maxUnackedMessagesPerConsumer",
        "maxUnackedMessagesOnConsumer",
        "--max-unacked-messages-per-consumer",
    ),
    "subscription": (
        "maxUnackedMessagesPerSubscription",
        "maxUnackedMessagesOnSubscription",
        "--max-unacked-messages-per-subscription",
    ),
}

NS = typer.Argument(..., help="tenant/namespace")
TOPIC = typer.Argument(..., help="persistent://tenant/namespace/topic (or a short name)")
APPLIED = typer.Option(False, "--applied", "-ap", help="the value in force (with inheritance)")


def register(namespaces: typer.Typer, topics: typer.Typer) -> None:
    """Add the unacked-limit commands to the ``namespaces`` and ``topics`` groups."""
    for what, (ns_path, topic_path_name, ns_option) in _LIMITS.items():
        _namespace_commands(namespaces, what, ns_path, ns_option)
        _topic_commands(topics, what, topic_path_name)


def _namespace_commands(app: typer.Typer, what: str, path: str, option: str) -> None:
    label = f"max unacked messages per {what}"

    @app.command(f"set-max-unacked-messages-per-{what}", help=f"Set the {label} of a namespace.")
    def set_limit(
        ctx: typer.Context,
        namespace: str = NS,
        value: int = typer.Option(..., option, "-c", help=f"{path} (0: unlimited)"),
    ) -> None:
        http: AdminHttp = ctx.obj
        http.call("POST", namespace_path(namespace, path), value)

    @app.command(f"get-max-unacked-messages-per-{what}", help=f"Show the {label} of a namespace.")
    def get_limit(ctx: typer.Context, namespace: str = NS) -> None:
        http: AdminHttp = ctx.obj
        print_json(http.call("GET", namespace_path(namespace, path)))

    @app.command(
        f"remove-max-unacked-messages-per-{what}", help=f"Remove the {label} of a namespace."
    )
    def remove_limit(ctx: typer.Context, namespace: str = NS) -> None:
        http: AdminHttp = ctx.obj
        http.call("DELETE", namespace_path(namespace, path))


def _topic_commands(app: typer.Typer, what: str, path: str) -> None:
    label = f"max unacked messages per {what}"

    def set_limit(
        ctx: typer.Context,
        topic: str = TOPIC,
        value: int = typer.Option(
            ..., "--maxNum", "-m", help=f"max unacked messages on {what} (0: unlimited)"
        ),
    ) -> None:
        http: AdminHttp = ctx.obj
        http.call("POST", topic_path(topic, path), value)

    def get_limit(ctx: typer.Context, topic: str = TOPIC, applied: bool = APPLIED) -> None:
        http: AdminHttp = ctx.obj
        print_json(http.call("GET", topic_path(topic, path), query={"applied": applied}))

    def remove_limit(ctx: typer.Context, topic: str = TOPIC) -> None:
        http: AdminHttp = ctx.obj
        http.call("DELETE", topic_path(topic, path))

    for word, hidden in (("per", False), ("on", True)):
        name = f"max-unacked-messages-{word}-{what}"
        app.command(f"set-{name}", help=f"Set the {label} of a topic.", hidden=hidden)(set_limit)
        app.command(f"get-{name}", help=f"Show the {label} of a topic.", hidden=hidden)(get_limit)
        app.command(f"remove-{name}", help=f"Remove the {label} of a topic.", hidden=hidden)(
            remove_limit
        )
