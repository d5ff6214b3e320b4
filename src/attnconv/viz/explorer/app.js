// attnconv explorer: every layer × head attention map for a clicked query token, for each model
// of the site. data.js (window.ATTNCONV_SITE) lists the models; a model's models/I/model.js and
// its per-image files are loaded when first shown; each data file assigns its object to
// window.ATTNCONV_FILES[its path]. The format is documented in attnconv/viz/export.py. The
// displayed arrays are exposed as window.attnconv.maps[layer][head] (Float64Array over key
// tokens, row-major) and each layer's query as window.attnconv.queries[layer] (the picked token,
// or for a transformed network's layer, which attends from its output pixels over its input
// pixels, the output pixel nearest the picked pixel); window.attnconv.ready is false while a
// model or an image is loading (the maps then show the previous one, greyed out); names and
// captions from the data are only ever inserted as text. A model with a class token also offers
// two other views (state.view): "class", the class token's attention per layer and head (maps
// as for "heads", null for a layer without the class token), and "rollout", the attention rollout
// through all layers (maps[0] = [the query token's row, the class token's row]).
"use strict";

(function () {
  const SITE = window.ATTNCONV_SITE;
  const $ = (id) => document.getElementById(id);
  if (!SITE || SITE.format !== "attnconv-explorer" || !SITE.models || !SITE.models.length) {
    $("maps").textContent = "data.js is missing or is not an attnconv explorer export.";
    return;
  }
  window.ATTNCONV_FILES = window.ATTNCONV_FILES || {};
  const CMAP = bytes(SITE.colormap);
  // A probability scale reaches at least FLOOR/N (N the map's keys): a near-uniform map stays in
  // the colour map's dark end instead of taking its brightest colours (attnconv.viz.maps.FLOOR).
  const FLOOR = SITE.floor;
  const HOVER_HELP = "Hover or tap a map to read its values.";

  // The model shown: its data (model.js), decoded layers, decoded image files, the picker's token
  // grid, and each layer's query and key grids (layerGrids).
  let M = null, D = null, H = 0, W = 0, N = 0, G = [];
  const view = {
    site: SITE,
    model: -1,
    data: null,
    state: { image: 0, query: [0, 0], mode: "total", softmax: true, scale: "map", view: "heads", overlay: false },
    maps: [],
    queries: [],
    scales: [],
    hover: null,
    ready: false,
    setModel, setQuery, setImage, setMode, setSoftmax, setScale, setView, setOverlay,
  };
  window.attnconv = view;

  // ------------------------------------------------------------------ loading and decoding

  const pending = {};
  function load(file) {
    if (!pending[file]) {
      pending[file] = new Promise((resolve, reject) => {
        const script = document.createElement("script");
        script.src = file;
        script.onload = () => {
          const payload = window.ATTNCONV_FILES[file];
          delete window.ATTNCONV_FILES[file];
          if (payload) resolve(payload); else reject(new Error(`${file} holds no explorer data`));
        };
        script.onerror = () => { delete pending[file]; reject(new Error(`could not load ${file}`)); };
        document.body.appendChild(script);
      });
    }
    return pending[file];
  }

  function bytes(b64) {
    const text = atob(b64);
    const out = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
    return out;
  }
  function f32(b64) { return new Float32Array(bytes(b64).buffer); }
  const F32 = 2 ** -24;  // the relative rounding error of a float32 number
  function u16(b64) { return new Uint16Array(bytes(b64).buffer); }

  function quantized(p) {
    return { shape: p.shape, n: p.shape[p.shape.length - 1], codes: u16(p.codes),
             lo: f32(p.lo), step: f32(p.step), type: p.type, split: p.split };
  }
  // Row r (over all leading axes) of a quantised array: lo[r] + code * step[r].
  function quantizedRow(q, r) {
    const out = new Float64Array(q.n);
    const lo = q.lo[r], step = q.step[r], base = r * q.n;
    for (let k = 0; k < q.n; k++) out[k] = lo + q.codes[base + k] * step;
    return out;
  }
  function content(p) {
    if (p.type !== "factors") return quantized(p);
    return { type: "factors", dim: p.dim, query: f32(p.query), key: f32(p.key) };
  }
  // Content logits of query q (head h) to every key: (q/√d)·k, or a stored row.
  function contentRow(c, head, q) {
    if (c.type !== "factors") return quantizedRow(c, head * N + q);
    const d = c.dim, out = new Float64Array(N), qb = (head * N + q) * d;
    for (let k = 0; k < N; k++) {
      const kb = (head * N + k) * d;
      let sum = 0;
      for (let i = 0; i < d; i++) sum += c.query[qb + i] * c.key[kb + i];
      out[k] = sum;
    }
    return out;
  }
  // A bound on the float32 rounding of q/√d and k in contentRow's factors: each term's rounding
  // is at most 2·F32 of it, and the sum of the terms' sizes is at most |q|·max|k|.
  function factorsError(c, head, q) {
    const d = c.dim, norm = (data, b) => Math.hypot(...data.subarray(b, b + d));
    let most = 0;
    for (let k = 0; k < N; k++) most = Math.max(most, norm(c.key, (head * N + k) * d));
    return 2 * F32 * norm(c.query, (head * N + q) * d) * most;
  }

  async function modelData(index) {
    const cached = modelCache[index];
    if (cached) return cached;
    const data = await load(SITE.models[index].file);
    const decoded = {
      data,
      layers: data.kind === "position" ? data.layers.map((p) =>
        p.type === "product" ? { type: "product", row: f32(p.row), col: f32(p.col) } : quantized(p)) : null,
      images: {},
    };
    modelCache[index] = decoded;
    return decoded;
  }
  const modelCache = {};

  async function imageData(model, index) {
    if (model.images[index]) return model.images[index];
    const payload = await load(model.data.images[index].file);
    const image = payload.average
      ? { average: payload.average.map(quantized) }
      : payload.probs
      ? { probs: payload.probs.map(quantized) }
      : { layers: payload.layers.map((l) => ({
          content: l.content && content(l.content),
          position: l.position && quantized(l.position),
        })) };
    if (payload.views) {
      image.views = { rollout: quantized(payload.views.rollout), class: payload.views.class.map((c) => c && quantized(c)) };
    }
    model.images[index] = image;
    return image;
  }

  // ------------------------------------------------------------------ maps

  // Each layer's query grid (qh × qw) and key grid (kh × kw), and the key row and column each
  // query row and column sits on: a transformed network's layers attend from their output pixels
  // over their input pixels (data.layer_grids); every other model's layers share the token grid,
  // each query on its own token (rows and cols null).
  function layerGrids() {
    return D.heads.map((_, layer) => {
      const g = D.layer_grids && D.layer_grids[layer];
      if (!g) return { name: null, qh: H, qw: W, kh: H, kw: W, rows: null, cols: null };
      return { name: g.name, qh: g.query[0], qw: g.query[1], kh: g.key[0], kw: g.key[1], rows: g.rows, cols: g.cols };
    });
  }
  // Layer l's query: the picked token, or the output pixel nearest the picked pixel (the picker's
  // grid scaled onto the layer's output grid).
  function layerQuery(layer) {
    const g = G[layer];
    return g.rows ? carriedQuery(view.state.query, [H, W], [g.qh, g.qw]) : view.state.query;
  }
  // Where layer l's query sits on its key grid (outlined on its maps).
  function queryOnKeys(layer) {
    const g = G[layer], q = layerQuery(layer);
    return g.rows ? [g.rows[q[0]], g.cols[q[1]]] : q;
  }

  // Probabilities of a position-only layer: R[q1, k1] * C[q2, k2], or a stored row.
  function positionProbs(layer, head, q1, q2) {
    const L = M.layers[layer];
    if (L.type !== "product") return quantizedRow(L, head * N + q1 * W + q2);
    const out = new Float64Array(N);
    const rb = (head * H + q1) * H, cb = (head * W + q2) * W;
    for (let k1 = 0; k1 < H; k1++) {
      for (let k2 = 0; k2 < W; k2++) out[k1 * W + k2] = L.row[rb + k1] * L.col[cb + k2];
    }
    return out;
  }

  // Logits of one term ("content", "position") or their sum ("total"); null if the layer lacks it.
  function logits(image, layer, head, q, mode) {
    const L = image.layers[layer];
    const out = new Float64Array(N);
    let present = false;
    if (mode !== "position" && L.content) {
      const c = contentRow(L.content, head, q);
      for (let k = 0; k < N; k++) out[k] += c[k];
      present = true;
    }
    if (mode !== "content" && L.position) {
      const p = quantizedRow(L.position, head * N + q);
      if (L.position.type === "sum") {
        for (let k1 = 0; k1 < H; k1++) {
          for (let k2 = 0; k2 < W; k2++) out[k1 * W + k2] += p[k1] + p[H + k2];
        }
      } else {
        for (let k = 0; k < N; k++) out[k] += p[k];
      }
      present = true;
    }
    return present ? out : null;
  }
  // A bound on the error of those logits from the stored numbers: half a quantisation step of
  // each quantised row (a positional "sum" row twice: a key's row part plus its column part) and
  // the float32 rounding of content factors.
  function logitError(image, layer, head, q, mode) {
    const L = image.layers[layer];
    let error = 0;
    if (mode !== "position" && L.content) {
      error += L.content.type === "factors" ? factorsError(L.content, head, q) : L.content.step[head * N + q] / 2;
    }
    if (mode !== "content" && L.position) {
      error += L.position.step[head * N + q] / (L.position.type === "sum" ? 1 : 2);
    }
    return error;
  }

  function softmax(x) {
    let max = -Infinity, sum = 0;
    for (const v of x) max = Math.max(max, v);
    const out = new Float64Array(x.length);
    for (let k = 0; k < x.length; k++) { out[k] = Math.exp(x[k] - max); sum += out[k]; }
    for (let k = 0; k < x.length; k++) out[k] /= sum;
    return out;
  }

  // Whether the maps shown are probabilities or, in the rollout view, shares of a token (else
  // logits).
  function showsProbabilities() {
    return D.kind !== "content" || view.state.view !== "heads" || view.state.softmax || Boolean(currentImage().average);
  }
  function currentImage() { return M.images[view.state.image] || {}; }
  // The score term shown: the user's choice where the model has both terms, else the total.
  function scoreMode() {
    return D.terms && D.terms.content && D.terms.position ? view.state.mode : "total";
  }
  // What the values of the maps are called.
  function valueName(probabilities) {
    if (view.state.view === "rollout") return "rollout weight";
    return probabilities ? "probability" : D.logit || "logit";
  }

  // The maps of the current view and, for each, a bound on the error of its values from the
  // stored numbers ({abs}: the same for every value, {rel}: a fraction of each), so that the
  // hover readout prints no digit the data cannot guarantee.
  function computeMaps() {
    const image = currentImage();
    const q = view.state.query[0] * W + view.state.query[1];
    const stepError = (array, row) => ({ abs: array.step[row] / 2, rel: 0 });
    if (view.state.view === "rollout") {
      const rollout = image.views.rollout;
      return { maps: [[quantizedRow(rollout, 1 + q), quantizedRow(rollout, 0)]],
               errors: [[stepError(rollout, 1 + q), stepError(rollout, 0)]] };
    }
    if (view.state.view === "class") {
      const rows = image.views.class.map((c, layer) => [...Array(D.heads[layer]).keys()].map((head) => c && [quantizedRow(c, head), stepError(c, head)]));
      return { maps: rows.map((row) => row.map((m) => m && m[0])), errors: rows.map((row) => row.map((m) => m && m[1])) };
    }
    const stored = image.average || image.probs;  // probabilities as they are shown
    const maps = [], errors = [];
    D.heads.forEach((heads, layer) => {
      const [q1, q2] = layerQuery(layer);
      const queries = G[layer].qh * G[layer].qw, lq = q1 * G[layer].qw + q2;
      const row = [], error = [];
      for (let head = 0; head < heads; head++) {
        if (D.kind === "position") {
          const L = M.layers[layer];
          row.push(positionProbs(layer, head, q1, q2));
          error.push(L.type === "product" ? { abs: 0, rel: 2 * F32 } : stepError(L, head * N + lq));
        } else if (stored) {
          row.push(quantizedRow(stored[layer], head * queries + lq));
          error.push(stepError(stored[layer], head * queries + lq));
        } else {
          const x = logits(image, layer, head, lq, scoreMode());
          const e = x && logitError(image, layer, head, lq, scoreMode());
          // softmax: each logit off by at most e moves a probability by at most a factor e^±2e
          row.push(x && view.state.softmax ? softmax(x) : x);
          error.push(x && (view.state.softmax ? { abs: 0, rel: Math.expm1(2 * e) } : { abs: e, rel: 0 }));
        }
      }
      maps.push(row);
      errors.push(error);
    });
    return { maps, errors };
  }

  // ------------------------------------------------------------------ layout of one model

  const mapsEl = $("maps");
  // Per map: its elements and key grid; the error bounds of the values shown (computeMaps); the
  // image the maps are drawn over ("model/image", null: none yet).
  let cells = [], mapErrors = [], underDrawn = null;

  // The grid of maps of the current view: its columns' headings, its rows (heading, tooltip, how
  // many maps, their key grid) and the widest a map is drawn.
  function layout() {
    if (view.state.view === "rollout") {
      return { width: 240, columns: [[null, "query token"], [null, "class token"]],
               rows: [{ word: null, label: "rollout", title: "", maps: 2, grid: [H, W] }] };
    }
    return {
      width: 106,
      columns: [...Array(Math.max(...D.heads)).keys()].map((head) => ["head", head]),
      rows: D.heads.map((maps, layer) => ({ word: "layer", label: layer, title: G[layer].name, maps, grid: [G[layer].kh, G[layer].kw] })),
    };
  }

  // What map `index` of row `row` is, for its canvas and the hover readout.
  function mapName(row, index) {
    if (view.state.view === "rollout") {
      const [q1, q2] = view.state.query;
      return index === 0 ? `rollout of the query token (row ${q1}, col ${q2})` : "rollout of the class token";
    }
    return `${view.state.view === "class" ? "class token, " : ""}layer ${row}, head ${index}`;
  }

  // Where a map outlines the query on its keys (null: nowhere; it does not depend on the query).
  function markerOf(row, index) {
    if (view.state.view === "heads") return queryOnKeys(row);
    return view.state.view === "rollout" && index === 0 ? view.state.query : null;
  }

  function buildMaps() {
    mapsEl.replaceChildren();
    cells = [];
    underDrawn = null;
    const { width, columns, rows } = layout();
    // columns share the width (nothing wider than the screen), up to about `width` px a map
    mapsEl.style.gridTemplateColumns = `1.2rem repeat(${columns.length}, minmax(0, 1fr))`;
    mapsEl.style.maxWidth = `calc(1.2rem + ${columns.length * width}px)`;
    mapsEl.appendChild(document.createElement("div"));
    for (const [word, label] of columns) mapsEl.appendChild(heading("col-head", word, label));
    rows.forEach(({ word, label, title, maps, grid: [kh, kw] }, r) => {
      const rowHead = heading("row-head", word, label);
      if (title) rowHead.title = title;
      mapsEl.appendChild(rowHead);
      const row = [];
      for (let index = 0; index < columns.length; index++) {
        const cell = document.createElement("div");
        mapsEl.appendChild(cell);
        if (index >= maps) continue;
        cell.className = "map";
        // The outline is placed in a frame holding only the canvas, so that it lines up with
        // the map's tokens (not with the map plus its caption); the frame's background is the
        // image when the maps are drawn over it.
        const frame = document.createElement("div");
        frame.className = "frame";
        const canvas = document.createElement("canvas");
        canvas.width = kw;
        canvas.height = kh;
        canvas.style.aspectRatio = `${kw} / ${kh}`;
        const marker = document.createElement("div");
        marker.className = "marker";
        frame.append(canvas, marker);
        const scale = document.createElement("div");
        scale.className = "scale";
        cell.append(frame, scale);
        canvas.addEventListener("pointermove", (e) => hover(e, canvas, r, index));
        canvas.addEventListener("pointerdown", (e) => hover(e, canvas, r, index));
        canvas.addEventListener("pointerleave", (e) => { if (e.pointerType === "mouse") leave(); });
        row.push({ cell, frame, canvas, marker, scale, grid: [kh, kw] });
      }
      cells.push(row);
    });
  }

  // "head 3" / "layer 2" (on phones the columns read "h3": style.css hides the word), or a label
  // alone (word null).
  function heading(className, word, label) {
    const el = document.createElement("div");
    el.className = className;
    if (word === null) {
      el.classList.add("plain");
      el.textContent = label;
      return el;
    }
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = `${word} `;
    el.append(span, String(label));
    return el;
  }

  function buildImages() {
    const strip = $("images");
    strip.replaceChildren();
    strip.hidden = D.images.length === 0;
    D.images.forEach((info, i) => {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "thumb";
      button.title = info.label;
      // the visible tag ("average") starts the accessible name, as WCAG's label-in-name asks
      button.setAttribute("aria-label", info.label);
      const thumb = document.createElement("canvas");
      thumb.width = D.image_size[1];
      thumb.height = D.image_size[0];
      const ctx = thumb.getContext("2d");
      ctx.putImageData(pixelsToImageData(ctx, info, thumb.width, thumb.height), 0, 0);
      button.appendChild(thumb);
      if (info.average) {
        const tag = document.createElement("span");
        tag.textContent = "average";
        button.appendChild(tag);
      }
      button.addEventListener("click", () => setImage(i));
      strip.appendChild(button);
    });
  }

  // Outline token `query` of an h × w grid.
  function placeMarker(el, query, [h, w]) {
    el.style.left = `${(100 * query[1]) / w}%`;
    el.style.top = `${(100 * query[0]) / h}%`;
    el.style.width = `${100 / w}%`;
    el.style.height = `${100 / h}%`;
  }

  // The range of `values` (from 0 for probabilities), leaving out key `skip` (or none: -1).
  function range(values, fromZero, skip) {
    let lo = fromZero ? 0 : Infinity, hi = -Infinity;
    values.forEach((v, k) => { if (k !== skip) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    return [lo, hi];
  }
  // The colour scale of a map of n keys whose values span [lo, hi]: probabilities from 0 to hi
  // but at least FLOOR/n (attnconv.viz.maps.scale_top), logits from lo to hi (they have no
  // uniform level: a softmax looks the same for logits shifted by any constant).
  function colourRange([lo, hi], probabilities, n) {
    return probabilities ? [0, Math.max(hi, FLOOR / n)] : [lo, hi];
  }

  function drawMap(canvas, values, [lo, hi]) {
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(canvas.width, canvas.height);
    const span = hi > lo ? hi - lo : 1;
    for (let k = 0; k < values.length; k++) {
      const c = Math.max(0, Math.min(255, Math.round((255 * (values[k] - lo)) / span)));
      img.data.set([CMAP[3 * c], CMAP[3 * c + 1], CMAP[3 * c + 2], 255], 4 * k);
    }
    ctx.putImageData(img, 0, 0);
  }

  // Three significant digits (0.174, 0.00552): small values stay readable.
  function formatValue(v) {
    const text = Number(v).toPrecision(3);
    return /^-0(\.0*)?$/.test(text) ? text.slice(1) : text;
  }
  // A range lo … hi with the decimals that give its width three significant digits, the same
  // for both ends ("-0.0123 … 0.0045", "-12.3 … 45.6"); never "-0.0".
  function formatRange(lo, hi) {
    const span = Math.abs(hi - lo) || Math.abs(hi) || 1;
    const decimals = Math.min(12, Math.max(0, 2 - Math.floor(Math.log10(span))));
    const fix = (v) => {
      const text = v.toFixed(decimals);
      return /^-0(\.0*)?$/.test(text) ? text.slice(1) : text;
    };
    return [fix(lo), fix(hi)];
  }
  // A probability as a multiple of the uniform level 1/n over n keys ("34/N", "1.1/N").
  function uniformMultiple(p, n) {
    const times = p * n;
    return `${times >= 9.95 ? times.toFixed(0) : times.toFixed(1)}/N`;
  }
  function caption(el, parts) {
    el.replaceChildren(...parts.map(([className, text]) => {
      const span = document.createElement("span");
      span.className = className;
      span.textContent = text;
      return span;
    }));
  }

  function render() {
    if (D.kind !== "position" && !M.images[view.state.image]) return;
    const { maps, errors } = computeMaps();
    const probabilities = showsProbabilities();
    // the query's own rollout weight, mostly the residual's, is left out of the colour scale
    // (drawn in its top colour), or every other token would be dark
    const skipped = (index) => view.state.view === "rollout" && index === 0 ? view.state.query[0] * W + view.state.query[1] : -1;
    const ranges = maps.map((row) => row.map((values, index) => values && range(values, probabilities, skipped(index))));
    const colours = ranges.map((row, layer) => row.map((r, head) => {
      const [kh, kw] = cells[layer][head].grid;
      return r && colourRange(r, probabilities, kh * kw);
    }));
    const present = colours.flat().filter(Boolean);
    const shared = present.length
      ? [Math.min(...present.map((r) => r[0])), Math.max(...present.map((r) => r[1]))]
      : [0, 1];
    drawUnder();
    view.scales = maps.map((row, layer) => row.map((values, head) => {
      const { cell, canvas, marker, scale, grid } = cells[layer][head];
      canvas.setAttribute("aria-label", mapName(layer, head));
      const where = markerOf(layer, head);
      marker.hidden = where === null;
      if (where) placeMarker(marker, where, grid);
      cell.classList.toggle("empty", values === null);
      if (values === null) {
        caption(scale, [["value", view.state.view === "class" ? "no class token yet" : "no such term"]]);
        return null;
      }
      const [lo, hi] = ranges[layer][head];
      const colour = view.state.scale === "shared" ? shared : colours[layer][head];
      drawMap(canvas, values, colour);
      if (probabilities) {
        const off = skipped(head) >= 0 ? " off the query" : "";
        caption(scale, [["value", formatValue(hi)], ["times", ` = ${uniformMultiple(hi, grid[0] * grid[1])}${off}`]]);
      } else {
        const [a, b] = formatRange(lo, hi);
        caption(scale, [["value", `${a} … ${b}`]]);
      }
      return colour;
    }));
    view.maps = maps;
    mapErrors = errors;
    view.queries = D.heads.map((_, layer) => layerQuery(layer));
    drawColorbar(probabilities, shared);
    placeMarker($("picker-marker"), view.state.query, [H, W]);
    $("picker-marker").hidden = view.state.view === "class";
    const [q1, q2] = view.state.query;
    const where = D.stem > 1 ? `, pixels ${q1 * D.stem}–${(q1 + 1) * D.stem - 1} × ${q2 * D.stem}–${(q2 + 1) * D.stem - 1}` : "";
    const image = D.images.length && D.kind !== "position" ? `${D.images[view.state.image].label}: ` : "";
    $("query-readout").textContent = D.layer_grids
      ? `${image}query pixel (row ${q1}, col ${q2}); each layer's query is its output pixel nearest it, outlined on its input`
      : view.state.view === "class"
      ? `${image}the class token's attention to the patches (the query token does not change it)`
      : `${image}query token (row ${q1}, col ${q2})${where}`;
    showHover();
    setLoading(false);
    view.ready = true;
  }

  // ------------------------------------------------------------------ colour bar and hover

  const colorbar = $("colorbar");
  (function drawGradient() {
    const ctx = colorbar.getContext("2d");
    const img = ctx.createImageData(256, 1);
    for (let c = 0; c < 256; c++) img.data.set([CMAP[3 * c], CMAP[3 * c + 1], CMAP[3 * c + 2], 255], 4 * c);
    ctx.putImageData(img, 0, 0);
  })();

  function drawColorbar(probabilities, shared) {
    const kind = valueName(probabilities);
    const mark = $("colorbar-uniform");
    const floor = `at least ${FLOOR}/N so that near-uniform maps stay dark`;
    if (view.state.scale === "shared") {
      const [lo, hi] = probabilities ? shared.map(formatValue) : formatRange(...shared);
      $("colorbar-lo").textContent = lo;
      $("colorbar-hi").textContent = hi;
      $("colorbar-caption").textContent = probabilities
        ? `${kind}, one scale for all maps, 0 to their largest value (${floor})`
        : `${kind}, one scale for all maps`;
    } else {
      $("colorbar-lo").textContent = probabilities ? "0" : "min";
      $("colorbar-hi").textContent = probabilities ? `max (≥ ${FLOOR}/N)` : "max";
      $("colorbar-caption").textContent = probabilities
        ? `${kind}, each map from 0 to its maximum (${floor}), printed under it`
        : `${kind}, each map from its minimum to its maximum, printed under it`;
    }
    // the uniform level 1/N: where a head that looks everywhere alike would sit (N the keys of
    // a layer: one level for the whole bar only when every layer has the same keys)
    const counts = [...new Set(cells.flat().map(({ grid }) => grid[0] * grid[1]))];
    const uniform = 1 / counts[0];
    // a probability scale starts at 0 and reaches at least FLOOR/N, past 1/N
    const onBar = probabilities && counts.length === 1 && view.state.scale === "shared";
    mark.hidden = !onBar;
    if (onBar) mark.style.left = `${(100 * uniform) / shared[1]}%`;
    const level = counts.length === 1
      ? `1/N = ${formatValue(uniform)} on each of the N = ${counts[0]} tokens`
      : `1/N on each of a layer's N input pixels (N = ${counts.join(", ")} by layer)`;
    $("uniform-caption").textContent = probabilities
      ? `Uniform attention: ${level}` +
        (onBar ? " (marked on the bar)" : "; under each map, its maximum is also given as a multiple of 1/N") + "."
      : "";
  }

  function hover(event, canvas, layer, head) {
    const rect = canvas.getBoundingClientRect();
    const [kh, kw] = cells[layer][head].grid;
    const k1 = Math.min(kh - 1, Math.floor(((event.clientY - rect.top) / rect.height) * kh));
    const k2 = Math.min(kw - 1, Math.floor(((event.clientX - rect.left) / rect.width) * kw));
    view.hover = { layer, head, key: [Math.max(0, k1), Math.max(0, k2)] };
    showHover();
  }
  function leave() { view.hover = null; showHover(); }

  // The hovered value for the current model, image, query and score: redrawn with every change.
  function showHover() {
    const h = view.hover;
    const values = h && view.maps[h.layer] && view.maps[h.layer][h.head];
    if (!values) { $("hover-readout").textContent = HOVER_HELP; return; }
    const [k1, k2] = h.key;
    const probabilities = showsProbabilities();
    const [kh, kw] = cells[h.layer][h.head].grid;
    const value = values[k1 * kw + k2];
    $("hover-readout").textContent =
      `${mapName(h.layer, h.head)}, key (${k1}, ${k2}): ${valueName(probabilities)} ` +
      `${formatExact(value, mapErrors[h.layer][h.head])}` + (probabilities ? ` (${uniformMultiple(value, kh * kw)})` : "");
  }

  // Four significant digits of `value`, or fewer decimals where its error bound (computeMaps)
  // leaves fewer right: the last one printed is off by at most one unit.
  function formatExact(value, { abs, rel }) {
    const error = abs + rel * Math.abs(value);
    const decimals = Math.floor(-Math.log10(2 * error));
    const four = value === 0 ? Infinity : 3 - Math.floor(Math.log10(Math.abs(value)));
    if (!(decimals < four)) return value.toPrecision(4);
    const text = value.toFixed(Math.min(100, Math.max(0, decimals)));
    return /^-0(\.0*)?$/.test(text) ? text.slice(1) : text;
  }

  // ------------------------------------------------------------------ picker and controls

  const picker = $("picker");
  picker.tabIndex = 0;

  function drawPicker() {
    const ctx = picker.getContext("2d");
    picker.style.aspectRatio = `${W} / ${H}`;
    if (D.images.length) {
      const [h, w] = D.image_size;
      picker.width = w;
      picker.height = h;
      ctx.putImageData(pixelsToImageData(ctx, D.images[view.state.image], w, h), 0, 0);
    } else {
      picker.width = W;
      picker.height = H;
      for (let r = 0; r < H; r++) {
        for (let c = 0; c < W; c++) {
          ctx.fillStyle = (r + c) % 2 ? "#e4e4e4" : "#f4f4f4";
          ctx.fillRect(c, r, 1, 1);
        }
      }
    }
  }

  // The maps over the image (the overlay setting): the image in grey as the background of each
  // map's frame, the map drawn translucent (style.css); set when the image or the maps change.
  function drawUnder() {
    mapsEl.classList.toggle("overlay", view.state.overlay);
    const key = view.state.overlay ? `${view.model}/${view.state.image}` : null;
    if (underDrawn === key) return;
    underDrawn = key;
    let url = "none";
    if (key) {
      const [h, w] = D.image_size;
      const info = D.images[view.state.image], px = bytes(info.pixels);
      const grey = document.createElement("canvas");
      grey.width = w;
      grey.height = h;
      const ctx = grey.getContext("2d");
      const img = ctx.createImageData(w, h);
      for (let i = 0; i < w * h; i++) {
        const v = info.channels === 1 ? px[i] : Math.round(0.2126 * px[3 * i] + 0.7152 * px[3 * i + 1] + 0.0722 * px[3 * i + 2]);
        img.data.set([v, v, v, 255], 4 * i);
      }
      ctx.putImageData(img, 0, 0);
      url = `url(${grey.toDataURL()})`;
    }
    for (const { frame } of cells.flat()) frame.style.backgroundImage = url;
  }

  function pixelsToImageData(ctx, info, w, h) {
    const px = bytes(info.pixels);
    const img = ctx.createImageData(w, h);
    for (let i = 0; i < w * h; i++) {
      const rgb = info.channels === 1 ? [px[i], px[i], px[i]] : [px[3 * i], px[3 * i + 1], px[3 * i + 2]];
      img.data.set([...rgb, 255], 4 * i);
    }
    return img;
  }

  function queryFromEvent(event) {
    const rect = picker.getBoundingClientRect();
    const r = Math.floor(((event.clientY - rect.top) / rect.height) * H);
    const c = Math.floor(((event.clientX - rect.left) / rect.width) * W);
    setQuery(Math.max(0, Math.min(H - 1, r)), Math.max(0, Math.min(W - 1, c)));
  }
  // The picker keeps the pointer while a button is down, so a drag past the image's edge still
  // moves the query (to the edge token).
  picker.addEventListener("pointerdown", (e) => {
    picker.focus();
    picker.setPointerCapture(e.pointerId);
    queryFromEvent(e);
  });
  picker.addEventListener("pointermove", (e) => { if (picker.hasPointerCapture(e.pointerId)) queryFromEvent(e); });
  picker.addEventListener("pointerup", (e) => { if (picker.hasPointerCapture(e.pointerId)) picker.releasePointerCapture(e.pointerId); });
  picker.addEventListener("keydown", (e) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (!moves[e.key]) return;
    e.preventDefault();
    const [r, c] = view.state.query;
    setQuery(Math.max(0, Math.min(H - 1, r + moves[e.key][0])), Math.max(0, Math.min(W - 1, c + moves[e.key][1])));
  });

  function setQuery(r, c) {
    if (!D || (r === view.state.query[0] && c === view.state.query[1])) return;
    view.state.query = [r, c];
    if (view.ready) render(); else placeMarker($("picker-marker"), view.state.query, [H, W]);
  }
  function setMode(mode) { view.state.mode = mode; syncControls(); if (D && view.ready) render(); }
  function setSoftmax(on) { view.state.softmax = Boolean(on); syncControls(); if (D && view.ready) render(); }
  function setScale(scale) { view.state.scale = scale === "shared" ? "shared" : "map"; if (D && view.ready) render(); }
  // "heads", or for a model with a class token "class" or "rollout".
  function setView(name) {
    if (!D) return;
    view.state.view = D.class_token && ["class", "rollout"].includes(name) ? name : "heads";
    syncControls();
    buildMaps();
    view.hover = null;
    if (view.ready) render();
  }
  function setOverlay(on) { view.state.overlay = Boolean(on); syncControls(); if (D && view.ready) render(); }

  // The score controls show what the maps show: the user's choice, or for the average over
  // images (always of total-score probabilities) that, greyed out, with a note; the user's
  // choice comes back with the next single image.
  // Only the controls that apply are offered: the views for a model with a class token, the
  // overlay for a model with images, the score terms for the per-head maps of a model with
  // content scores (the terms only when it has both), its logits named as the data names them.
  function syncControls() {
    if (!D) return;
    const info = D.images[view.state.image];
    const average = Boolean(info && info.average);
    const mode = average ? "total" : scoreMode();
    const both = Boolean(D.terms && D.terms.content && D.terms.position);
    $("views").hidden = !D.class_token && !D.images.length;
    $("view-choice").hidden = !D.class_token;
    document.querySelectorAll("input[name=view]").forEach((el) => { el.checked = el.value === view.state.view; });
    $("overlay-choice").hidden = !D.images.length;
    $("overlay").checked = view.state.overlay;
    $("modes").hidden = D.kind !== "content" || view.state.view !== "heads";
    document.querySelectorAll("input[name=mode]").forEach((el) => {
      el.checked = el.value === mode;
      el.parentElement.hidden = !both;
    });
    $("softmax-label").textContent = D.logit ? `softmax, else ${D.logit}` : "softmax";
    $("softmax").checked = average || view.state.softmax;
    $("modes").disabled = average;
    $("modes-note").hidden = !average;
    $("modes-note").textContent = average
      ? `The average over ${info.average} test images is of the attention probabilities of the total score.`
      : "";
  }

  function status(text) { $("status").textContent = text; }

  // While a model or an image loads, the maps still show the previous one: grey them out and
  // say what is coming.
  function setLoading(what) {
    mapsEl.classList.toggle("stale", Boolean(what));
    mapsEl.setAttribute("aria-busy", String(Boolean(what)));
    status(what ? `computing the attention for ${what} …` : "");
    if (what) $("hover-readout").textContent = HOVER_HELP;
  }

  async function setImage(index) {
    view.state.image = index;
    document.querySelectorAll("#images button").forEach((el, i) => el.setAttribute("aria-pressed", String(i === index)));
    drawPicker();
    syncControls();
    if (D.kind === "position") { render(); return; }
    const model = M;
    if (!model.images[index]) {
      view.ready = false;
      setLoading(D.images[index].label);
      try {
        await imageData(model, index);
      } catch (err) {
        status(err.message);
        return;
      }
    }
    if (M === model && view.state.image === index) render();
  }

  // The query token of the new grid at the same place of the image (the same token when the
  // grids are equal), so that models can be compared at one token.
  function carriedQuery(query, from, to) {
    if (!from) return [Math.floor(to[0] / 2), Math.floor(to[1] / 2)];
    return query.map((q, axis) => Math.min(to[axis] - 1, Math.floor(((q + 0.5) * to[axis]) / from[axis])));
  }

  async function setModel(index) {
    const info = SITE.models[index];
    const previous = D;
    view.model = index;
    view.ready = false;
    view.hover = null;
    $("model-select").value = String(index);
    showHeader(info);
    setLoading(info.name);
    let model;
    try {
      model = await modelData(index);
    } catch (err) {
      status(err.message);
      return;
    }
    if (view.model !== index) return;
    M = model;
    D = model.data;
    view.data = D;
    view.state.query = carriedQuery(view.state.query, previous && previous.grid, D.grid);
    [H, W] = D.grid;
    N = H * W;
    G = layerGrids();
    view.maps = [];
    // the same test image when the new model has it, else its first
    const label = previous && previous.images[view.state.image] && previous.images[view.state.image].label;
    const same = D.images.findIndex((image) => image.label === label);
    if (!D.class_token) view.state.view = "heads";
    showMeta();
    showContent();
    buildMaps();
    buildImages();
    await setImage(same >= 0 ? same : 0);
  }

  // ------------------------------------------------------------------ header

  function percent(x) { return `${(100 * x).toFixed(1)}%`; }

  function showHeader(info) {
    $("model-name").textContent = info.name;
    document.title = `${info.name}: ${SITE.title}`;
    $("description").textContent = info.description || "";
    const measured = info.test_accuracy !== null && info.test_accuracy !== undefined;
    const accuracy = measured ? `test accuracy ${percent(info.test_accuracy)}` : "test accuracy — (not measured)";
    $("accuracy").textContent = measured && info.dataset ? `${accuracy} on ${info.dataset}` : info.dataset ? `${info.dataset}: ${accuracy}` : accuracy;
    $("meta").textContent = "";
    $("content-readout").replaceChildren();
  }

  function showMeta() {
    const meta = Object.entries(D.meta).map(([k, v]) => `${k}: ${v}`);
    if (D.layer_grids) {
      meta.push(`image ${H}×${W}; transformed layers, input → output pixels: ` +
        G.map((g, layer) => `${layer} ${g.name} ${g.kh}×${g.kw} → ${g.qh}×${g.qw}`).join(", "));
    } else {
      meta.push(`token grid ${H}×${W}` + (D.stem > 1 ? ` (image ${D.image_size[0]}×${D.image_size[1]}, ${D.stem}×${D.stem} pixels a token)` : ""));
    }
    meta.push(`${D.heads.length} layers × ${Math.max(...D.heads)} heads`);
    meta.push({
      position: "position-only attention: the same for every image",
      content: "attention with content scores: per image",
      probabilities: "attention probabilities per image: Gaussian heads mixed with content attention by their gates",
    }[D.kind]);
    $("meta").textContent = meta.join(" · ");
  }

  // "0.998–1.000" (or one value when both ends print the same) over the values that are not
  // null; "—" without any.
  function spread(values, digits) {
    const known = values.filter((v) => v !== null);
    if (!known.length) return "—";
    const [lo, hi] = [Math.min(...known), Math.max(...known)].map((v) => v.toFixed(digits));
    return lo === hi ? lo : `${lo}–${hi}`;
  }

  // Whether the model's content attention is alive (D.content, attnconv.analysis.content), one
  // line per layer: the entropy of its heads' content maps ÷ log N, its gates, its query and key
  // norms against the start, and the predictions that change when its content maps are uniform.
  function showContent() {
    const el = $("content-readout");
    el.replaceChildren();
    const C = D.content;
    if (!C) return;
    const share = (x) => `${(100 * x).toFixed(2)}%`;
    const accuracy = (x) => (x === null || x === undefined ? "" : `, accuracy ${share(x)}`);
    const images = `${C.images} test image${C.images === 1 ? "" : "s"}`;
    const lines = [`Content attention on ${images}` +
      (C.accuracy === null || C.accuracy === undefined ? "" : ` (accuracy ${share(C.accuracy)})`) +
      ": entropy ÷ log N of each head's content map (1: uniform, 0: one-hot); uniform: the " +
      "predictions that change when the layer's content maps are replaced by uniform attention."];
    for (const L of C.layers) {
      const parts = [`${L.name} (N ${L.keys}): entropy ÷ log N ${spread(L.entropy, 3)}`];
      if (L.gates) parts.push(`gate ${spread(L.gates, 2)}`);
      if (L.query_ratio !== null && L.key_ratio !== null) {
        parts.push(`q, k norms ×${L.query_ratio.toFixed(2)}, ×${L.key_ratio.toFixed(2)} of the start`);
      }
      parts.push(`uniform: ${L.changed} of ${C.images} predictions changed${accuracy(L.accuracy)}`);
      lines.push(parts.join(" · "));
    }
    lines.push(`every layer uniform at once: ${C.changed} of ${C.images} predictions changed` +
      accuracy(C.ablated_accuracy));
    for (const text of lines) {
      const line = document.createElement("p");
      line.textContent = text;
      el.appendChild(line);
    }
  }

  // ------------------------------------------------------------------ start

  $("site-title").textContent = SITE.title;
  $("help-floor").textContent = FLOOR;
  const select = $("model-select");
  SITE.models.forEach((info, i) => {
    const option = document.createElement("option");
    option.value = String(i);
    option.textContent = info.name;
    select.appendChild(option);
  });
  select.addEventListener("change", () => setModel(Number(select.value)));
  $("switcher").hidden = SITE.models.length < 2;
  if (SITE.skipped.length) {
    $("skipped").textContent = "Not explorable: " + SITE.skipped.map((s) => `${s.name} (${s.reason})`).join("; ");
  }
  document.querySelectorAll("input[name=mode]").forEach((el) => el.addEventListener("change", () => setMode(el.value)));
  $("softmax").addEventListener("change", (e) => setSoftmax(e.target.checked));
  document.querySelectorAll("input[name=scale]").forEach((el) => el.addEventListener("change", () => setScale(el.value)));
  document.querySelectorAll("input[name=view]").forEach((el) => el.addEventListener("change", () => setView(el.value)));
  $("overlay").addEventListener("change", (e) => setOverlay(e.target.checked));
  setModel(0);
})();
