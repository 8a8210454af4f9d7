"""``keyshared admin topics set-/get-replicated-subscription-status``, with pulsar-admin's names
and options: turn the replication of a subscription's state to the other clusters on or off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from keyshared.admin_cli.args import print_json
from keyshared.admin_cli.http import AdminHttp


def add_commands(app: typer.Typer, sub_path: Callable[..., str], target: Any) -> None:
    """Register both commands on ``app``; ``sub_path(topic, sub, *rest)`` is a subscription's
    REST path, ``target`` the topic argument."""
    sub_opt = typer.Option(..., "--subscription", "-s", help="subscription name")

    def set_status(
        ctx: typer.Context,
        topic: str = target,
        subscription: str = sub_opt,
        enable: bool = typer.Option(False, "--enable", "-e", help="replicate its state"),
        disable: bool = typer.Option(False, "--disable", "-d", help="stop replicating it"),
    ) -> None:
        """Turn the replication of a subscription's state on (--enable) or off (--disable)."""
        if enable == disable:
            raise typer.BadParameter("give exactly one of --enable or --disable")
        http: AdminHttp = ctx.obj
        http.call("POST", sub_path(topic, subscription, "replicatedSubscriptionStatus"), enable)

    def get_status(ctx: typer.Context, topic: str = target, subscription: str = sub_opt) -> None:
        """Whether a subscription's state is replicated, by topic (partition)."""
        http: AdminHttp = ctx.obj
        print_json(http.call("GET", sub_path(topic, subscription, "replicatedSubscriptionStatus")))

    app.command("set-replicated-subscription-status")(set_status)
    app.command("get-replicated-subscription-status")(get_status)
