// A bar chart drawn as inline SVG: no library, themed through CSS variables.

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

/** points: [{label, value, title?}]. Returns an <svg> with role="img" and a text summary. */
export function barChart(points, { height = 180, width = 720, label = "Chart", unit = "" } = {}) {
  const pad = { top: 10, right: 8, bottom: 22, left: 38 };
  const max = Math.max(1, ...points.map((p) => p.value));
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const step = innerW / Math.max(1, points.length);
  const total = points.reduce((a, p) => a + p.value, 0);
  // unit: a word, or n => word, so "1 execution" and "2 executions" both read right.
  const unitOf = typeof unit === "function" ? unit : () => unit;
  const root = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `${label}: ${total} ${unitOf(total)} in total over ${points.length} ${points.length === 1 ? "bar" : "bars"}, peak ${max}`,
  });
  root.append(svg("line", { class: "axis", x1: pad.left, x2: width - pad.right, y1: pad.top + innerH, y2: pad.top + innerH }));
  // Whole-number gridlines only: 0, max, and the middle when it is a whole number.
  const ticks = [...new Set([0, max % 2 === 0 ? max / 2 : null, max].filter((t) => t !== null))];
  for (const tick of ticks) {
    const y = pad.top + innerH - innerH * (tick / max);
    root.append(svg("line", { class: "axis", x1: pad.left, x2: width - pad.right, y1: y, y2: y, "stroke-dasharray": tick ? "2 3" : "" }));
    root.append(svg("text", { x: pad.left - 4, y: y + 3, "text-anchor": "end" }, tick));
  }
  const labelEvery = Math.ceil(points.length / 12);
  points.forEach((p, i) => {
    const h = (p.value / max) * innerH;
    const x = pad.left + i * step + step * 0.15;
    const bar = svg("rect", { class: "bar", x, y: pad.top + innerH - h, width: Math.max(1, step * 0.7), height: Math.max(p.value ? 1 : 0, h), rx: 2 });
    bar.append(svg("title", {}, p.title || `${p.label}: ${p.value} ${unitOf(p.value)}`));
    root.append(bar);
    if (i % labelEvery === 0) {
      root.append(svg("text", { x: x + step * 0.35, y: height - 6, "text-anchor": "middle" }, p.label));
    }
  });
  return root;
}
