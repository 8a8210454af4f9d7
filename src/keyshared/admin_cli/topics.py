"""``keyshared admin topics ...`` (pulsar-admin's topic commands)."""

from __future__ import annotations

import typer

from keyshared.admin_cli.args import (
    namespace_path,
    parse_message_id,
    parse_reset_time,
    parse_seconds,
    print_json,
    print_lines,
    retention_policies,
    seg,
    topic_path,
)
from keyshared.admin_cli.http import AdminError, AdminHttp
from keyshared.admin_cli.messages import decode_messages
from keyshared.admin_cli.quotas import add_commands as add_quota_commands
from keyshared.admin_cli.rates import add_rate_commands
from keyshared.admin_cli.replicated_subs import add_commands as add_replicated_sub_commands

app = typer.Typer(help="Operations about topics.", no_args_is_help=True)

TOPIC = typer.Argument(..., help="persistent://tenant/namespace/topic (or a short name)")
NS = typer.Argument(..., help="tenant/namespace")
SUB = typer.Option(..., "--subscription", "-s", help="subscription name")


def _sub(topic: str, sub: str, *rest: str) -> str:
    return topic_path(topic, "subscription", seg(sub), *rest)


# --- lists, create, delete -------------------------------------------------------------
@app.command("list")
def list_topics(ctx: typer.Context, namespace: str = NS) -> None:
    """List the topics of a namespace (partitions one by one)."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", namespace_path(namespace, prefix="persistent")))


@app.command("list-partitioned-topics")
def list_partitioned(ctx: typer.Context, namespace: str = NS) -> None:
    """List the partitioned topics of a namespace."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", namespace_path(namespace, "partitioned", prefix="persistent")))


@app.command("create")
def create(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Create a non-partitioned topic."""
    http: AdminHttp = ctx.obj
    http.call("PUT", topic_path(topic))


@app.command("create-partitioned-topic")
def create_partitioned(
    ctx: typer.Context,
    topic: str = TOPIC,
    partitions: int = typer.Option(..., "--partitions", "-p", help="number of partitions"),
) -> None:
    """Create a partitioned topic."""
    http: AdminHttp = ctx.obj
    http.call("PUT", topic_path(topic, "partitions"), partitions)


@app.command("update-partitioned-topic")
def update_partitioned(
    ctx: typer.Context,
    topic: str = TOPIC,
    partitions: int = typer.Option(..., "--partitions", "-p", help="new number of partitions"),
) -> None:
    """Grow a partitioned topic."""
    http: AdminHttp = ctx.obj
    http.call("POST", topic_path(topic, "partitions"), partitions)


@app.command("get-partitioned-topic-metadata")
def partitioned_metadata(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Show a partitioned topic's number of partitions."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", topic_path(topic, "partitions")))


@app.command("delete")
def delete(
    ctx: typer.Context,
    topic: str = TOPIC,
    force: bool = typer.Option(False, "--force", "-f", help="close its clients first"),
) -> None:
    """Delete a topic."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", topic_path(topic), query={"force": force})


@app.command("delete-partitioned-topic")
def delete_partitioned(
    ctx: typer.Context,
    topic: str = TOPIC,
    force: bool = typer.Option(False, "--force", "-f", help="close its clients first"),
) -> None:
    """Delete a partitioned topic and its partitions."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", topic_path(topic, "partitions"), query={"force": force})


@app.command("unload")
def unload(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Unload a topic (its clients reconnect and it is loaded again)."""
    http: AdminHttp = ctx.obj
    http.call("PUT", topic_path(topic, "unload"))


# --- stats ---------------------------------------------------------------------------
@app.command("stats")
def stats(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Show the topic's stats."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", topic_path(topic, "stats")))


@app.command("stats-internal")
def stats_internal(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Show the topic's internal stats (ledgers, cursors)."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", topic_path(topic, "internalStats")))


@app.command("partitioned-stats")
def partitioned_stats(
    ctx: typer.Context,
    topic: str = TOPIC,
    per_partition: bool = typer.Option(False, "--per-partition", help="each partition too"),
) -> None:
    """Show a partitioned topic's stats."""
    http: AdminHttp = ctx.obj
    query = {"perPartition": per_partition}
    print_json(http.call("GET", topic_path(topic, "partitioned-stats"), query=query))


@app.command("last-message-id")
def last_message_id(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Show the id of the topic's last message."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", topic_path(topic, "lastMessageId")))


@app.command("get-message-id")
def get_message_id(
    ctx: typer.Context,
    topic: str = TOPIC,
    datetime: str = typer.Option(..., "--datetime", "-d", help="ISO-8601 time or 10m back"),
) -> None:
    """Show the id of the first message published at or after a time."""
    http: AdminHttp = ctx.obj
    stamp = parse_reset_time(datetime)
    print_json(http.call("GET", topic_path(topic, "messageid", str(stamp))))


# --- subscriptions -------------------------------------------------------------------
@app.command("subscriptions")
def subscriptions(ctx: typer.Context, topic: str = TOPIC) -> None:
    """List the topic's subscriptions."""
    http: AdminHttp = ctx.obj
    print_lines(http.call("GET", topic_path(topic, "subscriptions")))


@app.command("create-subscription")
def create_subscription(
    ctx: typer.Context,
    topic: str = TOPIC,
    subscription: str = SUB,
    message_id: str = typer.Option(
        "latest", "--messageId", "-m", help="ledgerId:entryId, earliest or latest"
    ),
) -> None:
    """Create a subscription at a message id."""
    http: AdminHttp = ctx.obj
    http.call("PUT", _sub(topic, subscription), parse_message_id(message_id))


@app.command("unsubscribe")
def unsubscribe(
    ctx: typer.Context,
    topic: str = TOPIC,
    subscription: str = SUB,
    force: bool = typer.Option(False, "--force", "-f", help="disconnect its consumers first"),
) -> None:
    """Delete a subscription."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", _sub(topic, subscription), query={"force": force})


@app.command("skip")
def skip(
    ctx: typer.Context,
    topic: str = TOPIC,
    subscription: str = SUB,
    count: int = typer.Option(..., "--count", "-n", help="number of messages to skip"),
) -> None:
    """Skip (acknowledge) the next N messages of a subscription."""
    http: AdminHttp = ctx.obj
    http.call("POST", _sub(topic, subscription, "skip", str(count)))


@app.command("clear-backlog")
def clear_backlog(ctx: typer.Context, topic: str = TOPIC, subscription: str = SUB) -> None:
    """Skip every message of a subscription's backlog."""
    http: AdminHttp = ctx.obj
    http.call("POST", _sub(topic, subscription, "skip_all"))


@app.command("reset-cursor")
def reset_cursor(
    ctx: typer.Context,
    topic: str = TOPIC,
    subscription: str = SUB,
    time: str = typer.Option("", "--time", "-t", help="back from now (10m, 3h) or ISO time"),
    message_id: str = typer.Option("", "--messageId", "-m", help="ledgerId:entryId"),
    exclude: bool = typer.Option(
        False, "--exclude-reset-position", "-e", help="start after the message id"
    ),
) -> None:
    """Reset a subscription to a time or a message id (its consumers reconnect there)."""
    if bool(time) == bool(message_id):
        raise typer.BadParameter("give exactly one of --time or --messageId")
    http: AdminHttp = ctx.obj
    if time:
        stamp = parse_reset_time(time)
        http.call("POST", _sub(topic, subscription, "resetcursor", str(stamp)))
        return
    body = dict(parse_message_id(message_id), isExcluded=exclude)
    http.call("POST", _sub(topic, subscription, "resetcursor"), body)


# --- reading messages ----------------------------------------------------------------
@app.command("peek-messages")
def peek_messages(
    ctx: typer.Context,
    topic: str = TOPIC,
    subscription: str = SUB,
    count: int = typer.Option(1, "--count", "-n", help="number of messages"),
) -> None:
    """Show the next N unacknowledged messages of a subscription, without consuming them."""
    http: AdminHttp = ctx.obj
    found: list[dict[str, object]] = []
    position = 1
    while len(found) < count:
        try:
            result = http.request("GET", _sub(topic, subscription, "position", str(position)))
        except AdminError as err:
            if err.status == 404 and found:
                break
            raise
        found.extend(decode_messages(result))
        position += 1
    print_json(found[:count])


@app.command("examine-message")
def examine_message(
    ctx: typer.Context,
    topic: str = TOPIC,
    initial_position: str = typer.Option(
        "latest", "--initialPosition", "-i", help="earliest or latest"
    ),
    position: int = typer.Option(1, "--messagePosition", "-m", help="1-based position"),
) -> None:
    """Show the N-th message from the earliest or the latest."""
    http: AdminHttp = ctx.obj
    query = {"initialPosition": initial_position, "messagePosition": position}
    print_json(
        decode_messages(http.request("GET", topic_path(topic, "examinemessage"), query=query))
    )


@app.command("get-message-by-id")
def get_message_by_id(
    ctx: typer.Context,
    topic: str = TOPIC,
    ledger_id: int = typer.Option(..., "--ledgerId", "-l", help="ledger id"),
    entry_id: int = typer.Option(..., "--entryId", "-e", help="entry id"),
) -> None:
    """Show the message at ledgerId:entryId."""
    http: AdminHttp = ctx.obj
    path = topic_path(topic, "ledger", str(ledger_id), "entry", str(entry_id))
    print_json(decode_messages(http.request("GET", path)))


# --- topic policies ------------------------------------------------------------------
APPLIED = typer.Option(False, "--applied", "-ap", help="the value in force (with inheritance)")


@app.command("set-deduplication")
def set_deduplication(
    ctx: typer.Context,
    topic: str = TOPIC,
    enable: bool = typer.Option(False, "--enable", "-e", help="enable deduplication"),
    disable: bool = typer.Option(False, "--disable", "-d", help="disable deduplication"),
) -> None:
    """Enable or disable deduplication on a topic."""
    if enable == disable:
        raise typer.BadParameter("give exactly one of --enable or --disable")
    http: AdminHttp = ctx.obj
    http.call("POST", topic_path(topic, "deduplicationEnabled"), enable)


@app.command("get-deduplication")
def get_deduplication(ctx: typer.Context, topic: str = TOPIC, applied: bool = APPLIED) -> None:
    """Show the topic's deduplication setting."""
    http: AdminHttp = ctx.obj
    query = {"applied": applied}
    print_json(http.call("GET", topic_path(topic, "deduplicationEnabled"), query=query))


@app.command("remove-deduplication")
def remove_deduplication(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Remove the topic's deduplication setting."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", topic_path(topic, "deduplicationEnabled"))


@app.command("set-retention")
def set_retention(
    ctx: typer.Context,
    topic: str = TOPIC,
    size: str = typer.Option(..., "--size", "-s", help="size limit: 4096, 10M, 16G, -1"),
    time: str = typer.Option(..., "--time", "-t", help="time limit: 100m, 3h, 2d, 5w, -1"),
) -> None:
    """Set the retention policy of a topic."""
    http: AdminHttp = ctx.obj
    http.call("POST", topic_path(topic, "retention"), retention_policies(size, time))


@app.command("get-retention")
def get_retention(ctx: typer.Context, topic: str = TOPIC, applied: bool = APPLIED) -> None:
    """Show the retention policy of a topic."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", topic_path(topic, "retention"), query={"applied": applied}))


@app.command("remove-retention")
def remove_retention(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Remove the retention policy of a topic."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", topic_path(topic, "retention"))


@app.command("set-message-ttl")
def set_message_ttl(
    ctx: typer.Context,
    topic: str = TOPIC,
    ttl: str = typer.Option(..., "--ttl", "-t", help="TTL: 3600, 60m, 1h"),
) -> None:
    """Set the message TTL of a topic."""
    http: AdminHttp = ctx.obj
    query = {"messageTTL": parse_seconds(ttl)}
    http.call("POST", topic_path(topic, "messageTTL"), query=query)


@app.command("get-message-ttl")
def get_message_ttl(ctx: typer.Context, topic: str = TOPIC, applied: bool = APPLIED) -> None:
    """Show the message TTL of a topic."""
    http: AdminHttp = ctx.obj
    print_json(http.call("GET", topic_path(topic, "messageTTL"), query={"applied": applied}))


@app.command("remove-message-ttl")
def remove_message_ttl(ctx: typer.Context, topic: str = TOPIC) -> None:
    """Remove the message TTL of a topic."""
    http: AdminHttp = ctx.obj
    http.call("DELETE", topic_path(topic, "messageTTL"))


# --- backlog quotas and inactive topic policies (admin_cli/quotas.py) -------------------
add_quota_commands(app, topic_path, "persistent://tenant/namespace/topic", applied=True)
# --- rates (publish, dispatch, subscription dispatch) -----------------------------------
add_rate_commands(app, lambda t, policy: topic_path(t, policy), TOPIC, topic=True)
add_replicated_sub_commands(app, _sub, TOPIC)
