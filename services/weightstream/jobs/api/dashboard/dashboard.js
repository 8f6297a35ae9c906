// The dashboard: the job list (polled), and the selected job followed live through its event stream.
// Every string from the service (ids, labels, logs, errors) goes into the page as text, never as HTML:
// the page's CSP (trusted types) would refuse innerHTML anyway.

import { Refused, forgetToken, getJson, readEvents, request, setToken, takeTokenFromFragment, token } from "./api.js";
import { LossChart } from "./chart.js";

const POLL_MS = 2000; // the job list and the selected job's header; events arrive on their own stream
const LOG_MS = 3000; // the log tail of a running job
const LOG_LINES = 200;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const REFUSED = "the service refused this token";

const $ = (id) => document.getElementById(id);
const chart = new LossChart($("loss-chart"));
let session = 0; // bumped when the token is dropped: late answers of an older session are ignored
let pollTimer = null;
let selected = null; // the followed job: see select()

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  node.append(...children);
  return node;
}

// ---- the token --------------------------------------------------------------------------------------

function showLogin(message) {
  session += 1;
  clearTimeout(pollTimer);
  if (selected) selected.stop.abort();
  selected = null;
  $("app").hidden = $("forget").hidden = $("detail").hidden = true;
  $("login").hidden = false;
  $("login-message").textContent = message;
  $("connection").textContent = "";
  $("token-input").value = "";
  $("token-input").focus();
}

function showApp() {
  $("login").hidden = true;
  $("app").hidden = $("forget").hidden = false;
  route();
}

// ---- the address: / is the list, /jobs/<id> the list with that job open (the same page, served at both).
// Opening a job pushes its address: one to share, and back and forward move between the jobs looked at.

function jobInPath() {
  const found = location.pathname.match(/^\/jobs\/([^/]+)$/);
  return found ? decodeURIComponent(found[1]) : null;
}

function route() {
  const id = jobInPath();
  if (id === null) deselect();
  else if (id !== selected?.id) select(id);
  poll();
}

function openJob(id) {
  if (id !== jobInPath()) history.pushState(null, "", `/jobs/${encodeURIComponent(id)}`);
  route();
}

// What every failed request comes to: a refused token asks for another, anything else is shown where
// it happened (`where`, or the connection line) and retried by whoever polls.
function failed(error, where = $("connection")) {
  if (error.name === "AbortError") return;
  if (error instanceof Refused) {
    forgetToken();
    showLogin(REFUSED);
  } else {
    where.textContent = error.message;
    where.classList.add("error"); // the connection line is muted until something goes wrong
  }
}

// ---- the job list -----------------------------------------------------------------------------------

function listQuery() {
  const query = new URLSearchParams();
  const phase = $("phase-filter").value;
  if (phase) query.set("status", phase);
  const labels = $("label-filter").value.split(/[\s,]+/).filter(Boolean);
  const bad = labels.filter((l) => l.indexOf("=") < 1);
  $("filter-message").textContent = bad.length ? `a label filter is key=value, not ${bad.join(" ")}` : "";
  for (const l of labels) if (!bad.includes(l)) query.append("label", l);
  return query;
}

async function poll() {
  const mine = session;
  clearTimeout(pollTimer);
  try {
    const { jobs } = await getJson(`/v1/jobs?${listQuery()}`);
    if (mine !== session) return;
    renderJobs(jobs);
    if (selected) showJob(await getJson(`/v1/jobs/${encodeURIComponent(selected.id)}`));
    $("connection").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    $("connection").classList.remove("error");
  } catch (error) {
    if (mine !== session) return;
    failed(error);
    if (error instanceof Refused) return;
  }
  pollTimer = setTimeout(poll, POLL_MS);
}

function renderJobs(jobs) {
  const now = Date.now() / 1000;
  // `user` and `duration_s` are newer fields of the job: shown when the service sends them
  $("job-table").classList.toggle("has-user", jobs.some((j) => j.user));
  const rows = jobs.map((job) => {
    const row = el(
      "tr",
      { "data-id": job.id, class: job.id === selected?.id ? "selected" : "" },
      el("td", { class: "mono", text: job.id }),
      el("td", {}, el("span", { class: `phase ${job.status}`, text: job.status })),
      el("td", { class: "num", text: String(job.num_csx) }),
      el("td", { class: "num", text: duration(now - job.created_at) }),
      el("td", { class: "num", text: duration(runSeconds(job, now)) }),
      el("td", {}, ...labelChips(job.labels)),
      el("td", { class: "num", text: String(job.priority) }),
      el("td", { class: "user", text: job.user ?? "" }),
    );
    row.addEventListener("click", () => openJob(job.id));
    return row;
  });
  $("job-rows").replaceChildren(...rows);
  $("no-jobs").hidden = jobs.length > 0;
}

function labelChips(labels) {
  return Object.entries(labels || {}).map(([k, v]) => el("span", { class: "chip", text: `${k}=${v}` }));
}

// Seconds the job has spent running, over all its runs (a requeued job runs again); null if never.
function runSeconds(job, now) {
  if (typeof job.duration_s === "number") return job.duration_s;
  let total = null;
  let since = null;
  for (const h of job.history) {
    if (h.status === "running") since ??= h.at;
    else if (since !== null) [total, since] = [(total ?? 0) + h.at - since, null];
  }
  return since === null ? total : (total ?? 0) + now - since;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  const two = (n) => String(n).padStart(2, "0");
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${two(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${two(Math.floor(s / 60) % 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor(s / 3600) % 24}h`;
}

// ---- one job ----------------------------------------------------------------------------------------

function deselect() {
  if (selected) selected.stop.abort();
  selected = null;
  $("detail").hidden = true;
  for (const row of $("job-rows").children) row.classList.remove("selected");
}

function select(id) {
  if (selected) selected.stop.abort();
  selected = {
    id,
    status: null,
    stop: new AbortController(), // ends this job's stream and timers when another is selected
    recent: [], // [at, step] of the last step events, for the ETA
    last: null, // the last step event
    roles: new Map(), // name -> {kind, state, address, restarts}
    numCsx: null, // the workers it asked for (the job's header)
    workers: null, // the workers it trains with now (its events), when they say
    armed: false, // the cancel button's first click
  };
  for (const row of $("job-rows").children) row.classList.toggle("selected", row.dataset.id === id);
  for (const f of ["d-step", "d-loss", "d-eval", "d-tps", "d-eta"]) $(f).textContent = "—";
  for (const f of ["d-error", "cancel-message", "download-message", "role-note", "straggler-note"]) {
    $(f).textContent = "";
  }
  $("d-id").textContent = id;
  $("log").textContent = "";
  $("checkpoints").replaceChildren();
  $("role-rows").replaceChildren();
  disarm();
  $("cancel").hidden = true; // until the job is known to be unfinished
  chart.reset();
  $("detail").hidden = false;
  follow(selected);
  refreshLog(selected);
  refreshCheckpoints(selected); // and the caller polls: the job's header comes with the list
}

function showJob(job) {
  if (!selected || job.id !== selected.id) return;
  $("d-phase").textContent = job.status;
  $("d-phase").className = `phase ${job.status}`;
  $("d-error").textContent = job.error ?? "";
  selected.numCsx = job.num_csx;
  showWorkers(selected);
  $("d-priority").textContent = String(job.priority);
  $("d-labels").replaceChildren(...labelChips(job.labels));
  $("d-duration").textContent = duration(runSeconds(job, Date.now() / 1000));
  $("d-user-box").hidden = !job.user;
  $("d-user").textContent = job.user ?? "";
  $("cancel").hidden = TERMINAL.has(job.status); // a finished job has nothing to cancel
}

// The workers the job trains with: "2 of 3" while it goes on without a worker it could not start again.
function showWorkers(job) {
  if (job.numCsx === null) return; // until the job's header is known
  const fewer = job.workers !== null && job.workers < job.numCsx;
  $("d-workers").textContent = fewer ? `${job.workers} of ${job.numCsx}` : String(job.numCsx);
}

// The job's events from the first, live until it ends; a dropped stream resumes after its last event.
async function follow(job) {
  let after = 0;
  while (!job.stop.signal.aborted) {
    try {
      const path = `/v1/jobs/${encodeURIComponent(job.id)}/events?after=${after}`;
      await readEvents(path, (e) => ((after = e.seq ?? after), onEvent(job, e)), job.stop.signal);
      if (TERMINAL.has(job.status)) return; // the server ends a finished job's stream
    } catch (error) {
      if (job.stop.signal.aborted) return;
      failed(error);
      if (error instanceof Refused) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function onEvent(job, { kind, data }) {
  if (job !== selected) return;
  if (kind === "step") {
    chart.add("loss", data.step, data.loss);
    job.last = data;
    job.recent = [...job.recent.slice(-19), [data.at, data.step]];
    $("d-step").textContent = data.max_steps ? `${data.step} / ${data.max_steps}` : String(data.step);
    $("d-loss").textContent = data.loss === null ? "not finite" : data.loss.toFixed(4);
    $("d-tps").textContent = Math.round(data.tokens_per_second).toLocaleString("en");
    $("d-eta").textContent = duration(eta(job));
    if (data.workers !== undefined) {
      job.workers = data.workers; // fewer than num_csx while a lost worker has no room to start again
      showWorkers(job);
    }
  } else if (kind === "eval") {
    chart.add("evals", data.step, data.eval_loss);
    $("d-eval").textContent = data.eval_loss === null ? "not finite" : `${data.eval_loss.toFixed(4)} (step ${data.step})`;
  } else if (kind === "checkpoint") {
    refreshCheckpoints(job);
  } else if (kind === "progress") {
    // the runner's phases: "starting" with the role counts, "running" with every role's address
    for (const [k, n] of Object.entries(data.roles || {})) {
      for (let i = 0; i < n; i++) role(job, `${k}-${i}`, k).state = "starting";
    }
    for (const [k, addresses] of Object.entries(data.addresses || {})) {
      addresses.forEach((a, i) => Object.assign(role(job, `${k}-${i}`, k), { state: "running", address: a }));
    }
    if (data.status === "resuming") $("role-note").textContent = `resuming from step ${data.step}`;
  } else if (kind === "restart") {
    const r = role(job, data.role, data.role_kind);
    Object.assign(r, { state: "restarting", restarts: r.restarts + 1, moved: true });
    $("role-note").textContent = `step ${data.step}: restart ${data.restarts}/${data.max_role_restarts}: ${data.reason}`;
  } else if (kind === "recovered") {
    for (const r of job.roles.values()) if (r.state === "restarting") r.state = "running";
    // every role's address after the recovery, a replacement's new one included
    for (const [k, addresses] of Object.entries(data.addresses || {})) {
      addresses.forEach((a, i) => Object.assign(role(job, `${k}-${i}`, k), { address: a, moved: false }));
    }
    const action = data.action ? `: ${data.action}` : "";
    $("role-note").textContent = `step ${data.step}: recovered in ${data.recovery_s.toFixed(1)}s, replaying ${data.replay_steps} steps${action}`;
  } else if (kind === "retry") {
    $("role-note").textContent = `step ${data.step}: retry: ${data.reason}`;
  } else if (kind === "workers") {
    job.workers = data.to_workers;
    showWorkers(job);
    $("role-note").textContent = `step ${data.step}: workers ${data.from_workers} → ${data.to_workers}: ${data.reason}`;
  } else if (kind === "straggler") {
    $("straggler-note").textContent =
      `step ${data.step}: straggler: ${data.worker} on ${data.host} ${data.ratio.toFixed(1)}x the other workers' median for ${data.steps} steps`;
  } else if (kind === "status") {
    job.status = data.status;
    $("d-phase").textContent = data.status;
    $("d-phase").className = `phase ${data.status}`;
    if (data.status !== "running") for (const r of job.roles.values()) r.state = "stopped";
    if (data.status !== "running") $("d-eta").textContent = "—";
    if (TERMINAL.has(data.status)) {
      $("cancel").hidden = true;
      refreshLog(job); // the last lines, and the checkpoints retention left
      refreshCheckpoints(job);
    }
  }
  renderRoles(job);
}

function role(job, name, kind) {
  if (!job.roles.has(name)) job.roles.set(name, { kind, state: "starting", address: "", restarts: 0 });
  return job.roles.get(name);
}

function renderRoles(job) {
  const rows = [...job.roles].map(([name, r]) =>
    el(
      "tr",
      {},
      el("td", { class: "mono", text: name }),
      el("td", {}, el("span", { class: `state ${r.state}`, text: r.state })),
      // a replacement's address arrives with the "recovered" event; until then the old one is marked
      el("td", { class: "mono", text: r.address + (r.moved ? " (before restart)" : "") }),
      el("td", { class: "num", text: String(r.restarts) }),
    ),
  );
  $("role-rows").replaceChildren(...rows);
}

// Seconds to max_steps at the pace of the last steps (wall clock between their events, so evals and
// checkpoints count too); the last step's own time until there are two.
function eta(job) {
  const { last, recent } = job;
  if (!last?.max_steps) return null;
  const [[t0, s0], [t1, s1]] = [recent[0], recent[recent.length - 1]];
  const perStep = s1 > s0 ? (t1 - t0) / (s1 - s0) : last.step_time_s;
  return (last.max_steps - last.step) * perStep;
}

async function refreshLog(job) {
  try {
    const log = $("log");
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    const text = await (await request(`/v1/jobs/${encodeURIComponent(job.id)}/logs?tail=${LOG_LINES}`)).text();
    if (job !== selected) return;
    log.textContent = text;
    log.classList.remove("error");
    if (atBottom) log.scrollTop = log.scrollHeight; // follow the tail unless the reader scrolled up
  } catch (error) {
    if (job === selected) failed(error, $("log"));
  }
  if (job === selected && !TERMINAL.has(job.status)) {
    clearTimeout(job.logTimer);
    job.logTimer = setTimeout(() => refreshLog(job), LOG_MS);
  }
}

async function refreshCheckpoints(job) {
  try {
    const { checkpoints } = await getJson(`/v1/jobs/${encodeURIComponent(job.id)}/checkpoints`);
    if (job !== selected) return;
    const items = checkpoints.map((c) => {
      const buttons = c.files.map((f) => {
        const b = el("button", { type: "button", class: "file", text: `${f.name} (${bytes(f.size)})` });
        b.addEventListener("click", () => download(job.id, c.step, f.name, b));
        return b;
      });
      return el("li", {}, el("strong", { text: `step ${c.step}` }), ...buttons);
    });
    $("checkpoints").replaceChildren(...items);
    if (!items.length) $("checkpoints").append(el("li", { class: "muted", text: "none yet" }));
  } catch (error) {
    if (job === selected) failed(error, $("download-message"));
  }
}

// A download needs the bearer header, which a plain link cannot send: the file is fetched into a blob
// and handed to the browser from memory (fine for a checkpoint shard; `wsctl download` for big jobs).
async function download(id, step, name, button) {
  button.disabled = true;
  try {
    const path = `/v1/jobs/${encodeURIComponent(id)}/checkpoints/${step}/files/${encodeURIComponent(name)}`;
    const url = URL.createObjectURL(await (await request(path)).blob());
    const link = el("a", { href: url, download: name });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (error) {
    failed(error, $("download-message"));
  } finally {
    button.disabled = false;
  }
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  const i = n > 0 ? Math.min(units.length - 1, Math.floor(Math.log2(n) / 10)) : 0;
  return `${(n / 1024 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

// Cancelling takes two clicks: a running job's work is lost to a stray one.
function disarm() {
  if (selected) selected.armed = false;
  $("cancel").textContent = "cancel job";
}

async function cancel() {
  const job = selected;
  if (!job.armed) {
    job.armed = true;
    $("cancel").textContent = "click again to cancel";
    setTimeout(() => job === selected && disarm(), 5000);
    return;
  }
  disarm();
  try {
    showJob(await (await request(`/v1/jobs/${encodeURIComponent(job.id)}`, { method: "DELETE" })).json());
    poll();
  } catch (error) {
    failed(error, $("cancel-message"));
  }
}

// ---- wiring -----------------------------------------------------------------------------------------

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken($("token-input").value.trim());
  showApp();
});
$("forget").addEventListener("click", () => (forgetToken(), showLogin("")));
$("cancel").addEventListener("click", cancel);
$("phase-filter").addEventListener("change", poll);
window.addEventListener("popstate", () => token() && route());
let typing = null;
$("label-filter").addEventListener("input", () => (clearTimeout(typing), (typing = setTimeout(poll, 300))));

takeTokenFromFragment();
if (token()) showApp();
else showLogin("");
