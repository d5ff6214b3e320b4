// attnconv explorer: every layer × head attention map for a clicked query token, for each model
// of the site. data.js (window.ATTNCONV_SITE) lists the models; a model's models/I/model.js and
// its per-image files are loaded when first shown; each data file assigns its object to
// window.ATTNCONV_FILES[its path]. The format is documented in attnconv/viz/export.py. The
// displayed arrays are exposed as window.attnconv.maps[layer][head] (Float64Array over key
// tokens, row-major) and each layer's query as window.attnconv.queries[layer] (the picked token,
// or for a transformed network's layer, which attends from its output pixels over its input
// pixels, the output pixel nearest the picked pixel); window.attnconv.ready is false while a
// model or an image is loading (the maps then show the previous one, greyed out); names and
// captions from the data are only ever inserted as text.
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
  const HOVER_HELP = "Hover or tap a map to read its values.";

  // The model shown: its data (model.js), decoded layers, decoded image files, the picker's token
  // grid, and each layer's query and key grids (layerGrids).
  let M = null, D = null, H = 0, W = 0, N = 0, G = [];
  const view = {
    site: SITE,
    model: -1,
    data: null,
    state: { image: 0, query: [0, 0], mode: "total", softmax: true, scale: "map" },
    maps: [],
    queries: [],
    scales: [],
    hover: null,
    ready: false,
    setModel, setQuery, setImage, setMode, setSoftmax, setScale,
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
    model.images[index] = payload.average
      ? { average: payload.average.map(quantized) }
      : payload.probs
      ? { probs: payload.probs.map(quantized) }
      : { layers: payload.layers.map((l) => ({
          content: l.content && content(l.content),
          position: l.position && quantized(l.position),
        })) };
    return model.images[index];
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
  function keyCount(layer) { return G[layer].kh * G[layer].kw; }

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

  function softmax(x) {
    let max = -Infinity, sum = 0;
    for (const v of x) max = Math.max(max, v);
    const out = new Float64Array(x.length);
    for (let k = 0; k < x.length; k++) { out[k] = Math.exp(x[k] - max); sum += out[k]; }
    for (let k = 0; k < x.length; k++) out[k] /= sum;
    return out;
  }

  // Whether the maps shown are probabilities (else logits).
  function showsProbabilities() {
    return D.kind !== "content" || view.state.softmax || Boolean(currentImage().average);
  }
  function currentImage() { return M.images[view.state.image] || {}; }

  function computeMaps() {
    const image = currentImage();
    const stored = image.average || image.probs;  // probabilities as they are shown
    return D.heads.map((heads, layer) => {
      const [q1, q2] = layerQuery(layer);
      const queries = G[layer].qh * G[layer].qw, q = q1 * G[layer].qw + q2;
      const row = [];
      for (let head = 0; head < heads; head++) {
        if (D.kind === "position") row.push(positionProbs(layer, head, q1, q2));
        else if (stored) row.push(quantizedRow(stored[layer], head * queries + q));
        else {
          const x = logits(image, layer, head, q, view.state.mode);
          row.push(x && view.state.softmax ? softmax(x) : x);
        }
      }
      return row;
    });
  }

  // ------------------------------------------------------------------ layout of one model

  const mapsEl = $("maps");
  let cells = [];

  function buildMaps() {
    mapsEl.replaceChildren();
    cells = [];
    const maxHeads = Math.max(...D.heads);
    // columns share the width (nothing wider than the screen), up to about 100 px a map
    mapsEl.style.gridTemplateColumns = `1.2rem repeat(${maxHeads}, minmax(0, 1fr))`;
    mapsEl.style.maxWidth = `calc(1.2rem + ${maxHeads * 106}px)`;
    mapsEl.appendChild(document.createElement("div"));
    for (let head = 0; head < maxHeads; head++) mapsEl.appendChild(heading("col-head", "head", head));
    D.heads.forEach((heads, layer) => {
      const rowHead = heading("row-head", "layer", layer);
      if (G[layer].name) rowHead.title = G[layer].name;
      mapsEl.appendChild(rowHead);
      const row = [];
      for (let head = 0; head < maxHeads; head++) {
        const cell = document.createElement("div");
        mapsEl.appendChild(cell);
        if (head >= heads) continue;
        cell.className = "map";
        // The outline is placed in a frame holding only the canvas, so that it lines up with
        // the map's tokens (not with the map plus its caption).
        const frame = document.createElement("div");
        frame.className = "frame";
        const canvas = document.createElement("canvas");
        canvas.width = G[layer].kw;
        canvas.height = G[layer].kh;
        canvas.style.aspectRatio = `${G[layer].kw} / ${G[layer].kh}`;
        canvas.setAttribute("aria-label", `layer ${layer}, head ${head}`);
        const marker = document.createElement("div");
        marker.className = "marker";
        frame.append(canvas, marker);
        const scale = document.createElement("div");
        scale.className = "scale";
        cell.append(frame, scale);
        canvas.addEventListener("pointermove", (e) => hover(e, canvas, layer, head));
        canvas.addEventListener("pointerdown", (e) => hover(e, canvas, layer, head));
        canvas.addEventListener("pointerleave", (e) => { if (e.pointerType === "mouse") leave(); });
        row.push({ cell, canvas, marker, scale });
      }
      cells.push(row);
    });
  }

  // "head 3" / "layer 2" (on phones the columns read "h3": style.css hides the word).
  function heading(className, word, number) {
    const el = document.createElement("div");
    el.className = className;
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = `${word} `;
    el.append(span, String(number));
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

  function range(values, fromZero) {
    let lo = fromZero ? 0 : Infinity, hi = -Infinity;
    for (const v of values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    return [lo, hi];
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
    const maps = computeMaps();
    const probabilities = showsProbabilities();
    const ranges = maps.map((row) => row.map((values) => values && range(values, probabilities)));
    const present = ranges.flat().filter(Boolean);
    const shared = present.length
      ? [Math.min(...present.map((r) => r[0])), Math.max(...present.map((r) => r[1]))]
      : [0, 1];
    view.scales = maps.map((row, layer) => row.map((values, head) => {
      const { cell, canvas, marker, scale } = cells[layer][head];
      placeMarker(marker, queryOnKeys(layer), [G[layer].kh, G[layer].kw]);
      cell.classList.toggle("empty", values === null);
      if (values === null) { caption(scale, [["value", "no such term"]]); return null; }
      const [lo, hi] = ranges[layer][head];
      drawMap(canvas, values, view.state.scale === "shared" ? shared : [lo, hi]);
      if (probabilities) {
        caption(scale, [["value", formatValue(hi)], ["times", ` = ${uniformMultiple(hi, keyCount(layer))}`]]);
      } else {
        const [a, b] = formatRange(lo, hi);
        caption(scale, [["value", `${a} … ${b}`]]);
      }
      return view.state.scale === "shared" ? shared : [lo, hi];
    }));
    view.maps = maps;
    view.queries = D.heads.map((_, layer) => layerQuery(layer));
    drawColorbar(probabilities, shared);
    placeMarker($("picker-marker"), view.state.query, [H, W]);
    const [q1, q2] = view.state.query;
    const where = D.stem > 1 ? `, pixels ${q1 * D.stem}–${(q1 + 1) * D.stem - 1} × ${q2 * D.stem}–${(q2 + 1) * D.stem - 1}` : "";
    const image = D.images.length && D.kind !== "position" ? `${D.images[view.state.image].label}: ` : "";
    $("query-readout").textContent = D.layer_grids
      ? `${image}query pixel (row ${q1}, col ${q2}); each layer's query is its output pixel nearest it, outlined on its input`
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
    const kind = probabilities ? "probability" : "logit";
    const mark = $("colorbar-uniform");
    if (view.state.scale === "shared") {
      const [lo, hi] = probabilities ? shared.map(formatValue) : formatRange(...shared);
      $("colorbar-lo").textContent = lo;
      $("colorbar-hi").textContent = hi;
      $("colorbar-caption").textContent = `${kind}, one scale for all maps`;
    } else {
      $("colorbar-lo").textContent = probabilities ? "0" : "min";
      $("colorbar-hi").textContent = "max";
      $("colorbar-caption").textContent = `${kind}, each map from ${probabilities ? "0" : "its minimum"} to its maximum, printed under it`;
    }
    // the uniform level 1/N: where a head that looks everywhere alike would sit (N the keys of
    // a layer: one level for the whole bar only when every layer has the same keys)
    const counts = [...new Set(G.map((_, layer) => keyCount(layer)))];
    const uniform = 1 / counts[0];
    const span = shared[1] - shared[0];
    const onBar = probabilities && counts.length === 1 && view.state.scale === "shared" && span > 0 && uniform <= shared[1];
    mark.hidden = !onBar;
    if (onBar) mark.style.left = `${(100 * (uniform - shared[0])) / span}%`;
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
    const { kh, kw } = G[layer];
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
    const value = values[k1 * G[h.layer].kw + k2];
    $("hover-readout").textContent =
      `layer ${h.layer}, head ${h.head}, key (${k1}, ${k2}): ${probabilities ? "probability" : "logit"} ` +
      `${value.toPrecision(4)}` + (probabilities ? ` (${uniformMultiple(value, keyCount(h.layer))})` : "");
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

  // The score controls show what the maps show: the user's choice, or for the average over
  // images (always of total-score probabilities) that, greyed out, with a note; the user's
  // choice comes back with the next single image.
  function syncControls() {
    const info = D && D.images[view.state.image];
    const average = Boolean(info && info.average);
    const mode = average ? "total" : view.state.mode;
    document.querySelectorAll("input[name=mode]").forEach((el) => { el.checked = el.value === mode; });
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
    showMeta();
    buildMaps();
    buildImages();
    $("modes").hidden = D.kind !== "content";
    await setImage(same >= 0 ? same : 0);
  }

  // ------------------------------------------------------------------ header

  function percent(x) { return `${(100 * x).toFixed(1)}%`; }

  function showHeader(info) {
    $("model-name").textContent = info.name;
    document.title = `${info.name}: ${SITE.title}`;
    $("description").textContent = info.description || "";
    const facts = [];
    if (info.test_accuracy !== null && info.test_accuracy !== undefined) facts.push(`test accuracy ${percent(info.test_accuracy)}`);
    if (info.dataset) facts.push(info.dataset);
    $("accuracy").textContent = facts.join(" on ");
    $("meta").textContent = "";
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

  // ------------------------------------------------------------------ start

  $("site-title").textContent = SITE.title;
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
  setModel(0);
})();
