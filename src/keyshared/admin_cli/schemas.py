"""``keyshared admin schemas ...`` (pulsar-admin's schema commands), and the namespace schema
policy commands pulsar-admin lists under ``namespaces``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from keyshared.admin_cli.args import namespace_path, print_json, seg
from keyshared.admin_cli.http import AdminHttp
from keyshared.admin_cli.namespaces import NS
from keyshared.admin_cli.namespaces import app as namespaces_app
from keyshared.broker.topic_name import InvalidTopicName, TopicName

app = typer.Typer(help="Operations about schemas.", no_args_is_help=True)

TOPIC = typer.Argument(..., help="topic name (persistent://tenant/namespace/topic or short)")
_FILE = typer.Option(
    ..., "--filename", "-f", help="file holding a PostSchemaPayload (type, schema, properties)"
)


def _schema_path(topic: str, *rest: str) -> str:
    try:
        name = TopicName.parse(topic)
    except InvalidTopicName as exc:
        raise typer.BadParameter(str(exc)) from None
    base = f"/admin/v2/schemas/{seg(name.tenant)}/{seg(name.namespace)}/{seg(name.local_name)}"
    return "/".join([base, *rest])


def _payload(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read a schema payload from {path}: {exc}") from None


@app.command("get")
def get(
    ctx: typer.Context,
    topic: str = TOPIC,
    version: int | None = typer.Option(None, "--version", help="the version to get"),
    all_versions: bool = typer.Option(False, "--all-version", help="every version"),
) -> None:
    """Show the latest version of a topic's schema (or one version, or all of them)."""
    http: AdminHttp = ctx.obj
    if all_versions:
        print_json(http.call("GET", _schema_path(topic, "schemas"))["getSchemaResponses"])
    elif version is not None:
        print_json(http.call("GET", _schema_path(topic, "schema", str(version))))
    else:
        print_json(http.call("GET", _schema_path(topic, "schema")))


@app.command("upload")
def upload(ctx: typer.Context, topic: str = TOPIC, filename: Path = _FILE) -> None:
    """Upload a schema: a new version when it is compatible."""
    http: AdminHttp = ctx.obj
    print_json(http.call("POST", _schema_path(topic, "schema"), _payload(filename)))


@app.command("delete")
def delete(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Delete every version of a topic's schema."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", _schema_path(topic, "schema"))


@app.command("compatibility")
def compatibility(ctx: typer.Context, topic: str = TOPIC, filename: Path = _FILE) -> None:
    """Whether a schema could be added to the topic under its compatibility strategy."""
    http: AdminHttp = ctx.obj
    print_json(http.call("POST", _schema_path(topic, "compatibility"), _payload(filename)))


# --- the namespace schema policies (pulsar-admin lists them under ``namespaces``) -------------
@namespaces_app.command("get-schema-compatibility-strategy")
def get_strategy(ctx: typer.Context, namespace: str = NS) -> None:
    """Show the namespace's schema compatibility strategy (UNDEFINED: the broker's applies)."""
    http: AdminHttp = ctx.obj
    typer.echo(http.call("GET", namespace_path(namespace, "schemaCompatibilityStrategy")))


@namespaces_app.command("set-schema-compatibility-strategy")
def set_strategy(
    ctx: typer.Context,
    namespace: str = NS,
    compatibility: str = typer.Option(
        ..., "--compatibility", "-c", help="ALWAYS_COMPATIBLE, BACKWARD, FULL_TRANSITIVE, ..."
    ),
) -> None:
    """Set the namespace's schema compatibility strategy."""
    http: AdminHttp = ctx.obj
    http.call("PUT", namespace_path(namespace, "schemaCompatibilityStrategy"), compatibility)


def _flag_commands(name: str, policy: str, what: str) -> None:
    def get_flag(ctx: typer.Context, namespace: str = NS) -> None:
        http: AdminHttp = ctx.obj
        print_json(http.call("GET", namespace_path(namespace, policy)))

    def set_flag(
        ctx: typer.Context,
        namespace: str = NS,
        enable: bool = typer.Option(False, "--enable", "-e", help=f"enable {what}"),
        disable: bool = typer.Option(False, "--disable", "-d", help=f"disable {what}"),
    ) -> None:
        if enable == disable:
            raise typer.BadParameter("give exactly one of --enable or --disable")
        http: AdminHttp = ctx.obj
        http.call("POST", namespace_path(namespace, policy), enable)

    get_flag.__doc__ = f"Show whether {what} is on for the namespace."
    set_flag.__doc__ = f"Turn {what} on or off for the namespace."
    namespaces_app.command(f"get-{name}")(get_flag)
    namespaces_app.command(f"set-{name}")(set_flag)


_flag_commands("is-allow-auto-update-schema", "isAllowAutoUpdateSchema", "schema auto-update")
_flag_commands("schema-validation-enforce", "schemaValidationEnforced", "schema validation")
