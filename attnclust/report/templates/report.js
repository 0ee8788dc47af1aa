/* attnclust report: the grid's head panel, the UMAP explorer, the per-question view and the cluster cards' links.
   Data: the JSON in #attnclust-data (attnclust/report/interactive.py). Maps are uint8 (weight * 255), zlib-deflated
   and base64-encoded; DecompressionStream("deflate") inflates them. No request leaves the page. Served by
   `attnclust explore DIR` (http/https only: on file:// no request is made at all), the head panel also loads any
   map at full length from the server's /api/search, /api/features and /api/map. */
(function () {
  "use strict";
  var DATA = null, EXP = null, HEADS = {}, inflated = {}, thumbs = null;
  var CELL_SIZES = [4, 7, 10, 14, 20], DEFAULT_CELL = 3, LABEL_W = 84, LABEL_H = 64;
  var lastFocus = null;
  var API = null; /* null: no server; else a promise of the longest feature ({feature_id, seq_len, ...}) */
  var SERVED = location.protocol === "http:" || location.protocol === "https:";
  /* Element ids: the report page's own names or, in an inline notebook view (attnclust/report/views.py wraps this
     script in a function of ATTNCLUST_VIEW, the id of the view's root element), that id, a dash and the same
     name, so that several views share a page. A view never calls the explore server. */
  var VIEW = typeof ATTNCLUST_VIEW === "string" ? ATTNCLUST_VIEW : null;
  function byId(name) { return document.getElementById(VIEW ? VIEW + "-" + name : name); }
  function within(name, selector) { var node = byId(name); return node ? node.querySelectorAll(selector) : []; }
  function scope() { return VIEW ? document.getElementById(VIEW) : document; }

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "class") { node.className = attrs[k]; } else { node.setAttribute(k, attrs[k]); }
    });
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function num(v, digits) {
    return v === null || v === undefined ? "–" : Number(v).toFixed(digits === undefined ? 3 : digits);
  }
  function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(0) + "%"; }

  function inflate(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot inflate the embedded maps (no DecompressionStream)"));
    }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new Uint8Array(buf); });
  }
  function questionMaps(qi) {
    if (!inflated[qi]) { inflated[qi] = inflate(EXP.questions[qi].maps); }
    return inflated[qi];
  }
  /* A question holds the maps of every (layer, head) in order, or of the (layer, head) pairs it lists in `pairs`. */
  function headSlice(bytes, q, layer, head) {
    var n = q.n, at = layer * EXP.heads + head;
    if (q.pairs) { at = q.pairs.findIndex(function (p) { return p[0] === layer && p[1] === head; }); }
    return at < 0 ? new Uint8Array(0) : bytes.subarray(at * n * n, (at + 1) * n * n);
  }
  function inSpan(span, i) { return span !== null && span !== undefined && i >= span[0] && i <= span[1]; }

  function paint(canvas, values, n) {
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(n, n);
    for (var i = 0; i < n * n; i++) {
      var t = Math.sqrt(values[i] / 255);
      img.data[4 * i] = Math.round(255 - 247 * t);
      img.data[4 * i + 1] = Math.round(255 - 207 * t);
      img.data[4 * i + 2] = Math.round(255 - 148 * t);
      img.data[4 * i + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  /* One map at full length with its token labels: keys along the top (.tok), queries down the side (.qtok). */
  /* One map (values: uint8, weight * 255, query-major). With `moved` ({load: function () -> Promise of such
     values, start: "weights" | "norm"}) the caption gets a weights / norm-weighted toggle: each query row's shares of
     the norm it moves (Kobayashi et al. 2020), loaded on first use. */
  function mapView(q, values, caption, moved) {
    var n = q.n, level = DEFAULT_CELL, shown = values, what = "weight";
    var fig = el("figure", { "class": "map-view", "data-weighting": "weights" });
    var cap = el("figcaption", {}, caption);
    var zoomOut = el("button", { type: "button", "class": "zoom", "aria-label": "Zoom out" }, "−");
    var zoomIn = el("button", { type: "button", "class": "zoom", "aria-label": "Zoom in" }, "+");
    cap.appendChild(document.createTextNode(" "));
    cap.appendChild(zoomOut);
    cap.appendChild(zoomIn);
    var byWeight = null, byNorm = null, normValues = null;
    function weighting(which) {
      var get = which !== "norm" ? Promise.resolve(values) : normValues ? Promise.resolve(normValues) :
        moved.load().then(function (v) { normValues = v; return v; });
      return get.then(function (v) {
        shown = v; what = which === "norm" ? "norm" : "weight";
        paint(canvas, v, n);
        byWeight.setAttribute("aria-pressed", String(which !== "norm"));
        byNorm.setAttribute("aria-pressed", String(which === "norm"));
        fig.setAttribute("data-weighting", which);
      }, function (err) { readout.textContent = "The norm-weighted map could not be loaded: " + err.message; });
    }
    if (moved) {
      var toggle = el("span", { "class": "mv-toggle", role: "group", "aria-label": "what the map shows" });
      byWeight = el("button", { type: "button", "class": "mv-weighting", "data-weighting": "weights",
        "aria-pressed": "true", title: "the attention weights" }, "Weights");
      byNorm = el("button", { type: "button", "class": "mv-weighting", "data-weighting": "norm", "aria-pressed": "false",
        title: "each query row's shares of the norm it moves: weight times the key's value-vector norm " +
          "(Kobayashi et al. 2020)" }, "Norm-weighted");
      toggle.appendChild(byWeight); toggle.appendChild(byNorm);
      cap.appendChild(document.createTextNode(" "));
      cap.appendChild(toggle);
      byWeight.addEventListener("click", function () { weighting("weights"); });
      byNorm.addEventListener("click", function () { weighting("norm"); });
    }
    var box = el("div", { "class": "mv-box", tabindex: "0", "aria-label": "attention map, scrollable" });
    var grid = el("div", { "class": "mv-grid" });
    var corner = el("div", { "class": "mv-corner" }, "query ↓ key →");
    var keys = el("div", { "class": "mv-keys" }), rows = el("div", { "class": "mv-rows" });
    var canvas = el("canvas", { width: n, height: n, "class": "mv-canvas" });
    for (var i = 0; i < n; i++) {
      var k = el("span", { "class": "tok" + (inSpan(q.answer, i) ? " answer" : "") + (inSpan(q.pred, i) ? " pred" : ""),
        title: i + ": " + q.tokens[i] }, q.tokens[i]);
      keys.appendChild(k);
      rows.appendChild(el("span", { "class": "qtok" + (inSpan(q.answer, i) ? " q-answer" : "") +
        (inSpan(q.pred, i) ? " q-pred" : ""), title: i + ": " + q.tokens[i] }, q.tokens[i]));
    }
    grid.appendChild(corner); grid.appendChild(keys); grid.appendChild(rows); grid.appendChild(canvas);
    box.appendChild(grid);
    var readout = el("p", { "class": "mv-readout", "aria-live": "polite" },
      n + " tokens; hover the map for a weight.");
    fig.appendChild(cap); fig.appendChild(box); fig.appendChild(readout);
    paint(canvas, values, n);
    function layout() {
      var c = CELL_SIZES[level], side = n * c;
      grid.style.gridTemplateColumns = LABEL_W + "px " + side + "px";
      grid.style.gridTemplateRows = LABEL_H + "px " + side + "px";
      canvas.style.width = side + "px"; canvas.style.height = side + "px";
      grid.classList.toggle("tiny", c < 10);
      keys.style.gridTemplateColumns = "repeat(" + n + ", " + c + "px)";
      rows.style.gridTemplateRows = "repeat(" + n + ", " + c + "px)";
      zoomOut.disabled = level === 0; zoomIn.disabled = level === CELL_SIZES.length - 1;
    }
    zoomOut.addEventListener("click", function () { level = Math.max(0, level - 1); layout(); });
    zoomIn.addEventListener("click", function () { level = Math.min(CELL_SIZES.length - 1, level + 1); layout(); });
    canvas.addEventListener("mousemove", function (ev) {
      var r = canvas.getBoundingClientRect();
      var col = Math.floor((ev.clientX - r.left) / r.width * n), row = Math.floor((ev.clientY - r.top) / r.height * n);
      if (row < 0 || col < 0 || row >= n || col >= n) { return; }
      readout.textContent = "query " + row + " “" + q.tokens[row] + "” → key " + col + " “" + q.tokens[col] +
        "”: " + (shown[row * n + col] / 255).toFixed(3) + (what === "weight" ? "" : " of the row's moved norm");
    });
    layout();
    if (moved && moved.start === "norm") { weighting("norm"); }
    return fig;
  }

  function placeholder(text) { return el("p", { "class": "muted" }, text); }

  function mapInto(container, qi, layer, head, caption) {
    var q = EXP.questions[qi], slot = placeholder("Decoding the map…");
    container.appendChild(slot);
    var moved = !q.moved ? null : { start: q.weighting, load: function () {
      return inflate(q.moved).then(function (bytes) { return headSlice(bytes, q, layer, head); });
    } };
    return questionMaps(qi).then(function (bytes) {
      container.replaceChild(mapView(q, headSlice(bytes, q, layer, head), caption, moved), slot);
    }, function (err) { slot.textContent = "The map could not be shown: " + err.message; });
  }

  /* ---------------------------------------------------------------- head panel */
  function table(rows, headers) {
    var t = el("table", { "class": "mini" });
    if (headers) {
      var tr = el("tr");
      headers.forEach(function (h) { tr.appendChild(el("th", {}, h)); });
      t.appendChild(tr);
    }
    rows.forEach(function (r) {
      var tr2 = el("tr");
      tr2.appendChild(el("th", {}, r[0]));
      for (var i = 1; i < r.length; i++) { tr2.appendChild(el("td", {}, r[i])); }
      t.appendChild(tr2);
    });
    return t;
  }

  function thumbView(pi) {
    var g = EXP.umap.grid, c = el("canvas", { width: g, height: g, "class": "thumb-big" });
    thumbs.then(function (bytes) { paint(c, bytes.subarray(pi * g * g, (pi + 1) * g * g), g); });
    return c;
  }

  function openHead(layer, head, point) {
    var info = HEADS[layer + "," + head], panel = byId("head-panel");
    var body = byId("head-panel-body");
    if (!panel || !body) { return; }
    lastFocus = document.activeElement;
    body.textContent = "";
    var title = "L" + layer + "H" + head;
    if (info) { title += " · cluster " + info.dominant + " (" + pct(info.purity) + " of its maps)"; }
    byId("head-panel-title").textContent = title;
    if (info) {
      var descr = DATA.descr[String(info.dominant)];
      if (descr) { body.appendChild(el("p", {}, "Dominant cluster " + info.dominant + ": " + descr)); }
      var facts = el("div", { "class": "row" });
      if (info.roles !== null) {
        var qrows = Object.keys(info.q).map(function (r) {
          return [r, num(info.q[r], 3), info.roles.indexOf(r) >= 0 ? "yes" : ""];
        });
        var roleBox = el("div");
        roleBox.appendChild(el("p", { "class": "hp-roles" },
          "Roles: " + (info.roles.length ? info.roles.join(", ") : "none")));
        if (qrows.length) { roleBox.appendChild(table(qrows, ["role", "q-value", "role?"])); }
        facts.appendChild(roleBox);
      }
      var other = [];
      if (info.importance !== null) {
        other.push(["importance", num(info.importance, 3) +
          (info.importance_rank !== null ? " (rank " + info.importance_rank + ")" : "")]);
      }
      Object.keys(info.lift).forEach(function (k) { other.push([k, num(info.lift[k], 3)]); });
      Object.keys(info.stats).forEach(function (k) {
        other.push([k, k === "n_maps" ? String(info.stats[k]) : num(info.stats[k], 3)]);
      });
      if (other.length) { facts.appendChild(table(other, ["measure", "value"])); }
      var shares = el("table", { "class": "mini" });
      shares.appendChild(table([], ["cluster", "share of the head's maps"]).firstChild);
      info.shares.forEach(function (s) {
        var tr = el("tr"), td = el("td", { "class": "txt" });
        tr.appendChild(el("th", {}, String(s[0])));
        var bar = el("span", { "class": "bar" });
        bar.style.width = Math.round(80 * s[1]) + "px";
        bar.style.background = DATA.palette[s[0]] || "#888888";
        td.appendChild(bar); td.appendChild(document.createTextNode(" " + pct(s[1])));
        tr.appendChild(td); shares.appendChild(tr);
      });
      facts.appendChild(shares);
      body.appendChild(facts);
    }
    body.appendChild(anyMapControls(layer, head));
    if (point !== undefined && EXP && EXP.umap) {
      var U = EXP.umap, qi = U.question[point], exid = U.example_ids[U.example[point]];
      var sel = el("div", { "class": "hp-selected" });
      sel.appendChild(el("h4", {}, "Selected map: example " + exid + ", L" + layer + "H" + head +
        ", cluster " + U.cluster[point]));
      body.appendChild(sel);
      if (qi >= 0) {
        mapInto(sel, qi, layer, head, EXP.questions[qi].question);
      } else {
        sel.appendChild(thumbView(point));
        sel.appendChild(el("p", { "class": "muted" }, "Pooled " + U.grid + " × " + U.grid +
          " thumbnail: this map's question is not among the embedded ones, so its full map is not in the page."));
      }
    }
    if (EXP && EXP.questions.length) {
      body.appendChild(el("h4", {}, "Example maps at full length"));
      EXP.head_examples.forEach(function (qi2) {
        var q = EXP.questions[qi2];
        mapInto(body, qi2, layer, head, q.question + " (" + q.n + " tokens)");
      });
    } else {
      body.appendChild(placeholder("This report embeds no example maps."));
    }
    panel.hidden = false;
    var close = byId("head-panel-close");
    if (close) { close.focus(); }
  }

  /* ---------------------------------------------------------------- any map from the explore server */
  function getJson(url) {
    return fetch(url, { headers: { Accept: "application/json" } }).then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) { throw new Error(body && body.error ? body.error : "HTTP " + r.status); }
        return body;
      });
    });
  }

  /* The map of one feature for (layer, head) from /api/map, drawn by mapView (weights scaled to 0..255 as the
     embedded maps are). */
  function apiMapInto(container, feature, layer, head) {
    var token = (container.loadToken = (container.loadToken || 0) + 1);
    container.textContent = "";
    var slot = placeholder("Loading feature " + feature + " (L" + layer + "H" + head + ")…");
    container.appendChild(slot);
    var url = "/api/map?feature=" + feature + "&layer=" + layer + "&head=" + head;
    function bytesOf(m) {
      var n = m.seq_len, values = new Uint8Array(n * n);
      for (var r = 0; r < n; r++) {
        for (var c = 0; c < n; c++) {
          values[r * n + c] = Math.max(0, Math.min(255, Math.round(m.weights[r][c] * 255)));
        }
      }
      return values;
    }
    return getJson(url).then(function (m) {
      if (token !== container.loadToken) { return; }
      var n = m.seq_len, values = bytesOf(m);
      var q = { n: n, tokens: m.tokens, answer: m.answer, pred: null };
      var moved = !m.value_norms ? null : { start: "weights", load: function () {
        return getJson(url + "&weighting=norm").then(bytesOf);
      } };
      container.replaceChild(mapView(q, values, "Feature " + m.feature + " (example " + m.example_id + "), L" +
        layer + "H" + head + (m.question ? " on “" + m.question + "”" : "") + " (" + n + " tokens" +
        (m.source === "recomputed" ? ", exact map recomputed by one forward of the run's model" :
          m.source && m.source !== "full" ? ", " + m.source + " map" : "") +
        (m.kept_mass !== null && m.kept_mass !== undefined ?
          ": its rows keep " + m.kept_mass.toFixed(3) + " of their mass on average" : "") +
        (m.source === "compact" && m.exact_on_demand_reason ? "; not recomputed: " + m.exact_on_demand_reason : "") +
        ")", moved), slot);
    }, function (err) {
      if (token === container.loadToken) { slot.textContent = "The map could not be loaded: " + err.message; }
    });
  }

  /* The head panel's "any question" block: a search over /api/search and a "longest feature" button. */
  function anyMapControls(layer, head) {
    var box = el("div", { "class": "hp-any" });
    box.appendChild(el("h4", {}, "Any question"));
    if (!API) {
      box.appendChild(el("p", { "class": "muted" },
        DATA.any_map_hint || "Run `attnclust explore DIR` to load any map."));
      return box;
    }
    var bar = el("div", { "class": "hp-any-bar" });
    var label = el("label", { "for": "panel-search" }, "Question text or id ");
    var input = el("input", { type: "search", id: "panel-search", autocomplete: "off",
      "aria-controls": "panel-results" });
    var longest = el("button", { type: "button", id: "panel-longest" }, "Longest feature");
    label.appendChild(input);
    bar.appendChild(label); bar.appendChild(longest);
    var results = el("ul", { id: "panel-results", "class": "hp-results", "aria-live": "polite" });
    var view = el("div", { "class": "hp-any-map" });
    box.appendChild(bar); box.appendChild(results); box.appendChild(view);
    var timer = null, asked = 0;
    function search() {
      var mine = ++asked;
      getJson("/api/search?limit=10&q=" + encodeURIComponent(input.value)).then(function (body) {
        if (mine !== asked) { return; }
        results.textContent = "";
        if (!body.results.length) { results.appendChild(el("li", { "class": "muted" }, "No question matches.")); }
        body.results.forEach(function (r) {
          var li = el("li", {}, (r.question || "(no question text)") + " [" + r.example_id + "] ");
          r.features.forEach(function (f) {
            var b = el("button", { type: "button", "class": "hp-feature", "data-feature": f.feature_id },
              "feature " + f.feature_id + " (" + f.seq_len + " tokens)");
            b.addEventListener("click", function () { apiMapInto(view, f.feature_id, layer, head); });
            li.appendChild(b);
          });
          results.appendChild(li);
        });
        if (body.total > body.results.length) {
          results.appendChild(el("li", { "class": "muted" }, (body.total - body.results.length) +
            " more: refine the search."));
        }
      }, function (err) { if (mine === asked) { results.textContent = "Search failed: " + err.message; } });
    }
    input.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(search, 250); });
    input.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter") { ev.preventDefault(); clearTimeout(timer); search(); }
    });
    longest.addEventListener("click", function () {
      API.then(function (f) { return apiMapInto(view, f.feature_id, layer, head); },
        function (err) { view.textContent = "The longest feature could not be found: " + err.message; });
    });
    return box;
  }

  function closeHead() {
    var panel = byId("head-panel");
    if (!panel || panel.hidden) { return; }
    panel.hidden = true;
    if (lastFocus && lastFocus.focus) { lastFocus.focus(); }
  }

  function setupGrid() {
    within("grid", "[data-layer][data-head]").forEach(function (cell) {
      var open = function () { openHead(Number(cell.dataset.layer), Number(cell.dataset.head)); };
      cell.addEventListener("click", open);
      cell.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(); }
      });
    });
    var select = byId("grid-color");
    if (select) {
      select.addEventListener("change", function () {
        var mode = select.value;
        within("grid", "[data-layer][data-head]").forEach(function (cell) {
          var bg = cell.getAttribute("data-" + mode + "-bg"), fg = cell.getAttribute("data-" + mode + "-fg");
          if (bg) { cell.style.background = bg; cell.style.color = fg; }
        });
        within("grid", "[data-legend]").forEach(function (ul) {
          ul.hidden = ul.getAttribute("data-legend") !== mode;
        });
      });
    }
    var close = byId("head-panel-close");
    if (close) { close.addEventListener("click", closeHead); }
    document.addEventListener("keydown", function (ev) {  /* in a view, only from inside it (Escape is Jupyter's) */
      if (ev.key === "Escape" && (!VIEW || scope().contains(document.activeElement))) { closeHead(); }
    });
    scope().querySelectorAll(".show-heads").forEach(function (btn) {
      btn.addEventListener("click", function () {
        var on = btn.getAttribute("aria-pressed") !== "true", c = btn.getAttribute("data-cluster");
        btn.setAttribute("aria-pressed", on ? "true" : "false");
        within("grid", "[data-cluster]").forEach(function (cell) {
          if (cell.getAttribute("data-cluster") === c) { cell.classList.toggle("hl", on); }
        });
        if (on) { byId("grid").scrollIntoView(); }
      });
    });
  }

  /* ---------------------------------------------------------------- UMAP */
  function setupUmap() {
    var canvas = byId("umap-canvas"), tip = byId("umap-tip");
    if (!canvas || !EXP || !EXP.umap) { return; }
    var U = EXP.umap, n = U.x.length, px = new Float32Array(n), py = new Float32Array(n);
    var x0 = Math.min.apply(null, U.x), x1 = Math.max.apply(null, U.x);
    var y0 = Math.min.apply(null, U.y), y1 = Math.max.apply(null, U.y);
    thumbs = inflate(U.thumbs);
    thumbs.catch(function () { return null; });
    var hover = -1;
    function draw() {
      var w = Math.max(200, Math.min(900, canvas.parentNode.clientWidth)), h = Math.round(w * 0.66);
      var ratio = window.devicePixelRatio || 1, pad = 10;
      canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio);
      canvas.style.width = w + "px"; canvas.style.height = h + "px";
      var ctx = canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, w, h);
      for (var i = 0; i < n; i++) {
        px[i] = pad + (U.x[i] - x0) / ((x1 - x0) || 1) * (w - 2 * pad);
        py[i] = h - pad - (U.y[i] - y0) / ((y1 - y0) || 1) * (h - 2 * pad);
        ctx.fillStyle = DATA.palette[U.cluster[i]] || "#888888";
        ctx.globalAlpha = 0.75;
        ctx.beginPath(); ctx.arc(px[i], py[i], i === hover ? 5 : 2.5, 0, 2 * Math.PI); ctx.fill();
      }
      ctx.globalAlpha = 1;
    }
    function nearest(ev) {
      var r = canvas.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
      var best = -1, bd = 64;
      for (var i = 0; i < n; i++) {
        var d = (px[i] - mx) * (px[i] - mx) + (py[i] - my) * (py[i] - my);
        if (d < bd) { bd = d; best = i; }
      }
      return { i: best, x: mx, y: my, w: r.width };
    }
    canvas.addEventListener("mousemove", function (ev) {
      var hit = nearest(ev);
      if (hit.i < 0) { tip.hidden = true; canvas.style.cursor = "default"; return; }
      var i = hit.i;
      canvas.style.cursor = "pointer";
      tip.textContent = "";
      var g = U.grid, thumb = el("canvas", { width: g, height: g, "class": "thumb" });
      tip.appendChild(thumb);
      tip.appendChild(el("div", {}, "(" + U.example_ids[U.example[i]] + ", layer " + U.layer[i] + ", head " +
        U.head[i] + ")"));
      tip.appendChild(el("div", {}, "cluster " + U.cluster[i] + (U.question[i] >= 0 ? " · full map embedded" : "")));
      thumbs.then(function (bytes) { if (bytes) { paint(thumb, bytes.subarray(i * g * g, (i + 1) * g * g), g); } });
      tip.hidden = false;
      tip.style.left = Math.max(0, Math.min(hit.x + 12, hit.w - 230)) + "px";
      tip.style.top = (hit.y + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    canvas.addEventListener("click", function (ev) {
      var hit = nearest(ev);
      if (hit.i >= 0) { openHead(U.layer[hit.i], U.head[hit.i], hit.i); }
    });
    draw();
    window.addEventListener("resize", draw);
  }

  /* ---------------------------------------------------------------- per-question view */
  function setupQuestions() {
    var qs = byId("question-select");
    if (!qs || !EXP) { return; }
    var ls = byId("qv-layer"), hs = byId("qv-head");
    var box = byId("qv-map"), token = 0;
    function show() {
      var qi = -1;
      EXP.questions.forEach(function (q, i) { if (q.id === qs.value) { qi = i; } });
      if (qi < 0) { return; }
      var q = EXP.questions[qi], layer = Number(ls.value), head = Number(hs.value), mine = ++token;
      byId("qv-gold").textContent = q.gold === null ? "(not in this run)" :
        (q.gold.length ? q.gold.join(" | ") : "none: the question is unanswerable");
      byId("qv-prediction").textContent = q.prediction === null ? "(no predictions in this run)" :
        (q.prediction ? q.prediction : "(no answer)");
      byId("qv-verdict").textContent = q.verdict === null ? "–" : q.verdict;
      box.textContent = "";
      questionMaps(qi).then(function (bytes) {
        if (mine !== token) { return; }
        box.textContent = "";
        box.appendChild(mapView(q, headSlice(bytes, q, layer, head), "L" + layer + "H" + head + " on “" +
          q.question + "” (" + q.n + " tokens" + (q.span ? ", span " + q.span : "") + ")"));
      }, function (err) { box.textContent = "The map could not be shown: " + err.message; });
    }
    [qs, ls, hs].forEach(function (s) { s.addEventListener("change", show); });
    show();
  }

  function init() {
    var node = byId("attnclust-data");
    if (!node) { return; }
    DATA = JSON.parse(node.textContent);
    EXP = DATA.explorer;
    DATA.heads.forEach(function (h) { HEADS[h.layer + "," + h.head] = h; });
    if (SERVED && !VIEW) {
      API = getJson("/api/features?sort=longest&limit=1").then(function (body) {
        if (!body.results || !body.results.length) { throw new Error("the run has no features"); }
        return body.results[0];
      });
      API.catch(function () { API = null; });  /* not served by `attnclust explore`: the panel shows the hint */
    }
    setupGrid();
    setupUmap();
    setupQuestions();
    showView(DATA.show);
  }

  /* An inline view's picture (attnclust/report/views.py): one head's panel, or one map with its tokens. */
  function showView(show) {
    if (show && show.head) { openHead(show.head[0], show.head[1]); }
    if (show && show.map) { mapInto(byId("map"), show.map.question, show.map.layer, show.map.head, show.map.caption); }
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); } else { init(); }
}());
