// pgq dashboard: the action buttons (POST to the JSON API, then reload), the throughput chart
// (polls /api/queues) and the live parts of a page (refetched in place). No framework, no build
// step. Text from the server is set with textContent, never as HTML.
"use strict";

let acting = false;  // an action is in flight: the page reloads after it, nothing is refreshed meanwhile

function flash(text, bad) {
  const box = document.getElementById("flash");
  box.textContent = text;
  box.className = bad ? "flash bad" : "flash";
  box.hidden = false;
}

async function act(button) {
  if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
  button.disabled = true;
  acting = true;
  try {
    const response = await fetch(button.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: {"Content-Type": "application/json"},
      body: button.dataset.body || "{}",
    });
    const answer = await response.json();
    if (!response.ok) {
      // The refusal as the server (often the database itself) worded it, and its hint on a line of its own.
      flash(answer.error + (answer.sqlstate ? " [SQLSTATE " + answer.sqlstate + "]" : "") +
            (answer.hint ? "\nhint: " + answer.hint : ""), true);
      button.disabled = false;
      acting = false;
      return;
    }
    // What the action answered ("retried 120 failed job(s) of queue mail"), shown after the reload.
    if (answer.detail) sessionStorage.setItem("pgq-flash", answer.detail);
    window.location.reload();
  } catch (error) {
    flash("the dashboard did not answer: " + error, true);
    button.disabled = false;
    acting = false;
  }
}

function bind(root) {
  for (const button of root.querySelectorAll("button.action")) {
    button.addEventListener("click", () => act(button));
  }
}

// The live parts of a page (elements with data-live and an id: the jobs list, the queues table,
// the workers, a job that may still change) are refetched every REFRESH_MS: the page's own URL is
// asked again and each live part replaced by its new version, in place (no reload: the filter
// form, what is typed in it and the scroll position stay). A part with a field being typed in is
// left for the next round; nothing is asked while the tab is hidden or an action is in flight. A part
// whose new version has no data-live (a job that finished) is replaced once more and then left:
// when no live part remains, the refreshing stops. A 404 (the job was deleted) stops it too.
const REFRESH_MS = 4000;

async function refresh() {
  let again = true;
  if (!document.hidden && !acting) {
    try {
      const response = await fetch(window.location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}});
      if (response.status === 404) again = false;
      if (response.ok && !acting) {
        const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
        for (const old of document.querySelectorAll("[data-live][id]")) {
          const now = fresh.getElementById(old.id);
          const focused = document.activeElement;  // someone typing in a field of this part: not now
          if (!now || (focused && focused.matches("input, select, textarea") && old.contains(focused))) continue;
          const adopted = document.adoptNode(now);
          old.replaceWith(adopted);
          bind(adopted);
        }
      }
    } catch (error) {
      // The dashboard did not answer (restarting, the network): try again next round.
    }
  }
  if (again && document.querySelector("[data-live][id]")) window.setTimeout(refresh, REFRESH_MS);
}

const FINISHED = ["done", "failed", "cancelled"];
const WINDOW_SECONDS = 300;
const STORED = "pgq-throughput";  // this tab's samples, kept across reloads and visits of other pages
const samples = [];  // [seconds since the epoch, finished jobs over all queues (the database's counters)]

// The chart starts from the database's finished counters, not from an empty tab: the page carries
// them (data-finished, from pgq.stats when the page was made) as a sample, after the samples this
// tab took in the last WINDOW_SECONDS on earlier visits. pgq keeps no history of the counters, so
// a tab that never showed the overview has one point at first, and a rate from the next poll on.
function seed(chart) {
  const now = Date.now() / 1000;
  let kept = [];
  try {
    kept = JSON.parse(sessionStorage.getItem(STORED) || "[]");
  } catch (error) {
    kept = [];
  }
  if (Array.isArray(kept)) {
    for (const s of kept) {
      if (Array.isArray(s) && s.length === 2 && Number.isFinite(s[0]) && Number.isFinite(s[1]) &&
          s[0] < now && now - s[0] <= WINDOW_SECONDS) samples.push([s[0], s[1]]);
    }
  }
  const finished = Number(chart.dataset.finished);
  if (chart.dataset.finished !== undefined && Number.isFinite(finished)) record(chart, now, finished);
}

function record(chart, at, finished) {
  samples.push([at, finished]);
  while (samples.length > 2 && samples[samples.length - 1][0] - samples[0][0] > WINDOW_SECONDS) samples.shift();
  try {
    sessionStorage.setItem(STORED, JSON.stringify(samples));
  } catch (error) {
    // Storage full or refused: the chart still works for this page.
  }
  drawChart(chart);
}

function drawChart(chart) {
  // Jobs per second between consecutive samples, from zero at the first; the time since the first
  // sample (at most the last 5 minutes) spans the chart's width, the peak its height.
  const rates = [[samples[0][0], 0]];
  for (let i = 1; i < samples.length; i++) {
    const dt = Math.max(0.001, samples[i][0] - samples[i - 1][0]);
    // The counters only grow; a fall (samples of another database in this tab) is not negative throughput.
    rates.push([samples[i][0], Math.max(0, samples[i][1] - samples[i - 1][1]) / dt]);
  }
  const now = samples[samples.length - 1][0];
  const span = Math.max(10, now - samples[0][0]);
  const peak = Math.max(...rates.map(r => r[1]));
  const top = Math.max(1, peak);
  const points = rates.map(([t, r]) =>
    (600 - (now - t) * 600 / span).toFixed(1) + "," + (118 - r * 110 / top).toFixed(1));
  chart.querySelector("polyline").setAttribute("points", points.join(" "));
  const first = points[0].split(",")[0];
  chart.querySelector("polygon").setAttribute("points", first + ",118 " + points.join(" ") + " 600,118");
  document.getElementById("rate").textContent = rates[rates.length - 1][1].toFixed(1);
  document.getElementById("peak").textContent = peak.toFixed(1);
  document.getElementById("span").textContent = Math.round(now - samples[0][0]);
}

function ago(seconds) {  // as the server writes an age: 4s, 3m 12s, 2h 5m, 3d 4h
  if (seconds === null) return "-";
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor(s % 3600 / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor(s % 86400 / 3600) + "h";
}

function updateCounts(queues) {
  for (const q of queues) {
    const row = document.querySelector('tr[data-queue="' + CSS.escape(q.queue) + '"]');
    if (!row) continue;
    for (const cell of row.querySelectorAll("td[data-col]")) {
      const col = cell.dataset.col;
      const target = cell.querySelector("a") || cell;
      target.textContent = col === "oldest_ready_age" ? ago(q[col]) : String(q[col]);
    }
  }
}

async function poll(chart) {
  try {
    const response = await fetch("/api/queues", {credentials: "same-origin"});
    if (response.ok) {
      const queues = (await response.json()).queues;
      const finished = queues.reduce((sum, q) => sum + FINISHED.reduce((s, c) => s + q[c], 0), 0);
      record(chart, Date.now() / 1000, finished);
      updateCounts(queues);
    }
  } finally {
    window.setTimeout(() => poll(chart), 2000);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const said = sessionStorage.getItem("pgq-flash");
  if (said !== null) {
    sessionStorage.removeItem("pgq-flash");
    flash(said, false);
  }
  bind(document);
  if (document.querySelector("[data-live][id]")) window.setTimeout(refresh, REFRESH_MS);
  const chart = document.getElementById("throughput");
  if (chart) {
    seed(chart);
    if (samples.length) window.setTimeout(() => poll(chart), 2000);
    else poll(chart);
  }
});
