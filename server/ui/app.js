// dlockd dashboard: polls /ui/api/* once a second and renders the lock table,
// the queues, the rates, the histograms and the Raft state.
//
// Every key, holder text and error message is user data: it is written with
// textContent or as an attribute value, never parsed as HTML (this file has
// no innerHTML). The page is served with a Content-Security-Policy that
// allows only this origin's scripts.
"use strict";

(function () {
  const POLL_MS = 1000;
  const RATE_WINDOW_MS = 10000; // rates: over the last 10 s
  const HIST_WINDOW_MS = 60000; // histograms: over the last minute
  const SPARK_POINTS = 60;
  const TOKEN_KEY = "dlock.token";

  // The counters shown as rates, in order. alarm: any increase in the
  // window raises the correctness alarm.
  const CARDS = [
    { id: "grants", title: "Grants", unit: "/s", help: "Grants made, to a free key or to the head of its queue." },
    { id: "contended", title: "Contention", unit: "/s", help: "Acquisitions that found the key held: refused tries and queued waits." },
    { id: "expired", title: "Expiries while held", unit: "/s", alarm: true, help: "Grants that ended by expiry: the holder neither renewed nor released in time. If it was still working, another holder may now act on the same key: the correctness alarm." },
    { id: "renew_failures", title: "Renew failures", unit: "/s", warn: true, help: "Renewals answered lease lost: the holder learned that its grant had ended." },
    { id: "force_releases", title: "Force releases", unit: "/s", warn: true, help: "Grants removed by an operator's force release." },
    { id: "unclaimed", title: "Unclaimed handovers", unit: "/s", warn: true, help: "Keys handed to a waiter that did not confirm in time." },
  ];

  const state = {
    prefix: "",
    limit: 50,
    pages: [""], // page tokens of the pages visited: pages[i] opens page i
    page: 0,
    next: "",
    paused: false,
    samples: [], // {t, counters, hold, wait}
    spark: {}, // id -> [rate]
    lastOK: 0,
    firstRows: false,
    localNode: "",
    timer: 0,
    inflight: false,
  };

  const $ = (id) => document.getElementById(id);

  // el builds an element: el("td", {class: "num", title: t}, "text", child).
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === "class") e.className = v;
        else if (k === "dataset") Object.assign(e.dataset, v);
        else e.setAttribute(k, v === true ? "" : String(v));
      }
    }
    for (const k of kids) {
      if (k === undefined || k === null) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  // ---- formatting ----

  function fmtDur(ms) {
    if (ms === null || ms === undefined) return "—";
    if (ms < 1000) return Math.max(0, Math.round(ms)) + " ms";
    const s = ms / 1000;
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + "h " + String(m % 60).padStart(2, "0") + "m";
    return Math.floor(h / 24) + "d " + (h % 24) + "h";
  }

  function fmtSecs(le) {
    if (!isFinite(le)) return "+Inf";
    if (le < 1) return Math.round(le * 1000) + "ms";
    if (le < 60) return le + "s";
    if (le < 3600) return le / 60 + "m";
    return le / 3600 + "h";
  }

  function fmtRate(r) {
    if (r === null || !isFinite(r)) return "—";
    if (r === 0) return "0";
    if (r < 0.1) return r.toFixed(2);
    if (r < 10) return r.toFixed(1);
    return Math.round(r).toLocaleString();
  }

  const fmtInt = (n) => Number(n).toLocaleString();

  // ---- fetching ----

  class HTTPError extends Error {
    constructor(status, body) {
      super((body && body.message) || "HTTP " + status);
      this.status = status;
      this.body = body;
    }
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const tok = sessionStorage.getItem(TOKEN_KEY);
    if (tok) headers.Authorization = "Bearer " + tok;
    const resp = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    if (!resp.ok) throw new HTTPError(resp.status, body);
    return body;
  }

  function locksURL() {
    const q = new URLSearchParams();
    if (state.prefix) q.set("prefix", state.prefix);
    q.set("limit", String(state.limit));
    const tok = state.pages[state.page];
    if (tok) q.set("page_token", tok);
    return "api/locks?" + q.toString();
  }

  async function poll() {
    if (state.inflight) return;
    state.inflight = true;
    const started = performance.now();
    // Each part is drawn as soon as it arrives: a slow answer (the
    // cluster's fan-out to an unreachable member) does not hold up the
    // lock table.
    const draw = (p, render) => p.then((v) => (render(v), v));
    const [locks, stats, cluster] = await Promise.allSettled([
      draw(api(locksURL()), (v) => {
        renderLocks(v);
        showBanner("");
      }),
      draw(api("api/stats"), renderStats),
      draw(api("api/cluster"), renderCluster),
    ]);
    state.inflight = false;
    const results = [locks, stats, cluster];
    const unauth = results.find((r) => r.status === "rejected" && r.reason.status === 401);
    if (unauth) {
      askToken(sessionStorage.getItem(TOKEN_KEY) ? "The token was refused: " + unauth.reason.message : "");
      setLive("locked", "token required");
      return; // polling resumes once a token is entered
    }
    if (locks.status === "rejected") showBanner(describeError("Lock table unavailable", locks.reason));
    const ok = results.every((r) => r.status === "fulfilled");
    if (ok) {
      state.lastOK = Date.now();
      setLive("ok", "live");
    } else {
      setLive("warn", "partial data");
    }
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    schedule(Math.max(0, POLL_MS - (performance.now() - started)));
  }

  function schedule(ms) {
    clearTimeout(state.timer);
    if (!state.paused) state.timer = setTimeout(poll, ms);
  }

  function refresh() {
    clearTimeout(state.timer);
    if (!state.inflight) poll();
  }

  function describeError(what, err) {
    if (!err) return what;
    const b = err.body;
    let msg = what + ": " + (err.message || String(err));
    if (b && b.leader) msg += " (leader " + (b.leader_id || "?") + " at " + b.leader + ")";
    else if (b && b.reason === "NOT_LEADER") msg += " (no leader known: an election may be running)";
    if (err.status === 403) msg = what + ": your token may not read this: " + (err.message || "");
    return msg;
  }

  // ---- rendering: status line ----

  function setLive(kind, text) {
    const live = $("live");
    live.dataset.state = kind;
    $("live-text").textContent = text;
  }

  function showBanner(text) {
    const b = $("banner");
    b.hidden = !text;
    b.textContent = text;
  }

  // ---- rendering: held keys ----

  function renderLocks(d) {
    const body = $("keys-body");
    const rows = [];
    for (const k of d.keys) rows.push(keyRow(k));
    body.replaceChildren(...rows);
    state.next = d.next_page_token || "";
    const empty = $("keys-empty");
    empty.hidden = d.keys.length > 0;
    if (!d.keys.length) {
      empty.textContent = state.prefix
        ? "No held key starts with \u201c" + state.prefix + "\u201d" + (d.filtered ? " that your token may read." : ".")
        : d.filtered ? "No held key that your token may read." : "No key is held.";
    }
    // The whole table's totals come only for a token that may read every key.
    $("keys-count").textContent = d.held_total == null ? ""
      : fmtInt(d.held_total) + " held · " + fmtInt(d.waiting_total) + " waiting" + (d.filtered ? " (whole table)" : "");
    $("page-info").textContent = "page " + (state.page + 1) + (d.keys.length ? " · " + d.keys.length + " keys" : "");
    $("prev").disabled = state.page === 0;
    $("first").disabled = state.page === 0;
    $("next").disabled = !state.next;
    $("filtered-note").hidden = !d.filtered;
    renderQueues(d.keys);
    if (!state.firstRows && d.keys.length) {
      state.firstRows = true;
      // For the browser test: ms from navigation start to the first page
      // of keys on screen.
      window.dlockFirstRowsMs = performance.now();
    }
    document.body.dataset.renderedAt = String(Date.now());
  }

  function keyRow(k) {
    const left = k.left_ms;
    const frac = left === null || !k.ttl_ms ? null : Math.max(0, Math.min(1, left / k.ttl_ms));
    const bar = el("div", { class: "bar" + (frac !== null && frac < 0.2 ? " low" : "") }, el("span", { style: null }));
    if (frac !== null) bar.firstChild.style.width = (frac * 100).toFixed(1) + "%";
    const q = k.waiters
      ? el("button", { type: "button", class: "pill link", title: "Show the queue of this key" }, String(k.waiters))
      : el("span", { class: "muted" }, "0");
    if (k.waiters) q.addEventListener("click", () => openQueue(k.key));
    return el(
      "tr",
      { dataset: { key: k.key, fence: String(k.fence) } },
      el("td", { class: "c-key mono", title: k.key }, k.key),
      el("td", { class: "c-holder", title: k.holder }, k.holder || el("span", { class: "muted" }, "—")),
      el("td", { class: "c-fence num mono" }, String(k.fence)),
      el("td", { class: "c-age num", title: k.age_at_least ? "granted before this node last restarted or restored its table" : "since the grant was applied" }, (k.age_at_least ? "≥ " : "") + fmtDur(k.age_ms)),
      el("td", { class: "c-left", title: "TTL " + fmtDur(k.ttl_ms) }, el("div", { class: "left" }, bar, el("span", { class: "left-text" }, fmtDur(left)))),
      el("td", { class: "c-queue num" }, q)
    );
  }

  // ---- rendering: queues ----

  function waiterItem(key, w) {
    return el(
      "li",
      { dataset: { key: key, pos: String(w.position) }, class: "waiter" },
      el("span", { class: "pos" }, String(w.position)),
      el("span", { class: "w-holder", title: w.holder }, w.holder || "—"),
      el("span", { class: "w-waited", title: "waiting since the queue entry was applied on the serving node" }, (w.at_least ? "≥ " : "") + fmtDur(w.waited_ms))
    );
  }

  function renderQueues(keys) {
    const blocks = [];
    for (const k of keys) {
      if (!k.waiters) continue;
      const items = k.queue.map((w) => waiterItem(k.key, w));
      if (k.waiters > k.queue.length) {
        const more = el("li", { class: "more" }, el("button", { type: "button", class: "link" }, "+ " + fmtInt(k.waiters - k.queue.length) + " more…"));
        more.firstChild.addEventListener("click", () => openQueue(k.key));
        items.push(more);
      }
      blocks.push(
        el(
          "div",
          { class: "queue", dataset: { key: k.key } },
          el(
            "div",
            { class: "q-head" },
            el("span", { class: "mono q-key", title: k.key }, k.key),
            el("span", { class: "muted small" }, "held by "),
            el("span", { class: "q-holder", title: k.holder }, k.holder || "—"),
            el("span", { class: "pill" }, fmtInt(k.waiters) + " waiting")
          ),
          el("ol", { class: "waiters" }, ...items)
        )
      );
    }
    $("queues").replaceChildren(...blocks);
    $("queues-empty").hidden = blocks.length > 0;
  }

  async function openQueue(key) {
    const m = $("queue-modal");
    $("qm-title").textContent = "Queue of " + key;
    $("qm-body").replaceChildren(el("p", { class: "muted" }, "loading…"));
    m.hidden = false;
    try {
      const d = await api("api/queue?" + new URLSearchParams({ key }).toString());
      const kids = [];
      if (d.held && d.holder) {
        kids.push(el("p", null, "Held by ", el("strong", null, d.holder.holder || "—"), " · fence ", el("span", { class: "mono" }, String(d.holder.fence)), " · age ", fmtDur(d.holder.age_ms), " · ", fmtDur(d.holder.left_ms), " left"));
      } else {
        kids.push(el("p", { class: "muted" }, "Not held."));
      }
      kids.push(el("p", { class: "muted small" }, fmtInt(d.waiters) + " waiting" + (d.waiters > d.queue.length ? ", the first " + d.queue.length + " shown" : "")));
      kids.push(el("ol", { class: "waiters big" }, ...d.queue.map((w) => waiterItem(key, w))));
      $("qm-body").replaceChildren(...kids);
    } catch (e) {
      $("qm-body").replaceChildren(el("p", { class: "error" }, describeError("Queue unavailable", e)));
    }
  }

  // ---- rendering: rates ----

  function buildCards() {
    const cards = CARDS.map((c) =>
      el(
        "div",
        { class: "card" + (c.alarm ? " alarm-card" : ""), id: "card-" + c.id, title: c.help, dataset: { counter: c.id } },
        el("div", { class: "card-title" }, c.title),
        el("div", { class: "card-value" }, el("span", { class: "rate" }, "—"), el("span", { class: "unit" }, c.unit)),
        el("div", { class: "card-foot" }, el("span", { class: "total muted small" }, ""), sparkSVG())
      )
    );
    $("cards").replaceChildren(...cards);
  }

  function sparkSVG() {
    const s = svg("svg", { class: "spark", viewBox: "0 0 120 28", preserveAspectRatio: "none", "aria-hidden": "true" });
    s.append(svg("path", { class: "area", d: "" }), svg("path", { class: "line", d: "" }));
    return s;
  }

  function drawSpark(node, values) {
    const max = Math.max(1e-9, ...values);
    const n = values.length;
    if (n < 2) return;
    // Right-aligned; the x scale grows to SPARK_POINTS as polls come in.
    const slots = Math.max(n, 20) - 1;
    const pts = values.map((v, i) => [120 - ((n - 1 - i) / slots) * 120, 26 - (v / max) * 24]);
    const line = "M" + pts.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join("L");
    node.querySelector(".line").setAttribute("d", line);
    node.querySelector(".area").setAttribute("d", line + "L" + pts[n - 1][0].toFixed(1) + ",28L" + pts[0][0].toFixed(1) + ",28Z");
  }

  // windowStart returns the oldest sample within ms of the newest.
  function sampleAgo(ms) {
    const s = state.samples;
    const last = s[s.length - 1];
    let old = s[0];
    for (const x of s) {
      if (last.t - x.t <= ms) {
        old = x;
        break;
      }
    }
    return old;
  }

  function renderStats(d) {
    const s = state.samples;
    const prev = s[s.length - 1];
    // A counter that went down: another leader or a restart answered.
    if (prev && (prev.node !== d.node_id || Object.keys(d.counters).some((k) => d.counters[k] < prev.counters[k]))) {
      s.length = 0;
      state.spark = {};
    }
    s.push({ t: d.time_ms, node: d.node_id, counters: d.counters, hold: d.hold_seconds, wait: d.wait_seconds });
    while (s.length > 2 && s[s.length - 1].t - s[0].t > HIST_WINDOW_MS + 5000) s.shift();
    const last = s[s.length - 1];
    const old = sampleAgo(RATE_WINDOW_MS);
    const dt = (last.t - old.t) / 1000;
    const p = s.length > 1 ? s[s.length - 2] : null;
    let alarm = 0;
    for (const c of CARDS) {
      const card = $("card-" + c.id);
      const rate = dt > 0 ? (last.counters[c.id] - old.counters[c.id]) / dt : null;
      const inWindow = sampleAgo(HIST_WINDOW_MS);
      const recent = last.counters[c.id] - inWindow.counters[c.id];
      card.querySelector(".rate").textContent = fmtRate(rate);
      card.querySelector(".total").textContent = fmtInt(last.counters[c.id]) + " total";
      card.classList.toggle("hot", recent > 0 && !!(c.alarm || c.warn));
      if (c.alarm) alarm += recent;
      const inst = p && last.t > p.t ? (last.counters[c.id] - p.counters[c.id]) / ((last.t - p.t) / 1000) : 0;
      const sp = (state.spark[c.id] = state.spark[c.id] || []);
      sp.push(Math.max(0, inst));
      while (sp.length > SPARK_POINTS) sp.shift();
      drawSpark(card.querySelector(".spark"), sp);
    }
    $("alarm").hidden = alarm === 0;
    if (alarm) {
      $("alarm-text").textContent =
        fmtInt(alarm) + (alarm === 1 ? " lease" : " leases") + " expired while held in the last minute. A holder that was still working may overlap with the next one: check that writes carry their fence.";
    }
    renderHist("hold", last.hold, sampleAgo(HIST_WINDOW_MS).hold);
    renderHist("wait", last.wait, sampleAgo(HIST_WINDOW_MS).wait);
    const src = d.source === "local" ? " · no leader: this node's own numbers" : "";
    document.body.dataset.statsSource = d.source;
    $("node").dataset.source = d.source;
    state.statsNode = d.node_id + src;
    renderNode();
  }

  // ---- rendering: histograms ----

  function quantile(buckets, total, q) {
    if (!total) return null;
    const rank = q * total;
    let prevLE = 0;
    let prevC = 0;
    for (const b of buckets) {
      if (b.count >= rank) {
        if (!isFinite(b.le)) return prevLE;
        const span = b.count - prevC;
        return prevLE + (span ? ((rank - prevC) / span) * (b.le - prevLE) : 0);
      }
      prevLE = b.le;
      prevC = b.count;
    }
    return prevLE;
  }

  function renderHist(name, now, then) {
    const box = $(name + "-hist");
    let cum = now.buckets.map((b) => ({ le: b.le, count: b.count }));
    let total = now.count;
    let label = "since the leader started";
    if (then && then !== now && now.count - then.count > 0) {
      cum = now.buckets.map((b, i) => ({ le: b.le, count: b.count - (then.buckets[i] ? then.buckets[i].count : 0) }));
      total = now.count - then.count;
      label = "last minute";
    }
    if (!total) {
      box.replaceChildren(el("div", { class: "hist-empty muted" }, name === "hold" ? "No grant has ended since the leader started." : "No waiter has been granted a key since the leader started."));
      $(name + "-meta").textContent = "no observations yet";
      return;
    }
    cum.push({ le: Infinity, count: total });
    const counts = cum.map((b, i) => ({ le: b.le, n: b.count - (i ? cum[i - 1].count : 0) }));
    let lo = counts.findIndex((c) => c.n > 0);
    let hi = counts.length - 1 - [...counts].reverse().findIndex((c) => c.n > 0);
    if (lo < 0) {
      lo = 0;
      hi = counts.length - 1;
    }
    while (hi - lo < 7) {
      if (lo > 0) lo--;
      if (hi - lo < 7 && hi < counts.length - 1) hi++;
      if (lo === 0 && hi === counts.length - 1) break;
    }
    const shown = counts.slice(lo, hi + 1);
    const max = Math.max(1, ...shown.map((c) => c.n));
    const bars = shown.map((c, i) =>
      el(
        "div",
        { class: "hbar", title: fmtInt(c.n) + " ≤ " + fmtSecs(c.le) },
        el("div", { class: "hcount small muted" }, c.n ? fmtInt(c.n) : ""),
        el("div", { class: "hfill-wrap" }, el("div", { class: "hfill" + (c.n ? "" : " zero") })),
        el("div", { class: "hle small muted" }, (i === 0 && lo === 0 ? "≤" : "") + fmtSecs(c.le))
      )
    );
    bars.forEach((b, i) => (b.querySelector(".hfill").style.height = ((shown[i].n / max) * 100).toFixed(1) + "%"));
    box.replaceChildren(...bars);
    const p50 = quantile(cum, total, 0.5);
    const p99 = quantile(cum, total, 0.99);
    $(name + "-meta").textContent = fmtInt(total) + " observed, " + label + " · p50 " + fmtDur(p50 * 1000) + " · p99 " + fmtDur(p99 * 1000);
  }

  // ---- rendering: Raft ----

  function renderCluster(d) {
    state.localNode = d.node_id;
    state.localState = d.state;
    state.leader = d.leader_id;
    const rows = d.members.map((m) =>
      el(
        "tr",
        { dataset: { member: m.id }, class: m.leader ? "leader" : "" },
        el("td", { title: "API " + (m.api_addr || "not registered") + " · Raft " + m.raft_addr }, el("span", { class: "mono" }, m.id), m.voter ? null : el("span", { class: "pill" }, "non-voter"), m.id === d.node_id ? el("span", { class: "muted small" }, " · this node") : null),
        el("td", { class: m.error ? "error small" : "", title: m.error || "" }, m.error ? "unreachable" : m.leader ? el("span", { class: "pill ok" }, m.state || "Leader") : m.state || "—"),
        el("td", { class: "num" }, m.term ? String(m.term) : "—"),
        el("td", { class: "num mono" }, m.applied_index ? fmtInt(m.applied_index) : "—"),
        el("td", { class: "num", title: m.error || "" }, m.leader ? "—" : fmtDur(m.last_contact_ms))
      )
    );
    $("members-body").replaceChildren(...rows);
    $("raft-summary").textContent = (d.leader_id ? "leader " + d.leader_id : "no leader") + " · term " + d.term + " · " + d.members.length + (d.members.length === 1 ? " member" : " members");
    renderNode();
  }

  function renderNode() {
    const n = $("node");
    const parts = [];
    if (state.localNode) parts.push(el("span", { class: "mono" }, state.localNode), " ", el("span", { class: "pill subtle" }, state.localState || "?"));
    if (state.leader && state.leader !== state.localNode) parts.push(el("span", { class: "muted small" }, " · data from leader " + state.leader));
    else if (!state.leader) parts.push(el("span", { class: "muted small" }, " · no leader"));
    n.replaceChildren(...parts);
  }

  // ---- token ----

  function askToken(err) {
    const m = $("auth");
    const e = $("auth-error");
    e.hidden = !err;
    e.textContent = err || "";
    if (m.hidden) {
      m.hidden = false;
      $("token").value = "";
      $("token").focus();
    }
    $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
  }

  // ---- controls ----

  function readHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    state.prefix = h.get("prefix") || "";
    const l = Number(h.get("limit"));
    if ([25, 50, 100, 250].includes(l)) state.limit = l;
    $("prefix").value = state.prefix;
    $("limit").value = String(state.limit);
  }

  function writeHash() {
    const h = new URLSearchParams();
    if (state.prefix) h.set("prefix", state.prefix);
    if (state.limit !== 50) h.set("limit", String(state.limit));
    const s = h.toString();
    history.replaceState(null, "", s ? "#" + s : location.pathname + location.search);
  }

  function resetPages() {
    state.pages = [""];
    state.page = 0;
  }

  function init() {
    buildCards();
    readHash();
    let debounce = 0;
    $("prefix").addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => {
        state.prefix = $("prefix").value;
        resetPages();
        writeHash();
        refresh();
      }, 200);
    });
    $("filter").addEventListener("submit", (e) => {
      e.preventDefault();
      state.prefix = $("prefix").value;
      resetPages();
      writeHash();
      refresh();
    });
    $("limit").addEventListener("change", () => {
      state.limit = Number($("limit").value);
      resetPages();
      writeHash();
      refresh();
    });
    $("next").addEventListener("click", () => {
      if (!state.next) return;
      state.pages = state.pages.slice(0, state.page + 1);
      state.pages.push(state.next);
      state.page++;
      refresh();
    });
    $("prev").addEventListener("click", () => {
      if (state.page > 0) state.page--;
      refresh();
    });
    $("first").addEventListener("click", () => {
      resetPages();
      refresh();
    });
    $("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      $("pause").textContent = state.paused ? "Resume" : "Pause";
      $("pause").setAttribute("aria-pressed", String(state.paused));
      if (state.paused) {
        clearTimeout(state.timer);
        setLive("paused", "paused");
      } else refresh();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      $("forget").hidden = true;
      refresh();
    });
    $("auth-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const t = $("token").value.trim();
      if (!t) return;
      sessionStorage.setItem(TOKEN_KEY, t);
      $("auth").hidden = true;
      $("forget").hidden = false;
      refresh();
    });
    $("qm-close").addEventListener("click", () => ($("queue-modal").hidden = true));
    $("queue-modal").addEventListener("click", (e) => {
      if (e.target === $("queue-modal")) $("queue-modal").hidden = true;
    });
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape") $("queue-modal").hidden = true;
    });
    window.addEventListener("hashchange", () => {
      readHash();
      resetPages();
      refresh();
    });
    $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
    // "updated N s ago" between polls, and a stale warning.
    setInterval(() => {
      if (state.paused || !state.lastOK) return;
      const ago = Date.now() - state.lastOK;
      if (ago > 5000) setLive("warn", "stale: last update " + fmtDur(ago) + " ago");
    }, 1000);
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
