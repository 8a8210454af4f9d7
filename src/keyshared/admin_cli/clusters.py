"""``keyshared admin clusters``: pulsar-admin's cluster commands and flags."""

from __future__ import annotations

from typing import Any

import typer

from keyshared.admin_cli.args import print_json, print_lines, seg
from keyshared.admin_cli.http import AdminHttp

app = typer.Typer(help="Operations about clusters.", no_args_is_help=True)

_CLUSTER = typer.Argument(..., help="cluster name")


def _data(
    url: str | None,
    url_secure: str | None,
    broker_url: str | None,
    broker_url_secure: str | None,
    auth_plugin: str | None,
    auth_parameters: str | None,
    proxy_url: str | None = None,
    proxy_protocol: str | None = None,
) -> dict[str, Any]:
    """``ClusterData`` from pulsar-admin's flags (unset flags are left out)."""
    fields = {
        "serviceUrl": url,
        "serviceUrlTls": url_secure,
        "brokerServiceUrl": broker_url,
        "brokerServiceUrlTls": broker_url_secure,
        "authenticationPlugin": auth_plugin,
        "authenticationParameters": auth_parameters,
        "proxyServiceUrl": proxy_url,
        "proxyProtocol": proxy_protocol,
    }
    return {k: v for k, v in fields.items() if v is not None}


_URL = typer.Option(None, "--url", help="service URL (http://...)")
_URL_SECURE = typer.Option(None, "--url-secure", help="TLS service URL (https://...)")
_BROKER_URL = typer.Option(None, "--broker-url", help="broker service URL (pulsar://...)")
_BROKER_URL_SECURE = typer.Option(
    None, "--broker-url-secure", help="TLS broker service URL (pulsar+ssl://...)"
)
_AUTH_PLUGIN = typer.Option(None, "--auth-plugin", help="authentication plugin class")
_AUTH_PARAMETERS = typer.Option(None, "--auth-parameters", help="authentication parameters")
_PROXY_URL = typer.Option(
    None, "--proxy-url", help="SNI proxy the replicator connects through (pulsar+ssl://...)"
)
_PROXY_PROTOCOL = typer.Option(None, "--proxy-protocol", help="proxy protocol (SNI)")


@app.command("list")
def list_clusters(ctx: typer.Context) -> None:
    """List the clusters."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", "/admin/v2/clusters"))


@app.command("get")
def get_cluster(ctx: typer.Context, cluster: str = _CLUSTER) -> None:
    """Show a cluster's configuration (ClusterData)."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", f"/admin/v2/clusters/{seg(cluster)}"))


@app.command("create")
def create_cluster(
    ctx: typer.Context,
    cluster: str = _CLUSTER,
    url: str | None = _URL,
    url_secure: str | None = _URL_SECURE,
    broker_url: str | None = _BROKER_URL,
    broker_url_secure: str | None = _BROKER_URL_SECURE,
    auth_plugin: str | None = _AUTH_PLUGIN,
    auth_parameters: str | None = _AUTH_PARAMETERS,
    proxy_url: str | None = _PROXY_URL,
    proxy_protocol: str | None = _PROXY_PROTOCOL,
) -> None:
    """Create a cluster."""
    http: AdminHttp = ctx.obj
    body = _data(
        url,
        url_secure,
        broker_url,
        broker_url_secure,
        auth_plugin,
        auth_parameters,
        proxy_url,
        proxy_protocol,
    )
    http.call("PUT", f"/admin/v2/clusters/{seg(cluster)}", body)


@app.command("update")
def update_cluster(
    ctx: typer.Context,
    cluster: str = _CLUSTER,
    url: str | None = _URL,
    url_secure: str | None = _URL_SECURE,
    broker_url: str | None = _BROKER_URL,
    broker_url_secure: str | None = _BROKER_URL_SECURE,
    auth_plugin: str | None = _AUTH_PLUGIN,
    auth_parameters: str | None = _AUTH_PARAMETERS,
    proxy_url: str | None = _PROXY_URL,
    proxy_protocol: str | None = _PROXY_PROTOCOL,
) -> None:
    """Replace a cluster's configuration."""
    http: AdminHttp = ctx.obj
    body = _data(
        url,
        url_secure,
        broker_url,
        broker_url_secure,
        auth_plugin,
        auth_parameters,
        proxy_url,
        proxy_protocol,
    )
    http.call("POST", f"/admin/v2/clusters/{seg(cluster)}", body)


@app.command("delete")
def delete_cluster(ctx: typer.Context, cluster: str = _CLUSTER) -> None:
    """Delete a cluster no tenant or namespace uses."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", f"/admin/v2/clusters/{seg(cluster)}")
