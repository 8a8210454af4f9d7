"""Turn raw run records into summaries, ratios, target checks, JSON and a Markdown table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .stats import ratio, summary

SUBJECT = "keyshared"
PEER = "pulsar-lite"
BATCHED_TARGET = 1.0
UNBATCHED_TARGET = 0.5
LATENCY_P99_TARGET_MS = 5.0
STARTUP_TARGET_S = 0.5


def _ok_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run for run in runs if "error" not in run]


def _figure(runs: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    return summary([float(run[key]) for run in _ok_runs(runs) if key in run])


def summarize_workload(workload: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-broker min/median/max and the subject/peer ratios for one configuration."""
    metric = "produce_msg_s" if workload["subscription"] == "none" else "e2e_msg_s"
    per_broker: dict[str, Any] = {}
    for name in sorted({run["broker"] for run in runs}):
        mine = [run for run in runs if run["broker"] == name]
        ok = _ok_runs(mine)
        per_broker[name] = {
            metric: _figure(mine, metric),
            "produce_msg_s": _figure(mine, "produce_msg_s"),
            "mb_s": _figure(mine, "mb_s"),
            "broker_cpu_us_per_msg": summary(
                [
                    run["broker_cpu_s"] * 1e6 / run["messages"]
                    for run in ok
                    if not math.isnan(run.get("broker_cpu_s", math.nan))
                ]
            ),
            "runs_ok": len(ok),
            "runs_failed": len(mine) - len(ok),
            "runs_incomplete": sum(1 for run in ok if not run.get("complete", False)),
            "duplicates": sum(int(run.get("duplicates", 0)) for run in ok),
            "missing": sum(int(run.get("missing", 0)) for run in ok),
            "unacked": sum(int(run["messages"]) - int(run.get("acked", 0)) for run in ok),
            "all_exact": bool(ok) and all(run.get("exact", False) for run in ok),
            "errors": [run["error"] for run in mine if "error" in run],
        }
    result: dict[str, Any] = {"workload": workload, "metric": metric, "brokers": per_broker}
    if SUBJECT in per_broker and PEER in per_broker:
        subject, peer = per_broker[SUBJECT][metric], per_broker[PEER][metric]
        target = BATCHED_TARGET if workload["batching"] else UNBATCHED_TARGET
        median_ratio = ratio(subject["median"], peer["median"])
        result["ratio"] = {
            "median": median_ratio,
            "min": ratio(subject["min"], peer["min"]),
            "produce_median": ratio(
                per_broker[SUBJECT]["produce_msg_s"]["median"],
                per_broker[PEER]["produce_msg_s"]["median"],
            ),
        }
        result["target"] = _ratio_target(target, subject["median"], peer["median"], median_ratio)
    return result


def _ratio_target(
    target: float, subject: float, peer: float, median_ratio: float
) -> dict[str, Any]:
    if math.isnan(subject):
        return {"ratio_at_least": target, "met": False, "why": f"{SUBJECT} did not complete"}
    if math.isnan(peer):
        # Completing where the peer stalls beats it, but there is no ratio to show.
        return {"ratio_at_least": target, "met": True, "why": f"{PEER} did not complete"}
    return {"ratio_at_least": target, "met": median_ratio >= target}


def summarize_latency(size: int, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-broker latency percentiles (min/median over runs) for one payload size."""
    per_broker: dict[str, Any] = {}
    for name in sorted({run["broker"] for run in runs}):
        mine = [run for run in runs if run["broker"] == name]
        per_broker[name] = {
            key: _figure(mine, key)
            for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "achieved_rate")
        }
        per_broker[name]["runs_ok"] = len(_ok_runs(mine))
        per_broker[name]["errors"] = [run["error"] for run in mine if "error" in run]
    result: dict[str, Any] = {"size": size, "brokers": per_broker}
    if SUBJECT in per_broker:
        p99 = per_broker[SUBJECT]["p99_ms"]["median"]
        result["target"] = {
            "p99_ms_below": LATENCY_P99_TARGET_MS,
            "met": p99 < LATENCY_P99_TARGET_MS,
        }
    if SUBJECT in per_broker and PEER in per_broker:
        result["ratio"] = {
            key: ratio(per_broker[SUBJECT][key]["median"], per_broker[PEER][key]["median"])
            for key in ("p50_ms", "p99_ms", "p999_ms")
        }
    return result


def summarize_startup(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Start-up min/median per broker, and the subject's target check."""
    result: dict[str, Any] = {}
    for name, runs in samples.items():
        result[name] = {
            "listen_s": _figure(runs, "listen_s"),
            "producer_s": _figure(runs, "producer_s"),
            "samples": runs,
        }
    if SUBJECT in result:
        median = result[SUBJECT]["listen_s"]["median"]
        result["target"] = {"listen_s_below": STARTUP_TARGET_S, "met": median < STARTUP_TARGET_S}
    return result


def json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) with None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}x"


def _met(target: dict[str, Any] | None) -> str:
    if target is None:
        return ""
    text = "yes" if target["met"] else "**no**"
    if target.get("why"):
        text += f" ({target['why']})"
    return text


def _cell(broker: dict[str, Any] | None, metric: str) -> str:
    if broker is None:
        return "-"
    figure = broker[metric]
    text = f"{_num(figure['median'])} ({_num(figure['min'])})"
    problems = []
    if broker["runs_failed"]:
        problems.append(f"{broker['runs_failed']} failed")
    if broker["runs_incomplete"]:
        problems.append(f"{broker['runs_incomplete']} stalled")
    if broker["unacked"]:
        problems.append(f"{broker['unacked']} unacked")
    if broker["duplicates"]:
        problems.append(f"{broker['duplicates']} dup")
    if broker["missing"]:
        problems.append(f"{broker['missing']} missing")
    if problems:
        text += " ⚠ " + ", ".join(problems)
    return text


def _batching_label(workload: dict[str, Any]) -> str:
    if not workload["batching"]:
        return "off"
    return "key-based" if workload["key_based_batching"] else "on"


def render_markdown(report: dict[str, Any]) -> str:
    """The README-ready Markdown: command, environment, throughput, latency and start-up."""
    meta = report["meta"]
    brokers = meta["brokers"]
    lines = [
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['cpus']} CPUs, {meta['platform']}, Python {meta['python']}; "
        f"pulsar-client {meta['versions'].get('pulsar-client', '?')}, "
        f"pulsar-lite {meta['versions'].get('pulsar-lite', '?')}, "
        f"keyshared {meta['versions'].get('keyshared', '?')} (commit {meta['git_commit']}); "
        f"{meta['started_at']}, {meta['runs']} run(s) per broker and configuration, "
        f"brokers interleaved A/B per run; load average before runs "
        f"{meta['loadavg_min']:.2f} to {meta['loadavg_max']:.2f}.",
        "",
        "Throughput in msg/s: median (min) over runs. End-to-end = messages / (first send → "
        "last receive) with the consumer attached from the start; produce = first send → "
        "last publish ack. Each run starts a fresh broker and begins once it is fully started "
        "(keyshared: its `ready` line; start-up has its own table). "
        "Ratio = keyshared / pulsar-lite, medians.",
        "",
    ]
    header = "| workload | size | batching | producers |"
    rule = "|---|---:|---|---:|"
    for name in brokers:
        header += f" {name} |"
        rule += "---:|"
    header += " ratio | target | met |"
    rule += "---:|---:|---|"
    lines += [header, rule]
    for item in report["throughput"]:
        workload = item["workload"]
        kind = (
            "produce only"
            if workload["subscription"] == "none"
            else f"e2e {workload['subscription'].replace('_', '-')}"
        )
        if workload.get("consumers", 1) > 1:
            kind += f", {workload['consumers']} consumers"
        row = (
            f"| {kind} | {workload['size']} B | {_batching_label(workload)} "
            f"| {workload['producers']} |"
        )
        for name in brokers:
            row += f" {_cell(item['brokers'].get(name), item['metric'])} |"
        target = item.get("target")
        row += (
            f" {_ratio(item.get('ratio', {}).get('median'))} "
            f"| {'' if target is None else '≥ ' + format(target['ratio_at_least'], '.1f') + 'x'} "
            f"| {_met(target)} |"
        )
        lines.append(row)
    if report["latency"]:
        lines += [
            "",
            f"Publish latency, ms (send_async → ack callback), non-batched, paced at "
            f"{meta['settings']['latency_rate']:,.0f} msg/s for {meta['settings']['latency_duration_s']} s "
            f"after {meta['settings'].get('latency_warmup_s', 0)} s of warm-up, on a broker that said it "
            "was ready: "
            "median (min) over runs.",
            "",
            "| size | broker | p50 | p99 | p99.9 | max | achieved msg/s |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for item in report["latency"]:
            for name in brokers:
                figures = item["brokers"].get(name)
                if figures is None:
                    continue
                cells = " | ".join(
                    f"{_num(figures[key]['median'], 2)} ({_num(figures[key]['min'], 2)})"
                    for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms")
                )
                rate = _num(figures["achieved_rate"]["median"])
                lines.append(f"| {item['size']} B | {name} | {cells} | {rate} |")
            target = item.get("target")
            if target is not None:
                lines.append(
                    f"| {item['size']} B | target: keyshared p99 < "
                    f"{target['p99_ms_below']:.0f} ms | | {_met(target)} | | | |"
                )
    startup = report["startup"]
    if startup:
        lines += [
            "",
            "Start-up, seconds from `Popen` (fresh data directory): median (min).",
            "",
            "| broker | to TCP listening | to first producer created |",
            "|---|---:|---:|",
        ]
        for name in brokers:
            figures = startup.get(name)
            if figures is None:
                continue
            listen, producer = figures["listen_s"], figures["producer_s"]
            lines.append(
                f"| {name} | {_num(listen['median'], 3)} ({_num(listen['min'], 3)}) "
                f"| {_num(producer['median'], 3)} ({_num(producer['min'], 3)}) |"
            )
        target = startup.get("target")
        if target is not None:
            lines.append(f"| target: keyshared < {target['listen_s_below']} s | {_met(target)} | |")
    if meta.get("notes"):
        lines += ["", *[f"- {note}" for note in meta["notes"]]]
    return "\n".join(lines) + "\n"
