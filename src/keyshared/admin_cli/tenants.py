"""``keyshared admin tenants | brokers``."""

from __future__ import annotations

import typer

from keyshared.admin_cli.args import print_json, print_lines, seg
from keyshared.admin_cli.http import AdminHttp

app = typer.Typer(help="Operations about tenants.", no_args_is_help=True)
brokers_app = typer.Typer(help="Operations about brokers.", no_args_is_help=True)


def _split(values: str) -> list[str]:
    return [v.strip() for v in values.split(",") if v.strip()]


@app.command("list")
def list_tenants(ctx: typer.Context) -> None:
    """List the tenants."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", "/admin/v2/tenants"))


@app.command("get")
def get_tenant(ctx: typer.Context, tenant: str = typer.Argument(..., help="tenant name")) -> None:
    """Show a tenant's admin roles and allowed clusters."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", f"/admin/v2/tenants/{seg(tenant)}"))


@app.command("create")
def create_tenant(
    ctx: typer.Context,
    tenant: str = typer.Argument(..., help="tenant name"),
    admin_roles: str = typer.Option("", "--admin-roles", "-r", help="comma-separated roles"),
    allowed_clusters: str = typer.Option(
        "", "--allowed-clusters", "-c", help="comma-separated clusters (default: all)"
    ),
) -> None:
    """Create a tenant."""
    http: AdminHttp = ctx.obj
    clusters = _split(allowed_clusters) or http.call("GET", "/admin/v2/clusters")
    body = {"adminRoles": _split(admin_roles), "allowedClusters": clusters}
    http.call("PUT", f"/admin/v2/tenants/{seg(tenant)}", body)


@app.command("update")
def update_tenant(
    ctx: typer.Context,
    tenant: str = typer.Argument(..., help="tenant name"),
    admin_roles: str = typer.Option("", "--admin-roles", "-r", help="comma-separated roles"),
    allowed_clusters: str = typer.Option(
        "", "--allowed-clusters", "-c", help="comma-separated clusters"
    ),
) -> None:
    """Replace a tenant's admin roles and allowed clusters."""
    http: AdminHttp = ctx.obj
    current = http.call("GET", f"/admin/v2/tenants/{seg(tenant)}")
    body = {
        "adminRoles": _split(admin_roles) if admin_roles else current["adminRoles"],
        "allowedClusters": (
            _split(allowed_clusters) if allowed_clusters else current["allowedClusters"]
        ),
    }
    http.call("POST", f"/admin/v2/tenants/{seg(tenant)}", body)


@app.command("delete")
def delete_tenant(
    ctx: typer.Context,
    tenant: str = typer.Argument(..., help="tenant name"),
    force: bool = typer.Option(False, "--force", "-f", help="delete its namespaces too"),
) -> None:
    """Delete a tenant."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", f"/admin/v2/tenants/{seg(tenant)}", query={"force": force})


@brokers_app.command("healthcheck")
def healthcheck(ctx: typer.Context) -> None:
    """Check that the broker answers."""
    http: AdminHttp = ctx.obj
    result = http.request("GET", "/admin/v2/brokers/health")
    print_lines([result.data.decode(errors="replace")])
