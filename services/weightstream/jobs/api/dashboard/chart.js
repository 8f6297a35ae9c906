// The loss chart: training loss (a line) and eval loss (a line with dots) by step, drawn as SVG. CSS
// sizes the chart (the page's width); its viewBox follows that size in CSS pixels, so a wider window
// gives more room to the lines, not larger text. No library: a few dozen lines, and nothing to vendor.

const SVG = "http://www.w3.org/2000/svg";
const MAX_DRAWN = 2000; // more points than pixels only costs time: longer runs are thinned to this many
const PAD = { left: 70, right: 16, top: 14, bottom: 44 }; // room for the ticks and the axis titles

export class LossChart {
  constructor(svg) {
    this.svg = svg;
    const box = svg.viewBox.baseVal; // the page's default, until the chart is laid out
    this.width = box.width;
    this.height = box.height;
    this.reset();
    new ResizeObserver(([entry]) => this.resize(entry.contentRect)).observe(svg);
  }

  // A new size from CSS (the window changed, or the chart was shown): the same pixels in the viewBox,
  // then drawn again. A hidden chart measures 0 and keeps its last size.
  resize({ width, height }) {
    [width, height] = [Math.round(width), Math.round(height)];
    if (!width || !height || (width === this.width && height === this.height)) return;
    [this.width, this.height] = [width, height];
    this.svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    this.draw();
  }

  reset() {
    this.loss = []; // [step, value], in the order they came (steps rise, but a resumed job repeats some)
    this.evals = [];
    this.scheduled = false;
    this.draw();
  }

  add(series, step, value) {
    if (value === null || !Number.isFinite(value)) return; // the service sends a non-finite loss as null
    this[series].push([step, value]);
    // events arrive in bursts (a whole history when a job is opened): draw once per frame, not per event
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => {
        this.scheduled = false;
        this.draw();
      });
    }
  }

  draw() {
    const all = [...this.loss, ...this.evals];
    this.svg.replaceChildren();
    this.svg.dataset.points = String(this.loss.length);
    this.svg.dataset.evals = String(this.evals.length);
    if (!all.length) {
      this.text(this.width / 2, this.height / 2, "no steps yet", "empty");
      return;
    }
    const xs = span(all.map((p) => p[0]));
    const ys = span(all.map((p) => p[1]));
    const x = (step) => PAD.left + ((step - xs.lo) / (xs.hi - xs.lo)) * (this.width - PAD.left - PAD.right);
    const y = (v) => this.height - PAD.bottom - ((v - ys.lo) / (ys.hi - ys.lo)) * (this.height - PAD.top - PAD.bottom);
    for (const t of ticks(ys.lo, ys.hi)) {
      this.line(PAD.left, y(t), this.width - PAD.right, y(t), "grid");
      this.text(PAD.left - 6, y(t) + 4, String(t), "tick y"); // ticks() rounded it
    }
    for (const t of ticks(xs.lo, xs.hi).filter(Number.isInteger)) {
      this.text(x(t), this.height - PAD.bottom + 18, String(t), "tick x");
    }
    this.line(PAD.left, this.height - PAD.bottom, this.width - PAD.right, this.height - PAD.bottom, "axis");
    const [midX, midY] = [(PAD.left + this.width - PAD.right) / 2, (PAD.top + this.height - PAD.bottom) / 2];
    this.text(midX, this.height - 6, "step", "title x");
    this.text(16, midY, "loss", "title y").setAttribute("transform", `rotate(-90 16 ${midY})`);
    this.polyline(thin(this.loss), x, y, "loss");
    this.polyline(this.evals, x, y, "eval");
    for (const [s, v] of this.evals) this.element("circle", { cx: x(s), cy: y(v), r: 3.5, class: "eval" });
  }

  polyline(points, x, y, cls) {
    const coords = points.map(([s, v]) => `${x(s).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    this.element("polyline", { points: coords, class: cls });
  }

  line(x1, y1, x2, y2, cls) {
    this.element("line", { x1, y1, x2, y2, class: cls });
  }

  text(x, y, content, cls) {
    const node = this.element("text", { x, y, class: cls });
    node.textContent = content;
    return node;
  }

  element(tag, attributes) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
    return this.svg.appendChild(node);
  }
}

// The data's range, padded so that no point sits on the frame (and never empty: one point still draws).
function span(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    // a loop, not Math.min(...values): a long run's million points would overflow the call stack
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
  return { lo: lo - pad, hi: hi + pad };
}

// About five round numbers (1, 2 or 5 times a power of ten apart) between lo and hi.
function ticks(lo, hi) {
  const raw = (hi - lo) / 5;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

// Every k-th point of a long series, and always the last, so at most about MAX_DRAWN are drawn.
function thin(points) {
  if (points.length <= MAX_DRAWN) return points;
  const k = Math.ceil(points.length / MAX_DRAWN);
  return points.filter((_, i) => i % k === 0 || i === points.length - 1);
}
