// shardgate's operator page: reads the admin API (/v1/...) with the
// admin token and redraws every REFRESH_MS. The page itself carries no
// data. The token comes from the URL fragment (#token=..., which browsers
// never send to the server) or from the login form, and is kept in
// sessionStorage for this browser session only.
"use strict";

const REFRESH_MS = 2000;
const HISTORY = 150; // samples kept: 5 minutes at 2 s
const RATE_WINDOW_MS = 10000; // rates and quantiles over the last ~10 s
const TOKEN_KEY = "shardgate-admin-token";
const DECISIONS = ["allow", "rate-limited", "capped", "denied", "no-shards", "no-tenant-shards", "no-region-shards"];

const $ = (sel) => document.querySelector(sel);
const state = { token: null, history: [], timer: null, inFlight: false };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmtRate(x) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  if (x >= 100) return Math.round(x).toLocaleString();
  if (x >= 10) return x.toFixed(1);
  return x.toFixed(2).replace(/\.?0+$/, "") || "0";
}

function fmtSeconds(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s < 0.001) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
  return s.toFixed(2) + " s";
}

// ---- the API ---------------------------------------------------------

class ApiError extends Error {}
class Unauthorized extends ApiError {}

async function api(method, path, body) {
  const headers = {};
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method, headers, cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  const text = await res.text();
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: text }; }
  if (res.status === 401) throw new Unauthorized((data && data.error) || "unauthorized");
  if (!res.ok) throw new ApiError((data && data.error) || `${method} ${path}: HTTP ${res.status}`);
  return data;
}

// ---- login -----------------------------------------------------------

function tokenFromFragment() {
  const m = /(?:^|[#&])token=([^&]*)/.exec(location.hash);
  if (!m) return null;
  history.replaceState(null, "", location.pathname + location.search);
  try { return decodeURIComponent(m[1]); } catch (_) { return m[1]; }
}

function showLogin(message) {
  stopRefresh();
  $("#dashboard").hidden = true;
  $("#login").hidden = false;
  const err = $("#login-error");
  err.hidden = !message;
  err.textContent = message || "";
  setStatus("idle", "token needed");
  $("#token").focus();
}

async function start() {
  const given = tokenFromFragment();
  if (given) sessionStorage.setItem(TOKEN_KEY, given);
  state.token = sessionStorage.getItem(TOKEN_KEY);
  let required = true;
  try {
    required = (await api("GET", "/ui/auth")).token_required;
  } catch (e) {
    setStatus("error", "admin API unreachable");
  }
  if (required && !state.token) return showLogin();
  openDashboard();
}

$("#login").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  state.token = $("#token").value.trim();
  try {
    await api("GET", "/v1/shards");
  } catch (e) {
    state.token = null;
    return showLogin(e instanceof Unauthorized ? "That token is not accepted." : e.message);
  }
  sessionStorage.setItem(TOKEN_KEY, state.token);
  $("#token").value = "";
  openDashboard();
});

function openDashboard() {
  $("#login").hidden = true;
  $("#dashboard").hidden = false;
  refresh();
}

function stopRefresh() {
  clearTimeout(state.timer);
  state.timer = null;
}

function setStatus(kind, text) {
  const s = $("#status");
  s.dataset.state = kind;
  s.textContent = text;
}

// ---- polling ---------------------------------------------------------

async function refresh() {
  stopRefresh();
  if (state.inFlight) return;
  state.inFlight = true;
  try {
    const [shards, metrics, top, denied, cluster, certs, plans] = await Promise.all([
      api("GET", "/v1/shards"),
      api("GET", "/v1/metrics"),
      api("GET", "/v1/tenants/top?by=refused&n=10"),
      api("GET", "/v1/tenants/denied"),
      api("GET", "/v1/cluster"),
      api("GET", "/v1/certs"),
      api("GET", "/v1/plans"),
    ]);
    renderPlans(plans);
    const sample = { at: performance.now(), metrics, shards };
    const prev = state.history[state.history.length - 1];
    if (prev && (metrics.router.routes < prev.metrics.router.routes ||
                 metrics.request_duration_seconds.count < prev.metrics.request_duration_seconds.count)) {
      state.history = []; // the gateway restarted: its counters began again
    }
    state.history.push(sample);
    if (state.history.length > HISTORY) state.history.shift();
    render({ shards, metrics, top, denied, cluster, certs });
    setStatus("ok", "live · " + new Date().toLocaleTimeString());
  } catch (e) {
    if (!(e instanceof Unauthorized) && !(e instanceof ApiError)) {
      console.error(e); // a fault of the page itself, not of the gateway
    }
    if (e instanceof Unauthorized) {
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = null;
      state.inFlight = false;
      return showLogin("The token was refused: " + e.message);
    }
    setStatus("error", "refresh failed: " + e.message);
  }
  state.inFlight = false;
  state.timer = setTimeout(refresh, REFRESH_MS);
}

/// The sample closest to RATE_WINDOW_MS before the last one.
function baseline() {
  const h = state.history;
  if (h.length < 2) return null;
  const last = h[h.length - 1];
  let base = h[h.length - 2];
  for (let i = h.length - 2; i >= 0; i--) {
    base = h[i];
    if (last.at - h[i].at >= RATE_WINDOW_MS) break;
  }
  return { base, last, secs: (last.at - base.at) / 1000 };
}

function decisionCounts(m) {
  const r = m.router;
  const out = { allow: r.allows };
  for (const d of DECISIONS.slice(1)) out[d] = (r.rejects_by_decision || {})[d] || 0;
  return out;
}

function failureCounts(m) {
  const out = {};
  for (const f of m.upstream_failures || []) {
    (out[f.shard] = out[f.shard] || {})[f.kind] = f.count;
  }
  return out;
}

/// A quantile of the durations observed between two cumulative histograms,
/// interpolated within its bucket as Prometheus' histogram_quantile does.
function quantile(q, now, before) {
  const b = now.buckets.map(([le, n], i) => [le, n - (before ? before.buckets[i][1] : 0)]);
  const total = now.count - (before ? before.count : 0);
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevN = 0;
  for (const [le, n] of b) {
    if (n >= rank) return prevLe + (le - prevLe) * ((rank - prevN) / Math.max(n - prevN, 1));
    prevLe = le; prevN = n;
  }
  return prevLe; // in the +Inf bucket: at least the last bound
}

// ---- rendering -------------------------------------------------------

function render(d) {
  const w = baseline();
  const rate = (now, before) => (w && w.secs > 0 ? Math.max(0, now - before) / w.secs : null);
  const m = d.metrics;

  // Tiles.
  const dc = decisionCounts(m);
  const dcBase = w ? decisionCounts(w.base.metrics) : null;
  const refusedNow = DECISIONS.slice(1).reduce((a, k) => a + dc[k], 0);
  const refusedBase = dcBase ? DECISIONS.slice(1).reduce((a, k) => a + dcBase[k], 0) : 0;
  $("#t-rps").textContent = fmtRate(w ? rate(dc.allow, dcBase.allow) : null);
  $("#t-refused").textContent = fmtRate(w ? rate(refusedNow, refusedBase) : null);
  const dur = m.request_duration_seconds;
  const durBase = w ? w.base.metrics.request_duration_seconds : null;
  $("#t-p50").textContent = fmtSeconds(quantile(0.5, dur, durBase));
  $("#t-p99").textContent = fmtSeconds(quantile(0.99, dur, durBase));
  $("#t-retries").textContent = fmtRate(w ? rate(m.retries, w.base.metrics.retries) : null);
  $("#t-active").textContent = d.shards.reduce((a, s) => a + (s.active || 0), 0).toLocaleString();

  renderShards(d.shards, m, w, rate);
  renderChart();
  renderTop(d.top);
  renderDenied(d.denied);
  renderDomains(m, w, rate);
  renderCluster(d.cluster);
  renderCerts(d.certs);
}

function renderShards(shards, m, w, rate) {
  const routed = m.router.shard_load_distribution || {};
  const routedBase = w ? w.base.metrics.router.shard_load_distribution || {} : {};
  const fails = failureCounts(m);
  const failsBase = w ? failureCounts(w.base.metrics) : {};
  const body = $("#shards tbody");
  body.replaceChildren(...shards.map((s) => {
    const st = !s.healthy ? "down" : s.draining ? "draining" : "up";
    const failRates = Object.entries(fails[s.id] || {})
      .map(([kind, n]) => [kind, rate(n, ((failsBase[s.id] || {})[kind]) || 0)])
      .filter(([, r]) => r !== null && r > 0);
    const cls = st === "down" ? "bad" : st === "draining" || failRates.length ? "warn" : null;
    const action = (name, label) => el("button", {
      "data-action": name, "data-shard": s.id,
      onclick: () => confirmThen(`${label} shard “${s.id}”?`, label,
        () => api("POST", `/v1/shards/${encodeURIComponent(s.id)}/${name}`), `shard ${s.id}: ${name}`),
    }, label);
    return el("tr", { class: cls, "data-shard": s.id, "data-state": st },
      el("td", {}, s.id),
      el("td", { class: "muted wide" }, s.url),
      el("td", {}, s.region || "–"),
      el("td", { class: "num wide" }, s.weight),
      el("td", {}, el("span", { class: "badge " + st }, st)),
      el("td", { class: "num" }, s.active),
      el("td", { class: "num" }, fmtRate(w ? rate(routed[s.id] || 0, routedBase[s.id] || 0) : null)),
      el("td", {}, failRates.length
        ? failRates.map(([k, r]) => el("span", { class: "fail" }, `${k} ${fmtRate(r)} `))
        : el("span", { class: "muted" }, "none")),
      el("td", { class: "actions" },
        s.draining ? null : action("drain", "Drain"),
        s.healthy && !s.draining ? action("unhealthy", "Mark down") : action("healthy", "Mark healthy")),
    );
  }));
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function renderChart() {
  const canvas = $("#chart");
  const h = state.history;
  const colors = DECISIONS.map((_, i) => cssVar("--c" + i));
  // Per-interval rates between consecutive samples.
  const series = DECISIONS.map(() => []);
  for (let i = 1; i < h.length; i++) {
    const secs = (h[i].at - h[i - 1].at) / 1000;
    const a = decisionCounts(h[i].metrics), b = decisionCounts(h[i - 1].metrics);
    DECISIONS.forEach((k, j) => series[j].push(secs > 0 ? Math.max(0, a[k] - b[k]) / secs : 0));
  }
  $("#legend").replaceChildren(...DECISIONS.map((k, j) => {
    const last = series[j].length ? series[j][series[j].length - 1] : null;
    const s = el("span", { "data-decision": k }, `${k} ${fmtRate(last)}/s`);
    s.style.setProperty("--swatch", colors[j]);
    return s;
  }));
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 600, height = 200;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, height);
  const left = 48, bottom = height - 18, top = 8, right = width - 8;
  const max = Math.max(1, ...series.flat());
  const nice = niceCeil(max);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = cssVar("--muted");
  g.strokeStyle = cssVar("--line");
  g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = bottom - ((bottom - top) * i) / 4;
    g.beginPath(); g.moveTo(left, y); g.lineTo(right, y); g.stroke();
    g.fillText(fmtRate((nice * i) / 4), 4, y + 4);
  }
  g.fillText("now", right - 22, height - 4);
  g.fillText(`-${Math.round((HISTORY * REFRESH_MS) / 60000)} min`, left, height - 4);
  const step = (right - left) / Math.max(1, HISTORY - 1);
  series.forEach((pts, j) => {
    if (!pts.length || pts.every((v) => v === 0)) return;
    g.strokeStyle = colors[j];
    g.lineWidth = 1.75;
    g.beginPath();
    pts.forEach((v, i) => {
      const x = right - (pts.length - 1 - i) * step;
      const y = bottom - ((bottom - top) * v) / nice;
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  });
}

function niceCeil(x) {
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function renderTop(top) {
  $("#top-window").textContent = `last ${top.window_seconds} s`;
  const rows = top.tenants.map((t) => el("tr", { "data-tenant": t.tenant },
    el("td", {}, t.tenant),
    el("td", { "data-plan": t.plan || "" }, t.plan || "–"),
    el("td", { class: "num", title: t.error ? `at least ${t.refused - t.error}, at most ${t.refused}` : null },
      t.error ? `${t.refused - t.error}–${t.refused}` : t.refused),
    el("td", { class: "num wide" }, t.rate_limited),
    el("td", { class: "num wide" }, t.capped),
    el("td", {}, el("button", {
      "data-action": "deny", "data-tenant": t.tenant,
      onclick: () => denyTenant(t.tenant),
    }, "Deny")),
  ));
  $("#top tbody").replaceChildren(...rows);
  $("#top-empty").hidden = rows.length > 0;
}

function renderDenied(denied) {
  const list = $("#denied-list");
  if (!denied.length) {
    list.replaceChildren(el("p", { class: "muted" }, "No tenant is denied."));
    return;
  }
  list.replaceChildren(el("p", { class: "muted" }, "Denied:"), ...denied.map((t) =>
    el("span", { class: "chip", "data-denied": t }, t,
      el("button", { "data-action": "allow", "data-tenant": t, onclick: () => allowTenant(t) }, "Allow"))));
}

function denyTenant(t) {
  return confirmThen(`Deny tenant “${t}”? Its requests will be refused with 403.`, "Deny",
    () => api("PUT", `/v1/tenants/${encodeURIComponent(t)}/deny`), `tenant ${t}: denied`);
}

function allowTenant(t) {
  return confirmThen(`Allow tenant “${t}” again?`, "Allow",
    () => api("DELETE", `/v1/tenants/${encodeURIComponent(t)}/deny`), `tenant ${t}: allowed`);
}

$("#tenant-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const t = $("#tenant").value.trim();
  if (t) denyTenant(t);
});
$("#tenant-form [data-do=allow]").addEventListener("click", () => {
  const t = $("#tenant").value.trim();
  if (t) allowTenant(t);
});
$("#tenant-form [data-do=plan]").addEventListener("click", () => {
  const t = $("#tenant").value.trim();
  const plan = $("#plan").value;
  if (!t) return;
  // "" = as configured: the runtime change is dropped; the tenant follows
  // `tenants`, then `default_plan`, then `limits`.
  const text = plan
    ? `Move tenant “${t}” to plan “${plan}”? Its limits change from its next request.`
    : `Put tenant “${t}” back on its configured plan? Its limits change from its next request.`;
  confirmThen(text, "Set plan",
    () => plan
      ? api("PUT", `/v1/tenants/${encodeURIComponent(t)}/plan`, { plan })
      : api("DELETE", `/v1/tenants/${encodeURIComponent(t)}/plan`),
    `tenant ${t}: plan ${plan || "as configured"}`);
});

function renderPlans(plans) {
  const select = $("#plan");
  const names = Object.keys(plans);
  const wanted = ["", ...names].join("\n");
  if (select.dataset.names === wanted) return; // keep the operator's choice
  select.dataset.names = wanted;
  select.replaceChildren(el("option", { value: "" }, "as configured"),
    ...names.map((n) => el("option", { value: n }, n)));
  const none = names.length === 0;
  select.hidden = none;
  $("#tenant-form [data-do=plan]").hidden = none;
}

function renderDomains(m, w, rate) {
  const d = m.domains, b = w ? w.base.metrics.domains : null;
  const row = (k, label) => el("tr", { "data-result": k }, el("td", {}, label),
    el("td", { class: "num" }, fmtRate(b ? rate(d[k], b[k]) : null)));
  $("#domains tbody").replaceChildren(
    row("exact", "exact"), row("wildcard", "wildcard"), row("fallback", "fallback suffix"),
    row("misses", "no tenant (421)"),
    el("tr", {}, el("td", {}, "entries"), el("td", { class: "num" }, d.entries)));
}

function renderCluster(c) {
  $("#cluster").hidden = !c.enabled;
  if (!c.enabled) return;
  $("#node").textContent = "node " + c.node_id;
  const kv = (k, v, cls) => el("tr", { class: cls }, el("td", {}, k), el("td", {}, v));
  $("#cluster-info tbody").replaceChildren(
    kv("Redis", c.redis.up ? "up" : "DOWN", c.redis.up ? null : "bad"),
    kv("target", Array.isArray(c.redis.target) ? c.redis.target.join(", ") : c.redis.target),
    kv("limits", c.mode === "shared" ? "shared through Redis" : c.mode === "allow" ? "NOT ENFORCED (Redis down, on_redis_down: allow)" : "limited requests refused (Redis down, on_redis_down: deny)", c.mode === "shared" ? null : "bad"),
    kv("nodes alive", c.nodes_alive),
    kv("sync errors", c.sync_errors, c.sync_errors ? "warn" : null));
  $("#nodes tbody").replaceChildren(...c.nodes.map((n) =>
    el("tr", { class: n.alive ? null : "bad", "data-node": n.id },
      el("td", {}, n.id + (n.id === c.node_id ? " (this one)" : "")),
      el("td", {}, el("span", { class: "badge " + (n.alive ? "up" : "down") }, n.alive ? "alive" : "gone")),
      el("td", { class: "num" }, fmtSeconds(n.last_seen_ago_ms / 1000) + " ago"))));
}

function renderCerts(c) {
  const any = c.certs.length || c.errors.length || c.acme;
  $("#certs").hidden = !any;
  if (!any) return;
  const now = Date.now() / 1000;
  $("#cert-list tbody").replaceChildren(...c.certs.map((x) => {
    const days = (x.expires - now) / 86400;
    const cls = days < 3 ? "bad" : days < 14 ? "warn" : null;
    return el("tr", { class: cls, "data-cert": x.name },
      el("td", {}, x.name),
      el("td", { class: "muted" }, x.sans.join(", ")),
      el("td", { class: "muted" }, x.issuer),
      el("td", {}, new Date(x.expires * 1000).toISOString().slice(0, 10) +
        ` (${days < 0 ? "expired" : Math.floor(days) + " d"})`),
      el("td", {}, x.source));
  }));
  const problems = c.errors.map((e) => el("p", { class: "error" }, `${e.file}: ${e.error}`));
  if (c.acme) {
    if (c.acme.account_error) problems.push(el("p", { class: "error" }, "ACME account: " + c.acme.account_error));
    for (const [host, s] of Object.entries(c.acme.hosts || {})) {
      if (s.state === "issued") continue;
      problems.push(el("p", { class: s.state === "failed" ? "error" : "muted" },
        `ACME ${host}: ${s.state}` + (s.last_error ? ` — ${s.last_error}` : "") +
        (s.retry_at ? ` (next try ${new Date(s.retry_at * 1000).toLocaleTimeString()})` : "")));
    }
  }
  $("#cert-problems").replaceChildren(...problems);
}

// ---- actions ---------------------------------------------------------

function confirmThen(text, label, action, done) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = label;
  dialog.returnValue = "";
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "ok") return;
    try {
      const answer = await action();
      toast(`${done} — done: ${JSON.stringify(answer)}`);
    } catch (e) {
      if (e instanceof Unauthorized) return showLogin("The token was refused: " + e.message);
      toast(`${done} failed: ${e.message}`, true);
    }
    refresh();
  }, { once: true });
  dialog.showModal();
}

function toast(text, error) {
  const t = $("#toast");
  t.textContent = text;
  t.className = error ? "error" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, error ? 10000 : 4000);
}

window.addEventListener("resize", () => { if (state.history.length) renderChart(); });
start();
