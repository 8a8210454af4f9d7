"""``keyshared admin``: the root command and its global options, like ``pulsar-admin``."""

from __future__ import annotations

import sys

import typer

from keyshared.admin_cli.http import AdminError, AdminHttp, parse_auth_params

DEFAULT_ADMIN_URL = "http://localhost:8080"

app = typer.Typer(
    name="keyshared admin",
    help="Administer a keyshared (or Pulsar) broker through its admin REST API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    admin_url: str = typer.Option(
        DEFAULT_ADMIN_URL,
        "--admin-url",
        envvar="KEYSHARED_ADMIN_URL",
        help="Admin service URL (webServiceUrl).",
    ),
    auth_plugin: str = typer.Option(
        "",
        "--auth-plugin",
        help="Authentication plugin (only token authentication is supported; may be omitted).",
    ),
    auth_params: str = typer.Option(
        "",
        "--auth-params",
        envvar="KEYSHARED_AUTH_PARAMS",
        help='Token authentication: token:XXX, file:/path/to/token or {"token":"XXX"}.',
    ),
    tls_trust_cert_path: str = typer.Option(
        "", "--tls-trust-cert-path", help="CA certificates to trust for an https admin URL."
    ),
    tls_allow_insecure: bool = typer.Option(
        False, "--tls-allow-insecure", help="Accept any server certificate."
    ),
    request_timeout: float = typer.Option(60.0, "--request-timeout", help="Seconds per call."),
) -> None:
    """Global options, given before the command group (as with pulsar-admin)."""
    if auth_plugin and "token" not in auth_plugin.lower():
        raise typer.BadParameter(
            "only token authentication is supported", param_hint="--auth-plugin"
        )
    ctx.obj = AdminHttp(
        admin_url,
        parse_auth_params(auth_params),
        timeout=request_timeout,
        trust_certs=tls_trust_cert_path or None,
        allow_insecure=tls_allow_insecure,
    )


def _register() -> None:
    from keyshared.admin_cli import clusters, namespaces, schemas, tenants, topics, unacked_limits

    app.add_typer(tenants.app, name="tenants")
    app.add_typer(clusters.app, name="clusters")
    app.add_typer(tenants.brokers_app, name="brokers")
    app.add_typer(namespaces.app, name="namespaces")
    app.add_typer(topics.app, name="topics")
    app.add_typer(schemas.app, name="schemas")
    unacked_limits.register(namespaces.app, topics.app)


def main(argv: list[str]) -> int:
    """Run ``keyshared admin`` with ``argv``; returns the exit status."""
    _register()
    try:
        app(args=argv, prog_name="keyshared admin", standalone_mode=True)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except AdminError as err:
        where = f"HTTP {err.status}" if err.status else "no connection"
        sys.stderr.write(f"{err.reason}\n\nReason: {err.reason} ({where})\n")
        return 1
    finally:
        sys.stdout.flush()
    return 0
