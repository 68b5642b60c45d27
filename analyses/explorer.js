// groklens explorer (analyses/explorer.py): draws one run at one checkpoint from the JSON in
// #explorer-data as inline SVG. Every string from a run reaches the page through textContent or
// an attribute value, never as markup.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("explorer-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var runSelect = document.getElementById("run");
  var slider = document.getElementById("checkpoint");
  var LABEL_COLOURS = {clock: "#1f77b4", pizza: "#d62728", neither: "#777"};

  function el(parent, tag, attrs, text) {
    var node = document.createElementNS(NS, tag);
    for (var k in attrs) { node.setAttribute(k, attrs[k]); }
    if (text !== undefined) { node.textContent = text; }
    parent.appendChild(node);
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  function fmt(x, digits) {
    if (x === null || x === undefined) { return "—"; }
    if (Math.abs(x) >= 1e4 || (Math.abs(x) < 1e-3 && x !== 0)) { return x.toExponential(2); }
    return x.toFixed(digits === undefined ? 3 : digits);
  }

  function steps(n) { return n.toLocaleString("en-US"); }

  function power(v) { return v >= 1 && v < 1e4 ? String(v) : "1e" + Math.round(Math.log10(v)); }

  // a linear or log10 scale from a domain to a pixel range
  function scale(lo, hi, a, b, log) {
    var f = log ? Math.log10 : function (v) { return v; };
    var l = f(lo), h = f(hi);
    if (!(h > l)) { h = l + 1; }
    return function (v) { return a + (f(v) - l) / (h - l) * (b - a); };
  }

  function finite(xs) { return xs.filter(function (v) { return v !== null && isFinite(v); }); }

  function ticksLog(lo, hi) {
    var out = [];
    for (var e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      var v = Math.pow(10, e);
      if (v >= lo * 0.999 && v <= hi * 1.001) { out.push(v); }
    }
    return out;
  }

  function axes(g, box, xlab, ylab) {
    el(g, "rect", {x: box.x0, y: box.y1, width: box.x1 - box.x0, height: box.y0 - box.y1, fill: "none",
                   stroke: "#999"});
    el(g, "text", {x: (box.x0 + box.x1) / 2, y: box.y0 + 30, "text-anchor": "middle", "class": "axis"}, xlab);
    el(g, "text", {x: box.x0, y: box.y1 - 6, "class": "axis"}, ylab);
  }

  // ------------------------------------------------------------------ loss and accuracy curves
  function drawCurves(run, step) {
    var svg = document.getElementById("curves");
    clear(svg);
    var c = run.curves;
    var readout = document.getElementById("curves-readout");
    if (!c.step.length) { readout.textContent = "no evaluation after step 0 yet"; return; }
    var xlo = c.step[0], xhi = Math.max(c.step[c.step.length - 1], xlo * 10);
    var panels = [
      {keys: ["train_loss", "test_loss"], title: "loss (log)", log: true, x0: 60, x1: 330},
      {keys: ["train_acc", "test_acc"], title: "accuracy", log: false, x0: 410, x1: 680}];
    var colours = {train_loss: "#1f77b4", test_loss: "#d62728", train_acc: "#1f77b4", test_acc: "#d62728"};
    panels.forEach(function (p) {
      var box = {x0: p.x0, x1: p.x1, y0: 220, y1: 20};
      var vals = finite([].concat(c[p.keys[0]], c[p.keys[1]])).filter(function (v) { return !p.log || v > 0; });
      var ylo = p.log ? Math.min.apply(null, vals) : 0, yhi = p.log ? Math.max.apply(null, vals) : 1;
      var X = scale(xlo, xhi, box.x0, box.x1, true), Y = scale(ylo, yhi, box.y0, box.y1, p.log);
      var g = el(svg, "g", {});
      axes(g, box, "step (log)", p.title);
      ticksLog(xlo, xhi).forEach(function (v) {
        el(g, "line", {x1: X(v), x2: X(v), y1: box.y0, y2: box.y0 + 4, stroke: "#999"});
        el(g, "text", {x: X(v), y: box.y0 + 16, "text-anchor": "middle", "class": "tick"}, steps(v));
      });
      (p.log ? ticksLog(ylo, yhi) : [0, 0.5, 1]).forEach(function (v) {
        el(g, "text", {x: box.x0 - 4, y: Y(v) + 4, "text-anchor": "end", "class": "tick"}, p.log ? power(v) : v);
      });
      // memorization's label at the bottom, grokking's at the top: the two are often close
      [["memorized", run.memorization, box.y0 - 6], ["grokked", run.grokking, box.y1 + 12]].forEach(function (ev) {
        if (ev[1] === null || ev[1] < xlo) { return; }
        el(g, "line", {x1: X(ev[1]), x2: X(ev[1]), y1: box.y0, y2: box.y1, stroke: "#aaa", "stroke-dasharray": "3 3"});
        var right = X(ev[1]) > (box.x0 + box.x1) / 2;  // the label on the side with room
        el(g, "text", {x: X(ev[1]) + (right ? -3 : 3), y: ev[2], "class": "tick",
                       "text-anchor": right ? "end" : "start"}, ev[0]);
      });
      p.keys.forEach(function (k) {
        var d = "", pen = "M";
        c.step.forEach(function (s, i) {
          var v = c[k][i];
          if (v === null || (p.log && v <= 0)) { pen = "M"; return; }
          d += pen + X(s).toFixed(1) + " " + Y(v).toFixed(1) + " ";
          pen = "L";
        });
        el(g, "path", {d: d, fill: "none", stroke: colours[k], "stroke-width": 1.5,
                       "stroke-dasharray": k.indexOf("train") === 0 ? "5 3" : ""});
      });
      var at = Math.max(step, xlo);
      el(g, "line", {x1: X(at), x2: X(at), y1: box.y0, y2: box.y1, stroke: "#000", "stroke-width": 1.5,
                     "class": "cursor"});
    });
    el(svg, "text", {x: 690, y: 60, "class": "tick", fill: "#1f77b4"}, "train (dashed)");
    el(svg, "text", {x: 690, y: 76, "class": "tick", fill: "#d62728"}, "test");
    var i = nearestIndex(c.step, step);
    readout.textContent = "evaluation at step " + steps(c.step[i]) + ": train loss " + fmt(c.train_loss[i]) +
      ", test loss " + fmt(c.test_loss[i]) + ", train acc " + fmt(c.train_acc[i]) + ", test acc " + fmt(c.test_acc[i]);
  }

  function nearestIndex(xs, x) {
    var best = 0;
    for (var i = 1; i < xs.length; i++) { if (Math.abs(xs[i] - x) <= Math.abs(xs[best] - x)) { best = i; } }
    return best;
  }

  // ------------------------------------------------------------------ panels of stored analyses
  // the stored checkpoint of `name` for slider position k, or null (the note says why)
  function stored(run, name, k) {
    var note = document.getElementById(name + "-note");
    var a = run[name];
    if (!a) { note.textContent = run.missing[name]; return null; }
    var j = a.at[k], s = a.steps[j];
    note.textContent = s === run.positions[k] ? "" : "nearest stored checkpoint: step " + steps(s);
    return j;
  }

  function blues(v) {
    var t = Math.max(0, Math.min(1, v));
    var r = Math.round(247 - t * (247 - 8)), g = Math.round(251 - t * (251 - 81)), b = Math.round(255 - t * (255 - 156));
    return "rgb(" + r + "," + g + "," + b + ")";
  }

  function drawAttention(run, k) {
    var svg = document.getElementById("attention");
    clear(svg);
    var j = stored(run, "attention", k);
    if (j === null) { return; }
    var a = run.attention, P = a.pattern[j], cw = 64, ch = 30, x0 = 70, y0 = 40;
    a.positions.forEach(function (name, q) {
      el(svg, "text", {x: x0 + q * cw + cw / 2, y: y0 - 8, "text-anchor": "middle", "class": "axis"}, name);
    });
    P.forEach(function (row, h) {
      el(svg, "text", {x: x0 - 6, y: y0 + h * ch + ch / 2 + 4, "text-anchor": "end", "class": "axis"}, "head " + h);
      row.forEach(function (v, q) {
        var cell = el(svg, "rect", {x: x0 + q * cw, y: y0 + h * ch, width: cw - 2, height: ch - 2,
                                    fill: v === null ? "#eee" : blues(v), "class": "cell"});
        el(cell, "title", {}, "head " + h + ", " + a.positions[q] + ": " + fmt(v));
        el(svg, "text", {x: x0 + q * cw + cw / 2 - 1, y: y0 + h * ch + ch / 2 + 4, "text-anchor": "middle",
                         "class": "value", fill: v !== null && v > 0.6 ? "#fff" : "#222"}, v === null ? "—" : v.toFixed(2));
      });
    });
    var w = x0 + a.positions.length * cw + 10, h = y0 + P.length * ch + 10;
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("width", w * 1.3);
  }

  function bars(svg, values, max, colourOf, ylab, integers) {
    var n = values.length, box = {x0: 50, x1: 550, y0: 170, y1: 20};
    var w = (box.x1 - box.x0) / n, Y = scale(0, max > 0 ? max : 1, box.y0, box.y1, false);
    axes(svg, box, "frequency k", ylab);
    values.forEach(function (v, i) {
      if (v === null) { return; }
      var bar = el(svg, "rect", {x: box.x0 + i * w + 0.5, y: Y(v), width: Math.max(w - 1, 0.5), height: box.y0 - Y(v),
                                 fill: colourOf(i + 1), "class": "bar"});
      el(bar, "title", {}, "k = " + (i + 1) + ": " + fmt(v));
      if (i === 0 || (i + 1) % 5 === 0 || i === n - 1) {
        el(svg, "text", {x: box.x0 + (i + 0.5) * w, y: box.y0 + 14, "text-anchor": "middle", "class": "tick"}, i + 1);
      }
    });
    // the top tick is the scale's top: 1 where nothing is counted (a count's axis never reads 0 to 0)
    var top = max > 0 ? max : 1;
    el(svg, "text", {x: box.x0 - 4, y: box.y1 + 4, "text-anchor": "end", "class": "tick"}, integers ? top : fmt(top, 2));
    el(svg, "text", {x: box.x0 - 4, y: box.y0 + 4, "text-anchor": "end", "class": "tick"}, "0");
    if (integers && !values.some(function (v) { return v > 0; })) {
      el(svg, "text", {x: (box.x0 + box.x1) / 2, y: (box.y0 + box.y1) / 2, "text-anchor": "middle", "class": "axis",
                       fill: "#555"}, "no clustered neurons");
    }
  }

  function drawFourier(run, k) {
    var spec = document.getElementById("spectrum"), clus = document.getElementById("clusters");
    clear(spec);
    clear(clus);
    var keysNote = document.getElementById("spectrum-keys"), unclNote = document.getElementById("clusters-unclustered");
    keysNote.textContent = "";
    unclNote.textContent = "";
    var j = stored(run, "fourier", k);
    document.getElementById("clusters-note").textContent = document.getElementById("fourier-note").textContent;
    if (j === null) { return; }
    var f = run.fourier, keys = f.keys[j];
    var isKey = function (q) { return keys.indexOf(q) >= 0 ? "#e6550d" : "#6baed6"; };
    bars(spec, f.power[j], f.power_max, isKey, "share of the embedding's power");
    keysNote.textContent = "key frequencies (orange): " + (keys.length ? keys.join(", ") : "none");
    bars(clus, f.counts[j], f.counts_max, isKey, "neurons", true);
    unclNote.textContent = "unclustered: " + f.unclustered[j] + " of " + f.neurons + " neurons (fraction below " +
      f.threshold + " in every frequency's block)";
  }

  function drawLabel(run, k) {
    var svg = document.getElementById("clock-plane"), big = document.getElementById("algorithm");
    clear(svg);
    big.textContent = "";
    document.getElementById("algorithm-values").textContent = "";
    var j = stored(run, "clock_pizza", k);
    if (j === null) { return; }
    var c = run.clock_pizza, rule = D.rule;
    big.textContent = c.label[j];
    big.style.color = LABEL_COLOURS[c.label[j]] || "#222";
    document.getElementById("algorithm-values").textContent = "gradient symmetricity " + fmt(c.gs[j]) +
      ", distance irrelevance " + fmt(c.di[j]);
    var box = {x0: 60, x1: 380, y0: 230, y1: 20};
    var X = scale(-1, 1, box.x0, box.x1, false), Y = scale(0, 1.2, box.y0, box.y1, false);
    el(svg, "rect", {x: X(-1), y: Y(1.2), width: X(rule.clock_max_symmetricity) - X(-1),
                     height: Y(rule.clock_min_irrelevance) - Y(1.2), fill: "#1f77b4", "fill-opacity": 0.12});
    el(svg, "rect", {x: X(rule.pizza_min_symmetricity), y: Y(rule.pizza_max_irrelevance),
                     width: X(1) - X(rule.pizza_min_symmetricity), height: Y(0) - Y(rule.pizza_max_irrelevance),
                     fill: "#d62728", "fill-opacity": 0.25});
    axes(svg, box, "gradient symmetricity", "distance irrelevance");
    el(svg, "text", {x: X(-0.95), y: Y(1.12), "class": "tick", fill: "#1f77b4"}, "clock");
    el(svg, "text", {x: X(0.9), y: Y(0.05), "class": "tick", fill: "#d62728", "text-anchor": "end"}, "pizza");
    [-1, 0, 1].forEach(function (v) {
      el(svg, "text", {x: X(v), y: box.y0 + 14, "text-anchor": "middle", "class": "tick"}, v);
    });
    [0, 0.5, 1].forEach(function (v) {
      el(svg, "text", {x: box.x0 - 4, y: Y(v) + 4, "text-anchor": "end", "class": "tick"}, v);
    });
    var d = "", pen = "M";
    c.gs.forEach(function (g, i) {
      if (g === null || c.di[i] === null) { pen = "M"; return; }
      d += pen + X(g).toFixed(1) + " " + Y(c.di[i]).toFixed(1) + " ";
      pen = "L";
      el(svg, "circle", {cx: X(g), cy: Y(c.di[i]), r: 2.5, fill: "#999"});
    });
    el(svg, "path", {d: d, fill: "none", stroke: "#bbb"});
    if (c.gs[j] !== null && c.di[j] !== null) {
      el(svg, "circle", {cx: X(c.gs[j]), cy: Y(c.di[j]), r: 6, fill: LABEL_COLOURS[c.label[j]] || "#222",
                         stroke: "#000", "stroke-width": 1.5, "class": "current"});
    }
  }

  // ------------------------------------------------------------------ state
  function current() { return D.runs[Number(runSelect.value)]; }

  function draw() {
    var run = current(), k = Number(slider.value), step = run.positions[k];
    document.getElementById("step").textContent = "step " + steps(step) + " (checkpoint " + (k + 1) + " of " +
      run.positions.length + ")";
    drawCurves(run, step);
    drawAttention(run, k);
    drawFourier(run, k);
    drawLabel(run, k);
  }

  function selectRun(keepPosition) {
    var run = current();
    slider.max = String(run.positions.length - 1);
    if (!keepPosition) { slider.value = String(run.positions.length - 1); }
    document.getElementById("run-info").textContent = run.group + " — " + run.path;
    draw();
  }

  D.runs.forEach(function (run, i) {
    var opt = document.createElement("option");
    opt.value = String(i);
    opt.textContent = run.name + " (" + run.group + ")";
    runSelect.appendChild(opt);
  });
  runSelect.addEventListener("change", function () { selectRun(false); });
  slider.addEventListener("input", draw);
  // #run=I&checkpoint=K opens run I at checkpoint K (links, screenshots)
  var want = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
    var parts = kv.split("=");
    if (parts.length === 2) { want[parts[0]] = parseInt(parts[1], 10); }
  });
  if (want.run >= 0 && want.run < D.runs.length) { runSelect.value = String(want.run); }
  selectRun(false);
  if (want.checkpoint >= 0) { slider.value = String(Math.min(want.checkpoint, Number(slider.max))); draw(); }
})();
