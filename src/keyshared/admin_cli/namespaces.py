"""``keyshared admin namespaces ...`` (pulsar-admin's namespace commands)."""

from __future__ import annotations

import typer

from keyshared.admin_cli.args import (
    namespace_path,
    parse_seconds,
    print_json,
    print_lines,
    retention_policies,
    seg,
)
from keyshared.admin_cli.http import AdminHttp
from keyshared.admin_cli.quotas import add_commands as add_quota_commands
from keyshared.admin_cli.rates import add_rate_commands

app = typer.Typer(help="Operations about namespaces.", no_args_is_help=True)

NS = typer.Argument(..., help="tenant/namespace")


@app.command("list")
def list_namespaces(ctx: typer.Context, tenant: str = typer.Argument(..., help="tenant")) -> None:
    """List the namespaces of a tenant."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", f"/admin/v2/namespaces/{seg(tenant)}"))


@app.command("create")
def create(ctx: typer.Context, namespace: str = NS) -> None:
    """Create a namespace."""
    http: AdminHttp = ctx.obj
    http.call("PUT", namespace_path(namespace))


@app.command("delete")
def delete(
    ctx: typer.Context,
    namespace: str = NS,
    force: bool = typer.Option(False, "--force", "-f", help="delete its topics too"),
) -> None:
    """Delete a namespace."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", namespace_path(namespace), query={"force": force})


@app.command("policies")
def policies(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the namespace's policies."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", namespace_path(namespace)))


@app.command("topics")
def topics(ctx: typer.Context, namespace: str = NS) -> None:
    """List the namespace's topics."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", namespace_path(namespace, "topics")))


@app.command("unload")
def unload(ctx: typer.Context, namespace: str = NS) -> None:
    """Unload every topic of the namespace."""
    http: AdminHttp = ctx.obj
    http.call("PUT", namespace_path(namespace, "unload"))


@app.command("clear-backlog")
def clear_backlog(
    ctx: typer.Context,
    namespace: str = NS,
    sub: str = typer.Option("", "--sub", "-s", help="only this subscription"),
    force: bool = typer.Option(False, "--force", "-force", help="accepted for compatibility"),
) -> None:
    """Clear the backlog of every subscription (or of one) on every topic of the namespace."""
    http: AdminHttp = ctx.obj
    path = namespace_path(namespace, "clearBacklog", seg(sub)) if sub else None
    http.call("POST", path or namespace_path(namespace, "clearBacklog"))


# --- retention -------------------------------------------------------------------------
@app.command("set-retention")
def set_retention(
    ctx: typer.Context,
    namespace: str = NS,
    size: str = typer.Option(..., "--size", "-s", help="size limit: 4096, 10M, 16G, -1"),
    time: str = typer.Option(..., "--time", "-t", help="time limit: 100m, 3h, 2d, 5w, -1"),
) -> None:
    """Set the retention policy of the namespace."""
    http: AdminHttp = ctx.obj
    http.call("POST", namespace_path(namespace, "retention"), retention_policies(size, time))


@app.command("get-retention")
def get_retention(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the retention policy of the namespace."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", namespace_path(namespace, "retention")))


@app.command("remove-retention")
def remove_retention(ctx: typer.Context, namespace: str = NS) -> None:
    """Remove the retention policy of the namespace."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", namespace_path(namespace, "retention"))


# --- deduplication ---------------------------------------------------------------------
@app.command("set-deduplication")
def set_deduplication(
    ctx: typer.Context,
    namespace: str = NS,
    enable: bool = typer.Option(False, "--enable", "-e", help="enable deduplication"),
    disable: bool = typer.Option(False, "--disable", "-d", help="disable deduplication"),
) -> None:
    """Enable or disable deduplication for the namespace."""
    if enable == disable:
        raise typer.BadParameter("give exactly one of --enable or --disable")
    http: AdminHttp = ctx.obj
    http.call("POST", namespace_path(namespace, "deduplication"), enable)


@app.command("get-deduplication")
def get_deduplication(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the namespace's deduplication setting."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", namespace_path(namespace, "deduplication")))


@app.command("remove-deduplication")
def remove_deduplication(ctx: typer.Context, namespace: str = NS) -> None:
    """Remove the namespace's deduplication setting (the broker's applies)."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", namespace_path(namespace, "deduplication"))


# --- message TTL -----------------------------------------------------------------------
@app.command("set-message-ttl")
def set_message_ttl(
    ctx: typer.Context,
    namespace: str = NS,
    ttl: str = typer.Option(..., "--messageTTL", "-ttl", "--ttl", help="TTL: 3600, 60m, 1h"),
) -> None:
    """Set the message TTL of the namespace."""
    http: AdminHttp = ctx.obj
    http.call("POST", namespace_path(namespace, "messageTTL"), parse_seconds(ttl))


@app.command("get-message-ttl")
def get_message_ttl(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the message TTL of the namespace."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", namespace_path(namespace, "messageTTL")))


@app.command("remove-message-ttl")
def remove_message_ttl(ctx: typer.Context, namespace: str = NS) -> None:
    """Remove the message TTL of the namespace."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", namespace_path(namespace, "messageTTL"))


# --- PIP-299 pause ---------------------------------------------------------------------
_PAUSE = "dispatcherPauseOnAckStatePersistent"


@app.command("set-dispatcher-pause-on-ack-state-persistent")
def set_pause(ctx: typer.Context, namespace: str = NS) -> None:
    """Pause dispatch while the ack state cannot be persisted (PIP-299)."""
    http: AdminHttp = ctx.obj
    http.call("POST", namespace_path(namespace, _PAUSE))


@app.command("get-dispatcher-pause-on-ack-state-persistent")
def get_pause(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the namespace's PIP-299 pause setting."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", namespace_path(namespace, _PAUSE)))


@app.command("remove-dispatcher-pause-on-ack-state-persistent")
def remove_pause(ctx: typer.Context, namespace: str = NS) -> None:
    """Remove the namespace's PIP-299 pause setting."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", namespace_path(namespace, _PAUSE))


# --- permissions -----------------------------------------------------------------------
@app.command("permissions")
def permissions(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the roles with permissions on the namespace."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", namespace_path(namespace, "permissions")))


@app.command("grant-permission")
def grant_permission(
    ctx: typer.Context,
    namespace: str = NS,
    role: str = typer.Option(..., "--role", help="client role"),
    actions: str = typer.Option(..., "--actions", help="comma-separated: produce,consume"),
) -> None:
    """Grant actions on the namespace to a role."""
    http: AdminHttp = ctx.obj
    wanted = [a.strip() for a in actions.split(",") if a.strip()]
    http.call("POST", namespace_path(namespace, "permissions", seg(role)), wanted)


@app.command("revoke-permission")
def revoke_permission(
    ctx: typer.Context,
    namespace: str = NS,
    role: str = typer.Option(..., "--role", help="client role"),
) -> None:
    """Revoke every permission of a role on the namespace."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", namespace_path(namespace, "permissions", seg(role)))


# --- backlog quotas and inactive topic policies (admin_cli/quotas.py) -------------------
add_quota_commands(app, namespace_path, "tenant/namespace", applied=False)
# --- rates (publish, dispatch, subscription dispatch) -----------------------------------
add_rate_commands(app, lambda ns, policy: namespace_path(ns, policy), NS, topic=False)
