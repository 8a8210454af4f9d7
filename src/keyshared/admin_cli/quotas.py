"""pulsar-admin's backlog-quota and inactive-topic-policy commands, for namespaces and topics.

``set-backlog-quota`` (``-l/--limit`` size, ``-lt/--limitTime`` time, ``-p/--policy``,
``-t/--type`` destination_storage | message_age), ``get-backlog-quotas``,
``remove-backlog-quota``; ``set-inactive-topic-policies`` (``-e``/``-d`` delete while inactive,
``-t/--max-inactive-duration``, ``-m/--delete-mode``), ``get-inactive-topic-policies``,
``remove-inactive-topic-policies``. The same commands are added to ``namespaces`` (argument
``tenant/namespace``) and ``topics`` (argument a topic, and ``--applied`` on the getters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from keyshared.admin_cli.args import parse_seconds, parse_size_bytes, print_json
from keyshared.admin_cli.http import AdminHttp
from keyshared.config import BACKLOG_QUOTA_RETENTION_POLICIES, INACTIVE_TOPIC_DELETE_MODES

QUOTA_TYPES = ("destination_storage", "message_age")

PathOf = Callable[..., str]


def backlog_quota_body(
    quota_type: str, limit: str | None, limit_time: str | None, policy: str
) -> dict[str, Any]:
    """The ``BacklogQuota`` pulsar-admin sends: the size for ``destination_storage``, the time
    for ``message_age`` (each required for its type), the other left at -1."""
    if quota_type not in QUOTA_TYPES:
        raise typer.BadParameter(f"--type must be one of {', '.join(QUOTA_TYPES)}")
    if policy not in BACKLOG_QUOTA_RETENTION_POLICIES:
        raise typer.BadParameter(
            f"--policy must be one of {', '.join(BACKLOG_QUOTA_RETENTION_POLICIES)}"
        )
    if quota_type == "destination_storage":
        if limit is None:
            raise typer.BadParameter("Quota type of 'destination_storage' needs a size limit")
        return {"limitSize": parse_size_bytes(limit), "limitTime": -1, "policy": policy}
    if limit_time is None:
        raise typer.BadParameter("Quota type of 'message_age' needs a time limit")
    return {"limitSize": -1, "limitTime": parse_seconds(limit_time), "policy": policy}


def inactive_body(enable: bool, disable: bool, duration: str, mode: str) -> dict[str, Any]:
    """The ``InactiveTopicPolicies`` pulsar-admin sends."""
    if enable == disable:
        raise typer.BadParameter(
            "give exactly one of --enable-delete-while-inactive or --disable-delete-while-inactive"
        )
    if mode not in INACTIVE_TOPIC_DELETE_MODES:
        raise typer.BadParameter(
            f"--delete-mode must be one of {', '.join(INACTIVE_TOPIC_DELETE_MODES)}"
        )
    return {
        "inactiveTopicDeleteMode": mode,
        "maxInactiveDurationSeconds": parse_seconds(duration),
        "deleteWhileInactive": enable,
    }


def add_commands(app: typer.Typer, path_of: PathOf, arg_help: str, *, applied: bool) -> None:
    """Add the commands to ``app``; ``path_of(name, *rest)`` makes the REST path of the
    namespace or topic; ``applied``: the getters take ``--applied`` (topics)."""
    target = typer.Argument(..., help=arg_help)

    @app.command("set-backlog-quota")
    def set_backlog_quota(
        ctx: typer.Context,
        name: str = target,
        limit: str | None = typer.Option(None, "--limit", "-l", help="size limit: 4096, 10M, 16G"),
        limit_time: str | None = typer.Option(
            None, "--limitTime", "-lt", help="time limit: 100, 100m, 3h, 2d"
        ),
        policy: str = typer.Option(
            ..., "--policy", "-p", help=" | ".join(BACKLOG_QUOTA_RETENTION_POLICIES)
        ),
        quota_type: str = typer.Option(
            "destination_storage", "--type", "-t", help="destination_storage | message_age"
        ),
    ) -> None:
        """Set a backlog quota."""
        http: AdminHttp = ctx.obj
        body = backlog_quota_body(quota_type, limit, limit_time, policy)
        http.call(
            "POST", path_of(name, "backlogQuota"), body, query={"backlogQuotaType": quota_type}
        )

    @app.command("remove-backlog-quota")
    def remove_backlog_quota(
        ctx: typer.Context,
        name: str = target,
        quota_type: str = typer.Option(
            "destination_storage", "--type", "-t", help="destination_storage | message_age"
        ),
    ) -> None:
        """Remove a backlog quota (the level above applies)."""
        http: AdminHttp = ctx.obj
        http.call("DELETE", path_of(name, "backlogQuota"), query={"backlogQuotaType": quota_type})

    @app.command("set-inactive-topic-policies")
    def set_inactive(
        ctx: typer.Context,
        name: str = target,
        enable: bool = typer.Option(
            False, "--enable-delete-while-inactive", "-e", help="delete inactive topics"
        ),
        disable: bool = typer.Option(
            False, "--disable-delete-while-inactive", "-d", help="keep inactive topics"
        ),
        duration: str = typer.Option(
            ..., "--max-inactive-duration", "-t", help="inactive this long: 1s, 10m, 5h, 3d"
        ),
        mode: str = typer.Option(
            ..., "--delete-mode", "-m", help=" | ".join(INACTIVE_TOPIC_DELETE_MODES)
        ),
    ) -> None:
        """Set the inactive topic policies."""
        http: AdminHttp = ctx.obj
        http.call(
            "POST",
            path_of(name, "inactiveTopicPolicies"),
            inactive_body(enable, disable, duration, mode),
        )

    @app.command("remove-inactive-topic-policies")
    def remove_inactive(ctx: typer.Context, name: str = target) -> None:
        """Remove the inactive topic policies (the level above applies)."""
        http: AdminHttp = ctx.obj
        http.call("DELETE", path_of(name, "inactiveTopicPolicies"))

    _add_getter(
        app,
        "get-backlog-quotas",
        "backlogQuotaMap",
        "Show the backlog quotas.",
        path_of,
        target,
        applied,
    )
    _add_getter(
        app,
        "get-inactive-topic-policies",
        "inactiveTopicPolicies",
        "Show the inactive topic policies.",
        path_of,
        target,
        applied,
    )


def _add_getter(
    app: typer.Typer, command: str, rest: str, doc: str, path_of: PathOf, target: Any, applied: bool
) -> None:
    """A ``get-...`` command; with ``applied`` it takes ``--applied`` (a topic's value in force)."""
    if applied:

        def get_applied(
            ctx: typer.Context,
            name: str = target,
            in_force: bool = typer.Option(
                False, "--applied", "-ap", help="the value in force (with inheritance)"
            ),
        ) -> None:
            http: AdminHttp = ctx.obj
            print_json(http.call("GET", path_of(name, rest), query={"applied": in_force}))

        get_applied.__doc__ = doc
        app.command(command)(get_applied)
        return

    def get(ctx: typer.Context, name: str = target) -> None:
        http: AdminHttp = ctx.obj
        print_json(http.call("GET", path_of(name, rest)))

    get.__doc__ = doc
    app.command(command)(get)
