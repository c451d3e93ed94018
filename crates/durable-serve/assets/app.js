// The dashboard of `durable serve`: plain JavaScript, no framework, no build step.
//
// Every value that comes from the API (run ids, workflow names, payloads, error messages) is
// user data: it reaches the DOM only as text (textContent, text nodes, attribute values through
// setAttribute), never as HTML. Links to runs are built as "#/runs/" + encodeURIComponent(id).
'use strict';

const STATUSES = ['pending', 'running', 'suspended', 'blocked', 'completed', 'failed', 'cancelled', 'dead'];
const STATUS_GROUPS = [
  ['failed,dead', 'failed or dead'],
  ['pending,running,suspended,blocked', 'in progress'],
];
const TERMINAL = new Set(['completed', 'failed', 'cancelled', 'dead']);
const RETRYABLE = new Set(['failed', 'dead']);
const TOKEN_KEY = 'durable.token';
const REFRESH_MS = 5000;

// ---------------------------------------------------------------------------------------------
// DOM helpers

const $ = (sel, root = document) => root.querySelector(sel);

/** An element with attributes (`on*` are listeners) and children (strings become text nodes). */
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

const runHref = (id) => '#/runs/' + encodeURIComponent(id);
const runLink = (id) => h('a', { href: runHref(id), class: 'run-link' }, id);
const badge = (status) => h('span', { class: 'badge s-' + status }, status);

function pad(n) { return String(n).padStart(2, '0'); }

/** Epoch milliseconds as local `YYYY-MM-DD HH:MM:SS` (the exact instant in the title). */
function fmtTime(ms) {
  if (ms === null || ms === undefined) return '—';
  const d = new Date(ms);
  if (Number.isNaN(d.getTime())) return String(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
const timeEl = (ms) => h('time', { title: ms === null || ms === undefined ? null : new Date(ms).toISOString() }, fmtTime(ms));

function fmtDuration(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** A JSON value, pretty-printed, as a `<pre>` (text only). */
function jsonBlock(value) {
  return h('pre', { class: 'json' }, value === undefined ? '' : JSON.stringify(value, null, 2));
}

function section(title, ...body) {
  return h('section', { class: 'card' }, h('h2', {}, title), ...body);
}

// ---------------------------------------------------------------------------------------------
// The API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const token = () => sessionStorage.getItem(TOKEN_KEY) || '';

function authHeaders(extra) {
  const headers = Object.assign({ Accept: 'application/json' }, extra);
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  return headers;
}

/** Calls the API; `body` is JSON text. Resolves to the decoded answer, rejects with an ApiError. */
async function api(method, path, body, signal) {
  const init = { method, signal, cache: 'no-store', headers: authHeaders(body === undefined ? {} : { 'Content-Type': 'application/json' }) };
  if (body !== undefined) init.body = body;
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'unreachable', `the server did not answer ${method} ${path} (${e.message}): is durable serve still running?`);
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!res.ok) {
    const err = (data && data.error) || {};
    let message = err.message || `${method} ${path} answered HTTP ${res.status}`;
    if (res.status === 401) message += ' — enter the server\'s token at the top of the page and press Save.';
    throw new ApiError(res.status, err.code || `http_${res.status}`, message);
  }
  if (data === null && text) throw new ApiError(res.status, 'bad_response', `${method} ${path}: the answer is not JSON`);
  return data;
}

// ---------------------------------------------------------------------------------------------
// Banner, live indicator, confirmation dialog

function showError(err) {
  if (err && err.name === 'AbortError') return;
  const text = err instanceof ApiError ? `${err.message} [${err.code}]` : String((err && err.message) || err);
  $('#error-text').textContent = text;
  $('#error').hidden = false;
  if (err instanceof ApiError && err.status === 401) $('#token').focus();
}
let noticeTimer = null;
/** A short confirmation that an action was taken (hidden again after a few seconds). */
function notify(text) {
  const box = $('#notice');
  box.textContent = text;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { box.hidden = true; }, 6000);
}

function clearError() { $('#error').hidden = true; $('#error-text').textContent = ''; }

function setLive(state, why) {
  const live = $('#live');
  live.dataset.state = state;
  live.textContent = state === 'on' ? 'live' : state === 'off' ? '' : 'reconnecting…';
  live.title = why || (state === 'on' ? 'following changes as they happen' : '');
}

/**
 * Asks before an action. Resolves to `null` (kept) or `{ input }` (confirmed; `input` is the
 * edited JSON text when `edit` was given).
 */
function confirmAction({ title, text, yes, edit }) {
  const dialog = $('#confirm');
  $('#confirm-title').textContent = title;
  $('#confirm-text').textContent = text;
  $('#confirm-yes').textContent = yes;
  $('#confirm-edit').hidden = edit === undefined;
  $('#confirm-invalid').hidden = true;
  const area = $('#confirm-input');
  area.value = edit === undefined ? '' : edit;
  dialog.returnValue = '';
  return new Promise((resolve) => {
    const onYes = (ev) => {
      if (edit === undefined) return;
      try {
        JSON.parse(area.value);
      } catch (e) {
        ev.preventDefault();
        $('#confirm-invalid').textContent = `not valid JSON: ${e.message}`;
        $('#confirm-invalid').hidden = false;
      }
    };
    $('#confirm-yes').addEventListener('click', onYes);
    dialog.addEventListener('close', () => {
      $('#confirm-yes').removeEventListener('click', onYes);
      resolve(dialog.returnValue === 'yes' ? { input: area.value } : null);
    }, { once: true });
    dialog.showModal();
    (edit === undefined ? $('#confirm-no') : area).focus();
  });
}

// ---------------------------------------------------------------------------------------------
// Live updates: the server-sent events of /api/events, read with fetch so the token can be sent
// (EventSource cannot send headers). Reconnects with a backoff until the view is left.

function follow(view, query, onRun, onDeleted) {
  const url = '/api/events' + (query ? '?' + query : '');
  (async () => {
    let delay = 500;
    while (!view.signal.aborted) {
      try {
        const res = await fetch(url, { headers: authHeaders({ Accept: 'text/event-stream' }), signal: view.signal, cache: 'no-store' });
        if (!res.ok) {
          setLive('retry', `live updates failed: HTTP ${res.status}`);
        } else {
          setLive('on');
          delay = 500;
          await readEvents(res.body, (event, data) => {
            if (event !== 'run' && event !== 'deleted') return;
            let value;
            try { value = JSON.parse(data); } catch (_) { return; }
            if (event === 'run') onRun(value);
            else if (typeof value.id === 'string') onDeleted(value.id);
          });
          setLive('retry', 'the event stream ended');
        }
      } catch (e) {
        if (view.signal.aborted) return;
        setLive('retry', `live updates lost: ${e.message}`);
      }
      await sleep(delay, view.signal);
      delay = Math.min(delay * 2, 10000);
    }
  })();
}

async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let event = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line === '' || line.startsWith(':')) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val.startsWith(' ')) val = val.slice(1);
        if (field === 'event') event = val;
        else if (field === 'data') data.push(val);
      }
      if (data.length) onEvent(event, data.join('\n'));
    }
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}

// ---------------------------------------------------------------------------------------------
// Router: one view at a time; leaving it aborts its requests, streams and timers.

let current = null;

function route() {
  if (current) current.abort();
  const view = new AbortController();
  current = view;
  clearError();
  setLive('off');
  const hash = location.hash || '#/runs';
  view.route = hash;
  const q = hash.indexOf('?');
  const path = q < 0 ? hash.slice(1) : hash.slice(1, q);
  const params = new URLSearchParams(q < 0 ? '' : hash.slice(q + 1));
  const area = path.split('/')[1] || 'runs';
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.dataset.nav === area);
  let page;
  if (path === '/runs' || path === '/' || path === '') page = runsPage(view, params);
  else if (path.startsWith('/runs/')) page = runPage(view, decodeSafe(path.slice('/runs/'.length)));
  else if (path === '/queues') page = tablesPage(view, 'Queues', '/api/queues');
  else if (path === '/schedules') page = tablesPage(view, 'Schedules', '/api/schedules');
  else if (path === '/workers') page = tablesPage(view, 'Workers', '/api/workers');
  else page = Promise.resolve(show(view, h('p', {}, 'No such page: ', path, '. ', h('a', { href: '#/runs' }, 'Back to the runs.'))));
  page.catch((e) => { if (!view.signal.aborted) showError(e); });
}

function decodeSafe(text) {
  try { return decodeURIComponent(text); } catch (_) { return text; }
}

/**
 * Replaces the page's content, unless the user has moved on to another view. `#view`'s
 * `data-route` names the address it shows (the browser tests wait for it).
 */
function show(view, ...nodes) {
  if (view.signal.aborted) return false;
  $('#view').replaceChildren(...nodes);
  $('#view').dataset.route = view.route;
  return true;
}

function every(view, ms, fn) {
  const t = setInterval(fn, ms);
  view.signal.addEventListener('abort', () => clearInterval(t), { once: true });
}

// ---------------------------------------------------------------------------------------------
// Runs list

const FILTERS = ['status', 'workflow', 'namespace', 'tag'];

function runsHash(filters, cursor) {
  const q = new URLSearchParams();
  for (const k of FILTERS) if (filters[k]) q.set(k, filters[k]);
  if (filters.limit) q.set('limit', filters.limit);
  if (cursor) q.set('cursor', cursor);
  const s = q.toString();
  return '#/runs' + (s ? '?' + s : '');
}

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

/** Whether a run belongs in the list filtered by `filters` (the stream is filtered by workflow only). */
function matches(run, filters) {
  if (filters.status && !filters.status.split(',').includes(run.status)) return false;
  if (filters.workflow && run.workflow !== filters.workflow) return false;
  if (filters.namespace && run.namespace !== filters.namespace) return false;
  if (filters.tag && !(run.tags || []).includes(filters.tag)) return false;
  return true;
}

function filterForm(filters, workflows) {
  const status = h('select', { id: 'filter-status', name: 'status' },
    h('option', { value: '' }, 'any status'),
    STATUS_GROUPS.map(([v, label]) => h('option', { value: v }, label)),
    STATUSES.map((s) => h('option', { value: s }, s)));
  if (filters.status && ![...status.options].some((o) => o.value === filters.status)) {
    status.append(h('option', { value: filters.status }, filters.status));
  }
  status.value = filters.status || '';
  const text = (name, placeholder, extra) =>
    h('input', Object.assign({ id: 'filter-' + name, name, placeholder, value: filters[name] || '', spellcheck: 'false' }, extra));
  const form = h('form', { id: 'filters', class: 'filters', autocomplete: 'off' },
    h('label', {}, 'Status', status),
    h('label', {}, 'Workflow', text('workflow', 'any workflow', { list: 'workflow-names' })),
    h('label', {}, 'Namespace', text('namespace', 'any namespace')),
    h('label', {}, 'Tag', text('tag', 'any tag')),
    h('datalist', { id: 'workflow-names' }, workflows.map((w) => h('option', { value: w.workflow }))),
    h('div', { class: 'buttons' },
      h('button', { id: 'apply-filters', type: 'submit' }, 'Apply'),
      h('button', { id: 'clear-filters', type: 'button', onclick: () => go('#/runs') }, 'Clear')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = {};
    for (const k of FILTERS) f[k] = form.elements[k].value.trim();
    go(runsHash(f, null));
  });
  return form;
}

const RUN_COLUMNS = ['Run', 'Workflow', 'Namespace', 'Status', 'Tags', 'Created', 'Updated'];

function runRow(run) {
  const cell = (label, cls, ...content) => h('td', { 'data-label': label, class: cls }, ...content);
  return h('tr', { 'data-run-id': run.id, 'data-status': run.status, 'data-updated': run.updated_at, 'data-created': run.created_at },
    cell('Run', 'id', runLink(run.id), run.parent ? h('span', { class: 'muted small' }, ' child') : null),
    cell('Workflow', 'workflow', `${run.workflow}@${run.version}`),
    cell('Namespace', 'namespace', run.namespace),
    cell('Status', 'status', badge(run.status)),
    cell('Tags', 'tags', (run.tags || []).map((t) => h('span', { class: 'tag' }, t))),
    cell('Created', 'created', timeEl(run.created_at)),
    cell('Updated', 'updated', timeEl(run.updated_at)));
}

function workflowSummary(workflows) {
  if (!workflows.length) return null;
  const statuses = STATUSES.filter((s) => workflows.some((w) => (w.counts || {})[s]));
  return h('details', { class: 'card workflows' },
    h('summary', {}, `Workflows (${workflows.length})`),
    h('div', { class: 'scroll' }, h('table', { class: 'grid' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Workflow'), statuses.map((s) => h('th', {}, s)))),
      h('tbody', {}, workflows.map((w) => h('tr', {},
        h('td', { 'data-label': 'Workflow' }, h('a', { href: runsHash({ workflow: w.workflow }) }, w.workflow)),
        statuses.map((s) => h('td', { 'data-label': s }, (w.counts || {})[s]
          ? h('a', { href: runsHash({ workflow: w.workflow, status: s }) }, String(w.counts[s])) : '·'))))))));
}

async function runsPage(view, params) {
  const filters = { limit: params.get('limit') || '' };
  for (const k of FILTERS) filters[k] = params.get(k) || '';
  const cursor = params.get('cursor') || '';
  const query = new URLSearchParams(runsHash(filters, cursor).slice('#/runs?'.length));

  const [page, workflows] = await Promise.all([
    api('GET', '/api/runs' + (query.toString() ? '?' + query : ''), undefined, view.signal),
    api('GET', '/api/workflows', undefined, view.signal).catch(() => []),
  ]);
  const tbody = h('tbody', {}, page.runs.map(runRow));
  const empty = h('p', { id: 'no-runs', class: 'muted', hidden: page.runs.length > 0 }, 'No runs match.');
  const paging = h('div', { class: 'paging' },
    cursor ? h('a', { id: 'first-page', class: 'button', href: runsHash(filters, null) }, '« First page') : null,
    page.next_cursor ? h('a', { id: 'next-page', class: 'button', href: runsHash(filters, page.next_cursor) }, 'Next page »') : null);
  show(view,
    h('h1', {}, 'Runs'),
    filterForm(filters, workflows),
    workflowSummary(workflows),
    h('div', { class: 'card' },
      h('table', { id: 'runs-table', class: 'grid runs' },
        h('thead', {}, h('tr', {}, RUN_COLUMNS.map((c) => h('th', {}, c)))),
        tbody),
      empty),
    paging);

  // Live: rows on the page change in place; new runs that match appear on the first page. The
  // stream follows the newest runs of the workflow, and on a later page (older runs, maybe past
  // those) the page's rows by id too, as many as fit a request line proxies accept.
  const stream = new URLSearchParams();
  if (filters.workflow) stream.set('workflow', filters.workflow);
  if (cursor && page.runs.length) {
    const ids = page.runs.map((r) => r.id);
    while (ids.length && encodeURIComponent(JSON.stringify(ids)).length > 6000) ids.pop();
    if (ids.length) stream.set('runs', JSON.stringify(ids));
  }
  follow(view, stream.toString(), (run) => {
    const rows = [...tbody.rows];
    const old = rows.find((r) => r.dataset.runId === run.id);
    if (old) {
      const seen = Number(old.dataset.updated);
      if (seen > run.updated_at || (seen === run.updated_at && old.dataset.status === run.status)) return;
      const row = runRow(run);
      row.classList.add('changed');
      old.replaceWith(row);
      return;
    }
    if (cursor || !matches(run, filters)) return;
    const last = rows[rows.length - 1];
    if (page.next_cursor && last && run.created_at < Number(last.dataset.created)) return;
    const row = runRow(run);
    row.classList.add('changed');
    const before = rows.find((r) => Number(r.dataset.created) <= run.created_at);
    tbody.insertBefore(row, before || null);
    empty.hidden = true;
  }, (id) => {
    const old = [...tbody.rows].find((r) => r.dataset.runId === id);
    if (old) old.remove();
    empty.hidden = tbody.rows.length > 0;
  });
}

// ---------------------------------------------------------------------------------------------
// One run

function field(label, ...value) {
  return [h('dt', {}, label), h('dd', {}, ...value)];
}

/** A generic rendering of API values whose shape the page does not depend on. */
function valueNode(key, v) {
  if (v === null || v === undefined) return '—';
  if (typeof v === 'number' && /(_at|_until|^at|until|since|last_seen|heartbeat)$/.test(key || '')) return timeEl(v);
  if (typeof v === 'object') return h('code', { class: 'small' }, JSON.stringify(v));
  return String(v);
}

function genericTable(rows) {
  if (!rows.length) return h('p', { class: 'muted' }, 'None.');
  const keys = [];
  for (const r of rows) for (const k of Object.keys(r || {})) if (!keys.includes(k)) keys.push(k);
  return h('div', { class: 'scroll' }, h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, keys.map((k) => h('th', {}, k)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, keys.map((k) => h('td', { 'data-label': k }, valueNode(k, (r || {})[k]))))))));
}

/** A table with `columns` ([label, row => node]) over `rows`. */
function columnsTable(id, columns, rows) {
  return h('div', { class: 'scroll' }, h('table', { class: 'grid', id },
    h('thead', {}, h('tr', {}, columns.map(([label]) => h('th', {}, label)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, columns.map(([label, cell]) => h('td', { 'data-label': label }, cell(r))))))));
}

/** What a wait waits for, in words: a signal's token (a child's or an update's as such), or
 * an event's name and matcher. */
function waitText(kind) {
  if (!kind) return '—';
  if (kind.type === 'event') return `event ${kind.name} matching ${JSON.stringify(kind.matcher)}`;
  const token = kind.token || '';
  const [prefix] = token.split(':', 1);
  const internal = { child: 'its child run', update: 'an update', task: 'an external task', remote: 'a remote step' };
  return internal[prefix] ? `${internal[prefix]} (${token})` : `signal ${token}`;
}

function waitersTable(waiters) {
  return columnsTable('run-waiters', [
    ['seq', (w) => String(w.seq)],
    ['step', (w) => w.name],
    ['waits for', (w) => waitText(w.kind)],
    ['since', (w) => valueNode('created_at', w.created_at)],
  ], waiters);
}

function tasksTable(tasks) {
  const t = (x) => x.task || {};
  return columnsTable('run-tasks', [
    ['seq', (x) => String(t(x).seq)],
    ['step', (x) => t(x).name],
    ['queue', (x) => t(x).queue],
    ['state', (x) => x.state],
    ['attempt', (x) => String(t(x).attempt)],
    ['worker', (x) => x.worker || '—'],
    ['lease until', (x) => valueNode('lease_until', x.lease_until)],
    ['progress', (x) => valueNode('progress', x.progress)],
  ], tasks);
}

function genericValue(v) {
  if (Array.isArray(v)) {
    if (v.every((x) => x && typeof x === 'object' && !Array.isArray(x))) return genericTable(v);
    return jsonBlock(v);
  }
  if (v && typeof v === 'object') {
    return h('dl', { class: 'fields' }, Object.entries(v).map(([k, x]) =>
      field(k, x && typeof x === 'object' ? genericValue(x) : valueNode(k, x))));
  }
  return h('p', {}, valueNode('', v));
}

/** A remote step's log line (`{attempt, at, level, message, data}`) as one line of text. */
function logLine(l) {
  if (typeof l === 'string') return l;
  const data = l.data === undefined || l.data === null ? '' : ' ' + JSON.stringify(l.data);
  return `[attempt ${l.attempt}] ${new Date(l.at).toISOString()} ${l.level} ${l.message}${data}`;
}

/**
 * One checkpoint; `child` is the child run it started, when it is a `child` checkpoint; `ended`:
 * the run is finished (a wait it left, as a race's losing branch or a cancelled run's, stays
 * `waiting`: it has no duration, not one that grows).
 */
function timelineEntry(c, child, ended) {
  const key = `cp-${c.seq}`;
  const details = [];
  if (c.input !== null && c.input !== undefined) details.push(h('h4', {}, 'input'), jsonBlock(c.input));
  if (c.output !== null && c.output !== undefined) details.push(h('h4', {}, 'output'), jsonBlock(c.output));
  const logs = c.logs;
  if (logs !== null && logs !== undefined && !(Array.isArray(logs) && !logs.length)) {
    details.push(h('h4', {}, 'logs'), h('pre', { class: 'logs' },
      Array.isArray(logs) ? logs.map(logLine).join('\n') : String(logs)));
  }
  return h('li', { 'data-seq': c.seq, class: 'step s-' + c.status },
    h('div', { class: 'step-head' },
      h('span', { class: 'seq' }, '#' + c.seq),
      h('span', { class: 'name' }, c.name),
      h('span', { class: 'kind' }, c.kind),
      badge(c.status),
      // A step still going: how long so far (the badge says running or waiting).
      h('span', { class: 'duration', title: 'duration' }, c.duration_ms === null || c.duration_ms === undefined
        ? ((c.status === 'running' || c.status === 'waiting') && c.started_at && !ended
          ? `${fmtDuration(Math.max(0, Date.now() - c.started_at))} so far` : '—')
        : fmtDuration(c.duration_ms)),
      c.attempts ? h('span', { class: 'attempts', title: 'attempts' }, c.attempts === 1 ? '1 attempt' : `${c.attempts} attempts`) : null,
      child ? h('span', { class: 'child-link' }, '→ ', runLink(child.id), ' ', badge(child.status)) : null),
    h('div', { class: 'step-meta muted small' }, 'started ', timeEl(c.started_at),
      c.wake_at ? [' · due ', timeEl(c.wake_at)] : null),
    c.error ? h('div', { class: 'step-error' }, c.error.message, c.error.code ? ` [${c.error.code}]` : '',
      c.error.retryable === false ? ' (fatal)' : '') : null,
    details.length ? h('details', { 'data-key': key }, h('summary', {}, 'details'), details) : null);
}

/** Children as a tree: each child can be opened to load its own children. */
function childList(children) {
  return h('ul', { class: 'tree' }, children.map((child) => {
    const sub = h('div', { class: 'subtree' });
    const toggle = h('button', { type: 'button', class: 'small', 'aria-expanded': 'false' }, '▸');
    toggle.addEventListener('click', async () => {
      if (toggle.getAttribute('aria-expanded') === 'true') {
        toggle.setAttribute('aria-expanded', 'false');
        toggle.textContent = '▸';
        sub.replaceChildren();
        return;
      }
      try {
        const page = await api('GET', '/api/runs?' + new URLSearchParams({ parent: child.id, limit: '500' }));
        sub.replaceChildren(page.runs.length ? childList(page.runs) : h('p', { class: 'muted small' }, 'no children'));
        toggle.setAttribute('aria-expanded', 'true');
        toggle.textContent = '▾';
      } catch (e) { showError(e); }
    });
    return h('li', { 'data-child-id': child.id },
      toggle, ' ', runLink(child.id), ' ', badge(child.status), ' ',
      h('span', { class: 'muted small' }, `${child.workflow}@${child.version}`, child.parent ? ` · seq ${child.parent.seq}` : ''),
      sub);
  }));
}

/**
 * The run page's actions: which statuses allow them, what the dialog says, the call.
 * `body(answer)` gives the JSON text sent; `edit(run)` the text the dialog lets the user edit;
 * `open(answer)` the run to show next (`null`: the runs list) instead of this one refreshed.
 */
const ACTIONS = [
  { id: 'retry-run', label: 'Retry', when: (s) => RETRYABLE.has(s), method: 'POST', suffix: '/retry',
    title: 'Retry', yes: 'Retry', body: () => '{}',
    text: 'The run starts again from its last completed step, with the same input.',
    done: 'is pending again until a worker picks it up.' },
  { id: 'retry-edit-run', label: 'Retry with input…', when: (s) => RETRYABLE.has(s), method: 'POST', suffix: '/retry',
    title: 'Retry with a new input', yes: 'Start a new run', edit: (run) => JSON.stringify(run.input, null, 2),
    body: (answer) => `{"input":${answer.input}}`,
    text: 'A new run of the same workflow starts with this input (the server must have the workflow registered).',
    done: (res) => `was retried as a new run: ${res.run.id}.`, open: (res) => res.run.id },
  { id: 'cancel-run', label: 'Cancel', when: (s) => !TERMINAL.has(s), method: 'POST', suffix: '/cancel', danger: true,
    title: 'Cancel', yes: 'Cancel the run', body: () => '{"compensate":false}',
    text: 'The run stops and is marked cancelled; its completed steps are not undone.',
    done: 'is cancelled.' },
  { id: 'cancel-compensate-run', label: 'Cancel with compensation', when: (s) => !TERMINAL.has(s), method: 'POST',
    suffix: '/cancel', danger: true, title: 'Cancel and compensate', yes: 'Cancel and compensate',
    body: () => '{"compensate":true}',
    text: 'The run stops and runs the compensations (undos) of its completed steps, newest first.',
    done: 'is being cancelled: its compensations run next.' },
  { id: 'delete-run', label: 'Delete', when: (s) => TERMINAL.has(s), method: 'DELETE', suffix: '', danger: true,
    title: 'Delete', yes: 'Delete', body: () => undefined,
    text: 'The run, its history and its child runs are removed from the store. This cannot be undone.',
    done: 'is deleted.', open: () => null },
];

function actionButtons(run, refresh) {
  const path = '/api/runs/' + encodeURIComponent(run.id);
  const perform = async (action) => {
    const answer = await confirmAction({
      title: `${action.title}: ${run.id}?`, text: action.text, yes: action.yes,
      edit: action.edit ? action.edit(run) : undefined,
    });
    if (!answer) return;
    clearError();
    try {
      const res = await api(action.method, path + action.suffix, action.body(answer));
      notify(`${run.id} ${typeof action.done === 'function' ? action.done(res) : action.done}`);
      if (!action.open) await refresh();
      else {
        const next = action.open(res);
        go(next ? runHref(next) : '#/runs');
      }
    } catch (e) { showError(e); }
  };
  return h('div', { class: 'actions' }, ACTIONS.map((action) => h('button', {
    id: action.id, type: 'button', class: action.danger ? 'danger' : null,
    disabled: !action.when(run.status), onclick: () => perform(action),
  }, action.label)));
}

function renderRun(view, d, refresh) {
  const run = d.run;
  const summary = h('dl', { class: 'fields' },
    field('Workflow', h('a', { href: runsHash({ workflow: run.workflow }) }, run.workflow), ` @ version ${run.version}`),
    field('Namespace', run.namespace),
    (run.tags || []).length ? field('Tags', run.tags.map((t) => h('a', { class: 'tag', href: runsHash({ tag: t }) }, t))) : null,
    run.parent ? field('Parent', runLink(run.parent.run_id), ` (seq ${run.parent.seq})`) : null,
    field('Priority', String(run.priority)),
    field('Created', timeEl(run.created_at)),
    field('Updated', timeEl(run.updated_at)),
    run.wake_at ? field('Wakes at', timeEl(run.wake_at)) : null,
    run.lease_owner ? field('Lease', run.lease_owner, ' until ', timeEl(run.lease_until)) : null,
    run.recovery_attempts ? field('Recoveries', String(run.recovery_attempts)) : null);
  const parts = [
    h('div', { class: 'run-head' },
      h('h1', {}, h('span', { class: 'muted' }, 'Run '), h('span', { id: 'run-id' }, run.id)),
      h('span', { id: 'run-status', class: 'badge big s-' + run.status }, run.status)),
    actionButtons(run, refresh),
    h('div', { class: 'columns' },
      section('Summary', summary),
      section('Input', jsonBlock(run.input))),
  ];
  if (run.error) {
    // A blocked run's error says what it waits for; it goes on by itself once that comes.
    const note = run.status === 'blocked'
      ? 'blocked: the run goes on by itself once a worker that can take it appears'
      : run.error.retryable === false ? 'fatal: not retried automatically' : null;
    parts.push(h('section', { class: 'card error-card', id: 'run-error' }, h('h2', {}, run.status === 'blocked' ? 'Blocked' : 'Error'),
      h('p', {}, run.error.message, run.error.code ? ` [${run.error.code}]` : ''),
      note ? h('p', { class: 'muted small', id: 'run-error-note' }, note) : null));
  }
  if (run.output !== null && run.output !== undefined) parts.push(section('Output', h('div', { id: 'run-output' }, jsonBlock(run.output))));
  const timeline = d.timeline || [];
  parts.push(section(`Timeline (${timeline.length})`,
    timeline.length ? null : h('p', { class: 'muted' }, 'No steps recorded yet.'),
    h('ol', { id: 'timeline', class: 'timeline' }, timeline.map((c) =>
      timelineEntry(c, c.kind === 'child' ? (d.children || []).find((r) => r.parent && r.parent.seq === c.seq) : null,
        TERMINAL.has(run.status))))));
  if ((d.children || []).length) parts.push(section(`Children (${d.children.length})`, h('div', { id: 'children' }, childList(d.children))));
  if ((d.waiters || []).length) parts.push(section('Waiting for', waitersTable(d.waiters)));
  if ((d.tasks || []).length) parts.push(section('Pending remote steps', tasksTable(d.tasks)));
  const admission = d.admission && Object.values(d.admission).some((v) => (Array.isArray(v) ? v.length : v));
  if (admission) parts.push(section('Admission', genericValue(d.admission)));

  // Keep the open/closed state of the details across live refreshes.
  const open = new Set([...document.querySelectorAll('#view details[open][data-key]')].map((e) => e.dataset.key));
  if (!show(view, ...parts)) return;
  for (const e of document.querySelectorAll('#view details[data-key]')) if (open.has(e.dataset.key)) e.open = true;
}

async function runPage(view, id) {
  const path = '/api/runs/' + encodeURIComponent(id);
  let pending = null;
  let loading = false;
  // Loads and renders the run; calls made while a load is in flight are folded into one more.
  const refresh = async () => {
    if (loading) { pending = true; return; }
    loading = true;
    try {
      do {
        pending = false;
        let d;
        try {
          d = await api('GET', path, undefined, view.signal);
        } catch (e) {
          if (e instanceof ApiError && e.status === 404) {
            show(view, h('h1', {}, 'Run ', h('span', { id: 'run-id' }, id)),
              h('p', { id: 'run-status', class: 'muted' }, 'not found'),
              h('p', {}, 'No run with this id (deleted?). ', h('a', { href: '#/runs' }, 'Back to the runs.')));
            return;
          }
          throw e;
        }
        renderRun(view, d, refresh);
      } while (pending && !view.signal.aborted);
    } finally {
      loading = false;
    }
  };
  await refresh();
  follow(view, new URLSearchParams({ run: id }).toString(), (run) => {
    if (run.id !== id) return;
    const status = $('#run-status');
    if (status) {
      status.textContent = run.status;
      status.className = 'badge big s-' + run.status;
    }
    refresh().catch((e) => { if (!view.signal.aborted) showError(e); });
  }, (deleted) => {
    if (deleted !== id) return;
    const status = $('#run-status');
    if (status) {
      status.textContent = 'deleted';
      status.className = 'badge big s-deleted';
    }
    showError(new Error(`run ${id} was deleted`));
  });
}

// ---------------------------------------------------------------------------------------------
// Queues, schedules, workers: shown as the API gives them, refreshed every few seconds.

const SECTION_TITLES = {
  admission: 'Admission gates (queues and concurrency keys)',
  tasks: 'Task queues of remote steps',
  queues: 'Queues of remote steps',
  workers: 'Live workers',
  schedules: 'Schedules',
};

async function tablesPage(view, title, path) {
  const load = async () => {
    const data = await api('GET', path, undefined, view.signal);
    const body = [];
    if (Array.isArray(data)) {
      body.push(h('div', { class: 'card' }, genericValue(data)));
    } else if (data && typeof data === 'object') {
      for (const [k, v] of Object.entries(data)) body.push(section(SECTION_TITLES[k] || k.replace(/_/g, ' '), genericValue(v)));
    } else {
      body.push(h('p', {}, valueNode('', data)));
    }
    show(view, h('h1', {}, title), h('p', { class: 'muted small' }, 'refreshed ', timeEl(Date.now())), ...body);
  };
  await load();
  every(view, REFRESH_MS, () => load().catch((e) => { if (!view.signal.aborted) showError(e); }));
}

// ---------------------------------------------------------------------------------------------
// Start

function initToken() {
  const input = $('#token');
  const state = $('#token-state');
  const showState = () => { state.textContent = token() ? 'saved for this tab' : ''; };
  input.value = token();
  showState();
  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = input.value.trim();
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
    showState();
    clearError();
    route();
  });
}

document.addEventListener('DOMContentLoaded', () => {
  initToken();
  $('#error-close').addEventListener('click', clearError);
  window.addEventListener('hashchange', route);
  route();
});
