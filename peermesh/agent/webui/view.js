// The peermesh web view: draws the mesh the agent's node sees and follows it live.
// The agent sends a snapshot first (and every few seconds), then one change per event,
// over server-sent events (/api/stream). Changes are applied once per animation frame.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const RECENT = 200;          // events listed
  const LABELS_UP_TO = 120;    // peers drawn with their name beside them
  const RTT_UP_TO = 40;        // peers drawn with the round trip on their link

  const state = {
    node: null, peers: new Map(), broker: null, leaders: {}, flux: {},
    selected: null, layoutDirty: true, pending: [], scheduled: false,
  };
  const dom = new Map();       // peer UUID -> {g, dot, label, link, rtt, ring}
  // Numbers for tests and the benchmark: what was drawn, how long updates took.
  const stats = window.peermeshView = {
    peers: 0, snapshots: 0, changes: 0, firstDrawn: null, latencies: [], enterLag: {},
  };

  const $ = (id) => document.getElementById(id);
  const el = (name, attrs, parent) => {
    const node = document.createElementNS(SVG, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  };
  const short = (uuid) => (uuid || "").slice(0, 8);

  function hue(text) {
    let h = 0;
    for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) >>> 0;
    return h % 360;
  }
  const groupColour = (group) => `hsl(${hue(group)}, 65%, 45%)`;

  // --- receiving ------------------------------------------------------

  function connect() {
    const source = new EventSource("api/stream");
    source.addEventListener("open", () => setStatus(true));
    source.addEventListener("error", () => setStatus(false));
    source.addEventListener("snapshot", (e) => queue({snapshot: JSON.parse(e.data)}));
    source.addEventListener("change", (e) => queue({change: JSON.parse(e.data)}));
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
        events.push(item.change.event);
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
    state.broker = snap.broker;
    state.leaders = snap.leaders || {};
    state.flux = snap.flux || {};
    const seen = new Set();
    for (const peer of snap.peers) {
      seen.add(peer.peer);
      if (!state.peers.has(peer.peer)) state.layoutDirty = true;
      state.peers.set(peer.peer, peer);
    }
    for (const uuid of Array.from(state.peers.keys())) {
      if (!seen.has(uuid)) { state.peers.delete(uuid); state.layoutDirty = true; }
    }
    const list = $("events");
    list.textContent = "";
    for (const event of snap.events) listEvent(event);
    $("node-name").textContent = snap.node.name;
    stats.snapshots++;
  }

  function applyChange(change) {
    stats.changes++;
    if (change.gone) {
      if (state.peers.delete(change.gone)) state.layoutDirty = true;
    } else if (change.peer) {
      const old = state.peers.get(change.peer.peer);
      if (!old || String(old.groups) !== String(change.peer.groups)) state.layoutDirty = true;
      state.peers.set(change.peer.peer, change.peer);
    }
    if ("broker" in change) state.broker = change.broker;
    if (change.flux) state.flux = change.flux;
    if (change.leaders) state.leaders = change.leaders;
  }

  // --- drawing ----------------------------------------------------------

  function sortedPeers() {
    const key = (p) => (p.groups[0] || "\uffff") + "\u0000" + p.name + "\u0000" + p.peer;
    return Array.from(state.peers.values()).sort((a, b) => key(a) < key(b) ? -1 : 1);
  }

  // Rings around this node: as many as give the largest dots, filled in order.
  function layout(peers) {
    const n = peers.length, inner = 110, outer = 450;
    let best = {k: 1, radius: 0};
    for (let k = 1; k <= 40 && n > 0; k++) {
      const radii = [];
      for (let i = 0; i < k; i++) radii.push(k === 1 ? Math.min(300, inner + 40 + n * 4) : inner + (outer - inner) * i / (k - 1));
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
    const peers = sortedPeers();
    if (state.layoutDirty) {
      geometry = layout(peers);
      state.layoutDirty = false;
    }
    const labels = peers.length <= LABELS_UP_TO, rtts = peers.length <= RTT_UP_TO;
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
    drawFlux();
    drawLegend(peers);
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
    if (!state.node || center.firstChild) {
      if (center.lastChild) center.lastChild.textContent = state.node ? state.node.name : "";
      return;
    }
    el("circle", {r: 34}, center);
    const text = el("text", {y: 4}, center);
    text.textContent = state.node.name;
    center.style.cursor = "pointer";
    center.addEventListener("click", () => select(state.node.peer));
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
      const label = el("text", {class: "flux-label", x: root[0], y: root[1] - geometry.radius - 22}, layer);
      label.textContent = `flux ${instance}: root, ${info.members.length} members`;
    }
  }

  function drawLegend(peers) {
    const counts = new Map();
    for (const peer of peers) for (const g of peer.groups) counts.set(g, (counts.get(g) || 0) + 1);
    const states = {alive: 0, evasive: 0, silent: 0};
    for (const peer of peers) states[peer.state || "alive"] = (states[peer.state || "alive"] || 0) + 1;
    const legend = $("legend");
    legend.textContent = "";
    const groups = Array.from(counts.entries()).sort().slice(0, 30);
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
    $("summary").textContent = `${peers.length} peers: ${states.alive} alive, ` +
      `${states.evasive} evasive, ${states.silent} silent \u00b7 ${counts.size} groups` +
      (broker ? ` \u00b7 broker ${broker.name}` : "");
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
