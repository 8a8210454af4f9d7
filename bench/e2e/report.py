"""Turn raw run records into summaries, ratios, target checks, JSON and a Markdown table."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .stats import ratio, summary
from .workloads import KEY_SPACES

SUBJECT = "keyshared"
PEER = "pulsar-lite"
BATCHED_TARGET = 1.0
UNBATCHED_TARGET = 0.5
LATENCY_P99_TARGET_MS = 5.0
# The p99 target applies to probes at this rate (alone and beside the 10,000 msg/s producer).
LATENCY_TARGET_RATE = 1_000
STARTUP_TARGET_S = 0.5


def write_result(
    args: argparse.Namespace, figures: dict[str, Any], runs: Sequence[dict[str, Any]]
) -> None:
    """Write a single-subject bench's JSON to ``args.out``: the command line, its ``--label``,
    every setting, the summary figures and the raw runs."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "label": args.label,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "summary": figures,
        "runs": list(runs),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")


def _ok_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run for run in runs if "error" not in run]


def _figure(runs: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    return summary([float(run[key]) for run in _ok_runs(runs) if run.get(key) is not None])


def _loads(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    return summary([float(run["loadavg_before"][0]) for run in runs if "loadavg_before" in run])


def _cpu_per(runs: Sequence[dict[str, Any]], count_key: str) -> dict[str, float]:
    """Broker CPU microseconds per message or per entry, over the runs that completed."""
    return summary(
        [
            run["broker_cpu_s"] * 1e6 / run[count_key]
            for run in _ok_runs(runs)
            if run.get("complete") and run.get(count_key) and _finite(run.get("broker_cpu_s"))
        ]
    )


def _finite(value: Any) -> bool:
    # Figures read back from JSON have None where a NaN was written.
    return isinstance(value, int | float) and math.isfinite(value)


def summarize_workload(workload: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-broker min/median/max, CPU per message and per entry, and the subject/peer ratios
    for one throughput cell."""
    metric = "produce_msg_s" if workload["subscription"] == "none" else "e2e_msg_s"
    per_broker: dict[str, Any] = {}
    for name in sorted({run["broker"] for run in runs}):
        mine = [run for run in runs if run["broker"] == name]
        ok = _ok_runs(mine)
        per_broker[name] = {
            metric: _figure(mine, metric),
            "produce_msg_s": _figure(mine, "produce_msg_s"),
            "mb_s": _figure(mine, "mb_s"),
            "broker_cpu_us_per_msg": _cpu_per(mine, "messages"),
            "broker_cpu_us_per_entry": _cpu_per(mine, "entries"),
            "messages_per_entry": summary(
                [run["messages"] / run["entries"] for run in ok if run.get("entries")]
            ),
            "loadavg": _loads(mine),
            "runs_ok": len(ok),
            "runs_failed": len(mine) - len(ok),
            "runs_incomplete": sum(1 for run in ok if not run.get("complete", False)),
            # Of those, the ones still progressing when the run's time limit hit (too slow,
            # rather than stalled).
            "runs_over_time": sum(1 for run in ok if run.get("outcome") == "deadline"),
            "duplicates": sum(int(run.get("duplicates", 0)) for run in ok),
            "missing": sum(int(run.get("missing", 0)) for run in ok),
            "unacked": sum(int(run["messages"]) - int(run.get("acked", 0)) for run in ok),
            "all_exact": bool(ok) and all(run.get("exact", False) for run in ok),
            "errors": [run["error"] for run in mine if "error" in run],
        }
    result: dict[str, Any] = {
        "workload": workload,
        "metric": metric,
        "brokers": per_broker,
        "loadavg": _loads(runs),
    }
    if PEER in per_broker:
        peer = per_broker[PEER]
        result["peer_stalled"] = bool(peer["runs_incomplete"] or peer["runs_failed"])
    if SUBJECT in per_broker and PEER in per_broker:
        subject, peer_figure = per_broker[SUBJECT][metric], per_broker[PEER][metric]
        target = BATCHED_TARGET if workload["batching"] != "off" else UNBATCHED_TARGET
        median_ratio = ratio(subject["median"], peer_figure["median"])
        result["ratio"] = {
            "median": median_ratio,
            "min": ratio(subject["min"], peer_figure["min"]),
            "produce_median": ratio(
                per_broker[SUBJECT]["produce_msg_s"]["median"],
                per_broker[PEER]["produce_msg_s"]["median"],
            ),
        }
        result["target"] = _ratio_target(
            target, subject["median"], peer_figure["median"], median_ratio
        )
    return result


def _ratio_target(
    target: float, subject: float, peer: float, median_ratio: float
) -> dict[str, Any]:
    if math.isnan(subject):
        return {"ratio_at_least": target, "met": False, "why": f"{SUBJECT} did not complete"}
    if math.isnan(peer):
        # Completing where the peer stalls beats it, but there is no ratio to show.
        return {"ratio_at_least": target, "met": True, "why": f"{PEER} stalled"}
    return {"ratio_at_least": target, "met": median_ratio >= target}


def _comparable_keys(subscription: str, batching: str, keys: int) -> int:
    # Exclusive and Shared run one key space unless batching is key-based (keys_matter).
    return keys if batching == "keybased" or subscription == "key_shared" else KEY_SPACES[0]


def derive_key_shared_ratios(throughput: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each Key_Shared cell: its rate over Exclusive's (one consumer: Exclusive admits
    no more) and over Shared's with the same consumer count, for the same size, batching,
    producers and key space, per broker (medians of the same invocation)."""
    by_shape: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in throughput:
        w = item["workload"]
        shape = (w["subscription"], w["consumers"], w["size"], w["batching"], w["producers"])
        by_shape[(*shape, w["keys"])] = item
    derived = []
    for item in throughput:
        w = item["workload"]
        if w["subscription"] != "key_shared":
            continue
        base = (w["size"], w["batching"], w["producers"])
        keys = _comparable_keys("exclusive", w["batching"], w["keys"])
        exclusive = by_shape.get(("exclusive", 1, *base, keys))
        shared = by_shape.get(("shared", w["consumers"], *base, keys))
        row: dict[str, Any] = {"workload": w, "brokers": {}}
        for name, figures in item["brokers"].items():
            mine = figures[item["metric"]]["median"]
            ratios: dict[str, float] = {"key_shared_msg_s": mine}
            for label, other in (("exclusive", exclusive), ("shared", shared)):
                theirs = math.nan
                if other is not None and name in other["brokers"]:
                    theirs = other["brokers"][name][other["metric"]]["median"]
                ratios[f"{label}_msg_s"] = theirs
                ratios[f"over_{label}"] = ratio(mine, theirs)
            row["brokers"][name] = ratios
        row["exclusive_cell"] = None if exclusive is None else exclusive["workload"]["name"]
        row["shared_cell"] = None if shared is None else shared["workload"]["name"]
        derived.append(row)
    return derived


def summarize_latency(cell: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-broker latency percentiles (min/median over runs) for one latency cell."""
    per_broker: dict[str, Any] = {}
    for name in sorted({run["broker"] for run in runs}):
        mine = [run for run in runs if run["broker"] == name]
        figures: dict[str, Any] = {
            key: _figure(mine, key)
            for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "achieved_rate")
        }
        backgrounds = [run["background"] for run in _ok_runs(mine) if "background" in run]
        if backgrounds:
            figures["background_achieved_rate"] = summary(
                [float(b["achieved_rate"]) for b in backgrounds]
            )
            figures["background_p99_ms"] = summary([float(b["p99_ms"]) for b in backgrounds])
        figures["broker_cpu_us_per_msg"] = summary(
            [
                run["broker_cpu_s"]
                * 1e6
                / (run["acked"] + run.get("background", {}).get("acked", 0))
                for run in _ok_runs(mine)
                if run.get("acked") and _finite(run.get("broker_cpu_s"))
            ]
        )
        figures["loadavg"] = _loads(mine)
        figures["runs_ok"] = len(_ok_runs(mine))
        figures["runs_incomplete"] = sum(
            1 for run in _ok_runs(mine) if not run.get("complete", False)
        )
        figures["errors"] = [run["error"] for run in mine if "error" in run]
        per_broker[name] = figures
    result: dict[str, Any] = {"cell": cell, "size": cell["size"], "brokers": per_broker}
    if SUBJECT in per_broker and cell["rate"] <= LATENCY_TARGET_RATE:
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


def _current_workload(workload: dict[str, Any]) -> dict[str, Any]:
    # Results written before the matrix grew (commit 83ea15d and earlier) had a boolean
    # ``batching`` plus ``key_based_batching``, one consumer and 10,000 keys.
    if not isinstance(workload["batching"], bool):
        return workload
    batching = "off"
    if workload["batching"]:
        batching = "keybased" if workload.get("key_based_batching") else "default"
    one = 0 if workload["subscription"] == "none" else 1
    return {
        **workload,
        "batching": batching,
        "consumers": workload.get("consumers", one),
        "keys": workload.get("keys", 10_000),
    }


def rebuild(result: dict[str, Any]) -> dict[str, Any]:
    """Recompute every summary and derived ratio from the raw runs of a written JSON result,
    so a report can be re-rendered (``run_e2e.py --render``) after the summaries change."""
    throughput = []
    for item in result.get("throughput", []):
        summary_ = summarize_workload(_current_workload(item["workload"]), item["runs"])
        summary_["runs"] = item["runs"]
        throughput.append(summary_)
    latency = []
    for item in result.get("latency", []):
        cell = item.get("cell") or {"size": item["size"], "rate": 1000, "background_rate": 0}
        summary_ = summarize_latency(cell, item["runs"])
        summary_["runs"] = item["runs"]
        latency.append(summary_)
    return {
        **result,
        "throughput": throughput,
        "key_shared_ratios": derive_key_shared_ratios(throughput),
        "latency": latency,
    }


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


_PROBLEM_KEYS = (
    ("runs_failed", "failed"),
    ("runs_incomplete", "stalled"),
    ("runs_over_time", "over time limit"),
    ("unacked", "unacked"),
    ("duplicates", "dup"),
    ("missing", "missing"),
)


def _cell(broker: dict[str, Any] | None, metric: str) -> str:
    if broker is None:
        return "-"
    figure = broker[metric]
    runs = broker["runs_ok"] + broker["runs_failed"]
    over_time = broker.get("runs_over_time", 0)
    stalled = broker["runs_incomplete"] - over_time
    whole = math.isnan(figure["median"])
    if whole and not runs:
        text = "-"
    elif whole and over_time == 0:
        text = f"stalled in {runs} of {runs}"
    elif whole:
        text = f"no rate: {stalled} stalled, {over_time} over the time limit, of {runs}"
    else:
        text = f"{_num(figure['median'])} ({_num(figure['min'])})"
    counts = {**broker, "runs_incomplete": stalled}
    problems = [
        f"{counts[key]:,} {label}"
        for key, label in _PROBLEM_KEYS
        if counts.get(key) and not (whole and label in ("stalled", "over time limit"))
    ]
    if problems:
        text += " ⚠ " + ", ".join(problems)
    return text


_BATCHING = {"off": "off", "default": "default", "keybased": "key-based"}
_KIND = {
    "none": "produce only",
    "exclusive": "e2e Exclusive",
    "shared": "e2e Shared",
    "key_shared": "e2e Key_Shared",
}


def _keys(keys: int) -> str:
    return f"{keys // 1000:,}k" if keys % 1000 == 0 else f"{keys:,}"


def _cpu(value: float) -> str:
    # Microseconds: whole numbers, but one decimal below 10 (batched runs cost ~1 us/message).
    return _num(value, 1 if not math.isnan(value) and value < 10 else 0)


def _pair(item: dict[str, Any], key: str, brokers: Sequence[str]) -> str:
    values = []
    for name in brokers:
        figures = item["brokers"].get(name)
        values.append(_cpu(figures[key]["median"]) if figures else "-")
    return " / ".join(values)


def _load(figure: dict[str, float]) -> str:
    if math.isnan(figure["min"]):
        return "-"
    if round(figure["min"], 1) == round(figure["max"], 1):
        return f"{figure['min']:.1f}"
    return f"{figure['min']:.1f}\u2013{figure['max']:.1f}"


def _ratio_text(item: dict[str, Any]) -> str:
    value = item.get("ratio", {}).get("median")
    if value is None or math.isnan(value):
        return "peer stalled" if item.get("peer_stalled") else "-"
    text = _ratio(value)
    if item.get("peer_stalled"):
        text += " (peer stalled in some runs)"
    return text


def _throughput_lines(report: dict[str, Any], brokers: Sequence[str]) -> list[str]:
    header = "| workload | consumers | size | batching | producers | keys |"
    rule = "|---|---:|---:|---|---:|---:|"
    for name in brokers:
        header += f" {name} msg/s |"
        rule += "---:|"
    header += " ratio | CPU µs/msg | CPU µs/entry | load | target |"
    rule += "---:|---:|---:|---:|---|"
    lines = [header, rule]
    for item in report["throughput"]:
        w = item["workload"]
        consumers = "-" if w["subscription"] == "none" else str(w["consumers"])
        row = (
            f"| {_KIND[w['subscription']]} | {consumers} | {w['size']} B "
            f"| {_BATCHING[w['batching']]} | {w['producers']} | {_keys(w['keys'])} |"
        )
        for name in brokers:
            row += f" {_cell(item['brokers'].get(name), item['metric'])} |"
        per_entry = (
            _pair(item, "broker_cpu_us_per_entry", brokers) if w["batching"] != "off" else "="
        )
        target = item.get("target")
        target_text = "" if target is None else f"≥ {target['ratio_at_least']:.1f}x: {_met(target)}"
        row += (
            f" {_ratio_text(item)} | {_pair(item, 'broker_cpu_us_per_msg', brokers)} "
            f"| {per_entry} | {_load(item['loadavg'])} | {target_text} |"
        )
        lines.append(row)
    return lines


def _derived_lines(report: dict[str, Any], brokers: Sequence[str]) -> list[str]:
    derived = report.get("key_shared_ratios") or []
    if not derived:
        return []
    header = "| consumers | size | batching | producers | keys |"
    rule = "|---:|---:|---|---:|---:|"
    for name in brokers:
        header += f" {name}: KS / Exclusive | {name}: KS / Shared |"
        rule += "---:|---:|"
    lines = [
        "",
        "Key_Shared against Exclusive (one consumer: Exclusive admits no more, so with 4 and 16 "
        "Key_Shared consumers this is the same workload spread over more consumer processes) "
        "and against Shared with the same consumer count; same size, batching, producers and "
        "key space; ratios of each broker's own medians in this invocation (- where a side "
        "stalled or was not run).",
        "",
        header,
        rule,
    ]
    for row in derived:
        w = row["workload"]
        line = (
            f"| {w['consumers']} | {w['size']} B | {_BATCHING[w['batching']]} "
            f"| {w['producers']} | {_keys(w['keys'])} |"
        )
        for name in brokers:
            figures = row["brokers"].get(name, {})
            line += (
                f" {_ratio(figures.get('over_exclusive'))} | {_ratio(figures.get('over_shared'))} |"
            )
        lines.append(line)
    return lines


def _latency_lines(report: dict[str, Any], brokers: Sequence[str]) -> list[str]:
    if not report["latency"]:
        return []
    settings = report["meta"]["settings"]
    lines = [
        "",
        f"Publish latency, ms (send_async → ack callback), non-batched, paced for "
        f"{settings['latency_duration_s']} s after {settings.get('latency_warmup_s', 0)} s of "
        "warm-up, on a broker that said it was ready: median (min) over runs. `+bg` = a second "
        "non-batched producer on another topic of the same broker paced at that rate meanwhile "
        "(its achieved rate and p99 in the last column but two).",
        "",
        "| probe | broker | p50 | p99 | p99.9 | max | achieved msg/s | background msg/s (p99) "
        "| CPU µs/msg | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for item in report["latency"]:
        cell = item["cell"]
        label = f"{cell['size']} B at {cell['rate']:,}/s"
        if cell.get("background_rate"):
            label += f" +bg {cell['background_rate']:,}/s"
        for name in brokers:
            figures = item["brokers"].get(name)
            if figures is None:
                continue
            cells = " | ".join(
                f"{_num(figures[key]['median'], 2)} ({_num(figures[key]['min'], 2)})"
                for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms")
            )
            background = "-"
            if "background_achieved_rate" in figures:
                background = (
                    f"{_num(figures['background_achieved_rate']['median'])} "
                    f"({_num(figures['background_p99_ms']['median'], 1)} ms)"
                )
            lines.append(
                f"| {label} | {name} | {cells} | {_num(figures['achieved_rate']['median'])} "
                f"| {background} | {_cpu(figures['broker_cpu_us_per_msg']['median'])} "
                f"| {_load(figures['loadavg'])} |"
            )
        target = item.get("target")
        if target is not None:
            lines.append(
                f"| {label} | target: keyshared p99 < {target['p99_ms_below']:.0f} ms | "
                f"| {_met(target)} | | | | | | |"
            )
    return lines


def _startup_lines(report: dict[str, Any], brokers: Sequence[str]) -> list[str]:
    startup = report["startup"]
    if not startup:
        return []
    lines = [
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
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The README-ready Markdown: command, environment, throughput, Key_Shared ratios,
    latency and start-up."""
    meta = report["meta"]
    brokers = meta["brokers"]
    lines = [
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['cpus']} CPUs, {meta['platform']}, Python {meta['python']}; "
        f"pulsar-client {meta['versions'].get('pulsar-client', '?')}, "
        f"pulsar-lite {meta['versions'].get('pulsar-lite', '?')}, "
        f"keyshared {meta['versions'].get('keyshared', '?')} (commit {meta['git_commit']}); "
        f"{meta['started_at']}, {_num(meta['elapsed_s'] / 60, 1)} min, "
        f"{meta['runs']} run(s) per broker and cell, brokers interleaved A/B per run; "
        f"1-minute load average before runs {_num(meta['loadavg_min'], 2)} to "
        f"{_num(meta['loadavg_max'], 2)}.",
    ]
    if report["throughput"]:
        lines += [
            "",
            "Throughput in msg/s: median (min) over runs. End-to-end = messages / (first send → "
            "the last message's first delivery to any consumer), consumers attached from the "
            "start; produce only = first send → last publish ack, no subscription. Each run "
            "starts a fresh broker and begins once it is fully started. Ratio = keyshared / "
            'pulsar-lite, medians; "peer stalled" = pulsar-lite delivered nothing new for the '
            "idle timeout, or was still delivering at the run's time limit (40 s + 1 s per "
            "500 messages), in some or all runs (no rate from those runs). CPU = the broker "
            "process's user+system time over the run (from `/proc`), per message and, when "
            "batching, per stored entry (entries counted from the publish receipts), "
            f"{' / '.join(brokers)}, medians. Load = the 1-minute load average before each "
            "run.",
            "",
            *_throughput_lines(report, brokers),
        ]
    lines += _derived_lines(report, brokers)
    lines += _latency_lines(report, brokers)
    lines += _startup_lines(report, brokers)
    if meta.get("notes"):
        lines += ["", *[f"- {note}" for note in meta["notes"]]]
    return "\n".join(lines) + "\n"
