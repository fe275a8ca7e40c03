// The peermesh web view: draws the mesh the agent's node sees and follows it live.
// The agent sends a snapshot first (and every few seconds), then one change per event,
// over server-sent events (/api/stream). Changes are applied once per animation frame.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const RECENT = 200;          // events listed
  const LABELS_UP_TO = 120;    // peers drawn with their name beside them
  const RTT_UP_TO = 40;        // peers drawn with the round trip on their link
  const LINKS_UP_TO = 200;     // peers drawn with a link (beyond, the links only blur the picture
                               // and make every repaint slow)

  const state = {
    node: null, peers: new Map(), broker: null, leaders: {}, flux: {},
    selected: null, layoutDirty: true, pending: [], scheduled: false,
    dirty: new Set(),          // peers to redraw (all of them after a new layout)
    primary: new Map(),        // peer -> the group it is placed with (its first, when seen)
  };
  const dom = new Map();       // peer UUID -> {g, dot, label, link, rtt, ring}
  // Numbers for tests and the benchmark: what was drawn, how long updates took.
  const stats = window.peermeshView = {
    peers: 0, snapshots: 0, changes: 0, firstDrawn: null, latencies: [], enterLag: {},
    trees: {},                 // instance -> [[rank, parent], ...] as drawn
  };

  const $ = (id) => document.getElementById(id);
  const el = (name, attrs, parent) => {
    const node = document.createElementNS(SVG, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  };
  const short = (uuid) => (uuid || "").slice(0, 8);

  // Groups get colours in the order they are first seen (the page keeps them).
  const PALETTE = ["#1f77b4", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#7f7f7f", "#ff7f0e", "#393b79", "#637939", "#843c39"];
  const colours = new Map();
  function groupColour(group) {
    if (!colours.has(group)) {
      const n = colours.size;
      colours.set(group, n < PALETTE.length ? PALETTE[n]
                                            : `hsl(${(n * 137.5) % 360}, 60%, 42%)`);
    }
    return colours.get(group);
  }

  // --- receiving ------------------------------------------------------

  function connect() {
    const source = new EventSource("api/stream");
    source.addEventListener("open", () => setStatus(true));
    source.addEventListener("error", () => setStatus(false));
    source.addEventListener("snapshot", (e) => queue({snapshot: JSON.parse(e.data)}));
    source.addEventListener("change", (e) => queue({change: JSON.parse(e.data)}));
    source.addEventListener("flux", (e) => queue({change: JSON.parse(e.data)}));
  }

  function setStatus(live) {
    const status = $("status");
    status.textContent = live ? "live" : "reconnecting";
    status.className = "status " + (live ? "live" : "down");
  }

  function queue(item) {
    state.pending.push(item);
    if (!state.scheduled) {
      state.scheduled = true;
      requestAnimationFrame(flush);
    }
  }

  function flush() {
    state.scheduled = false;
    const items = state.pending;
    state.pending = [];
    const events = [];
    for (const item of items) {
      if (item.snapshot) {
        applySnapshot(item.snapshot);
        events.length = 0;
      } else {
        applyChange(item.change);
        if (item.change.event) events.push(item.change.event);
      }
    }
    draw();
    for (const event of events) listEvent(event);
    const now = Date.now();
    for (const event of events) {
      const lag = now - event.time * 1000;   // the event at the agent to drawn here, ms
      stats.latencies.push(lag);
      if (stats.latencies.length > 5000) stats.latencies.shift();
      if (event.type === "ENTER" && event.peer) stats.enterLag[event.peer] = lag;
    }
  }

  function applySnapshot(snap) {
    state.node = snap.node;
    if (snap.broker !== state.broker) {
      state.dirty.add(state.broker);
      state.dirty.add(snap.broker);
      state.broker = snap.broker;
    }
    if (JSON.stringify(snap.leaders || {}) !== JSON.stringify(state.leaders)) {
      state.leaders = snap.leaders || {};
      state.layoutDirty = true;
    }
    state.flux = snap.flux || {};
    state.fluxDirty = true;
    const seen = new Set();
    for (const peer of snap.peers) {
      seen.add(peer.peer);
      const old = state.peers.get(peer.peer);
      if (!old || JSON.stringify(old) !== JSON.stringify(peer)) state.dirty.add(peer.peer);
      if (state.primary.get(peer.peer) !== (peer.groups[0] || "")) {
        state.primary.set(peer.peer, peer.groups[0] || "");   // regroup at each snapshot
        state.layoutDirty = true;
      }
      state.peers.set(peer.peer, peer);
    }
    for (const uuid of Array.from(state.peers.keys())) {
      if (!seen.has(uuid)) forget(uuid);
    }
    const list = $("events");
    list.textContent = "";
    for (const event of snap.events) listEvent(event);
    $("node-name").textContent = snap.node.name;
    stats.snapshots++;
  }

  function forget(uuid) {
    if (state.peers.delete(uuid)) state.layoutDirty = true;
    state.primary.delete(uuid);
  }

  function applyChange(change) {
    if (change.event) stats.changes++;
    if (change.gone) {
      forget(change.gone);
    } else if (change.peer) {
      const uuid = change.peer.peer;
      if (!state.peers.has(uuid)) {
        state.primary.set(uuid, change.peer.groups[0] || "");
        state.layoutDirty = true;
      }
      state.peers.set(uuid, change.peer);
      state.dirty.add(uuid);
    }
    if ("broker" in change && change.broker !== state.broker) {
      state.dirty.add(state.broker);
      state.dirty.add(change.broker);
      state.broker = change.broker;
    }
    if (change.flux) { state.flux = change.flux; state.fluxDirty = true; }
    if (change.leaders) { state.leaders = change.leaders; state.layoutDirty = true; }
  }

  // --- drawing ----------------------------------------------------------

  function sortedPeers() {
    const key = (p) => (state.primary.get(p.peer) || "\uffff") + "\u0000" + p.name + "\u0000" + p.peer;
    return Array.from(state.peers.values()).sort((a, b) => key(a) < key(b) ? -1 : 1);
  }

  // Rings around this node: as many as give the largest dots, filled in order.
  function layout(peers) {
    const n = peers.length, inner = 110, outer = 450;
    let best = {k: 1, radius: 0};
    for (let k = 1; k <= 40 && n > 0; k++) {
      const radii = [];
      for (let i = 0; i < k; i++) radii.push(k === 1 ? Math.min(330, inner + 60 + n * 8) : inner + (outer - inner) * i / (k - 1));
      const total = radii.reduce((s, r) => s + 2 * Math.PI * r, 0);
      const gap = k === 1 ? 200 : (outer - inner) / (k - 1);
      const radius = Math.min(16, 0.42 * total / n, 0.42 * gap);
      if (radius > best.radius) best = {k, radius, radii, total};
    }
    const positions = new Map();
    if (!n) return {positions, radius: 14};
    let index = 0;
    best.radii.forEach((r, ring) => {
      const last = ring === best.k - 1;
      const count = last ? n - index : Math.round(n * 2 * Math.PI * r / best.total);
      for (let j = 0; j < count && index < n; j++, index++) {
        const angle = -Math.PI / 2 + 2 * Math.PI * j / count + (ring % 2) * Math.PI / count;
        positions.set(peers[index].peer, [r * Math.cos(angle), r * Math.sin(angle)]);
      }
    });
    return {positions, radius: Math.max(2, best.radius)};
  }

  let geometry = {positions: new Map(), radius: 14};

  function draw() {
    let peers;
    const relayout = state.layoutDirty;
    if (relayout) {
      peers = sortedPeers();
      geometry = layout(peers);
      state.layoutDirty = false;
    } else {
      peers = [];
      for (const uuid of state.dirty) if (state.peers.has(uuid)) peers.push(state.peers.get(uuid));
    }
    state.dirty.clear();
    const total = state.peers.size;
    const labels = total <= LABELS_UP_TO, rtts = total <= RTT_UP_TO;
    $("links").style.display = total <= LINKS_UP_TO ? "" : "none";
    $("graph").setAttribute("shape-rendering", total <= LINKS_UP_TO ? "auto" : "optimizeSpeed");
    const leaders = new Set(Object.values(state.leaders));
    for (const uuid of Array.from(dom.keys())) {
      if (!state.peers.has(uuid)) {
        const d = dom.get(uuid);
        d.g.remove(); d.link.remove(); if (d.rtt) d.rtt.remove();
        dom.delete(uuid);
      }
    }
    for (const peer of peers) {
      let d = dom.get(peer.peer);
      if (!d) d = create(peer);
      const [x, y] = geometry.positions.get(peer.peer) || [0, 0];
      const r = geometry.radius;
      d.g.setAttribute("transform", `translate(${x.toFixed(1)},${y.toFixed(1)})`);
      d.g.setAttribute("class", `peer ${peer.state || "alive"}` +
                       (state.selected === peer.peer ? " selected" : ""));
      d.dot.setAttribute("r", r);
      d.dot.style.stroke = peer.groups.length ? groupColour(peer.groups[0]) : "#fff";
      d.link.setAttribute("x2", x.toFixed(1));
      d.link.setAttribute("y2", y.toFixed(1));
      d.title.textContent = `${peer.name} (${peer.state || "alive"})`;
      d.label.textContent = labels ? peer.name + (leaders.has(peer.peer) ? " \u2605" : "") : "";
      d.label.setAttribute("y", r + 12);
      const broker = state.broker === peer.peer;
      d.ring.setAttribute("r", r + 5);
      d.ring.style.display = broker ? "" : "none";
      d.badge.textContent = broker ? "broker" : "";
      d.badge.setAttribute("y", -r - 8);
      if (rtts && peer.rtt != null) {
        if (!d.rtt) d.rtt = el("text", {class: "rtt"}, $("links"));
        d.rtt.setAttribute("x", (x * 0.55).toFixed(1));
        d.rtt.setAttribute("y", (y * 0.55).toFixed(1));
        d.rtt.textContent = (peer.rtt * 1000).toFixed(peer.rtt < 0.01 ? 2 : 1) + " ms";
      } else if (d.rtt) {
        d.rtt.remove(); d.rtt = null;
      }
    }
    drawCenter();
    if (relayout || state.fluxDirty) { drawFlux(); drawTrees(); }
    state.fluxDirty = false;
    drawLegend();
    stats.peers = dom.size;
    if (stats.firstDrawn === null && state.node) {
      stats.firstDrawn = performance.now();
      performance.mark("mesh-drawn");
    }
    if (state.selected) showDetails(state.selected);
  }

  function create(peer) {
    const g = el("g", {"data-peer": peer.peer}, $("peers"));
    const link = el("line", {class: "link", x1: 0, y1: 0}, $("links"));
    const ring = el("circle", {class: "broker"}, g);
    const dot = el("circle", {class: "dot"}, g);
    const title = el("title", {}, dot);
    const label = el("text", {}, g);
    const badge = el("text", {class: "badge", "text-anchor": "middle"}, g);
    g.addEventListener("click", () => select(peer.peer));
    const d = {g, dot, title, label, link, ring, badge, rtt: null};
    dom.set(peer.peer, d);
    return d;
  }

  function drawCenter() {
    const center = $("center");
    if (!state.node) return;
    if (!center.firstChild) {
      el("circle", {r: 34}, center);
      el("text", {y: 4}, center);
      center.style.cursor = "pointer";
      center.addEventListener("click", () => select(state.node.peer));
    }
    const me = state.node.peer;
    const leads = Object.values(state.leaders).includes(me);
    center.lastChild.textContent = state.node.name + (leads ? " \u2605" : "") +
      (state.broker === me ? " (broker)" : "");
  }

  function drawFlux() {
    const layer = $("flux");
    layer.textContent = "";
    const at = (uuid) => state.node && uuid === state.node.peer ? [0, 0] : geometry.positions.get(uuid);
    for (const [instance, info] of Object.entries(state.flux)) {
      const root = at(info.root);
      if (!root) continue;
      for (const member of info.members) {
        const p = at(member);
        if (!p || member === info.root) continue;
        el("line", {class: "flux", x1: root[0], y1: root[1], x2: p[0], y2: p[1]}, layer);
      }
      const label = el("text", {class: "flux-label", x: root[0], y: root[1] + geometry.radius + 26}, layer);
      label.textContent = `flux ${instance}: root, ${info.members.length} members`;
    }
  }

  // Each instance's tree as its members said it (ranks, parent -> child edges, states).
  function drawTrees() {
    const box = $("flux-trees");
    box.textContent = "";
    stats.trees = {};
    let shown = false;
    for (const [instance, info] of Object.entries(state.flux)) {
      const tree = info.tree;
      if (!tree) continue;
      shown = true;
      const title = document.createElement("h3");
      const size = tree.size != null ? `, size ${tree.size}` : "";
      title.textContent = `${instance}: ${tree.ranks.length} ranks${size}`;
      box.appendChild(title);
      if (tree.error) {
        const p = document.createElement("p");
        p.className = "error";
        p.textContent = tree.error;
        box.appendChild(p);
      }
      if (tree.ranks.length) box.appendChild(treeSvg(tree.ranks));
      stats.trees[instance] = tree.ranks.map((r) => [r.rank, r.parent]);
    }
    $("flux-pane").hidden = !shown;
  }

  function treeSvg(ranks) {
    const byRank = new Map(ranks.map((r) => [r.rank, r]));
    const kids = new Map();
    const tops = [];
    for (const r of ranks) {
      if (r.parent == null || !byRank.has(r.parent) || r.parent === r.rank) tops.push(r);
      else (kids.get(r.parent) || kids.set(r.parent, []).get(r.parent)).push(r);
    }
    const STEP = 30, LEVEL = 40, R = 10;
    const at = new Map();
    let leaves = 0, depthMax = 0;
    const place = (r, depth) => {       // leaves left to right, a parent above its children
      depthMax = Math.max(depthMax, depth);
      const children = (kids.get(r.rank) || []).sort((a, b) => a.rank - b.rank);
      let x;
      if (children.length) {
        const xs = children.map((c) => place(c, depth + 1));
        x = (xs[0] + xs[xs.length - 1]) / 2;
      } else {
        x = leaves++ * STEP;
      }
      at.set(r.rank, [x + R + 4, depth * LEVEL + R + 4]);
      return x;
    };
    for (const r of tops.sort((a, b) => a.rank - b.rank)) place(r, 0);
    const svg = document.createElementNS(SVG, "svg");
    const width = Math.max(1, leaves) * STEP + 2 * R, height = (depthMax + 1) * LEVEL;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", width);
    svg.setAttribute("class", "tree");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "the Flux tree");
    for (const r of ranks) {
      const p = at.get(r.parent), c = at.get(r.rank);
      if (!p || !c || r.parent === r.rank) continue;
      el("line", {class: "tree-edge", x1: p[0], y1: p[1], x2: c[0], y2: c[1],
                  "data-parent": r.parent, "data-child": r.rank}, svg);
    }
    for (const r of ranks) {
      const c = at.get(r.rank);
      if (!c) continue;
      const g = el("g", {class: "rank " + String(r.state).replace(/[^a-z-]/g, ""),
                         "data-rank": r.rank, transform: `translate(${c[0]},${c[1]})`}, svg);
      el("circle", {r: R}, g);
      const label = el("text", {y: 3.5}, g);
      label.textContent = r.rank;
      const tip = el("title", {}, g);
      tip.textContent = `rank ${r.rank}: ${r.state}` + (r.error ? ` (${r.error})` : "");
    }
    return svg;
  }

  function drawLegend() {
    const peers = Array.from(state.peers.values());
    const counts = new Map();
    for (const peer of peers) for (const g of peer.groups) counts.set(g, (counts.get(g) || 0) + 1);
    const states = {alive: 0, evasive: 0, silent: 0};
    for (const peer of peers) states[peer.state || "alive"] = (states[peer.state || "alive"] || 0) + 1;
    const legend = $("legend");
    const groups = Array.from(counts.entries()).sort().slice(0, 30);
    const key = JSON.stringify(groups);
    if (legend.dataset.key === key) groups.length = 0;   // unchanged: leave it be
    else { legend.dataset.key = key; legend.textContent = ""; }
    for (const [group, count] of groups) {
      const li = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.border = `3px solid ${groupColour(group)}`;
      li.append(swatch, `${group} (${count})`);
      legend.appendChild(li);
    }
    const broker = state.broker && (state.peers.get(state.broker) ||
                                    (state.node && state.node.peer === state.broker ? state.node : null));
    const summary = `${peers.length} peers: ${states.alive} alive, ` +
      `${states.evasive} evasive, ${states.silent} silent \u00b7 ${counts.size} groups` +
      (broker ? ` \u00b7 broker ${broker.name}` : "");
    if ($("summary").textContent !== summary) $("summary").textContent = summary;
  }

  // --- details and events ---------------------------------------------

  function select(uuid) {
    state.selected = uuid;
    for (const [key, d] of dom) d.g.classList.toggle("selected", key === uuid);
    showDetails(uuid);
  }

  function showDetails(uuid) {
    const peer = state.peers.get(uuid) || (state.node && state.node.peer === uuid ? state.node : null);
    const box = $("details");
    box.textContent = "";
    const h = document.createElement("h2");
    h.textContent = peer ? peer.name : "Peer";
    box.appendChild(h);
    if (!peer) {
      const p = document.createElement("p");
      p.className = "hint";
      p.textContent = `${short(uuid)} left the mesh.`;
      box.appendChild(p);
      return;
    }
    const roles = [];
    if (peer.self) roles.push("this node");
    if (state.broker === uuid) roles.push("elected broker");
    for (const [group, leader] of Object.entries(state.leaders)) if (leader === uuid) roles.push(`leader of ${group}`);
    for (const [instance, info] of Object.entries(state.flux)) {
      if (info.root === uuid) roles.push(`flux ${instance} root`);
      else if (info.members.includes(uuid)) roles.push(`flux ${instance} member`);
    }
    const rows = [
      ["UUID", peer.peer], ["address", peer.address], ["state", peer.state || (peer.self ? "" : "alive")],
      ["round trip", peer.rtt != null ? (peer.rtt * 1000).toFixed(2) + " ms" : ""],
      ["last heard", peer.last_heard != null ? peer.last_heard.toFixed(1) + " s ago" : ""],
      ["groups", (peer.groups || []).join(", ")], ["roles", (peer.roles || []).concat(roles).join(", ")],
    ];
    for (const [key, value] of Object.entries(peer.headers || {})) rows.push([key, value]);
    const table = document.createElement("table");
    for (const [key, value] of rows) {
      if (value === "" || value == null) continue;
      const tr = table.insertRow();
      const th = document.createElement("th");
      th.textContent = key;
      tr.appendChild(th);
      tr.insertCell().textContent = value;
    }
    box.appendChild(table);
  }

  function listEvent(event) {
    const list = $("events");
    const li = document.createElement("li");
    const time = document.createElement("time");
    time.textContent = new Date(event.time * 1000).toLocaleTimeString();
    const kind = document.createElement("span");
    kind.className = "kind " + event.type;
    kind.textContent = event.type;
    let text = ` ${event.name || short(event.peer)}`;
    if (event.group) text += ` \u2192 ${event.group}`;
    if (event.size) text += ` (${event.size} octets)`;
    if (event.reason) text += ` (${event.reason})`;
    li.append(time, kind, text);
    list.insertBefore(li, list.firstChild);
    while (list.childNodes.length > RECENT) list.removeChild(list.lastChild);
  }

  connect();
})();
