// The console's script: live topology progress and the traffic charts.
// Served from /ui/static/ (the Content-Security-Policy allows no inline
// script); it reads only the console's JSON under /ui/.
"use strict";

function text(id, value) {
  var el = document.getElementById(id);
  if (el && el.textContent !== value) { el.textContent = value; }
}

function setBar(percent, done) {
  var fill = document.getElementById("progress-fill");
  if (!fill) { return; }
  fill.style.width = Math.max(0, Math.min(100, percent)) + "%";
  fill.classList.toggle("done", done);
}

function pollProgress(box) {
  var src = box.getAttribute("data-src");
  var fill = document.getElementById("progress-fill");
  if (fill) { setBar(Number(fill.getAttribute("data-percent")), document.getElementById("progress-state").textContent === "done"); }
  function tick() {
    fetch(src, { credentials: "same-origin", cache: "no-store" }).then(function (r) { return r.json(); }).then(function (p) {
      if (p.error) { text("progress-state", "unknown"); text("progress-step", p.error); return; }
      text("progress-versions", p.running ? p.active_version + " → " + p.target_version : String(p.active_version));
      text("progress-state", p.running ? "running" : "done");
      text("progress-step", p.step);
      text("progress-shards", p.running ? p.shards_done + " of " + p.shards_total + " shards seated" : "–");
      text("progress-partitions", p.running ? p.partitions_moved + " of " + p.partitions_total + " moved" : "–");
      text("progress-waiting", p.waiting_for || "nothing");
      text("progress-remaining", p.remaining || "–");
      setBar(p.percent, !p.running);
      var ul = document.getElementById("progress-recent");
      if (ul && p.recent && p.recent.length) {
        ul.replaceChildren.apply(ul, p.recent.map(function (c) {
          var li = document.createElement("li");
          li.textContent = c.from + " → " + c.to + ": started " + c.started + ", done " + c.finished + " (" + c.took + ")";
          return li;
        }));
      }
      box.setAttribute("data-updates", String(Number(box.getAttribute("data-updates") || "0") + 1));
    }).catch(function () { text("progress-state", "unreachable"); });
  }
  tick();
  setInterval(tick, 1000);
}

var colors = {
  ACQUIRED: "#2f5bd3", RECLAIMED: "#b54708", IN_PROGRESS: "#f79009", COMPLETED: "#067647",
  FINGERPRINT_MISMATCH: "#9e77ed", EXPIRED: "#667085", OK: "#98a2b3",
  p50: "#2f5bd3", p90: "#f79009", p99: "#b42318"
};
var palette = ["#b42318", "#e31b54", "#7a5af8", "#0086c9", "#15b79e", "#4e5ba6"];

function colorOf(name, i) { return colors[name] || palette[i % palette.length]; }

var SVG = "http://www.w3.org/2000/svg";

// chart draws series (name -> values, nulls skipped) as lines in box.
function chart(box, series, unit) {
  var names = Object.keys(series).sort();
  var n = 0, max = 0;
  names.forEach(function (k) {
    n = Math.max(n, series[k].length);
    series[k].forEach(function (v) { if (v !== null && v > max) { max = v; } });
  });
  box.replaceChildren();
  if (n < 1) { var p = document.createElement("p"); p.className = "muted"; p.textContent = "Waiting for two samples…"; box.appendChild(p); return; }
  if (max === 0) { max = 1; }
  var W = 1000, H = 200, L = 64, B = 8, T = 10;
  var svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  function line(x1, y1, x2, y2, stroke) {
    var l = document.createElementNS(SVG, "line");
    l.setAttribute("x1", x1); l.setAttribute("y1", y1); l.setAttribute("x2", x2); l.setAttribute("y2", y2);
    l.setAttribute("stroke", stroke); l.setAttribute("stroke-width", "1");
    svg.appendChild(l);
  }
  function label(x, y, s) {
    var t = document.createElementNS(SVG, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "13"); t.setAttribute("fill", "#667085");
    t.textContent = s;
    svg.appendChild(t);
  }
  [0, 0.5, 1].forEach(function (f) {
    var y = T + (H - T - B) * (1 - f);
    line(L, y, W, y, "#eaecf0");
    label(2, y + 4, fmt(max * f, unit));
  });
  var step = n > 1 ? (W - L) / (n - 1) : 0;
  var legend = document.createElement("div");
  legend.className = "legend";
  names.forEach(function (k, i) {
    var pts = [];
    series[k].forEach(function (v, j) {
      if (v === null) { return; }
      pts.push((L + j * step).toFixed(1) + "," + (T + (H - T - B) * (1 - v / max)).toFixed(1));
    });
    var pl = document.createElementNS(SVG, "polyline");
    pl.setAttribute("points", pts.join(" "));
    pl.setAttribute("fill", "none");
    pl.setAttribute("stroke", colorOf(k, i));
    pl.setAttribute("stroke-width", "2");
    svg.appendChild(pl);
    pts.forEach(function (xy) {
      var c = document.createElementNS(SVG, "circle");
      c.setAttribute("cx", xy.split(",")[0]);
      c.setAttribute("cy", xy.split(",")[1]);
      c.setAttribute("r", "3");
      c.setAttribute("fill", colorOf(k, i));
      svg.appendChild(c);
    });
    var last = series[k][series[k].length - 1];
    var s = document.createElement("span");
    s.style.color = colorOf(k, i);
    s.textContent = k + (last === null || last === undefined ? "" : " " + fmt(last, unit));
    legend.appendChild(s);
  });
  box.appendChild(svg);
  var axis = document.createElement("div");
  axis.className = "axis";
  var from = document.createElement("span");
  from.textContent = "−" + Math.round(n * interval) + " s";
  var to = document.createElement("span");
  to.textContent = "now";
  axis.appendChild(from);
  axis.appendChild(to);
  box.appendChild(axis);
  box.appendChild(legend);
}

var interval = 5;

function fmt(v, unit) {
  if (unit === "s") {
    if (v < 0.001) { return (v * 1e6).toFixed(0) + " µs"; }
    if (v < 1) { return (v * 1e3).toFixed(v < 0.01 ? 2 : 1) + " ms"; }
    return v.toFixed(2) + " s";
  }
  return (v < 10 ? v.toFixed(2) : v.toFixed(0)) + "/s";
}

function pollTraffic(box) {
  var src = box.getAttribute("data-src");
  var holder = document.getElementById("namespaces-charts");
  function tick() {
    fetch(src, { credentials: "same-origin", cache: "no-store" }).then(function (r) { return r.json(); }).then(function (t) {
      interval = t.interval_s || interval;
      chart(document.getElementById("latency"), t.latency, "s");
      var names = Object.keys(t.namespaces).sort();
      names.forEach(function (ns) {
        var id = "chart-" + ns;
        var el = document.getElementById(id);
        if (!el) {
          var sec = document.createElement("section");
          sec.className = "card";
          var h = document.createElement("h2");
          h.textContent = ns + " · outcomes per second";
          el = document.createElement("div");
          el.className = "chart";
          el.id = id;
          sec.appendChild(h);
          sec.appendChild(el);
          holder.appendChild(sec);
        }
        chart(el, t.namespaces[ns], "/s");
      });
      box.setAttribute("data-updates", String(Number(box.getAttribute("data-updates") || "0") + 1));
    }).catch(function () {});
  }
  tick();
  setInterval(tick, Math.max(1000, 1000 * (Number(box.getAttribute("data-interval")) || 5)));
}

document.addEventListener("DOMContentLoaded", function () {
  var p = document.getElementById("progress");
  if (p) { pollProgress(p); }
  var t = document.getElementById("traffic");
  if (t) { pollTraffic(t); }
});
