"""``keyshared admin schemas ...`` (pulsar-admin's schema commands)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from keyshared.admin_cli.args import print_json, seg
from keyshared.admin_cli.http import AdminHttp
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
