"""``set-/get-/remove-publish-rate``, ``...-dispatch-rate`` and ``...-subscription-dispatch-rate``
for ``keyshared admin namespaces`` and ``topics``, with pulsar-admin's names and options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from keyshared.admin_cli.args import print_json
from keyshared.admin_cli.http import AdminHttp

_DISPATCH = (
    ("dispatch-rate", "dispatchRate", "the dispatch rate of each topic"),
    (
        "subscription-dispatch-rate",
        "subscriptionDispatchRate",
        "the dispatch rate of each subscription",
    ),
)


def add_rate_commands(
    app: typer.Typer, path: Callable[[str, str], str], target: Any, *, topic: bool
) -> None:
    """Register the nine rate commands on ``app`` (namespaces or topics); ``path(name, policy)``
    is the REST path of a policy of the named namespace or topic, ``target`` its argument."""
    what = "topic" if topic else "namespace"
    applied_opt = typer.Option(False, "--applied", "-ap", help="the value in force (inherited)")

    def set_publish_rate(
        ctx: typer.Context,
        name: str = target,
        msgs: int = typer.Option(-1, "--msg-publish-rate", "-m", help="messages/s (-1: none)"),
        nbytes: int = typer.Option(-1, "--byte-publish-rate", "-b", help="bytes/s (-1: none)"),
    ) -> None:
        http: AdminHttp = ctx.obj
        body = {"publishThrottlingRateInMsg": msgs, "publishThrottlingRateInByte": nbytes}
        http.call("POST", path(name, "publishRate"), body)

    set_publish_rate.__doc__ = f"Set the publish rate of each topic of the {what}."
    app.command("set-publish-rate")(set_publish_rate)
    _add_get_remove(app, path, target, "publish-rate", "publishRate", what, topic, applied_opt)

    for command, policy, text in _DISPATCH:
        _add_set_dispatch(app, path, target, command, policy, f"Set {text} of the {what}.")
        _add_get_remove(app, path, target, command, policy, what, topic, applied_opt)


def _add_set_dispatch(
    app: typer.Typer,
    path: Callable[[str, str], str],
    target: Any,
    command: str,
    policy: str,
    doc: str,
) -> None:
    def set_rate(
        ctx: typer.Context,
        name: str = target,
        msgs: int = typer.Option(-1, "--msg-dispatch-rate", "-md", help="messages per period"),
        nbytes: int = typer.Option(-1, "--byte-dispatch-rate", "-bd", help="bytes per period"),
        period: int = typer.Option(1, "--dispatch-rate-period", "-dt", help="period, seconds"),
        relative: bool = typer.Option(
            False, "--relative-to-publish-rate", "-rp", help="a share of the publish rate"
        ),
    ) -> None:
        http: AdminHttp = ctx.obj
        body = {
            "dispatchThrottlingRateInMsg": msgs,
            "dispatchThrottlingRateInByte": nbytes,
            "ratePeriodInSecond": period,
            "relativeToPublishRate": relative,
        }
        http.call("POST", path(name, policy), body)

    set_rate.__doc__ = doc
    app.command(f"set-{command}")(set_rate)


def _add_get_remove(
    app: typer.Typer,
    path: Callable[[str, str], str],
    target: Any,
    command: str,
    policy: str,
    what: str,
    topic: bool,
    applied_opt: Any,
) -> None:
    words = command.replace("-", " ")
    if topic:

        def get_rate(ctx: typer.Context, name: str = target, applied: bool = applied_opt) -> None:
            http: AdminHttp = ctx.obj
            print_json(http.call("GET", path(name, policy), query={"applied": applied}))

    else:

        def get_rate(ctx: typer.Context, name: str = target) -> None:  # type: ignore[misc]
            http: AdminHttp = ctx.obj
            print_json(http.call("GET", path(name, policy)))

    def remove_rate(ctx: typer.Context, name: str = target) -> None:
        http: AdminHttp = ctx.obj
        http.call("DELETE", path(name, policy))

    get_rate.__doc__ = f"Show the {words} of the {what}."
    remove_rate.__doc__ = f"Remove the {words} of the {what} (the level above applies)."
    app.command(f"get-{command}")(get_rate)
    app.command(f"remove-{command}")(remove_rate)
