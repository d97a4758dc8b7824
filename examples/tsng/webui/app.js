// tsng VIP editor. Plain JavaScript, no build step, served from the
// agent's binary. Every edit stays a draft until Save, New VIP and Delete
// VIP included: a new VIP exists only in the window until Save creates it,
// and a deletion is only marked until Save removes it. Status refreshes
// never replace a dirty draft; a save conflict keeps the draft and offers
// Discard / reload; Discard drops the draft; closing a dirty window asks
// first.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
};

// This start's token: the sign-in (handoff.js) keeps it in this origin's
// session storage; it is sent as a header (never a cookie, which every
// port of 127.0.0.1 would receive) and is in no URL.
const token = sessionStorage.getItem("tsng-token") || "";

async function api(method, path, body) {
  const opts = { method, headers: { "X-Tsng-Token": token }, credentials: "omit" };
  if (method !== "GET") opts.headers["Content-Type"] = "application/json";
  if (body !== undefined) opts.body = JSON.stringify(body);
  const r = await fetch("/api" + path, opts);
  if (r.status === 401) {
    const err = new Error("Not signed in. Run `tsng ui` on this machine: it opens the editor signed in.");
    err.status = 401;
    throw err;
  }
  const text = await r.text();
  const data = text ? JSON.parse(text) : null;
  if (!r.ok) {
    const err = new Error((data && data.error) || r.statusText);
    err.code = data && data.code;
    err.current = data && data.current_revision;
    err.status = r.status;
    throw err;
  }
  return data;
}

// Go durations ("3s", "1.5s", "250ms", "2h0m0s") to milliseconds.
function durMs(d) {
  if (typeof d === "number") return d * 1000;
  if (!d) return 0;
  let ms = 0;
  const re = /([\d.]+)(h|ms|m|s|us|µs|ns)/g;
  let m;
  while ((m = re.exec(d))) {
    const v = parseFloat(m[1]);
    ms += v * { h: 3600e3, m: 60e3, s: 1e3, ms: 1, us: 1e-3, "µs": 1e-3, ns: 1e-6 }[m[2]];
  }
  return ms;
}
const clone = (v) => JSON.parse(JSON.stringify(v));

// The editor's state: one VIP window at a time.
const state = {
  net: null,       // network name
  id: null,        // service id of the open VIP window ("new" for a New VIP draft)
  isNew: false,    // the window holds a VIP that Save has not created yet
  newName: "",     // the name typed on the network page for New VIP
  loaded: null,    // {service, revision} as last read or saved
  draft: null,     // the service being edited
  nodes: [],       // the network's members
  conflict: null,  // current revision after a refused save
  pendingNav: null,
  statusTimer: null,
  lastCounters: null,
};

// Canonical form of a service for dirty checks: what Save would send.
function canon(svc) {
  const s = clone(svc);
  for (const l of s.listeners || []) {
    l.backends = (l.backends || []).map((b) => b.node + ":" + b.port + (b.drain ? " drain" : "")).sort();
    l.idle_timeout = durMs(l.idle_timeout);
    const c = l.check || {};
    l.check = [c.port_check === false ? "off" : "on", durMs(c.interval), durMs(c.timeout), c.failures || 0, c.successes || 0];
  }
  (s.listeners || []).sort((a, b) => (a.proto + a.port).localeCompare(b.proto + b.port));
  return JSON.stringify({ name: s.name, listeners: s.listeners || [] });
}
// A new VIP and a pending deletion are unsaved by definition.
const dirty = () => state.draft !== null &&
  (state.isNew || !!state.draft.deleted || canon(state.draft) !== canon(state.loaded.service));

// The address of the open window.
const windowHash = () => "#/n/" + encodeURIComponent(state.net) + (state.isNew ? "/new" : "/v/" + state.id);

// discardDraft drops the draft: an existing VIP goes back to its loaded
// configuration (a pending deletion included); a new one is forgotten.
// It reports whether the window is gone (a new VIP's).
function discardDraft() {
  if (state.isNew) {
    state.id = null;
    state.draft = null;
    state.isNew = false;
    window.onbeforeunload = null;
    return true;
  }
  state.draft = clone(state.loaded.service);
  markDirty();
  return false;
}

function markDirty() {
  const d = dirty();
  const mark = $("#dirty");
  if (mark) mark.textContent = d ? "● unsaved draft" : "";
  const save = $("#save");
  if (save) save.disabled = !d;
  const discard = $("#discard");
  if (discard) discard.disabled = !d;
  window.onbeforeunload = d ? (e) => { e.preventDefault(); e.returnValue = ""; return ""; } : null;
}

// Navigation inside the app goes through here so that a dirty draft is
// never dropped silently.
function navigate(hash) {
  if (location.hash === hash) return;
  if (state.id && dirty()) {
    state.pendingNav = hash;
    $("#close-dialog").showModal();
    return;
  }
  location.hash = hash;
}

document.addEventListener("click", (e) => {
  const a = e.target.closest("a[data-nav]");
  if (!a) return;
  e.preventDefault();
  navigate(a.getAttribute("href"));
});

$("#dialog-keep").addEventListener("click", () => {
  state.pendingNav = null;
  $("#close-dialog").close();
});
$("#dialog-discard").addEventListener("click", () => {
  const to = state.pendingNav || "#/n/" + encodeURIComponent(state.net);
  state.pendingNav = null;
  discardDraft();
  $("#close-dialog").close();
  location.hash = to;
});

let lastHash = location.hash;
window.addEventListener("hashchange", () => {
  // The browser's back button: stay if the draft is dirty, and ask.
  if (state.id && dirty() && !location.hash.startsWith(windowHash())) {
    state.pendingNav = location.hash;
    history.replaceState(null, "", lastHash);
    $("#close-dialog").showModal();
    return;
  }
  lastHash = location.hash;
  route();
});

async function route() {
  clearInterval(state.statusTimer);
  state.statusTimer = null;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    const nets = await api("GET", "/v1/networks");
    renderNetworkLinks(nets || []);
    if (parts[0] === "n" && parts[1]) {
      state.net = parts[1];
      if (parts[2] === "new") return await openNew(parts[1]);
      if (parts[2] === "v" && parts[3]) return await openVIP(parts[1], parts[3]);
      state.id = null;
      state.draft = null;
      state.isNew = false;
      return await showNetwork(parts[1]);
    }
    state.id = null;
    state.draft = null;
    state.isNew = false;
    if (nets && nets.length) return navigate("#/n/" + encodeURIComponent(nets[0].name));
    $("#main").replaceChildren(el("p", { class: "muted", text: "No networks configured." }));
  } catch (err) {
    $("#main").replaceChildren(el("div", { class: "banner error", text: err.message }));
  }
}

function renderNetworkLinks(nets) {
  $("#networks").replaceChildren(...nets.map((n) =>
    el("a", { href: "#/n/" + encodeURIComponent(n.name), "data-nav": true, text: n.name + (n.up ? "" : " (down)") })));
}

// ---- Network page ----

function health(doc) {
  if (!doc.status) return { text: doc.routable ? "no observation" : "not routed", cls: "muted" };
  let ok = 0, all = 0;
  for (const l of doc.status.listeners || []) for (const b of l.backends || []) { all++; if (b.eligible) ok++; }
  if (doc.error) return { text: "error: " + doc.error, cls: "bad" };
  if (all === 0) return { text: "no backends", cls: "muted" };
  return { text: ok + "/" + all + " backends eligible", cls: ok === all ? "ok" : ok ? "warn" : "bad" };
}

async function showNetwork(net) {
  const docs = await api("GET", "/v1/networks/" + encodeURIComponent(net) + "/vips");
  const rows = (docs || []).map((d) => {
    const h = health(d);
    return el("tr", { "data-vip": d.name },
      el("td", {}, el("a", { href: "#/n/" + encodeURIComponent(net) + "/v/" + d.id, "data-nav": true, class: "vip-link", text: d.name + "." + net })),
      el("td", {}, el("code", { class: "vip-addr", text: d.addr || "—" })),
      el("td", { text: (d.listeners || []).map((l) => l.proto + "/" + l.port).join(", ") || "—" }),
      el("td", { class: "health " + h.cls, text: h.text }));
  });
  const name = el("input", { id: "new-name", placeholder: "name, e.g. api" });
  const msg = el("div");
  // New VIP opens a draft; Save creates it.
  const create = el("button", { id: "create", class: "primary", text: "New VIP", onclick: () => {
    state.newName = name.value.trim();
    navigate("#/n/" + encodeURIComponent(net) + "/new");
  } });
  $("#main").replaceChildren(
    el("h1", { text: "Network " + net }),
    el("table", { id: "vip-table" }, el("thead", {}, el("tr", {}, el("th", { text: "VIP" }), el("th", { text: "Address" }), el("th", { text: "Listeners" }), el("th", { text: "Health" }))), el("tbody", {}, ...rows)),
    el("div", { class: "toolbar" }, name, create), msg);
  state.statusTimer = setInterval(async () => {
    if (location.hash !== "#/n/" + encodeURIComponent(net)) return;
    try {
      const fresh = await api("GET", "/v1/networks/" + encodeURIComponent(net) + "/vips");
      for (const d of fresh || []) {
        const cell = $(`tr[data-vip="${CSS.escape(d.name)}"] .health`);
        if (cell) { const h = health(d); cell.textContent = h.text; cell.className = "health " + h.cls; }
      }
    } catch (_) { /* the next tick retries */ }
  }, 1000);
}

// ---- VIP window ----

async function openVIP(net, id) {
  if (state.id !== id || !state.draft) {
    const [doc, nodes] = await Promise.all([
      api("GET", "/v1/networks/" + encodeURIComponent(net) + "/vips/" + id),
      api("GET", "/v1/networks/" + encodeURIComponent(net) + "/nodes"),
    ]);
    state.id = id;
    state.nodes = nodes || [];
    state.loaded = { service: doc, revision: doc.revision, doc };
    state.draft = clone(serviceOf(doc));
    state.loaded.service = serviceOf(doc);
    state.conflict = null;
    state.lastCounters = null;
  }
  renderVIP();
  state.statusTimer = setInterval(refreshStatus, 1000);
}

// openNew opens a New VIP draft: nothing exists until Save.
async function openNew(net) {
  if (!(state.isNew && state.draft)) {
    state.nodes = (await api("GET", "/v1/networks/" + encodeURIComponent(net) + "/nodes")) || [];
    state.id = "new";
    state.isNew = true;
    const empty = { id: "", name: "", network: net, listeners: [] };
    state.loaded = { service: empty, revision: "", doc: { id: "", addr: "", status: null } };
    state.draft = Object.assign(clone(empty), { name: state.newName || "" });
    state.newName = "";
    state.conflict = null;
    state.lastCounters = null;
  }
  renderVIP();
}

// serviceOf is the draft form of a service document. A listener's drain
// list (the replicated field `tsng vip backend drain` edits) becomes a
// drain flag on each backend row, so that the flag moves with its row when
// the row's node or port is edited and goes with it when it is removed.
function serviceOf(doc) {
  const listeners = clone(doc.listeners || []);
  for (const l of listeners) {
    const drain = l.drain || [];
    l.backends = (l.backends || []).map((b) => ({ node: b.node, port: b.port, drain: drain.some((x) => x.node === b.node && x.port === b.port) }));
    delete l.drain;
  }
  return { id: doc.id, name: doc.name, network: doc.network, listeners };
}

// wireListeners is the API form of a draft's listeners: each backend row's
// drain flag becomes an entry of its listener's drain list.
function wireListeners(ls) {
  return clone(ls || []).map((l) => {
    const backends = l.backends || [];
    l.drain = backends.filter((b) => b.drain).map((b) => ({ node: b.node, port: b.port }));
    l.backends = backends.map((b) => ({ node: b.node, port: b.port }));
    return l;
  });
}

function nodeName(id) {
  const n = state.nodes.find((x) => x.id === id);
  return n ? n.name : id.slice(0, 12);
}

function numberInput(attrs, value, onchange) {
  return el("input", Object.assign({ type: "number", min: 0, value: value || "" }, attrs, { oninput: (e) => onchange(e.target.value) }));
}

function renderVIP() {
  const d = state.draft, doc = state.loaded.doc, net = state.net;
  const main = $("#main");
  const deleting = d.deleted ? el("div", { id: "delete-draft", class: "banner conflict" },
    el("strong", { text: "Deletion pending. " }),
    el("span", { text: "Save deletes this VIP for good (its id becomes a signed tombstone); Discard keeps it. " }),
    el("button", { id: "undo-delete", text: "Keep this VIP", onclick: () => { delete d.deleted; renderVIP(); } })) : null;
  const listeners = (d.listeners || []).map((l, i) => renderListener(l, i));
  const conflict = state.conflict ? el("div", { id: "conflict", class: "banner conflict" },
    el("strong", { text: "This VIP was changed elsewhere (now at revision " + state.conflict + "). " }),
    el("span", { text: "Your draft is kept. " }),
    el("button", { id: "discard-reload", onclick: discardReload, text: "Discard / reload" })) : null;
  main.replaceChildren(...[
    el("div", { class: "toolbar" },
      el("h1", { class: "title", text: (state.isNew ? "New VIP " : "VIP ") + (d.name || "") + "." + net }),
      // The address clients dial, always in view.
      doc.addr ? el("span", { class: "vip-addr" }, el("code", { id: "vip-addr", text: doc.addr }),
        doc.addr_moved ? el("span", { class: "warn", text: " (moved after a collision)" }) : null)
        : el("span", { class: "muted", id: "vip-addr-pending", text: "address assigned on Save" }),
      el("span", { id: "dirty", class: "dirty-mark" })),
    conflict,
    deleting,
    doc.addr_collision ? el("div", { id: "addr-collision", class: "banner error" },
      el("strong", { text: "Address collision. " }),
      el("span", { text: "Node " + (doc.addr_collision.node_name || doc.addr_collision.node.slice(0, 12)) + "'s address " + doc.addr_collision.addr +
        " is this VIP's reservation, so the VIP uses " + (doc.addr_collision.effective_addr || "no address") + " instead. Give the node another address in its config." })) : null,
    doc.warnings && doc.warnings.length ? el("div", { id: "backend-warnings", class: "banner conflict" },
      el("strong", { text: "Backends this node will not serve. " }),
      el("span", { text: doc.warnings.join("\n") })) : null,
    el("div", { id: "error" }),
    el("div", { class: "row" }, el("label", { text: "Name " }, el("input", { id: "vip-name", value: d.name, oninput: (e) => { d.name = e.target.value; markDirty(); } }))),
    el("h2", { text: "Listeners" }),
    ...listeners,
    el("div", { class: "toolbar" },
      el("button", { id: "add-listener", text: "Add listener", onclick: () => {
        d.listeners = d.listeners || [];
        d.listeners.push({ proto: "tcp", port: 0, generation: 0, backends: [], check: {}, idle_timeout: "0s" });
        renderVIP();
      } })),
    el("div", { class: "toolbar" },
      el("button", { id: "save", class: "primary", text: "Save", onclick: save }),
      el("button", { id: "discard", text: "Discard", onclick: () => {
        if (discardDraft()) location.hash = "#/n/" + encodeURIComponent(net);
        else renderVIP();
      } }),
      el("button", { id: "close", text: "Close", onclick: () => navigate("#/n/" + encodeURIComponent(net)) }),
      state.isNew || d.deleted ? null : el("button", { id: "delete-vip", class: "danger", text: "Delete VIP", onclick: () => { d.deleted = true; renderVIP(); } })),
    el("h2", { text: "Live status" }),
    el("div", { id: "status" }, el("p", { class: "muted", text: "waiting for the first sample…" })),
    el("details", { id: "ids" }, el("summary", { text: "Ids and node addresses" }),
      el("p", {}, "Service id ", el("code", { id: "service-id", text: doc.id || "— (assigned on Save)" })),
      el("p", {}, "Revision ", el("code", { id: "revision", text: state.loaded.revision || "—" })),
      el("p", { text: "Backend nodes:" }),
      el("ul", {}, ...state.nodes.map((n) => el("li", {}, n.name + " ", el("code", { text: n.addr + " " + n.id })))))].filter((x) => x));
  markDirty();
  if (state.loaded.doc.status) renderStatus(state.loaded.doc);
}

function renderListener(l, i) {
  const d = state.draft;
  const c = l.check || (l.check = {});
  const set = (fn) => (v) => { fn(v); markDirty(); };
  const backends = (l.backends || []).map((b, j) => el("tr", { class: "backend" },
    el("td", {}, el("select", { class: "backend-node", onchange: (e) => { b.node = e.target.value; markDirty(); } },
      ...state.nodes.map((n) => el("option", { value: n.id, selected: n.id === b.node, text: n.name })))),
    el("td", {}, numberInput({ class: "backend-port", max: 65535 }, b.port, set((v) => { b.port = parseInt(v, 10) || 0; }))),
    // Draining: no client makes new bindings to the backend; existing
    // ones go on until idle expiry. Part of the draft, like every edit.
    el("td", {}, el("label", { title: "No new bindings to this backend; existing ones go on until idle expiry" },
      el("input", { type: "checkbox", class: "backend-drain", checked: !!b.drain, onchange: (e) => { b.drain = e.target.checked; markDirty(); } }), " drain")),
    el("td", {}, el("button", { class: "remove-backend danger", text: "Remove", onclick: () => { l.backends.splice(j, 1); renderVIP(); } }))));
  return el("div", { class: "card listener", "data-listener": i },
    el("div", { class: "row" },
      el("select", { class: "proto", onchange: (e) => { l.proto = e.target.value; markDirty(); } },
        el("option", { value: "tcp", selected: l.proto === "tcp", text: "tcp" }), el("option", { value: "udp", selected: l.proto === "udp", text: "udp" })),
      el("span", { text: "/" }),
      numberInput({ class: "port", max: 65535, placeholder: "port" }, l.port, set((v) => { l.port = parseInt(v, 10) || 0; })),
      el("span", { class: "muted", text: l.generation ? "generation " + l.generation : "new" }),
      el("button", { class: "remove-listener danger", text: "Delete listener", onclick: () => { d.listeners.splice(i, 1); renderVIP(); } })),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", { text: "Backend node" }), el("th", { text: "Port" }), el("th", { text: "Drain" }), el("th"))), el("tbody", {}, ...backends)),
    el("p", { class: "muted backend-hint", text: "On a tun-mode node the application listens on the node's overlay address; on a netstack-mode node on 127.0.0.1 at the port, and only if that node's own config lists it in backend_ports." }),
    el("div", { class: "row" },
      el("button", { class: "add-backend", text: "Add backend", onclick: () => {
        l.backends = l.backends || [];
        l.backends.push({ node: state.nodes.length ? state.nodes[0].id : "", port: 0, drain: false });
        renderVIP();
      } })),
    el("div", { class: "row" },
      el("label", {}, el("input", { type: "checkbox", class: "port-check", checked: c.port_check !== false && l.proto === "tcp", disabled: l.proto !== "tcp",
        onchange: (e) => { c.port_check = e.target.checked; markDirty(); } }), " TCP connect checks"),
      el("label", {}, "interval ms ", numberInput({ class: "check-interval", placeholder: "3000" }, durMs(c.interval) || "", set((v) => { c.interval = v ? v / 1000 : undefined; }))),
      el("label", {}, "timeout ms ", numberInput({ class: "check-timeout", placeholder: "2000" }, durMs(c.timeout) || "", set((v) => { c.timeout = v ? v / 1000 : undefined; }))),
      el("label", {}, "failures ", numberInput({ class: "check-failures", placeholder: "2" }, c.failures, set((v) => { c.failures = parseInt(v, 10) || 0; }))),
      el("label", {}, "successes ", numberInput({ class: "check-successes", placeholder: "1" }, c.successes, set((v) => { c.successes = parseInt(v, 10) || 0; }))),
      el("label", {}, "flow idle timeout s ", numberInput({ class: "idle-timeout", placeholder: l.proto === "udp" ? "120" : "7200" }, durMs(l.idle_timeout) / 1000 || "", set((v) => { l.idle_timeout = v ? parseFloat(v) : 0; })))));
}

async function save() {
  const net = state.net;
  $("#error").replaceChildren();
  const base = "/v1/networks/" + encodeURIComponent(net) + "/vips";
  try {
    if (state.isNew) {
      // One request: the agent validates the whole draft before it
      // creates anything.
      const doc = await api("POST", base, { name: state.draft.name, listeners: wireListeners(state.draft.listeners) });
      state.isNew = false;
      state.id = doc.id;
      state.loaded = { service: serviceOf(doc), revision: doc.revision, doc };
      state.draft = clone(state.loaded.service);
      markDirty();
      location.hash = windowHash(); // opens the created VIP's window
      return;
    }
    if (state.draft.deleted) {
      await api("DELETE", base + "/" + state.id + "?revision=" + encodeURIComponent(state.loaded.revision));
      state.id = null;
      state.draft = null;
      window.onbeforeunload = null;
      location.hash = "#/n/" + encodeURIComponent(net);
      return;
    }
    const doc = await api("PUT", base + "/" + state.id, { service: Object.assign(clone(state.draft), { listeners: wireListeners(state.draft.listeners) }), revision: state.loaded.revision });
    state.loaded = { service: serviceOf(doc), revision: doc.revision, doc };
    state.draft = clone(state.loaded.service);
    state.conflict = null;
    renderVIP();
  } catch (err) {
    if (err.code === "conflict") {
      state.conflict = err.current || "?";
      renderVIP(); // the draft stays as it is
    } else {
      $("#error").replaceChildren(el("div", { class: "banner error", id: "save-error", text: err.message }));
    }
  }
}

async function discardReload() {
  const doc = await api("GET", "/v1/networks/" + encodeURIComponent(state.net) + "/vips/" + state.id);
  state.loaded = { service: serviceOf(doc), revision: doc.revision, doc };
  state.draft = clone(state.loaded.service);
  state.conflict = null;
  renderVIP();
}

async function refreshStatus() {
  if (!state.id || state.isNew) return;
  let doc;
  try {
    doc = await api("GET", "/v1/networks/" + encodeURIComponent(state.net) + "/vips/" + state.id);
  } catch (_) { return; }
  if (doc.revision !== state.loaded.revision && !dirty() && !state.conflict) {
    // A clean window follows the saved configuration.
    state.loaded = { service: serviceOf(doc), revision: doc.revision, doc };
    state.draft = clone(state.loaded.service);
    renderVIP();
    return;
  }
  state.loaded.doc.status = doc.status;
  renderStatus(doc); // never touches the draft
}

function fmtRate(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(1);
}

// Keys of the rates: what they count, never a position (a listener by
// protocol, port and generation; a backend by its listener, node and port).
const listenerKey = (l) => l.listener + "#" + (l.generation || 0);
const backendKey = (l, b) => listenerKey(l) + "/" + b.node + ":" + b.port;

// statusRates derives per-second packet and byte rates (both directions
// together) from the cumulative counters of a status document and the
// previous baseline (null at first). The counters reset only when the
// agent or the network restarts: a new counters_since, or any counter
// lower than in the baseline, makes this document the new baseline with no
// rates (reset). A counter new since the baseline has no rate yet. So no
// rate is ever negative.
function statusRates(base, doc, now) {
  const st = doc && doc.status;
  if (!st) return { base: null, reset: false, rates: {} };
  const c = {};
  const add = (key, x) => { c[key] = { p: (x.packets_out || 0) + (x.packets_in || 0), b: (x.bytes_out || 0) + (x.bytes_in || 0) }; };
  add("totals", st.totals || {});
  for (const l of st.listeners || []) {
    add(listenerKey(l), l);
    for (const b of (l.backends || []).concat(l.draining_backends || [])) add(backendKey(l, b), b);
  }
  const next = { t: now, since: doc.counters_since || "", c };
  if (!base) return { base: next, reset: false, rates: {} };
  let reset = base.since !== next.since;
  for (const k of Object.keys(c)) if (base.c[k] && (c[k].p < base.c[k].p || c[k].b < base.c[k].b)) reset = true;
  const rates = {};
  const dt = (now - base.t) / 1000;
  if (!reset && dt > 0) {
    for (const k of Object.keys(c)) {
      if (base.c[k]) rates[k] = { pps: (c[k].p - base.c[k].p) / dt, bps: (c[k].b - base.c[k].b) / dt };
    }
  }
  return { base: next, reset, rates };
}
window.tsngStatusRates = statusRates; // for the tests

// rttCurrent: a backend's RTT is shown only while measured and the
// backend eligible, or drained over a path that answers; the agent's API
// already clears it otherwise, and this keeps to the same rule.
function rttCurrent(b) {
  return b.rtt_known && (b.eligible || (b.drain && b.path_reason === "ok"));
}

// fmtAge prints a sample age in milliseconds as the CLI does: tenths of
// a second under a minute, else hours, minutes and seconds; — without one.
function fmtAge(ms) {
  if (typeof ms !== "number" || ms < 0) return "—";
  if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
  let s = Math.round(ms / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  s %= 60;
  return (h ? h + "h" + m + "m" : m + "m") + s + "s";
}

function dropCount(d) {
  return Object.values(d || {}).reduce((n, v) => n + v, 0);
}

// statusTable builds the status table of a service status st: per
// listener a row of its own counters, then a row per backend (health, RTT
// while current, sample age, bindings, drops, UDP failovers, rate), then
// the VIP's totals and its drops by reason. rate(key) formats the rate of
// a counter key. It returns the elements to show.
function statusTable(st, rate) {
  const rows = [];
  for (const l of st.listeners || []) {
    // UDP bindings fail over; TCP ones never do.
    const fo = (n) => (l.listener || "").startsWith("udp/") ? String(n || 0) : "—";
    rows.push(el("tr", { class: "status-row listener-total", "data-status-listener": l.listener },
      el("td", { text: l.listener }), el("td", { class: "muted", text: "listener" }), el("td"), el("td"), el("td"),
      el("td", { class: "status-cell bindings", text: String(l.active_bindings || 0) }),
      el("td", { class: "status-cell drops", text: String(dropCount(l.drops)) }),
      el("td", { class: "status-cell failovers", text: fo(l.udp_failovers) }),
      el("td", { class: "status-cell rate", text: rate(listenerKey(l)) })));
    for (const b of (l.backends || []).concat(l.draining_backends || [])) {
      const next = l.next && l.next.node === b.node && l.next.port === b.port;
      // A departed node is named by its stored id, which selects it; the
      // cell's title has the full id, the text the name it had if known.
      const id = b.departed ? b.node.slice(0, 12) : (b.node_name || nodeName(b.node));
      let label = id + ":" + b.port;
      if (b.departed) label += b.node_name ? " (departed; formerly " + b.node_name + ")" : " (departed)";
      const rtt = rttCurrent(b) ? b.rtt_ms.toFixed(2) + " ms" : (b.sample_age_ms >= 0 ? "—" : "unknown");
      rows.push(el("tr", { class: "status-row", "data-backend": (b.departed ? id : nodeName(b.node)) + ":" + b.port },
        el("td", { text: l.listener }),
        el("td", Object.assign({ text: label + (next ? "  ← next" : "") + (b.draining ? " (draining)" : "") }, b.departed ? { title: b.node } : {})),
        el("td", { class: "reason " + (b.eligible ? "ok" : "bad"), text: b.reason + (b.check_error ? " (" + b.check_error + ")" : "") }),
        el("td", { class: "status-cell rtt", text: rtt }),
        el("td", { class: "status-cell age", text: fmtAge(b.sample_age_ms) }),
        el("td", { class: "status-cell bindings", text: String(b.active_bindings || 0) }),
        el("td", { class: "status-cell drops", text: String(dropCount(b.drops)) }),
        el("td", { class: "status-cell failovers", text: fo(b.udp_failovers) }),
        el("td", { class: "status-cell rate", text: rate(backendKey(l, b)) })));
    }
  }
  const t = st.totals || {};
  rows.push(el("tr", { class: "status-row totals" },
    el("td", { text: "total" }), el("td"), el("td"), el("td"), el("td"),
    el("td", { class: "status-cell bindings", text: String((st.listeners || []).reduce((n, l) => n + (l.active_bindings || 0), 0)) }),
    el("td", { class: "status-cell drops", text: String(dropCount(t.drops)) }),
    el("td", { class: "status-cell failovers", text: String(t.udp_failovers || 0) }),
    el("td", { class: "status-cell rate", id: "total-rate", text: rate("totals") })));
  const out = [el("table", { id: "status-table" },
    el("thead", {}, el("tr", {}, ...["Listener", "Backend", "Health", "RTT", "Sample age", "Bindings", "Drops", "UDP failovers", "Rate"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows))];
  const reasons = Object.keys(t.drops || {}).sort();
  if (reasons.length) out.push(el("p", { class: "muted", id: "drop-reasons", text: "drops: " + reasons.map((r) => r + " " + t.drops[r]).join(", ") }));
  return out;
}
window.tsngStatusTable = (st) => statusTable(st, () => "—"); // for the tests

function renderStatus(doc) {
  const box = $("#status");
  if (!box) return;
  const st = doc.status;
  if (!st) { box.replaceChildren(el("p", { class: "muted", text: "no observation (network down or VIP not routed)" })); return; }
  const r = statusRates(state.lastCounters, doc, Date.parse(st.at) || Date.now());
  state.lastCounters = r.base;
  const fmt = (key) => {
    const x = r.rates[key];
    return x ? fmtRate(x.pps) + " pkt/s, " + fmtRate(x.bps) + " B/s" : "—";
  };
  box.replaceChildren(...[...statusTable(st, fmt),
    r.reset ? el("p", { class: "muted", id: "counters-reset", text: "counters restarted (the agent or the network restarted): rates resume with the next sample" }) : null,
    el("p", { class: "muted", id: "status-at", text: "observed " + new Date(st.at || Date.now()).toLocaleTimeString() })].filter((x) => x));
}

route();
