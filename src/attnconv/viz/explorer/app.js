// attnconv explorer: every layer × head attention map for a clicked query token.
// Data comes from data.js (window.ATTNCONV_DATA) and, for models with content scores, one
// images/image_NNN.js per test image (window.ATTNCONV_IMAGES[i]), loaded when the image is picked.
// The format is documented in attnconv/viz/export.py. The displayed arrays are exposed as
// window.attnconv.maps[layer][head] (Float64Array over key tokens, row-major).
"use strict";

(function () {
  const D = window.ATTNCONV_DATA;
  if (!D || D.format !== "attnconv-explorer") {
    document.getElementById("maps").textContent =
      "data.js is missing or is not an attnconv explorer export.";
    return;
  }
  const [H, W] = D.grid;
  const N = H * W;
  const CMAP = bytes(D.colormap);
  const view = {
    data: D,
    state: { image: 0, query: [Math.floor(H / 2), Math.floor(W / 2)], mode: "total", softmax: true },
    maps: [],
    scales: [],
    ready: false,
    setQuery, setImage, setMode, setSoftmax,
  };
  window.attnconv = view;

  // ------------------------------------------------------------------ decoding

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

  const positionLayers = D.kind === "position" ? D.layers.map((p) =>
    p.type === "product" ? { type: "product", row: f32(p.row), col: f32(p.col) } : quantized(p)) : null;
  const imageCache = {};

  // ------------------------------------------------------------------ maps

  // Probabilities of a position-only layer: R[q1, k1] * C[q2, k2], or a stored row.
  function positionProbs(layer, head, q1, q2) {
    const L = positionLayers[layer];
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
    const L = image[layer];
    const out = new Float64Array(N);
    let present = false;
    if (mode !== "position" && L.content) {
      const c = quantizedRow(L.content, head * N + q);
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

  function computeMaps() {
    const [q1, q2] = view.state.query;
    const image = D.kind === "content" ? imageCache[view.state.image] : null;
    return D.heads.map((heads, layer) => {
      const row = [];
      for (let head = 0; head < heads; head++) {
        if (D.kind === "position") { row.push(positionProbs(layer, head, q1, q2)); continue; }
        const x = logits(image, layer, head, q1 * W + q2, view.state.mode);
        row.push(x && view.state.softmax ? softmax(x) : x);
      }
      return row;
    });
  }

  // ------------------------------------------------------------------ drawing

  const mapsEl = document.getElementById("maps");
  const cells = [];
  const maxHeads = Math.max(...D.heads);
  mapsEl.style.gridTemplateColumns = `1.4rem repeat(${maxHeads}, minmax(44px, ${Math.max(64, 900 / maxHeads)}px))`;
  mapsEl.appendChild(document.createElement("div"));
  for (let head = 0; head < maxHeads; head++) {
    const el = document.createElement("div");
    el.className = "col-head";
    el.textContent = `head ${head}`;
    mapsEl.appendChild(el);
  }
  D.heads.forEach((heads, layer) => {
    const label = document.createElement("div");
    label.className = "row-head";
    label.textContent = `layer ${layer}`;
    mapsEl.appendChild(label);
    const row = [];
    for (let head = 0; head < maxHeads; head++) {
      const cell = document.createElement("div");
      mapsEl.appendChild(cell);
      if (head >= heads) continue;
      cell.className = "map";
      const canvas = document.createElement("canvas");
      canvas.width = W;
      canvas.height = H;
      canvas.style.aspectRatio = `${W} / ${H}`;
      const marker = document.createElement("div");
      marker.className = "marker";
      const scale = document.createElement("div");
      scale.className = "scale";
      cell.append(canvas, marker, scale);
      canvas.addEventListener("mousemove", (e) => hover(e, canvas, layer, head));
      row.push({ cell, canvas, marker, scale });
    }
    cells.push(row);
  });

  function placeMarker(el, query) {
    el.style.left = `${(100 * query[1]) / W}%`;
    el.style.top = `${(100 * query[0]) / H}%`;
    el.style.width = `${100 / W}%`;
    el.style.height = `${100 / H}%`;
  }

  function drawMap(canvas, values, fromZero) {
    let lo = fromZero ? 0 : Infinity, hi = -Infinity;
    for (const v of values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(W, H);
    const span = hi > lo ? hi - lo : 1;
    for (let k = 0; k < N; k++) {
      const c = Math.round((255 * (values[k] - lo)) / span);
      img.data.set([CMAP[3 * c], CMAP[3 * c + 1], CMAP[3 * c + 2], 255], 4 * k);
    }
    ctx.putImageData(img, 0, 0);
    return [lo, hi];
  }

  function render() {
    const image = D.kind === "content" ? imageCache[view.state.image] : true;
    if (!image) return;
    const maps = computeMaps();
    const probabilities = D.kind === "position" || view.state.softmax;
    view.scales = maps.map((row, layer) => row.map((values, head) => {
      const { cell, canvas, marker, scale } = cells[layer][head];
      placeMarker(marker, view.state.query);
      cell.classList.toggle("empty", values === null);
      if (values === null) { scale.textContent = "no such term"; return null; }
      const [lo, hi] = drawMap(canvas, values, probabilities);
      scale.textContent = probabilities ? `max ${hi.toFixed(3)}` : `${lo.toFixed(1)} … ${hi.toFixed(1)}`;
      return [lo, hi];
    }));
    view.maps = maps;
    placeMarker(document.getElementById("picker-marker"), view.state.query);
    const [q1, q2] = view.state.query;
    const where = D.stem > 1 ? `, pixels ${q1 * D.stem}–${(q1 + 1) * D.stem - 1} × ${q2 * D.stem}–${(q2 + 1) * D.stem - 1}` : "";
    const image_label = D.kind === "content" ? `${D.images[view.state.image].label}: ` : "";
    document.getElementById("query-readout").textContent = `${image_label}query token (row ${q1}, col ${q2})${where}`;
    view.ready = true;
  }

  function hover(event, canvas, layer, head) {
    const values = view.maps[layer] && view.maps[layer][head];
    if (!values) return;
    const rect = canvas.getBoundingClientRect();
    const k1 = Math.min(H - 1, Math.floor(((event.clientY - rect.top) / rect.height) * H));
    const k2 = Math.min(W - 1, Math.floor(((event.clientX - rect.left) / rect.width) * W));
    const kind = D.kind === "position" || view.state.softmax ? "probability" : "logit";
    document.getElementById("hover-readout").textContent =
      `layer ${layer}, head ${head}, key (${k1}, ${k2}): ${kind} ${values[k1 * W + k2].toPrecision(4)}`;
  }

  // ------------------------------------------------------------------ picker and controls

  const picker = document.getElementById("picker");
  picker.tabIndex = 0;
  picker.style.aspectRatio = `${W} / ${H}`;

  function drawPicker() {
    const ctx = picker.getContext("2d");
    if (D.kind === "content") {
      const [h, w] = D.image_size;
      const info = D.images[view.state.image];
      picker.width = w;
      picker.height = h;
      ctx.putImageData(pixelsToImageData(ctx, info, w, h), 0, 0);
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
  picker.addEventListener("pointerdown", (e) => { picker.focus(); queryFromEvent(e); });
  picker.addEventListener("pointermove", (e) => { if (e.buttons) queryFromEvent(e); });
  picker.addEventListener("keydown", (e) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (!moves[e.key]) return;
    e.preventDefault();
    const [r, c] = view.state.query;
    setQuery(Math.max(0, Math.min(H - 1, r + moves[e.key][0])), Math.max(0, Math.min(W - 1, c + moves[e.key][1])));
  });

  function setQuery(r, c) {
    if (r === view.state.query[0] && c === view.state.query[1]) return;
    view.state.query = [r, c];
    render();
  }
  function setMode(mode) { view.state.mode = mode; render(); }
  function setSoftmax(on) { view.state.softmax = Boolean(on); render(); }

  function setImage(index) {
    view.state.image = index;
    document.querySelectorAll("#images canvas").forEach((el, i) => el.classList.toggle("selected", i === index));
    drawPicker();
    if (imageCache[index]) { render(); return; }
    view.ready = false;
    const script = document.createElement("script");
    script.src = D.images[index].file;
    script.onload = () => {
      imageCache[index] = window.ATTNCONV_IMAGES[index].layers.map((l) => ({
        content: l.content && quantized(l.content),
        position: l.position && quantized(l.position),
      }));
      delete window.ATTNCONV_IMAGES[index];
      if (view.state.image === index) render();
    };
    script.onerror = () => {
      document.getElementById("hover-readout").textContent = `could not load ${D.images[index].file}`;
    };
    document.body.appendChild(script);
  }

  // ------------------------------------------------------------------ start

  document.getElementById("title").textContent = D.title;
  document.title = D.title;
  const meta = Object.entries(D.meta).map(([k, v]) => `${k}: ${v}`);
  meta.push(`token grid ${H}×${W}` + (D.stem > 1 ? ` (image ${D.image_size[0]}×${D.image_size[1]}, ${D.stem}×${D.stem} pixels a token)` : ""));
  meta.push(D.kind === "position" ? "position-only attention: the same for every image" : "attention with content scores: per image");
  document.getElementById("meta").textContent = meta.join(" · ");

  if (D.kind === "content") {
    const strip = document.getElementById("images");
    D.images.forEach((info, i) => {
      const thumb = document.createElement("canvas");
      thumb.width = D.image_size[1];
      thumb.height = D.image_size[0];
      thumb.title = info.label;
      thumb.getContext("2d").putImageData(pixelsToImageData(thumb.getContext("2d"), info, thumb.width, thumb.height), 0, 0);
      thumb.addEventListener("click", () => setImage(i));
      strip.appendChild(thumb);
    });
    const modes = document.getElementById("modes");
    modes.hidden = false;
    modes.querySelectorAll("input[name=mode]").forEach((el) => el.addEventListener("change", () => setMode(el.value)));
    document.getElementById("softmax").addEventListener("change", (e) => setSoftmax(e.target.checked));
    setImage(0);
  } else {
    drawPicker();
    render();
  }
})();
