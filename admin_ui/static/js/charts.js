// Thin wrappers over chart.js (loaded from /admin/vendor, installed from npm).
import { el } from "./dom.js";

const PALETTE = ["#1f5fbf", "#e07b00", "#2a9d5c", "#b3261e", "#7b4fc4", "#00838f", "#8d6e63"];

export function color(i) { return PALETTE[i % PALETTE.length]; }

// One colour per kind of token on every page, whatever order a page lists them in.
export const TOKEN_COLORS = {
  "uncached prompt tokens": "#1f5fbf",
  "cached prompt tokens": "#2a9d5c",
  "completion tokens": "#e07b00",
};

// A dataset of one kind of token (a key of TOKEN_COLORS), in that kind's colour.
export function tokenSeries(label, data) {
  const c = TOKEN_COLORS[label];
  return { label, data, backgroundColor: c, borderColor: c };
}

// A chart card: canvas plus the same numbers as a table for screen readers and tests.
export function chartBox(title, config, { id } = {}) {
  const canvas = el("canvas", { role: "img", "aria-label": title, id });
  const box = el("div", { class: "chart-box" }, canvas);
  const data = config.data;
  const rows = data.labels.map((label, i) =>
    el("tr", {}, el("th", { scope: "row" }, label), data.datasets.map((d) => el("td", { class: "num" }, d.data[i] === null ? "—" : String(d.data[i])))));
  const details = el("details", {},
    el("summary", {}, "Data"),
    el("div", { class: "table-wrap" }, el("table", { "aria-label": `${title} data`, "data-chart": id || title },
      el("thead", {}, el("tr", {}, el("th", {}, ""), data.datasets.map((d) => el("th", { class: "num" }, d.label)))),
      el("tbody", {}, rows))));
  const section = el("section", { class: "card", "aria-label": title }, el("h2", {}, title), box, details);
  requestAnimationFrame(() => {
    if (!canvas.isConnected || !window.Chart) return;
    const chart = new window.Chart(canvas, {
      ...config,
      options: {
        responsive: true, maintainAspectRatio: false, animation: false,
        interaction: { mode: "index", intersect: false },
        plugins: { legend: { display: data.datasets.length > 1 } },
        ...(config.options || {}),
      },
    });
    canvas.chart = chart;
  });
  return section;
}

export function lineConfig(labels, datasets, { yMax, stacked } = {}) {
  return {
    type: "line",
    data: { labels, datasets: datasets.map((d, i) => ({ borderColor: color(i), backgroundColor: color(i), pointRadius: 0, spanGaps: true, borderWidth: 2, ...d })) },
    options: { scales: { y: { beginAtZero: true, max: yMax, stacked }, x: { ticks: { maxTicksLimit: 8 } } } },
  };
}

export function barConfig(labels, datasets, { stacked = true } = {}) {
  return {
    type: "bar",
    data: { labels, datasets: datasets.map((d, i) => ({ backgroundColor: color(i), ...d })) },
    options: { scales: { x: { stacked }, y: { stacked, beginAtZero: true } } },
  };
}
