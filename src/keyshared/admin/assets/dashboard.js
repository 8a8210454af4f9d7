// keyshared dashboard: polls /dashboard/api/overview and draws topics, subscriptions, consumers
// and, for Key_Shared, the hash space. Plain JavaScript, no build step, nothing from other hosts.
"use strict";

(() => {
  const OVERVIEW = "/dashboard/api/overview";
  const POLL_MS = 1000;
  const HISTORY = 90;
  const MAX_IDS = 60;
  const PALETTE = [
    "#4e9af1", "#f5a524", "#3fbf7f", "#b07cf7", "#2ec4c4", "#f07fc0",
    "#c9d94a", "#8c9eff", "#ff9f68", "#6ad1a3", "#d4a5ff", "#5fb3d9",
  ];

  const state = {
    token: localStorage.getItem("keyshared.token") || "",
    data: null,
    paused: false,
    filter: "",
    history: new Map(), // topic -> {in: [], out: []}
    colors: new Map(), // "topic|sub" -> Map(consumerName -> palette index)
    selected: new Map(), // "topic|sub" -> {hash, key}
    blockers: new Map(), // "topic|sub" -> blocker JSON or {error}
    topicEls: new Map(), // topic -> element
  };

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const nf1 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
  const fmtInt = (n) => nf0.format(n || 0);
  const fmtRate = (n) => (n && n < 10 ? nf1.format(n) : nf0.format(n || 0));
  function fmtBytes(n) {
    n = n || 0;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? nf0.format(n) : nf1.format(n)) + " " + units[i];
  }
  const subKey = (topic, sub) => topic + "|" + sub;

  function setHTML(el, html) {
    if (el._html !== html) {
      el.innerHTML = html;
      el._html = html;
    }
  }

  // --- the admin API -------------------------------------------------------------------------
  async function api(path) {
    const headers = {};
    if (state.token) headers.Authorization = "Bearer " + state.token;
    const resp = await fetch(path, { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      $("auth").hidden = false;
      throw new Error(resp.status === 401 ? "token needed" : "not allowed");
    }
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(body.reason || body.detail || "HTTP " + resp.status);
    return body;
  }

  function blockersPath(topic, sub, query) {
    const rest = topic.replace(/^[a-z-]+:\/\//, "").split("/").map(encodeURIComponent).join("/");
    return "/admin/v2/persistent/" + rest + "/subscription/" + encodeURIComponent(sub) +
      "/hashBlockers?" + query;
  }

  // --- colours: stable per consumer name within a subscription ----------------------------------
  function colorOf(key, name) {
    let m = state.colors.get(key);
    if (!m) { m = new Map(); state.colors.set(key, m); }
    if (!m.has(name)) {
      const used = new Set(m.values());
      let i = 0;
      while (used.has(i)) i += 1;
      m.set(name, i);
    }
    const i = m.get(name);
    return i < PALETTE.length ? PALETTE[i] : "hsl(" + ((i * 137.508) % 360).toFixed(0) + ",62%,62%)";
  }

  function forgetColors(key, consumers) {
    const m = state.colors.get(key);
    if (!m) return;
    const live = new Set(consumers.map((c) => c.consumerName));
    for (const name of [...m.keys()]) if (!live.has(name)) m.delete(name);
  }

  // --- rendering -----------------------------------------------------------------------------
  function render(data) {
    $("cluster").textContent = "cluster " + data.cluster + " · v" + data.version;
    let subs = 0, consumers = 0, producers = 0, rin = 0, rout = 0, backlog = 0, draining = 0;
    for (const t of data.topics) {
      subs += t.subscriptions.length;
      producers += t.publishers.length;
      rin += t.msgRateIn;
      rout += t.msgRateOut;
      backlog += t.msgBacklog;
      for (const s of t.subscriptions) {
        consumers += s.consumers.length;
        draining += s.drainingHashesCount || 0;
      }
    }
    $("c-topics").textContent = fmtInt(data.topics.length);
    $("c-subs").textContent = fmtInt(subs);
    $("c-consumers").textContent = fmtInt(consumers);
    $("c-producers").textContent = fmtInt(producers);
    $("c-in").textContent = fmtRate(rin);
    $("c-out").textContent = fmtRate(rout);
    $("c-backlog").textContent = fmtInt(backlog);
    $("c-draining").textContent = fmtInt(draining);
    $("c-draining").classList.toggle("alert", draining > 0);

    const container = $("topics");
    const shown = data.topics.filter((t) => !state.filter || t.name.includes(state.filter));
    const names = new Set(shown.map((t) => t.name));
    for (const [name, el] of state.topicEls) {
      if (!names.has(name)) { el.remove(); state.topicEls.delete(name); }
    }
    let previous = null;
    for (const t of shown) {
      let el = state.topicEls.get(t.name);
      if (!el) {
        el = document.createElement("article");
        el.className = "topic";
        el.dataset.topic = t.name;
        el.innerHTML = '<div class="topic-head"></div><div class="producers"></div><div class="subs"></div>';
        state.topicEls.set(t.name, el);
      }
      const want = previous ? previous.nextSibling : container.firstChild;
      if (want !== el) container.insertBefore(el, want);
      previous = el;
      renderTopic(el, t);
    }
    $("empty").hidden = data.topics.length > 0;
  }

  function recordHistory(data) {
    const names = new Set();
    for (const t of data.topics) {
      names.add(t.name);
      const h = state.history.get(t.name) || { in: [], out: [] };
      h.in.push(t.msgRateIn);
      h.out.push(t.msgRateOut);
      if (h.in.length > HISTORY) { h.in.shift(); h.out.shift(); }
      state.history.set(t.name, h);
    }
    for (const name of [...state.history.keys()]) if (!names.has(name)) state.history.delete(name);
  }

  function topicNameHTML(name) {
    const m = /^([a-z-]+:\/\/)([^/]+\/[^/]+\/)(.*)$/.exec(name);
    if (!m) return esc(name);
    return '<span class="scheme">' + esc(m[1]) + '</span><span class="ns">' + esc(m[2]) +
      '</span><span class="leaf">' + esc(m[3]) + "</span>";
  }

  function metric(k, v, u) {
    return '<div class="metric"><div class="k">' + k + '</div><div class="v">' + v +
      (u ? ' <span class="u">' + u + "</span>" : "") + "</div></div>";
  }

  function sparkline(name) {
    const h = state.history.get(name) || { in: [], out: [] };
    const max = Math.max(1, ...h.in, ...h.out);
    // Newest at the right edge; the line grows leftwards as history accumulates (a single
    // sample is drawn as a short step so the first second is not blank).
    const pts = (arr) => {
      const series = arr.length === 1 ? [arr[0], arr[0]] : arr;
      return series.map((v, i) => (((HISTORY - series.length + i) / (HISTORY - 1)) * 100)
        .toFixed(2) + "," + (32 - (v / max) * 30).toFixed(2)).join(" ");
    };
    const lines = h.in.length
      ? '<polyline class="out" points="' + pts(h.out) + '"/><polyline class="in" points="' +
        pts(h.in) + '"/>'
      : "";
    return '<div class="metric"><div class="k">last 90 s · <span class="in-key">in</span> ' +
      '<span class="out-key">out</span></div>' +
      '<svg class="spark" viewBox="0 0 100 34" preserveAspectRatio="none">' + lines + "</svg></div>";
  }

  // A topic past its backlog quota (size and/or age), with the limits in the tooltip.
  function quotaBadge(t) {
    const over = t.backlogQuotaExceeded || [];
    if (!over.length) return "";
    const what = over.map((q) => (q === "message_age" ? "age" : "size")).join(" + ");
    const tip = "backlog quota exceeded: " + over.join(", ") + " (limit " +
      fmtBytes(t.backlogQuotaLimitSize) + ", " + t.backlogQuotaLimitTime + " s)";
    return '<span class="badge drain over-quota" title="' + esc(tip) + '">over quota: ' + esc(what) + "</span>";
  }

  // Each remote cluster of a replicated topic: its replicator's state, backlog and delay (the
  // last error on hover); a cluster that only replicates here shows its inbound rate.
  function replicationHTML(t) {
    const rep = t.replication || {};
    const clusters = Object.keys(rep).sort();
    if (!clusters.length) return "";
    const outbound = new Set(t.replicationOutbound || []);
    const errors = t.replicationErrors || {};
    return '<div class="replication"><span class="muted">replication:</span> ' + clusters.map((c) => {
      const r = rep[c];
      const out = outbound.has(c);
      const cls = out ? (r.connected ? "up" : "down") : "in-only";
      const state = out ? (r.connected ? "connected" : "disconnected") : "inbound only";
      const tip = errors[c] ? ' title="' + esc(errors[c]) + '"' : "";
      return '<span class="r ' + cls + '" data-cluster="' + esc(c) + '"' + tip + "><b>→ " + esc(c) +
        '</b> <span class="badge state">' + state + "</span>" +
        (out
          ? ' backlog <span class="backlog">' + fmtInt(r.replicationBacklog) + "</span> · delay " +
            '<span class="delay">' + fmtInt(r.replicationDelayInSeconds) + "</span> s · out " +
            fmtRate(r.msgRateOut) + " msg/s"
          : "") +
        " · in " + fmtRate(r.msgRateIn) + " msg/s</span>";
    }).join("") + "</div>";
  }

  function renderTopic(el, t) {
    const [head, prods, subsEl] = el.children;
    setHTML(head,
      '<div class="topic-name" title="' + esc(t.name) + '">' + topicNameHTML(t.name) + "</div>" +
      quotaBadge(t) +
      metric("in", fmtRate(t.msgRateIn), "msg/s") +
      metric("out", fmtRate(t.msgRateOut), "msg/s") +
      metric("throughput in", fmtBytes(t.msgThroughputIn), "/s") +
      metric("storage", fmtBytes(t.storageSize)) +
      metric("backlog", fmtInt(t.msgBacklog), "msgs") +
      sparkline(t.name));
    // The producers, the schema and the replication in one line (the schema was added to
    // setHTML's result, not to the HTML, until the replication joined it).
    setHTML(prods, (t.publishers.length
      ? '<span class="muted">producers:</span> ' + t.publishers.map((p) =>
          '<span class="p' + (p.rateLimited ? ' throttled" title="a publish rate limit holds this producer: its sends wait' : "") +
          '" data-producer="' + esc(p.producerName) + '"><b>' + esc(p.producerName) + "</b> " +
          fmtRate(p.msgRateIn) + " msg/s" + (p.rateLimited ? ' <span class="badge throttled">rate-limited</span>' : "") +
          "</span>").join("")
      : '<span class="p">no producers</span>') +
      (t.schema
        ? ' <span class="p schema" title="' + esc(t.schema.data) + '"><span class="muted">schema:</span> <b>' +
            esc(t.schema.type) + "</b> v" + fmtInt(t.schema.version) + "</span>"
        : "") +
      replicationHTML(t));

    const names = new Set(t.subscriptions.map((s) => s.name));
    for (const child of [...subsEl.children]) {
      if (!names.has(child.dataset.subscription)) child.remove();
    }
    if (!t.subscriptions.length) {
      if (!subsEl.querySelector(".none")) subsEl.innerHTML = '<div class="sub none">no subscriptions</div>';
      return;
    }
    const none = subsEl.querySelector(".none");
    if (none) none.remove();
    let previous = null;
    for (const s of t.subscriptions) {
      let sel = [...subsEl.children].find((c) => c.dataset.subscription === s.name);
      if (!sel) sel = newSubElement(t.name, s.name);
      const want = previous ? previous.nextSibling : subsEl.firstChild;
      if (want !== sel) subsEl.insertBefore(sel, want);
      previous = sel;
      renderSub(sel, t, s);
    }
  }

  function newSubElement(topic, name) {
    const el = document.createElement("div");
    el.className = "sub";
    el.dataset.subscription = name;
    el.dataset.topic = topic;
    el.innerHTML = '<div class="sub-head"></div><div class="hashspace"></div>' +
      '<div class="tools" hidden><input type="text" class="key-input" placeholder="a key → its hash">' +
      '<button type="button" class="ghost key-go">find</button><span class="chips"></span></div>' +
      '<div class="blocker-slot"></div><table class="consumers"></table>';
    return el;
  }

  function renderSub(el, t, s) {
    const key = subKey(t.name, s.name);
    const keyShared = s.type === "Key_Shared";
    el.dataset.type = s.type;
    forgetColors(key, s.consumers);
    const head = [
      '<span class="sub-name">' + esc(s.name) + "</span>",
      '<span class="badge ' + esc(s.type) + '">' + esc(s.type) + "</span>",
    ];
    if (keyShared && s.keySharedMode) {
      head.push('<span class="badge mode">' + esc(s.keySharedMode) +
        (s.allowOutOfOrderDelivery ? " · out of order" : "") + "</span>");
    }
    if (s.drainingHashesCount) {
      head.push('<span class="badge drain">' + fmtInt(s.drainingHashesCount) + " draining</span>");
    }
    head.push('<span class="kv">backlog <b>' + fmtInt(s.msgBacklog) + "</b></span>");
    head.push('<span class="kv">unacked <b>' + fmtInt(s.unackedMessages) + "</b></span>");
    head.push('<span class="kv">out <b>' + fmtRate(s.msgRateOut) + "</b> msg/s</span>");
    head.push('<span class="kv">ack <b>' + fmtRate(s.messageAckRate) + "</b> msg/s</span>");
    if (s.msgInReplay) head.push('<span class="kv">in replay <b>' + fmtInt(s.msgInReplay) + "</b></span>");
    if (s.msgDelayed) head.push('<span class="kv">delayed <b>' + fmtInt(s.msgDelayed) + "</b></span>");
    if (s.blockedOnAckStatePersistent) head.push('<span class="badge drain">paused: ack state</span>');
    if (s.blockedSubscriptionOnUnackedMsgs) {
      head.push('<span class="badge drain" data-testid="sub-blocked-unacked" title="maxUnackedMessagesPerSubscription reached: ' +
        'dispatch resumes when its consumers hold less than half">blocked: unacked</span>');
    }
    setHTML(el.children[0], head.join(""));

    const space = el.querySelector(".hashspace");
    const tools = el.querySelector(".tools");
    tools.hidden = !keyShared;
    if (keyShared) {
      setHTML(space, hashSpaceSVG(key, s));
      const chips = [];
      for (const c of s.consumers) {
        for (const d of c.drainingHashes || []) {
          chips.push('<span class="chip" data-hash="' + d.hash + '" title="draining on ' +
            esc(c.consumerName) + ": " + d.unackMsgs + " unacked, " + d.blockedAttempts +
            ' blocked attempts">#' + d.hash + "</span>");
        }
      }
      setHTML(tools.querySelector(".chips"), chips.length
        ? '<span class="muted">draining:</span> ' + chips.slice(0, 40).join("") +
          (chips.length > 40 ? '<span class="muted"> +' + (chips.length - 40) + " more</span>" : "")
        : '<span class="muted">no draining hashes · click the bar to ask what blocks a hash</span>');
    } else {
      setHTML(space, "");
    }
    setHTML(el.querySelector(".blocker-slot"), keyShared ? blockerHTML(key, s) : "");
    setHTML(el.querySelector(".consumers"), consumersHTML(key, s, keyShared));
  }

  function hashBounds(s) {
    // The picture always starts at 0, even when the selector never assigns hash 0.
    const r = s.hashRange || [0, 65535];
    const lo = Math.min(0, r[0]);
    return { lo, hi: r[1], span: r[1] - lo + 1 };
  }

  function hashSpaceSVG(key, s) {
    const { lo, hi, span } = hashBounds(s);
    const pct = (h) => (((h - lo) / span) * 100).toFixed(4) + "%";
    const wid = (a, b) => (((b - a + 1) / span) * 100).toFixed(4) + "%";
    const parts = ['<rect class="track" x="0" y="18" width="100%" height="30" rx="3"/>'];
    const selected = state.selected.get(key);
    for (const c of s.consumers) {
      const color = colorOf(key, c.consumerName);
      for (const [a, b] of c.keyHashRangeArrays || []) {
        parts.push('<rect class="range" data-testid="range" data-consumer="' + esc(c.consumerName) +
          '" data-consumer-id="' + esc(c.consumerId) + '" data-start="' + a + '" data-end="' + b +
          '" x="' + pct(a) + '" y="18" width="' + wid(a, b) + '" height="30" fill="' + color + '"/>');
      }
    }
    for (const c of s.consumers) {
      for (const d of c.drainingHashes || []) {
        parts.push('<g class="draining-marker" data-hash="' + d.hash + '" data-consumer="' +
          esc(c.consumerName) + '"><line x1="' + pct(d.hash) + '" x2="' + pct(d.hash) +
          '" y1="10" y2="48"/><circle cx="' + pct(d.hash) + '" cy="9" r="4"/></g>');
      }
    }
    const ticks = [lo, lo + span / 4, lo + span / 2, lo + (3 * span) / 4, hi];
    parts.push('<g class="axis">');
    ticks.forEach((h, i) => {
      const anchor = i === 0 ? "start" : i === ticks.length - 1 ? "end" : "middle";
      parts.push('<line x1="' + pct(h) + '" x2="' + pct(h) + '" y1="48" y2="53"/>' +
        '<text x="' + pct(h) + '" y="66" text-anchor="' + anchor + '">' + Math.round(h) + "</text>");
    });
    parts.push("</g>");
    if (selected) {
      const h = selected.hash;
      const anchor = (h - lo) / span > 0.85 ? "end" : "start";
      const dx = anchor === "end" ? -6 : 6;
      parts.push('<g class="selected" data-hash="' + h + '"><line x1="' + pct(h) + '" x2="' + pct(h) +
        '" y1="4" y2="56"/><text x="' + pct(h) + '" dx="' + dx + '" y="14" text-anchor="' + anchor +
        '">#' + h + (selected.key ? " · " + esc(selected.key) : "") + "</text></g>");
    }
    return '<svg class="hash-svg" role="img" aria-label="hash space ' + lo + "–" + hi + '">' +
      parts.join("") + "</svg>";
  }

  function ownerAt(s, h) {
    for (const c of s.consumers) {
      for (const [a, b] of c.keyHashRangeArrays || []) if (h >= a && h <= b) return c;
    }
    return null;
  }

  function idsHTML(ids) {
    if (!ids || !ids.length) return '<span class="muted">none</span>';
    const shown = ids.slice(0, MAX_IDS).map((id) => '<span class="msg-id">' + esc(id) + "</span>");
    if (ids.length > MAX_IDS) shown.push('<span class="muted">+' + (ids.length - MAX_IDS) + " more</span>");
    return '<span class="ids">' + shown.join("") + "</span>";
  }

  function who(key, name) {
    if (name === null || name === undefined) return '<b class="muted">nobody</b>';
    return '<span class="swatch" style="background:' + colorOf(key, name) + '"></span><b class="cname">' +
      esc(name) + "</b>";
  }

  function blockerHTML(key, s) {
    const sel = state.selected.get(key);
    if (!sel) return "";
    const b = state.blockers.get(key);
    const title = '<span class="close" data-action="close" title="close">✕</span>' +
      '<div class="title">Hash <span class="h">#' + sel.hash + "</span>" +
      (sel.key ? ' <span class="muted">(key "' + esc(sel.key) + '")</span>' : "");
    if (!b) return '<div class="blocker" data-hash="' + sel.hash + '">' + title + ' <span class="muted">asking…</span></div></div>';
    if (b.error) {
      return '<div class="blocker" data-hash="' + sel.hash + '">' + title + '</div><div class="row">' +
        esc(b.error) + "</div></div>";
    }
    const rows = [title + " → owned by " + who(key, b.consumerName) + "</div>"];
    if (b.draining) {
      rows.push('<div class="row">Draining: new messages of this hash wait until ' +
        who(key, b.drainingConsumerName) + " acks <b>" + b.unackedMessageIds.length +
        "</b> message(s) it holds · blocked attempts <b>" + fmtInt(b.blockedAttempts) + "</b></div>");
      rows.push('<div class="row">blocking messages on ' + esc(b.drainingConsumerName) + ": " +
        idsHTML(b.unackedMessageIds) + "</div>");
    } else {
      rows.push('<div class="row">Not draining: no other consumer holds this hash.</div>');
    }
    rows.push('<div class="row">delivered to the owner, not acked: ' + idsHTML(b.pendingMessageIds) + "</div>");
    rows.push('<div class="row">waiting for redelivery: ' + idsHTML(b.replayMessageIds) + "</div>");
    if (b.consumerName !== null && b.availablePermits === 0) {
      rows.push('<div class="row">the owner has no permits now: delivery waits for it to ask for more.</div>');
    }
    return '<div class="blocker' + (b.draining ? " draining" : "") + '" data-testid="blocker" data-hash="' +
      b.hash + '" data-draining="' + (b.draining ? "true" : "false") + '">' + rows.join("") + "</div>";
  }

  function consumersHTML(key, s, keyShared) {
    if (!s.consumers.length) return '<tbody><tr><td class="none">no consumers connected</td></tr></tbody>';
    const { span } = hashBounds(s);
    const head = ["consumer"];
    if (keyShared) head.push("hash share", "ranges");
    head.push("permits", "unacked", "out msg/s", "ack msg/s");
    if (keyShared) head.push("draining");
    const rows = s.consumers.map((c) => {
      const color = colorOf(key, c.consumerName);
      const cells = ['<td><span class="swatch" style="background:' + color + '"></span><span class="cname">' +
        esc(c.consumerName) + "</span></td>"];
      if (keyShared) {
        const ranges = c.keyHashRangeArrays || [];
        const owned = ranges.reduce((n, [a, b]) => n + (b - a + 1), 0);
        const share = (owned / span) * 100;
        cells.push('<td><span class="share"><span style="width:' + share.toFixed(1) + "%;background:" + color +
          '"></span></span>' + nf1.format(share) + "%</td>");
        const text = ranges.slice(0, 3).map(([a, b]) => "[" + a + ", " + b + "]").join(" ");
        cells.push('<td class="ranges" data-testid="ranges">' + text +
          (ranges.length > 3 ? " +" + (ranges.length - 3) + " more" : "") + "</td>");
      }
      cells.push('<td class="num">' + fmtInt(c.availablePermits) + "</td>");
      cells.push('<td class="num">' + fmtInt(c.unackedMessages) + (c.blockedConsumerOnUnackedMsgs
        ? ' <span class="badge drain" data-testid="consumer-blocked-unacked" title="maxUnackedMessagesPerConsumer reached: ' +
          'it gets messages again when it holds half or less">blocked</span>' : "") + "</td>");
      cells.push('<td class="num">' + fmtRate(c.msgRateOut) + "</td>");
      cells.push('<td class="num">' + fmtRate(c.messageAckRate) + "</td>");
      if (keyShared) {
        const n = c.drainingHashesCount || 0;
        cells.push('<td class="num">' + (n ? '<span class="drain-count">' + fmtInt(n) + "</span> <span class=\"muted\">(" +
          fmtInt(c.drainingHashesUnackedMessages) + " unacked)</span>" : '<span class="muted">0</span>') + "</td>");
      }
      return '<tr class="consumer-row" data-consumer="' + esc(c.consumerName) + '" data-consumer-id="' +
        esc(c.consumerId) + '">' + cells.join("") + "</tr>";
    });
    const th = head.map((h, i) => "<th" + (i >= (keyShared ? 3 : 1) ? ' class="num"' : "") + ">" + h + "</th>");
    return "<thead><tr>" + th.join("") + "</tr></thead><tbody>" + rows.join("") + "</tbody>";
  }

  // --- what blocks a hash --------------------------------------------------------------------
  async function askBlockers(topic, sub, query) {
    const key = subKey(topic, sub);
    try {
      const b = await api(blockersPath(topic, sub, query));
      const sel = state.selected.get(key);
      if (!sel) return;
      sel.hash = b.hash;
      state.blockers.set(key, b);
    } catch (err) {
      state.blockers.set(key, { error: String(err.message || err) });
    }
    if (state.data) render(state.data);
  }

  function select(topic, sub, hash, keyText) {
    const key = subKey(topic, sub);
    state.selected.set(key, { hash, key: keyText || null });
    state.blockers.delete(key);
    if (state.data) render(state.data);
    const query = keyText ? "key=" + encodeURIComponent(keyText) : "hash=" + hash;
    askBlockers(topic, sub, query);
  }

  function refreshBlockers() {
    for (const [key, sel] of state.selected) {
      const [topic, sub] = splitKey(key);
      askBlockers(topic, sub, sel.key ? "key=" + encodeURIComponent(sel.key) : "hash=" + sel.hash);
    }
  }

  function splitKey(key) {
    const i = key.lastIndexOf("|");
    return [key.slice(0, i), key.slice(i + 1)];
  }

  function findSub(topic, sub) {
    if (!state.data) return null;
    const t = state.data.topics.find((x) => x.name === topic);
    return t ? t.subscriptions.find((x) => x.name === sub) || null : null;
  }

  function hashAt(svg, s, clientX, snap) {
    const rect = svg.getBoundingClientRect();
    const { lo, hi, span } = hashBounds(s);
    const frac = Math.min(Math.max((clientX - rect.left) / rect.width, 0), 1);
    let h = Math.min(hi, lo + Math.floor(frac * span));
    if (snap) {
      let best = null;
      for (const c of s.consumers) {
        for (const d of c.drainingHashes || []) {
          const px = Math.abs(((d.hash - lo) / span) * rect.width - (clientX - rect.left));
          if (px <= 6 && (!best || px < best.px)) best = { px, hash: d.hash };
        }
      }
      if (best) h = best.hash;
    }
    return h;
  }

  // --- events --------------------------------------------------------------------------------
  document.addEventListener("click", (ev) => {
    const subEl = ev.target.closest(".sub[data-subscription]");
    if (!subEl) return;
    const topic = subEl.dataset.topic;
    const sub = subEl.dataset.subscription;
    const s = findSub(topic, sub);
    if (!s) return;
    const svg = ev.target.closest("svg.hash-svg");
    if (svg) { select(topic, sub, hashAt(svg, s, ev.clientX, true)); return; }
    const chip = ev.target.closest(".chip[data-hash]");
    if (chip) { select(topic, sub, Number(chip.dataset.hash)); return; }
    if (ev.target.closest("[data-action=close]")) {
      state.selected.delete(subKey(topic, sub));
      state.blockers.delete(subKey(topic, sub));
      render(state.data);
      return;
    }
    if (ev.target.closest(".key-go")) {
      const input = subEl.querySelector(".key-input");
      if (input.value) select(topic, sub, 0, input.value);
    }
  });

  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter" || !ev.target.classList.contains("key-input")) return;
    const subEl = ev.target.closest(".sub[data-subscription]");
    if (subEl && ev.target.value) select(subEl.dataset.topic, subEl.dataset.subscription, 0, ev.target.value);
  });

  document.addEventListener("mousemove", (ev) => {
    const tip = $("tooltip");
    const svg = ev.target.closest && ev.target.closest("svg.hash-svg");
    if (!svg) { tip.hidden = true; return; }
    const subEl = svg.closest(".sub[data-subscription]");
    const s = findSub(subEl.dataset.topic, subEl.dataset.subscription);
    if (!s) return;
    const h = hashAt(svg, s, ev.clientX, true);
    const owner = ownerAt(s, h);
    const drain = s.consumers.flatMap((c) => (c.drainingHashes || []).map((d) => [c, d]))
      .find(([, d]) => d.hash === h);
    tip.textContent = "#" + h + " → " + (owner ? owner.consumerName : "nobody") +
      (drain ? " · draining on " + drain[0].consumerName + " (" + drain[1].unackMsgs + " unacked)" : "");
    tip.style.left = ev.clientX + 12 + "px";
    tip.style.top = ev.clientY + 14 + "px";
    tip.hidden = false;
  });

  $("pause").addEventListener("change", (ev) => { state.paused = ev.target.checked; });
  $("filter").addEventListener("input", (ev) => {
    state.filter = ev.target.value.trim();
    if (state.data) render(state.data);
  });
  $("token-button").addEventListener("click", () => { $("auth").hidden = !$("auth").hidden; });
  $("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("auth-token").value.trim();
    localStorage.setItem("keyshared.token", state.token);
    $("auth").hidden = true;
    poll();
  });
  $("auth-clear").addEventListener("click", () => {
    state.token = "";
    localStorage.removeItem("keyshared.token");
    $("auth-token").value = "";
  });

  // --- the poll loop -------------------------------------------------------------------------
  let inFlight = false;
  async function poll() {
    if (inFlight) return;
    inFlight = true;
    const live = $("live");
    try {
      const data = await api(OVERVIEW);
      state.data = data;
      recordHistory(data);
      render(data);
      refreshBlockers();
      live.className = "live ok";
      $("live-text").textContent = "live · " + new Date(data.timestamp).toLocaleTimeString();
      document.body.dataset.loaded = "true";
    } catch (err) {
      live.className = "live err";
      $("live-text").textContent = "offline · " + (err.message || err);
    } finally {
      inFlight = false;
    }
  }

  // ?filter=TEXT opens the page filtered, as a link to one topic.
  const initial = new URLSearchParams(location.search).get("filter");
  if (initial) {
    state.filter = initial;
    $("filter").value = initial;
  }

  poll();
  setInterval(() => { if (!state.paused) poll(); }, POLL_MS);
})();
