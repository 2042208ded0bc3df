// pgq dashboard: the action buttons (POST to the JSON API, then reload) and the throughput chart
// (polls /api/queues). No framework, no build step. Text from the server is set with textContent,
// never as HTML.
"use strict";

function flash(text, bad) {
  const box = document.getElementById("flash");
  box.textContent = text;
  box.className = bad ? "flash bad" : "flash";
  box.hidden = false;
}

async function act(button) {
  if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
  button.disabled = true;
  try {
    const response = await fetch(button.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: {"Content-Type": "application/json"},
      body: button.dataset.body || "{}",
    });
    const answer = await response.json();
    if (!response.ok) {
      flash(answer.error + (answer.sqlstate ? " [SQLSTATE " + answer.sqlstate + "]" : ""), true);
      button.disabled = false;
      return;
    }
    if (answer.detail) flash(answer.detail, false);
    window.location.reload();
  } catch (error) {
    flash("the dashboard did not answer: " + error, true);
    button.disabled = false;
  }
}

const FINISHED = ["done", "failed", "cancelled"];
const WINDOW_SECONDS = 300;
const samples = [];  // [seconds, finished jobs over all queues]

function drawChart(chart) {
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i][0] - samples[i - 1][0];
    // Pruning removes finished jobs: a fall in the count is not negative throughput.
    rates.push([samples[i][0], Math.max(0, samples[i][1] - samples[i - 1][1]) / dt]);
  }
  const now = samples[samples.length - 1][0];
  const peak = Math.max(1, ...rates.map(r => r[1]));
  const points = rates.map(([t, r]) =>
    (600 - (now - t) * 600 / WINDOW_SECONDS).toFixed(1) + "," + (118 - r * 110 / peak).toFixed(1));
  chart.querySelector("polyline").setAttribute("points", points.join(" "));
  const last = rates.length ? rates[rates.length - 1][1] : 0;
  document.getElementById("rate").textContent = last.toFixed(1);
  document.getElementById("peak").textContent = rates.length ? Math.max(...rates.map(r => r[1])).toFixed(1) : "0.0";
  document.getElementById("span").textContent = Math.round(now - samples[0][0]);
}

function updateCounts(queues) {
  for (const q of queues) {
    const row = document.querySelector('tr[data-queue="' + CSS.escape(q.queue) + '"]');
    if (!row) continue;
    for (const cell of row.querySelectorAll("td[data-col]")) {
      const col = cell.dataset.col;
      if (col === "oldest_ready_age") continue;
      const target = cell.querySelector("a") || cell;
      target.textContent = String(q[col]);
    }
  }
}

async function poll(chart) {
  try {
    const response = await fetch("/api/queues", {credentials: "same-origin"});
    if (response.ok) {
      const queues = (await response.json()).queues;
      const finished = queues.reduce((sum, q) => sum + FINISHED.reduce((s, c) => s + q[c], 0), 0);
      samples.push([performance.now() / 1000, finished]);
      while (samples.length > 2 && samples[samples.length - 1][0] - samples[0][0] > WINDOW_SECONDS) samples.shift();
      drawChart(chart);
      updateCounts(queues);
    }
  } finally {
    window.setTimeout(() => poll(chart), 2000);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button.action")) {
    button.addEventListener("click", () => act(button));
  }
  const chart = document.getElementById("throughput");
  if (chart) poll(chart);
});
