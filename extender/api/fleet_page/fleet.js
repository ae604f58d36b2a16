// The fleet page (issue 46): polls fleet/data and draws it; every string from the cluster (pod,
// node and model names, reasons) reaches the page through textContent only, never as markup.
"use strict";

const POLL_MS = 2000;
const query = { class: "", rack: "", q: "", offset: 0, limit: 100 };
let lastPage = { total: 0 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function gib(mib) { return `${(mib / 1024).toFixed(1)} GiB`; }
function shortPod(key) { const name = String(key).split("/").pop(); return name.length > 18 ? name.slice(0, 17) + "…" : name; }

async function getJson(url, options) {
  const response = await fetch(url, Object.assign({ headers: { accept: "application/json" } }, options || {}));
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

// Each refresh is numbered: typing a name filter asks once per keystroke, and an earlier answer
// arriving after a later one must not draw the fleet of a shorter filter over it.
let asked = 0;

async function refresh() {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) if (value !== "" && value !== null) params.set(key, value);
  const ask = ++asked;
  try {
    const data = await getJson(`fleet/data?${params}`);
    if (ask !== asked) return; // a later refresh was asked meanwhile: its answer draws
    draw(data);
    document.getElementById("error").hidden = true;
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (ask !== asked) return;
    const box = document.getElementById("error");
    box.hidden = false;
    box.textContent = `cannot read the fleet: ${err.message}`;
  }
}

function draw(data) {
  drawSummary(data.summary);
  drawClasses(data.classes);
  drawFilters(data);
  drawNodes(data.nodes);
  drawPending(data.pending);
  lastPage = data.page;
  document.getElementById("page-info").textContent =
    data.page.total ? `${data.page.offset + 1}–${Math.min(data.page.offset + data.page.limit, data.page.total)} of ${data.page.total} nodes` : "no nodes";
}

function drawSummary(s) {
  const items = [["nodes", s.nodes], ["GPUs", s.gpus], ["free", s.free], ["held", s.held], ["dirty", s.dirty],
                 ["cordoned", s.cordoned], ["out of service", s.failed], ["whole NVLink islands free", s.freeIslands]];
  document.getElementById("summary").replaceChildren(...items.map(([label, n]) => el("div", {}, el("b", { text: n }), label)));
}

function drawClasses(classes) {
  const rows = classes.map((c) => el("tr", { class: c.nodeClass === query.class ? "chosen" : "", "data-class": c.nodeClass },
    el("td", {}, el("button", { type: "button", text: c.nodeClass, onclick: () => choose({ class: c.nodeClass === query.class ? "" : c.nodeClass }) })),
    el("td", { text: c.nodes }), el("td", { text: c.gpus }), el("td", { text: c.free }), el("td", { text: c.held }),
    el("td", { text: c.dirty }), el("td", { text: c.cordoned }), el("td", { text: c.failed }), el("td", { text: c.freeIslands })));
  const head = el("tr", {}, ["node class", "nodes", "GPUs", "free", "held", "dirty", "cordoned", "out of service", "free islands"]
    .map((h) => el("th", { text: h })));
  document.getElementById("classes").replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, rows)));
}

function drawFilters(data) {
  fillSelect(document.getElementById("filter-class"), data.classes.map((c) => c.nodeClass), query.class);
  fillSelect(document.getElementById("filter-rack"), data.racks, query.rack);
}

function fillSelect(select, values, chosen) {
  const wanted = ["", ...values];
  const have = [...select.options].map((o) => o.value);
  if (have.join("\u0000") !== wanted.join("\u0000")) {
    select.replaceChildren(...wanted.map((v) => el("option", { value: v, text: v || "all" })));
  }
  select.value = chosen;
}

function drawNodes(nodes) {
  document.getElementById("nodes").replaceChildren(...nodes.map(drawNode));
}

function drawNode(node) {
  const badges = [node.rack && el("span", { class: "badge", text: `rack ${node.rack}` }),
                  node.unschedulable && el("span", { class: "badge warn", text: "unschedulable" }),
                  node.telemetry !== "fresh" && el("span", { class: "badge warn", text: "no telemetry" }),
                  node.inventoryError && el("span", { class: "badge warn", title: node.inventoryError, text: "inventory problem" })];
  const islands = node.islands.map((island, i) => el("span", {
    class: `island island-${island.state}`, "data-node": node.name, "data-island": i, "data-state": island.state,
    text: `NVLink [${island.gpus.join(",")}] ${island.state}` }));
  const cells = node.units.map((unit) => drawUnit(node.name, unit));
  const engines = node.engines.map((e) => el("div", { text:
    `${e.pod} (${e.model}): KV ${(e.kvCacheUsage * 100).toFixed(0)} %, ${e.running} running, ${e.waiting} waiting${e.stale ? " (stale)" : ""}` }));
  return el("article", { class: "node", "data-node": node.name },
    el("h3", {}, el("span", { text: node.name }), el("span", {}, badges)),
    el("div", { class: "facts", text: node.class }),
    islands.length ? el("div", { class: "islands" }, islands) : null,
    el("div", { class: "gpus" }, cells),
    engines.length ? el("div", { class: "engines" }, engines) : null);
}

function drawUnit(nodeName, unit) {
  const lines = [`${unit.mig ? "MIG " + (unit.profile || "") : "GPU"} ${unit.gpu} ${unit.id}`, `state: ${unit.state}`];
  if (unit.island !== null) lines.push(`NVLink island ${unit.island}`);
  if (unit.holder) lines.push(`held by ${unit.holder.pod} (${unit.holder.state})${unit.holder.role ? ", role " + unit.holder.role : ""}`
                             + `${unit.holder.gang ? ", gang " + unit.holder.gang : ""}`);
  if (unit.engine) lines.push(`engine ${unit.engine.model}: KV ${(unit.engine.kvCacheUsage * 100).toFixed(0)} %, ${unit.engine.waiting} waiting`);
  if (unit.foreignMiB) lines.push(`foreign processes hold ${gib(unit.foreignMiB)}`);
  if (unit.share) lines.push(`shares: ${unit.share.sharers} promised ${gib(unit.share.promisedMiB)} of ${gib(unit.share.capacityMiB || 0)}`);
  if (unit.failure) lines.push(unit.failure);
  const who = unit.holder ? shortPod(unit.holder.pod) : unit.state === "dirty" && unit.foreignMiB ? `${Math.round(unit.foreignMiB / 1024)}G`
    : unit.state === "cordoned" ? "cordon" : unit.state === "failed" ? "down" : unit.share ? `${unit.share.sharers} share` : "";
  let fill = null;
  if (unit.share && unit.share.capacityMiB) {  // CSSOM, not a style attribute: the page's CSP allows no inline style
    fill = el("span", { class: "fill" });
    fill.style.width = `${Math.min(100, 100 * unit.share.promisedMiB / unit.share.capacityMiB).toFixed(0)}%`;
  }
  return el("div", { class: `gpu state-${unit.state}`, "data-node": nodeName, "data-gpu": unit.gpu, "data-unit": unit.id,
                     "data-state": unit.state, title: lines.join("\n") },
    el("span", { class: "idx", text: unit.mig ? `${unit.gpu} ${unit.profile || "mig"}` : unit.gpu }),
    el("span", { class: "who", text: who }), fill);
}

function drawPending(pending) {
  const body = document.querySelector("#pending tbody");
  body.replaceChildren(...pending.map((p) => el("tr", { "data-pod": p.pod, class: p.result },
    el("td", {}, el("button", { class: "pod", type: "button", text: p.pod, onclick: () => showDecision(p.pod) })),
    el("td", { text: p.reason || p.result }))));
  document.querySelector("#pending .empty").hidden = pending.length > 0;
}

async function showDecision(podKey) {
  const [namespace, name] = podKey.split("/");
  const panel = document.getElementById("decision");
  const body = document.getElementById("decision-body");
  panel.hidden = false;
  body.replaceChildren(el("p", { class: "muted", text: `reading ${podKey}…` }));
  try {
    const data = await getJson(`debug/decisions/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`);
    const parts = [el("p", {}, el("b", { text: podKey }))];
    for (const [verb, record] of Object.entries(data.decisions)) {
      parts.push(el("h4", { text: `${verb}: ${record.result}` }), el("p", { class: "summary", text: record.summary }));
      const verdicts = (record.details && record.details.verdicts) || {};
      const items = Object.entries(verdicts).slice(0, 50).map(([node, statuses]) => {
        const last = statuses[statuses.length - 1] || {};
        const verdict = { SUCCESS: "fits", UNSCHEDULABLE: "not now", UNSCHEDULABLE_AND_UNRESOLVABLE: "never" }[last.code] || last.code || "";
        return el("li", { "data-node": node }, el("b", { text: node }), ` ${verdict}`, last.plugin ? ` (${last.plugin})` : "",
                  last.reason ? el("div", { class: "reason", text: last.reason }) : null);
      });
      if (items.length) parts.push(el("ul", { class: "verdicts" }, items));
    }
    parts.push(el("details", {}, el("summary", { text: "the records as JSON" }), el("pre", { text: JSON.stringify(data, null, 2) })));
    body.replaceChildren(...parts);
  } catch (err) {
    body.replaceChildren(el("p", { class: "error", text: `${podKey}: ${err.message}` }));
  }
}

async function simulate(event) {
  event.preventDefault();
  const out = document.getElementById("simulate-result");
  let objects;
  try {
    objects = jsyaml.loadAll(document.getElementById("simulate-input").value).filter((o) => o !== null && o !== undefined);
  } catch (err) {
    out.replaceChildren(el("p", { class: "error", text: `not YAML or JSON: ${err.message}` }));
    return;
  }
  const replicas = document.getElementById("simulate-replicas").value;
  const request = { objects, namespace: document.getElementById("simulate-namespace").value || "default" };
  if (replicas !== "") request.replicas = Number(replicas);
  out.replaceChildren(el("p", { class: "muted", text: "simulating…" }));
  try {
    const answer = await getJson("debug/simulate", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request) });
    const rows = answer.pods.map((p) => el("tr", { "data-pod": p.pod },
      el("td", { text: p.pod }),
      el("td", { class: p.fits ? "fits" : p.never ? "never" : "waits", text: p.fits ? "fits" : p.never ? "never" : "waits" }),
      el("td", { text: p.fits ? `${p.node} [${p.gpuIndices.join(",")}]${p.tiedNodes.length > 1 ? " (tied: " + p.tiedNodes.join(", ") + ")" : ""}`
                                : p.reason + (p.preemption ? `; ${p.preemption}` : "") })));
    const gangs = answer.gangs.map((g) => el("p", { text: `gang ${g.gang}: ${g.bindsWhole ? "binds whole" : "would not bind"}: ${g.reason}` }));
    out.replaceChildren(el("p", { text: `${answer.summary}; nothing was reserved` }), el("table", {}, el("tbody", {}, rows)), gangs);
  } catch (err) {
    out.replaceChildren(el("p", { class: "error", text: err.message }));
  }
}

function choose(change) {
  Object.assign(query, change, { offset: change.offset !== undefined ? change.offset : 0 });
  refresh();
}

document.getElementById("filter-class").addEventListener("change", (e) => choose({ class: e.target.value }));
document.getElementById("filter-rack").addEventListener("change", (e) => choose({ rack: e.target.value }));
document.getElementById("filter-name").addEventListener("input", (e) => choose({ q: e.target.value }));
document.getElementById("prev").addEventListener("click", () => choose({ offset: Math.max(0, query.offset - query.limit) }));
document.getElementById("next").addEventListener("click", () => {
  if (query.offset + query.limit < lastPage.total) choose({ offset: query.offset + query.limit });
});
document.getElementById("decision-close").addEventListener("click", () => { document.getElementById("decision").hidden = true; });
document.getElementById("simulate-form").addEventListener("submit", simulate);
refresh();
setInterval(refresh, POLL_MS);
