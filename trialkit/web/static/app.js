// trialkit's page: vanilla JS, no build step. Everything a trial wrote (ids,
// parameter names and values, metric keys, log lines) reaches the page as
// text: DOM nodes get it through textContent (never innerHTML), uPlot's
// labels likewise (it sets them as text or draws them on its canvas), and plotly
// labels get it with <, > and & escaped (plotly reads a few HTML tags in labels).
'use strict';

(() => {
  const TOKEN_KEY = 'trialkit-token';
  const REFRESH_GAP_MS = 1000;  // live updates redraw at most once a second
  const LOG_POLL_MS = 1000;
  const DISK_POLL_MS = 5000;  // how soon the header says the manager's disk takes no writes (or takes them again)
  const POOL_POLL_MS = 2000;  // other experiments' jobs change without an event of this manager: ask again
  const POOL_ORDER = {priority: 'smaller priority first, then the earlier submitted',
    priority_descending: 'bigger priority first, then the earlier submitted',
    fair_share: 'the fewest slots held for its weight first'};
  const FINAL = ['SUCCEEDED', 'FAILED', 'USER_CANCELED', 'SYS_CANCELED', 'EARLY_STOPPED'];
  const STATUSES = ['WAITING', 'RUNNING', 'PREEMPTED', ...FINAL];
  // A trial stopped with a checkpoint waits to be activated: users know it as paused (as the CLI says).
  const statusLabel = (status) => (status === 'PREEMPTED' ? 'PAUSED' : status);

  // ---------------------------------------------------------------- token, API
  // The printed URL carries the page's token (?token=...) for its first use only: it is used at once, then,
  // once the first view is shown (keepToken: storage and history would cost the browser a round of messages
  // before it), kept for this tab (sessionStorage: a reload keeps it, closing the tab forgets it) and taken out
  // of the address and of the history entry. It opens the page's routes only, never the admin ones.
  const given = new URL(location.href).searchParams.get('token');
  const token = given || sessionStorage.getItem(TOKEN_KEY) || '';
  function keepToken() {
    if (!given) return;
    sessionStorage.setItem(TOKEN_KEY, given);
    const url = new URL(location.href);
    url.searchParams.delete('token');
    history.replaceState(null, '', url.pathname + url.search + url.hash);
  }

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, options = {}) {
    const headers = Object.assign({Authorization: 'Bearer ' + token}, options.headers || {});
    const resp = await fetch(path, Object.assign({}, options, {headers}));
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({}));
      throw new ApiError(resp.status, body.error || resp.statusText);
    }
    return resp.json();
  }

  const enc = encodeURIComponent;
  const expPath = (exp) => '/api/ui/experiments/' + enc(exp);

  // ---------------------------------------------------------------- DOM helpers
  // el('td', {class: 'num'}, text, child...): strings become text nodes, never markup.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else if (key === 'class') node.className = value;
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }
  const $ = (id) => document.getElementById(id);
  const headRow = (...labels) => el('thead', {}, el('tr', {}, labels.map((h) => el('th', {}, h))));

  function statusBadge(status) {
    return el('span', {class: 'badge status-' + String(status).toLowerCase().replace(/[^a-z_]/g, '')},
      statusLabel(status));
  }
  function fmtNumber(x) {
    if (x === null || x === undefined) return '—';
    if (typeof x !== 'number') return String(x);
    return Number.isInteger(x) ? String(x) : String(Number(x.toPrecision(6)));
  }
  function fmtValue(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v === 'object') return JSON.stringify(v);
    return typeof v === 'number' ? fmtNumber(v) : String(v);
  }
  function fmtBytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
  }
  function fmtDuration(s) {
    if (s === null || s === undefined) return '—';
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    return h ? `${h}h ${String(m).padStart(2, '0')}m` : m ? `${m}m ${String(sec).padStart(2, '0')}s` : `${sec}s`;
  }
  const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : '—');
  // A trial's final result on one line: its number (a dict's "default"), then the other keys of a dict.
  function finalText(metric, final) {
    if (final === null || final === undefined) return '—';
    const main = metric === null ? fmtValue(typeof final === 'object' && !Array.isArray(final) ? final.default : final)
      : fmtNumber(metric);
    if (typeof final !== 'object' || Array.isArray(final)) return main;
    return [main, ...Object.entries(final).filter(([k]) => k !== 'default').map(([k, v]) => `${k} ${fmtValue(v)}`)]
      .join(' · ');
  }
  // Plotly reads <br>, <b>, <a> and entities in its labels: escape what came from trials.
  const plotText = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

  function showProblem(message) {
    const box = $('problem');
    box.textContent = message || '';
    box.hidden = !message;
  }
  let noticeTimer = null;
  function notice(message) {
    const box = $('notice');
    box.textContent = message;
    box.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => { box.hidden = true; }, 4000);
  }
  // The server's refusal of a token already says what to open: it is shown as it is, once.
  const problemFrom = (err) => String(err.message || err);

  // plotly.js draws what uPlot does not (a trial's GPU chart, the Hyperparameters view). It comes in two
  // bundles (assets.py): the basic one draws these trace types, the full one every type. Each is fetched
  // and run on first use, after the next frame: its evaluation is one long task, and what the view has
  // drawn so far paints before it.
  const BASIC_TRACES = new Set(['scatter', 'bar', 'pie']);
  const bundles = {};
  function loadPlotly(full) {
    if (!full && bundles.full) return bundles.full;  // the full bundle draws everything the basic one does
    const kind = full ? 'full' : 'basic';
    if (!bundles[kind]) {
      const link = $('plotly');
      bundles[kind] = new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)))
        .then(() => new Promise((resolve, reject) => {
          const script = document.createElement('script');
          // The script sets window.Plotly as it runs; its load event follows at once.
          script.addEventListener('load', () => (window.Plotly ? resolve(window.Plotly)
            : reject(new Error('plotly.js did not load'))));
          script.addEventListener('error', () => reject(new Error(full
            ? "parallel coordinates need plotly.js: pip install 'trialkit[control]'" : 'plotly.js did not load')));
          script.src = full ? link.dataset.full : link.dataset.basic;
          document.head.append(script);
        }));
    }
    return bundles[kind];
  }
  const PLOT_CONFIG = {displaylogo: false, responsive: true};

  // uPlot draws the curves: a deferred script of the page, compiled as it downloads and run once the page is
  // parsed, that is once this script (inline, at the page's end) has asked for the first view's data: its
  // evaluation overlaps the answers instead of delaying the questions (bench/bench_web.py).
  const uplotReady = new Promise((resolve, reject) => {
    const script = $('uplot');
    script.addEventListener('load', () => (window.uPlot ? resolve(window.uPlot) : reject(new Error('uPlot did not load'))));
    script.addEventListener('error', () => reject(new Error('uPlot did not load')));
  });
  uplotReady.catch(() => {});  // said where curves are drawn; a view without curves does not need it

  async function plot(node, traces, layout) {
    const Plotly = await loadPlotly(traces.some((t) => !BASIC_TRACES.has(t.type)));
    const base = {margin: {l: 60, r: 20, t: 20, b: 50}, paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: '#fff'};
    await Plotly.react(node, traces, Object.assign(base, layout), PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- info, actions
  // Asked once the first view is shown (start()), unless that view has action buttons, which wait for it: its
  // answer would otherwise come in among the first view's own (bench/bench_web.py).
  // Asked again when the events stream comes back (follow()): the address may then be served by another server,
  // `trialkit ui` (read-only) after the run's, or a resumed run's after `trialkit ui`.
  let info = {read_only: true, actions: []};
  let infoAsked = null, diskPoll = null;
  function infoReady() {
    infoAsked = infoAsked || api('/api/ui/info').then((got) => {
      info = got;
      // plain "read-only": the run's end note (closing()) said how to serve the page again, which this server does
      Object.assign($('mode'), {textContent: 'read-only', hidden: !got.read_only});
      $('live').hidden = got.read_only;  // a read-only page serves what was stored: nothing on it is live
      showDisk(got.disk);
      // A disk that refuses writes commits nothing, so no change event tells of it: ask now and then.
      clearInterval(diskPoll);
      diskPoll = got.read_only ? null
        : setInterval(() => api('/api/ui/info').then((now) => showDisk(now.disk), () => {}), DISK_POLL_MS);
    }).catch((err) => showProblem(problemFrom(err)));
    return infoAsked;
  }

  const diskBadge = Object.assign(document.createElement('span'), {id: 'disk', className: 'badge', hidden: true});
  document.querySelector('header').append(diskBadge);
  function showDisk(problem) {
    diskBadge.textContent = problem ? `DISK: ${problem}` : '';
    diskBadge.hidden = !problem;
  }

  async function act(exp, trial, action, body) {
    try {
      await api(`${expPath(exp)}/trials/${enc(trial)}/${action}`, {
        method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body || {}),
      });
      notice(`${action}: ${trial}`);
      refreshSoon();
    } catch (err) {
      showProblem(`${action} ${trial}: ${problemFrom(err)}`);
    }
  }

  // The buttons a trial in this status can take, among the actions the manager offers.
  function actionButtons(exp, trial) {
    if (info.read_only) return null;
    const can = (a) => info.actions.includes(a);
    const live = trial.status === 'RUNNING' || trial.status === 'WAITING';
    const box = el('span', {class: 'actions'});
    const button = (action, label, body, extra) => el('button', Object.assign({'data-action': action,
      onclick: () => act(exp, trial.id, action, body && body())}, extra), label);
    if (can('pause') && live) box.append(button('pause', 'Pause'));
    if (can('activate') && trial.status === 'PREEMPTED') box.append(button('activate', 'Activate'));
    if (can('kill') && live) box.append(button('kill', 'Kill', null, {class: 'danger'}));
    if (can('priority') && !FINAL.includes(trial.status)) {
      const input = el('input', {class: 'priority', type: 'number', step: 1, value: trial.priority,
        'aria-label': 'priority'});
      box.append(input, button('priority', 'Set priority', () => ({priority: parseInt(input.value, 10)})));
    }
    return box;
  }

  // ---------------------------------------------------------------- views
  function crumbs(...parts) {
    $('crumbs').replaceChildren(...parts.flatMap((p, i) => (i ? [' / ', p] : [p])));
  }

  // The title: its name (id) and status, from the view's answer (`heading`: the overview, or the `experiment`
  // that the other views' answers carry); its id alone until that is in.
  const title = (exp, heading) => (heading
    ? [heading.name ? `${heading.name} (${exp})` : exp, ' ', statusBadge(heading.status)] : [exp]);
  function retitle(exp, heading) {
    const h1 = document.querySelector('#main > h1');
    if (h1 && heading) h1.replaceChildren(...title(exp, heading));
  }

  function experimentHeader(exp, active, overview) {
    crumbs(el('a', {href: '#/'}, 'experiments'), el('a', {href: '#/exp/' + enc(exp)}, exp));
    const tab = (name, label) => el('a', {href: `#/exp/${enc(exp)}${name ? '/' + name : ''}`,
      class: active === name ? 'active' : null}, label);
    return [
      el('h1', {}, title(exp, overview)),
      el('nav', {class: 'tabs'}, tab('', 'Overview'), tab('trials', 'Trials'), tab('params', 'Hyperparameters'),
        tab('queue', 'Queue')),
    ];
  }

  // When a view first showed all its parts (and the trials view its table), and when the frame that paints them
  // had run (paintedAt: its style, layout and paint are the browser's part): tests and bench/ read these.
  function markReady(name) {
    if (document.body.dataset.ready === name) return;
    document.body.dataset.ready = name;
    document.body.dataset.readyAt = String(performance.now());
    requestAnimationFrame(() => setTimeout(() => {
      if (document.body.dataset.ready === name) document.body.dataset.paintedAt = String(performance.now());
    }));
  }
  function markTable() {
    if (!document.body.dataset.tableAt) document.body.dataset.tableAt = String(performance.now());
  }

  class ExperimentsView {
    constructor() { this.key = 'experiments'; }
    mount(main) {
      crumbs(el('a', {href: '#/'}, 'experiments'));
      this.body = el('tbody');
      const table = el('table', {id: 'experiments'},
        headRow('Experiment', 'Name', 'Status', 'Trials', 'By status', 'Best metric', 'Duration', 'Started'),
        this.body);
      main.replaceChildren(el('h1', {}, 'Experiments'), el('div', {class: 'table-wrap'}, table));
    }
    async load() {
      const list = await api('/api/ui/experiments');
      this.body.replaceChildren(...list.map((e) => el('tr', {},
        el('td', {}, el('a', {href: '#/exp/' + enc(e.id)}, e.id)),
        el('td', {}, e.name || ''),
        el('td', {}, statusBadge(e.status)),
        el('td', {class: 'num'}, e.trials),
        el('td', {}, Object.entries(e.counts).map(([s, n]) => `${statusLabel(s)} ${n}`).join(' · ')),
        el('td', {class: 'num'}, e.best ? fmtNumber(e.best.metric) : '—'),
        el('td', {}, fmtDuration(e.elapsed)),
        el('td', {}, fmtTime(e.created)))));
      if (!list.length) this.body.append(el('tr', {}, el('td', {colspan: 8, class: 'muted empty'}, 'no experiments yet')));
      markReady('experiments');
    }
  }

  class OverviewView {
    constructor(exp) { this.exp = exp; this.key = 'overview:' + exp; }
    mount(main) { this.main = main; }
    async load() {
      const o = await api(expPath(this.exp));
      const card = (title, ...content) => el('div', {class: 'card'}, el('h3', {}, title), ...content);
      const best = o.best;
      this.main.replaceChildren(
        ...experimentHeader(this.exp, '', o),
        el('div', {class: 'cards'},
          card('Status', el('div', {class: 'big'}, o.status),
            o.reason ? el('div', {class: 'muted', id: 'ended-why'}, o.reason) : ''),
          card('Trials', el('div', {class: 'big'}, o.trials, o.max_trials ? ` / ${o.max_trials}` : ''),
            el('div', {class: 'muted', id: 'trials-left'}, !o.live ? `ended (${o.status})`
              : o.remaining_trials === null ? 'no trial limit' : `${o.remaining_trials} left`)),
          card('Duration', el('div', {class: 'big'}, fmtDuration(o.elapsed)),
            el('div', {class: 'muted', id: 'time-left'}, o.max_duration === null ? 'no time limit'
              : !o.live ? `limit ${fmtDuration(o.max_duration)}, ended (${o.status})`
              : `of ${fmtDuration(o.max_duration)}, ${fmtDuration(o.remaining_duration)} left`)),
          card('Best metric', el('div', {class: 'big'}, best ? fmtNumber(best.metric) : '—'),
            el('div', {class: 'muted'}, o.optimize_mode,
              best ? [' · ', el('a', {href: `#/exp/${enc(this.exp)}/trial/${enc(best.id)}`}, best.id)] : ''))),
        el('h2', {}, 'Trials by status'),
        el('div', {class: 'cards', id: 'counts'}, Object.entries(o.counts).map(([s, n]) =>
          el('div', {class: 'card'}, el('h3', {}, statusLabel(s)), el('div', {class: 'big'}, n)))),
        el('div', {class: 'two'},
          el('div', {}, el('h2', {}, 'Best trial parameters'),
            best ? paramsTable(best.parameters) : el('p', {class: 'muted', id: 'no-best'},
              o.live ? 'no final metric yet' : 'no trial reported a final metric')),
          el('div', {}, el('h2', {}, 'Search space'),
            el('pre', {class: 'json'}, JSON.stringify(o.search_space, null, 2)))),
        el('h2', {}, 'Config'),
        el('pre', {class: 'json', id: 'config'}, JSON.stringify(o.config, null, 2)));
      markReady('overview');
    }
  }

  function paramsTable(params) {
    const rows = Object.entries(params || {});
    if (!rows.length) return el('p', {class: 'muted empty'}, 'no parameters');
    return el('table', {class: 'params'}, el('tbody', {}, rows.map(([k, v]) =>
      el('tr', {}, el('th', {}, k), el('td', {}, fmtValue(v))))));
  }

  // Whether the trials view's address sets a filter (a status, a metric or parameter range).
  const filters = (q) => [...q.keys()].some((k) => ['status', 'metric'].includes(k) || k.startsWith('p:'));

  // The trials table (server-side sort, filters, pages) and the curves of the selected trials.
  class TrialsView {
    constructor(exp) {
      this.exp = exp; this.key = 'trials:' + exp; this.tableKey = null; this.curveKey = null; this.ended = new Set();
      this.asksFirst = true;  // load() reads only the address until its answer is in
    }

    mount(main) {
      this.head = el('thead');
      // A row's checkbox (the only input in the body) selects its trial: one listener for them all.
      this.body = el('tbody', {onchange: (e) => this.toggle(e.target.closest('tr').dataset.trial, e.target.checked)});
      this.pager = el('span', {class: 'pager'});
      const choose = (key) => (e) => this.set({[key]: e.target.value, offset: null});
      this.status = el('select', {'aria-label': 'status', onchange: choose('status')},
        el('option', {value: ''}, 'all statuses'), STATUSES.map((s) => el('option', {value: s}, statusLabel(s))));
      this.size = el('select', {'aria-label': 'page size', onchange: choose('limit')},
        [25, 50, 100, 200].map((n) => el('option', {value: n}, `${n} a page`)));
      this.curveTitle = el('h2', {}, 'Curves');
      this.metricPick = new MetricPicker('curve-metric');
      this.chart = el('div', {class: 'chart', id: 'curves'});
      main.replaceChildren(
        ...experimentHeader(this.exp, 'trials'),
        el('div', {class: 'toolbar'}, this.status, this.size,
          el('button', {onclick: () => this.clearFilters()}, 'Clear filters'), el('span', {class: 'spacer'}),
          this.pager),
        el('div', {class: 'table-wrap'}, el('table', {id: 'trials'}, this.head, this.body)),
        el('div', {class: 'panel'}, el('div', {class: 'toolbar'}, this.curveTitle, this.metricPick.node,
          el('span', {class: 'spacer'}), el('button', {onclick: () => this.set({sel: null})}, 'Clear selection')),
        this.chart));
      followWidth(this.chart);
    }

    query() { return new URLSearchParams(location.hash.split('?')[1] || ''); }
    set(changes) {
      const q = this.query();
      for (const [k, v] of Object.entries(changes)) (v === null || v === '' ? q.delete(k) : q.set(k, v));
      location.hash = `#/exp/${enc(this.exp)}/trials?${q}`;
    }
    clearFilters() {
      const q = this.query();
      for (const k of [...q.keys()]) {
        if (['status', 'metric', 'offset'].includes(k) || k.startsWith('p:')) q.delete(k);
      }
      location.hash = `#/exp/${enc(this.exp)}/trials?${q}`;
    }
    selected() { return (this.query().get('sel') || '').split(',').filter(Boolean); }

    async load(live) {
      const q = this.query();
      const tableQuery = new URLSearchParams(q);
      tableQuery.delete('sel');
      tableQuery.delete('curve');
      const tableKey = tableQuery.toString();
      const curveKey = `${q.get('sel') || ''} ${q.get('curve') || ''}`;
      const tableDue = live || tableKey !== this.tableKey;
      if (!tableDue) this.markSelection();
      if (!tableQuery.has('limit')) tableQuery.set('limit', '50');
      const curvesDue = live || curveKey !== this.curveKey;
      const chosen = this.selected();
      const curvesOf = enc(chosen.join(',')), metric = enc(q.get('curve') || '');
      // The table and its curves come in one answer when both are due (the first view, a live update), and are
      // shown together: a cold page waits for one answer, not two (a loaded machine's manager serves each in
      // turn), and lays the view out and paints it once, not the table first and then again with its curves
      // (bench/bench_web.py). What alone is due comes alone.
      let page = null, curves = null;
      if (tableDue) {
        const withCurves = curvesDue ? `&with=curves&trials=${curvesOf}&curve=${metric}` : '';
        page = await api(`${expPath(this.exp)}/trials?${tableQuery}${withCurves}`);
        curves = page.curves || null;
      } else if (curvesDue) {
        curves = await api(`${expPath(this.exp)}/curves?trials=${curvesOf}&metric=${metric}`);
      }
      reveal(this.chart);
      if (page) {
        retitle(this.exp, page.experiment);
        this.showTable(tableQuery, page);
        this.tableKey = tableKey;
      }
      if (curves) {
        await this.showCurves(chosen, curves);
        this.curveKey = curveKey;
      }
      markReady('trials');
    }

    showTable(q, page) {
      this.status.value = q.get('status') || '';
      this.size.value = q.get('limit');
      this.params = page.parameters;
      this.ended = new Set(page.rows.filter((t) => FINAL.includes(t.status)).map((t) => t.id));  // chart's words
      if (this.head.dataset.params !== JSON.stringify(page.parameters)) this.buildHead(page.parameters);
      this.syncHead(q);
      const picked = new Set(this.selected());
      // One empty row, cloned for each trial and its cells given their text: a cold page made its 50 rows cell by
      // cell in ~5 ms, after its answer (bench/bench_web.py).
      const empty = el('tr', {}, el('td', {}, el('input', {type: 'checkbox', 'aria-label': 'select'})),
        el('td', {}, el('a')), el('td', {class: 'num'}), el('td'), el('td', {class: 'num metric'}),
        page.parameters.map(() => el('td', {class: 'param'})), el('td', {class: 'num'}), el('td'));
      this.body.replaceChildren(...page.rows.map((t) => {
        const row = empty.cloneNode(true);
        const [pick, link, sequence, status, metric, ...rest] = row.children;
        row.dataset.trial = t.id;
        pick.firstChild.checked = picked.has(t.id);
        link.firstChild.setAttribute('href', `#/exp/${enc(this.exp)}/trial/${enc(t.id)}`);
        link.firstChild.textContent = t.id;
        sequence.textContent = t.sequence;
        // Clipped by app.css (#trials .reason): the whole of it on hover.
        status.append(el('div', {class: 'status-cell'}, statusBadge(t.status),
          t.reason ? el('span', {class: 'muted reason', title: t.reason}, ' ' + t.reason) : ''));
        metric.textContent = fmtNumber(t.metric);
        const texts = [...page.parameters.map((p) => fmtValue((t.parameters || {})[p])), t.restarts,
          fmtDuration(t.duration)];
        rest.forEach((cell, i) => { cell.textContent = texts[i]; });
        return row;
      }));
      if (!page.rows.length) {
        const filtered = filters(q);
        this.body.append(el('tr', {}, el('td', {colspan: 7 + page.parameters.length, class: 'muted empty'},
          filtered ? 'no trial matches these filters' : 'no trials yet')));
      }
      const first = page.total ? page.offset + 1 : 0;
      const last = Math.min(page.total, page.offset + page.rows.length);
      this.pager.replaceChildren(
        el('button', {disabled: page.offset === 0,
          onclick: () => this.set({offset: Math.max(0, page.offset - page.limit) || null})}, '‹ prev'),
        el('span', {class: 'muted', id: 'range'}, ` ${first}–${last} of ${page.total} `),
        el('button', {disabled: last >= page.total, onclick: () => this.set({offset: page.offset + page.limit})},
          'next ›'));
      markTable();
    }

    buildHead(params) {
      this.head.dataset.params = JSON.stringify(params);
      const sortable = (label, key) => el('th', {},
        el('button', {class: 'sort', 'data-sort': key, onclick: () => this.sortBy(key)}, label));
      const filter = (key) => el('th', {}, el('input', {'data-filter': key, placeholder: 'a..b, >x, text',
        'aria-label': `filter ${key}`, onchange: (e) => this.set({[key]: e.target.value.trim(), offset: null})}));
      this.head.replaceChildren(
        el('tr', {}, el('th', {}, ''), sortable('Trial', 'id'), sortable('#', 'sequence'), sortable('Status', 'status'),
          sortable('Metric', 'metric'), params.map((p) => sortable(p, 'p:' + p)), sortable('Restarts', 'restarts'),
          sortable('Duration', 'duration')),
        el('tr', {class: 'filters'}, el('th'), el('th'), el('th'), el('th'), filter('metric'),
          params.map((p) => filter('p:' + p)), el('th'), el('th')));
    }

    syncHead(q) {
      const sort = q.get('sort') || 'sequence';
      const arrow = q.get('order') === 'desc' ? ' ▼' : ' ▲';
      for (const button of this.head.querySelectorAll('button.sort')) {
        const on = button.dataset.sort === sort;
        button.classList.toggle('on', on);
        button.dataset.arrow = on ? arrow : '';
        button.textContent = button.textContent.replace(/ [▲▼]$/, '') + (on ? arrow : '');
      }
      for (const input of this.head.querySelectorAll('input[data-filter]')) {
        if (document.activeElement !== input) input.value = q.get(input.dataset.filter) || '';
      }
    }

    sortBy(key) {
      const q = this.query();
      const current = q.get('sort') || 'sequence';
      const desc = current === key ? q.get('order') !== 'desc' : key === 'metric';
      this.set({sort: key, order: desc ? 'desc' : 'asc', offset: null});
    }

    toggle(id, on) {
      const picked = this.selected().filter((t) => t !== id);
      if (on) picked.push(id);
      this.set({sel: picked.join(',') || null});
    }

    markSelection() {
      const picked = new Set(this.selected());
      for (const row of this.body.querySelectorAll('tr[data-trial]')) {
        row.querySelector('input[type=checkbox]').checked = picked.has(row.dataset.trial);
      }
    }

    // The curves are the trials selected, else the experiment's best (queries.curves): the filters choose the
    // table's rows, not them, and the title says so while a filter is set; where no trial has reported an
    // intermediate result, it says there are none.
    async showCurves(chosen, data) {
      const filtered = filters(this.query());
      this.curveTitle.textContent = chosen.length ? `Curves: ${chosen.length} selected`
        : !data.reported ? 'Curves: none, no trial has reported an intermediate result'
        : `Curves: the experiment's ${data.series.length} best${filtered ? ', regardless of the filters' : ''}`;
      this.metricPick.show(data, (name) => this.set({curve: name}));
      // "yet" only while one of them may still report: an ended trial reports no more.
      const ended = data.series.length > 0 && data.series.every((s) => this.ended.has(s.id));
      await drawCurves(this.chart, data, ended);
    }
  }

  // One metric of some trials over their steps (a Determined report's steps_completed, else its place in the
  // trial's series), drawn by uPlot on a canvas; the best trial among them bold, the others thin. What there
  // is none of is said in words in the chart's place ("yet" unless `ended`: they can report no more).
  const COLORS = ['#2f6fdb', '#e4572e', '#17a398', '#f3a712', '#8f5bd6', '#5c946e', '#d1495b', '#00798c',
    '#7d7d7d', '#b5651d'];
  async function drawCurves(node, data, ended = false) {
    const uPlot = await uplotReady;
    const top = data.top;
    const drawn = data.series.filter((s) => s.steps.length);
    const one = data.series.length === 1;
    const note = !data.series.length ? 'no trial has reported yet'
      : data.series.some((s) => s.reports) ? (drawn.length ? '' : `no trial here reported ${data.metric}`)
      : data.series.some((s) => s.metric !== null)
        ? `no intermediate results: ${one ? 'this trial' : 'these trials'} reported a final result only`
        : `no metrics: ${one ? 'this trial has' : 'these trials have'} reported none${ended ? '' : ' yet'}`;
    node.dataset.empty = note;
    if (note) {
      forgetChart(node);
      node.replaceChildren(el('p', {class: 'chart-note empty'}, note));
      return;
    }
    // uPlot takes one x array for every series: the steps of them all, a gap (null) where one has none.
    const xs = [...new Set(drawn.flatMap((s) => s.steps))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const ys = drawn.map((s) => {
      const column = new Array(xs.length).fill(null);
      s.steps.forEach((x, i) => { column[at.get(x)] = s.values[i]; });
      return column;
    });
    const series = drawn.map((s, i) => ({label: s.id + (s.id === data.best ? ' (best)' : ''), spanGaps: true,
      stroke: COLORS[i % COLORS.length], width: s.id === top ? 3 : 1.5, alpha: s.id === top || !top ? 1 : 0.7,
      points: {show: s.steps.length < 2 || undefined}, value: legendValue}));
    const group = (data.groups || {})[data.metric];
    const y = data.metric === 'default' ? 'intermediate result' : group ? `${data.metric} (${group})` : data.metric;
    const whole = xs.every(Number.isInteger);
    // A live update of the same curves (trials, metric, their looks) gives the chart its new points: the chart
    // is made once, not anew each second while the experiment runs (and a legend being read stays put).
    const shape = JSON.stringify([data.x, y, whole, series.map((s) => [s.label, s.stroke, s.width, s.alpha,
      s.points.show])]);
    if (node.uplot && node.uplotShape === shape) {
      node.uplot.setData([xs, ...ys]);
      return;
    }
    forgetChart(node);
    node.replaceChildren();
    // Made out of the page and shown once drawn (uPlot draws in a microtask it queues as it is made): its canvas's
    // font, set as it draws, then needs no styles of the page, which a canvas in it has the browser work out there
    // and then (~3 ms of a cold page; bench/bench_web.py). It measures where it is shown at the first pointer move.
    const chart = new uPlot({width: widths.get(node) || node.clientWidth || 800, height: CHART_HEIGHT,
      scales: {x: {time: false}, y: {range: valueRange}},
      series: [{label: data.x, value: legendValue}, ...series],
      axes: [{label: data.x, values: tickValues, incrs: whole ? WHOLE_STEPS : undefined},
        {label: y, size: valueAxisSize, values: tickValues}]},
    [xs, ...ys]);
    node.uplot = chart;
    node.uplotShape = shape;
    await null;
    if (node.uplot === chart) node.replaceChildren(chart.root);  // unless another drawing took its place meanwhile
  }
  // The values' own span, a tenth of it either side (of the value, where they are all one), down to 0 only where
  // that side would cross it (a loss): uPlot's own took 0 in, a trial's 0.836 three times a line on 0-1.5.
  function valueRange(u, low, high) {
    if (low == null || high == null) return [0, 1];
    const pad = (high - low) / 10 || Math.abs(high) / 10 || 1;
    return [low >= 0 && low - pad < 0 ? 0 : low - pad, high <= 0 && high + pad > 0 ? 0 : high + pad];
  }
  function forgetChart(node) {
    if (node.uplot) node.uplot.destroy();
    node.uplot = null;
    node.uplotShape = null;
  }
  // Numbers on the chart read as in the table (fmtNumber), not through uPlot's Intl.NumberFormat: the first use of
  // Intl costs a fresh renderer 15-60 ms (bench/bench_web.py), and the trials view needs it nowhere else.
  // Ticks with the decimals their step has, one precision for all (0.90, 0.95, 1.00; 0.9123450 to 0.9123480 where
  // the table's six digits read 0.912346 three times), else as the table writes numbers (fmtNumber).
  const tickValues = (u, splits, axis, space, step) => {
    if (!(step > 0)) return splits.map((v) => (v === null ? '' : fmtNumber(v)));
    let decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
    while (decimals < 15 && Math.abs(step * 10 ** decimals - Math.round(step * 10 ** decimals)) > 1e-6) decimals++;
    return splits.map((v) => (v === null ? '' : v.toFixed(decimals)));
  };
  // The value axis as wide as its longest label, so that its title is drawn clear of them (~7 px a character).
  const valueAxisSize = (u, values) => Math.max(60, 24 + 7 * Math.max(0, ...(values || []).map((v) => v.length)));
  const legendValue = (u, v, seriesIdx, idx) => (idx === null ? '--' : v === null ? '' : fmtNumber(v));
  // Whole steps tick at whole numbers only (uPlot's own steps would put 1.5, 2.5 between 1, 2 and 3).
  const WHOLE_STEPS = Array.from({length: 16}, (_, e) => [1, 2, 5].map((m) => m * 10 ** e)).flat();
  const CHART_HEIGHT = 320;
  // A curves chart's width, as a ResizeObserver tells it after each layout (a window resized, a scrollbar come), or
  // as reveal() reckons it for a view built out of sight: reading it from the node would lay out the tables around
  // it again first (bench/bench_web.py: ~20 ms of a cold page).
  const widths = new WeakMap();
  const resized = new ResizeObserver((entries) => {
    for (const {target, contentRect} of entries) {
      const width = Math.round(contentRect.width);
      widths.set(target, width);
      if (target.uplot && width && target.uplot.width !== width) target.uplot.setSize({width, height: CHART_HEIGHT});
    }
  });
  const followWidth = (node) => resized.observe(node);

  // A choice of the metric the curves show: every metric the trials report by the name a user knows it by
  // (default, a dict's keys, a Determined metric by the name its user wrote: GROUP.NAME only where two groups
  // share it), the one shown selected; beside it, a Determined metric's group as a mark (T, V), as
  // Determined's own page tells training and validation apart.
  class MetricPicker {
    constructor(id) {
      this.select = el('select', {id, 'aria-label': 'metric', hidden: true});
      this.mark = el('span', {class: 'group-mark', hidden: true});
      this.node = el('span', {class: 'metric-pick'}, this.select, this.mark);
    }
    show(data, choose) {
      const groups = data.groups || {};
      this.select.replaceChildren(...data.metrics.map((name) => el('option', {value: name,
        selected: name === data.metric, title: groups[name] ? `${groups[name]} metric` : null}, name)));
      this.select.hidden = data.metrics.length < 2;
      this.select.onchange = (e) => choose(e.target.value);
      const group = groups[data.metric];
      this.mark.textContent = group ? group[0].toUpperCase() : '';
      this.mark.title = group ? `a ${group} metric` : '';
      this.mark.hidden = !group;
    }
  }

  // A trial's GPUs over time (trialkit.gpus samples): utilization and memory used, one pair of lines per GPU.
  async function drawGpuUse(node, samples) {
    const indices = [...new Set(samples.flatMap((s) => s.gpus.map((g) => g.index)))].sort((a, b) => a - b);
    const series = (index, field) => {
      const points = samples.flatMap((s) => s.gpus.filter((g) => g.index === index)
        .map((g) => [new Date(s.time * 1000), g[field]]));
      return {x: points.map((p) => p[0]), y: points.map((p) => p[1])};
    };
    const traces = indices.flatMap((index) => [
      {type: 'scatter', mode: 'lines+markers', name: `GPU ${index} utilization %`, ...series(index, 'utilization')},
      {type: 'scatter', mode: 'lines', name: `GPU ${index} memory MiB`, yaxis: 'y2', line: {dash: 'dot'},
        ...series(index, 'memory_used')},
    ]);
    await plot(node, traces, {xaxis: {type: 'date'}, yaxis: {title: {text: 'utilization %'}, range: [0, 100]},
      yaxis2: {title: {text: 'memory MiB'}, overlaying: 'y', side: 'right', rangemode: 'tozero'},
      legend: {orientation: 'h', y: -0.2}, margin: {l: 60, r: 60, t: 20, b: 50}});
  }

  // Parallel coordinates of parameters and final metric, and the metric against each parameter.
  class HyperView {
    constructor(exp) { this.exp = exp; this.key = 'params:' + exp; }
    mount(main) {
      this.parcoords = el('div', {class: 'chart tall', id: 'parcoords'});
      this.scatter = el('div', {class: 'chart tall', id: 'scatter'});
      this.note = el('p', {class: 'chart-note'});
      main.replaceChildren(...experimentHeader(this.exp, 'params'), this.note,
        el('div', {class: 'panel'}, el('h2', {}, 'Parameters and final metric'), this.parcoords),
        el('div', {class: 'panel'}, el('h2', {}, 'Final metric against each parameter'), this.scatter));
    }
    async load() {
      const h = await api(`${expPath(this.exp)}/hyper`);
      retitle(this.exp, h.experiment);
      // Each chart draws trials by their final metric: with none, there is nothing to draw, said in words.
      const none = !h.ids.length;
      this.note.classList.toggle('empty', none);
      this.note.textContent = none ? 'Nothing to draw: these charts show each trial by its final metric, and no '
        + 'trial has one.' : `${h.ids.length} trials with a final metric (${h.optimize_mode})`;
      for (const chart of [this.parcoords, this.scatter]) chart.parentElement.hidden = none;
      if (none) {
        markReady('params');
        return;
      }
      const dims = h.parameters.map((p) => axis(p, h.columns[p], h.scales[p]));
      dims.push({label: 'metric', values: h.metric});
      const parcoords = plot(this.parcoords, [{type: 'parcoords', dimensions: dims,
        line: {color: h.metric, colorscale: 'Viridis', showscale: true, reversescale: h.optimize_mode === 'minimize'}}],
      {margin: {l: 70, r: 70, t: 40, b: 30}});
      const n = Math.max(1, h.parameters.length);
      const cols = Math.min(3, n);
      const layout = {grid: {rows: Math.ceil(n / cols), columns: cols, pattern: 'independent'}, showlegend: false,
        height: Math.max(360, 300 * Math.ceil(n / cols)), margin: {l: 60, r: 20, t: 20, b: 50}};
      const traces = h.parameters.map((p, i) => {
        const suffix = i ? String(i + 1) : '';
        layout['xaxis' + suffix] = scatterAxis(p, h.columns[p], h.scales[p]);
        layout['yaxis' + suffix] = {title: {text: i % cols ? '' : 'metric'}};
        const categories = h.scales[p].kind === 'category';
        return {type: 'scatter', mode: 'markers',
          x: h.columns[p].map((v) => (typeof v === 'string' || (categories && v !== null) ? plotText(String(v)) : v)),
          y: h.metric, text: h.ids.map(plotText), xaxis: 'x' + suffix, yaxis: 'y' + suffix,
          marker: {size: 6, opacity: 0.7}};
      });
      this.scatter.style.height = layout.height + 'px';
      await Promise.all([parcoords, plot(this.scatter, traces, layout)]);
      markReady('params');
    }
  }

  // Axes follow the search space (queries' `scales`, plot.parameter_scale): a log type on a log axis
  // (parcoords has none: log10 of the values, ticks at the powers of ten), a choice's options as
  // categories in the space's order, numbers as they are; any other values as categories of their text. Each
  // spans the space as declared (plot.parameter_span: low to high; every option of a choice), and any value drawn
  // beyond it, not only the values drawn. Parcoords writes tick labels as plain text, but reads markup in axis titles.
  function axis(name, values, scale) {
    const label = plotText(name);
    const numeric = values.every((v) => typeof v === 'number' || v === null);
    const ends = spanned(values, scale.span);
    if (scale.kind === 'log' && numeric && ends && ends[0] > 0) {
      const [low, high] = ends.map(Math.log10);
      const decades = [];
      for (let d = Math.floor(low); d <= Math.ceil(high); d++) decades.push(d);
      return {label: label + ' (log)', values: values.map((v) => (v === null ? null : Math.log10(v))),
        range: wide([low, high]), tickvals: decades, ticktext: decades.map((d) => String(10 ** d))};
    }
    if (scale.kind !== 'category' && numeric) {
      const whole = wholeTicks(values, ends);
      return whole ? {label, values, range: wide(ends), tickvals: whole} : {label, values, range: wide(ends)};
    }
    const labels = optionLabels(values, scale);
    const index = new Map(labels.map((l, i) => [l, i]));
    return {label, values: values.map((v) => (v === null ? null : index.get(String(v)))),
      range: wide([0, labels.length - 1]), tickvals: labels.map((_, i) => i), ticktext: labels};
  }
  function scatterAxis(name, values, scale) {
    const title = {text: plotText(name)};
    const numeric = values.every((v) => typeof v === 'number' || v === null);
    if (scale.kind === 'category' || !numeric) {
      const labels = optionLabels(values, scale);
      return {title, type: 'category', categoryorder: 'array', categoryarray: labels.map(plotText),
        range: [-0.5, labels.length - 0.5]};
    }
    const log = scale.kind === 'log';
    const ends = spanned(values, scale.span);
    if (!wide(ends) || (log && ends[0] <= 0)) return {title, type: log ? 'log' : undefined};
    // A margin (5% a side, as `experiment plot` has), so that a point at either end shows whole.
    const [low, high] = log ? ends.map(Math.log10) : ends;
    const pad = (high - low) * 0.05;
    const ticks = log ? powerTicks(low, high) : wholeTicks(values, ends);
    // A log axis labelled plainly (plotly's own writes 0.0001 as "100μ"), as the parallel coordinates are.
    return {title, type: log ? 'log' : undefined, range: [low - pad, high + pad], exponentformat: 'none',
      ...(ticks ? {tickmode: 'array', tickvals: ticks, ticktext: ticks.map(String)} : {})};
  }
  // The powers of ten from 10^low to 10^high, thinned to at most 5, as `experiment plot` ticks a log axis
  // (plot.log_ticks); null where fewer than 2 (a range inside a decade: the chart's own ticks).
  function powerTicks(low, high) {
    const powers = [];
    for (let d = Math.ceil(low - 1e-9); d <= Math.floor(high + 1e-9); d++) powers.push(Number(`1e${d}`));
    const stride = Math.ceil(powers.length / 5);
    return powers.length >= 2 ? powers.filter((_, i) => i % stride === 0) : null;
  }
  // Ticks on whole numbers only where every value drawn is one (a randint, a quniform of q 1, Hyperband's
  // TRIAL_BUDGET), as `experiment plot` has them (plot._whole_ticks): 1, 2 or 5 times a power of ten apart, at
  // most 8 steps from `ends`' first whole number to its last; null otherwise (the chart's own ticks).
  function wholeTicks(values, ends) {
    const drawn = values.filter((v) => v !== null);
    if (!ends || !drawn.length || !drawn.every(Number.isInteger)) return null;
    const [low, high] = [Math.ceil(ends[0]), Math.floor(ends[1])];
    const steps = [];
    for (let p = 1; p <= 1e15; p *= 10) steps.push(p, 2 * p, 5 * p);
    const step = steps.find((s) => (high - low) / s <= 8);
    if (!step) return null;
    const ticks = [];
    for (let t = Math.ceil(low / step) * step; t <= high; t += step) ticks.push(t);
    return ticks;
  }
  // The space's [low, high] widened to any value drawn beyond it; without a span, the values' own ends; null when
  // there is neither.
  function spanned(values, span) {
    const ends = [...(span || []), ...values.filter((v) => v !== null)];
    return ends.length ? [Math.min(...ends), Math.max(...ends)] : null;
  }
  // A range with room in it; else none (plotly's own, around one value).
  const wide = (ends) => (ends && ends[0] < ends[1] ? ends : undefined);
  // A choice's options in the space's order (every one, drawn or not), then the values it does not name.
  const optionLabels = (values, scale) => [...new Set([...scale.options.map(String),
    ...values.filter((v) => v !== null).map(String).sort()])];

  // The queue: the jobs of the home's resource pool (every local experiment's, in the order its free slots go to
  // them, as `trialkit job list --pool`), with `job update`'s changes and Move to Top; then this experiment's trials.
  class QueueView {
    constructor(exp) { this.exp = exp; this.key = 'queue:' + exp; this.timer = null; }
    mount(main) {
      this.body = el('tbody');
      this.poolTitle = el('h2', {}, 'Resource pool');
      this.poolNote = el('p', {class: 'muted', id: 'pool-note'});
      this.poolHead = el('thead');
      this.poolBody = el('tbody');
      this.poolTable = el('div', {class: 'table-wrap', hidden: true},
        el('table', {id: 'pool-jobs'}, this.poolHead, this.poolBody));
      main.replaceChildren(...experimentHeader(this.exp, 'queue'), this.poolTitle, this.poolNote, this.poolTable,
        el('h2', {}, 'Trials of this experiment'),
        el('p', {class: 'muted'}, 'Running trials, then waiting ones in the order they will start, then paused ones.'),
        el('div', {class: 'table-wrap'}, el('table', {id: 'queue'},
          headRow('Position', 'Trial', 'Status', 'Priority', 'Submitted', 'Restarts', 'Actions'), this.body)));
    }
    unmount() { clearTimeout(this.timer); }
    async load() {
      const [queue] = await Promise.all([api(`${expPath(this.exp)}/queue`), infoReady().then(() => this.loadPool())]);
      retitle(this.exp, queue.experiment);
      const rows = queue.trials;
      this.body.replaceChildren(...rows.map((t) => el('tr', {'data-trial': t.id},
        el('td', {class: 'num'}, t.position),
        el('td', {}, el('a', {href: `#/exp/${enc(this.exp)}/trial/${enc(t.id)}`}, t.id)),
        el('td', {}, statusBadge(t.status)),
        el('td', {class: 'num'}, t.priority),
        el('td', {}, fmtTime(t.created)),
        el('td', {class: 'num'}, t.restarts),
        el('td', {}, actionButtons(this.exp, t)))));
      if (!rows.length) {
        this.body.append(el('tr', {}, el('td', {colspan: 7, class: 'muted'}, 'nothing running or waiting')));
      }
      markReady('queue');
    }

    // The pool's part never fails the view: an experiment without a job in a pool says so in its place.
    async loadPool() {
      clearTimeout(this.timer);
      if (info.read_only) {  // no experiment loop behind the page to ask: the route would only refuse (501)
        this.poolTable.hidden = true;
        this.poolNote.textContent = "Read-only: the resource pool's jobs are shown by a running experiment's page.";
        return;
      }
      try {
        const pool = await api(`${expPath(this.exp)}/pool`);
        // Not while a priority is being typed or an experiment chosen: the next look redraws it.
        if (!this.poolBody.contains(document.activeElement)) this.showPool(pool);
        this.timer = setTimeout(() => { if (current === this) this.loadPool(); }, POOL_POLL_MS);
      } catch (err) {
        this.poolTable.hidden = true;
        this.poolNote.textContent = problemFrom(err);
      }
    }

    showPool(pool) {
      // A fair share pool orders by the slots each job holds for its weight; the others by priority.
      const weighted = pool.scheduler === 'fair_share';
      this.poolTitle.textContent = `Resource pool ${pool.pool}`;
      this.poolNote.textContent = 'Every experiment of this TRIALKIT_HOME that takes slots from this pool, in the ' +
        `order its free slots go to them (${POOL_ORDER[pool.scheduler] || pool.scheduler}), as ` +
        '`trialkit job list --pool` shows them.';
      this.poolHead.replaceChildren(el('tr', {}, ['Position', 'Experiment', 'Name', 'Priority',
        weighted ? 'Weight' : null, 'Submitted', 'Slots (acquired/needed)', 'State', pool.can_update && 'Actions']
        .filter(Boolean).map((h) => el('th', {}, h))));
      this.poolBody.replaceChildren(...pool.jobs.map((job) => el('tr', {'data-job': job.id,
        class: job.id === this.exp ? 'mine' : null},
        el('td', {class: 'num'}, job.position),
        el('td', {}, job.id === this.exp ? el('a', {href: '#/exp/' + enc(job.id)}, job.id) : job.id),
        el('td', {}, job.experiment_name || ''),
        el('td', {class: 'num'}, job.priority),
        weighted ? el('td', {class: 'num'}, fmtValue(job.weight)) : null,
        el('td', {}, fmtTime(job.submitted)),
        el('td', {class: 'num'}, `${fmtNumber(job.slots_acquired)}/${fmtNumber(job.slots_needed)}`),
        el('td', {}, statusBadge(job.status)),
        pool.can_update && el('td', {}, this.jobButtons(job, pool.jobs, weighted)))));
      if (!pool.jobs.length) {
        this.poolBody.append(el('tr', {}, el('td', {colspan: 9, class: 'muted'}, 'no job in this pool')));
      }
      this.poolTable.hidden = false;
    }

    jobButtons(job, jobs, weighted) {
      const box = el('span', {class: 'actions'});
      const button = (name, label, change) => el('button', {'data-pool-action': name,
        onclick: () => this.update(Object.assign({job: job.id}, change()), label)}, label);
      if (weighted) {  // a place or a priority counts for nothing there (the pool refuses them)
        const weight = el('input', {class: 'priority', type: 'number', min: 0, step: 'any', value: job.weight,
          'aria-label': 'weight'});
        return el('span', {class: 'actions'}, weight,
          button('weight', 'Set weight', () => ({weight: parseFloat(weight.value)})));
      }
      if (job.position > 0) box.append(button('top', 'Move to Top', () => ({top: true})));
      const priority = el('input', {class: 'priority', type: 'number', step: 1, value: job.priority,
        'aria-label': 'priority'});
      box.append(priority, button('priority', 'Set priority', () => ({priority: parseInt(priority.value, 10)})));
      const others = jobs.filter((j) => j.id !== job.id);
      if (others.length) {
        const other = el('select', {'aria-label': 'next to'}, others.map((j) =>
          el('option', {value: j.id}, j.experiment_name ? `${j.id} (${j.experiment_name})` : j.id)));
        box.append(button('ahead_of', 'Ahead of', () => ({ahead_of: other.value})),
          button('behind_of', 'Behind', () => ({behind_of: other.value})), other);
      }
      return box;
    }

    async update(change, label) {
      try {
        const pool = await api(`${expPath(this.exp)}/pool`, {method: 'POST',
          headers: {'Content-Type': 'application/json'}, body: JSON.stringify({updates: [change]})});
        this.showPool(pool);
        notice(`${label}: ${change.job}`);
      } catch (err) {
        showProblem(`${label} ${change.job}: ${problemFrom(err)}`);
      }
    }
  }

  // One trial: facts, actions, parameters, its curve, status history and a live tail of its logs.
  class TrialView {
    constructor(exp, trial) {
      this.exp = exp; this.trial = trial; this.key = `trial:${exp}:${trial}`;
      this.logName = 'stdout'; this.logChosen = false; this.offset = null; this.timer = null; this.rank = '';
      this.metric = '';
    }
    mount(main) {
      crumbs(el('a', {href: '#/'}, 'experiments'), el('a', {href: '#/exp/' + enc(this.exp)}, this.exp),
        el('a', {href: `#/exp/${enc(this.exp)}/trials`}, 'trials'), this.trial);
      this.title = el('h1', {}, this.trial);
      this.facts = el('dl', {class: 'facts'});
      this.actions = el('div', {class: 'actions'});
      this.params = el('div');
      this.chart = el('div', {class: 'chart', id: 'trial-curve'});
      this.metricPick = new MetricPicker('trial-metric');
      this.gpuChart = el('div', {class: 'chart', id: 'trial-gpus'});
      this.gpuPanel = el('div', {class: 'panel', hidden: true}, el('h2', {}, 'GPU use'), this.gpuChart);
      this.checkpoints = el('tbody');
      this.checkpointsWhere = el('p', {class: 'muted', id: 'checkpoints-where'});
      this.checkpointsPanel = el('div', {class: 'panel'}, el('h2', {}, 'Checkpoints'), this.checkpointsWhere,
        el('div', {class: 'fits'}, el('table', {id: 'checkpoints'},
          headRow('UUID', 'Run', 'Steps', 'Metric', 'Size', 'Kept by', 'Where'), this.checkpoints)));
      this.elastic = el('dl', {class: 'facts', id: 'elastic'});
      this.elasticPanel = el('div', {class: 'panel', hidden: true}, el('h2', {}, 'Elastic sizing'), this.elastic);
      this.history = el('tbody');
      this.log = el('pre', {id: 'log'});
      this.rankBox = el('input', {type: 'number', min: '0', placeholder: 'every rank', id: 'log-rank',
        'aria-label': 'only the lines of rank', onchange: (e) => { this.rank = e.target.value.trim(); this.switchLog(this.logName); }});
      this.logTabs = el('div', {class: 'toolbar'}, ...['stdout', 'stderr'].map((name) =>
        el('button', {'data-log': name, onclick: () => this.switchLog(name)}, name)), el('label', {}, ' rank ', this.rankBox));
      main.replaceChildren(this.title, this.actions,
        el('div', {class: 'two'}, el('div', {class: 'panel'}, el('h2', {}, 'Trial'), this.facts),
          el('div', {class: 'panel'}, el('h2', {}, 'Parameters'), this.params)), this.elasticPanel,
        el('div', {class: 'panel'}, el('div', {class: 'toolbar'}, el('h2', {}, 'Intermediate results'),
          this.metricPick.node), this.chart), this.gpuPanel, this.checkpointsPanel,
        el('div', {class: 'panel'}, el('h2', {}, 'Status history'), el('table', {id: 'history'},
          headRow('Time', 'Status', 'Exit code', 'Reason', 'Source'), this.history)),
        el('div', {class: 'panel'}, el('h2', {}, 'Log'), this.logTabs, this.log));
      followWidth(this.chart);
    }
    unmount() { clearTimeout(this.timer); }

    async load() {
      const path = `${expPath(this.exp)}/trials/${enc(this.trial)}`;
      const curvesPath = `${expPath(this.exp)}/curves?trials=${enc(this.trial)}&metric=${enc(this.metric)}`;
      const [t, curves] = await Promise.all([api(path), api(curvesPath), infoReady()]);
      this.data = t;
      // A failed trial's why (its traceback) is on stderr: show that first, unless a tab was chosen.
      if (!this.logChosen && t.status === 'FAILED') this.logName = 'stderr';
      this.title.replaceChildren(this.trial, ' ', statusBadge(t.status));
      this.actions.replaceChildren(actionButtons(this.exp, t) || '');
      const fact = (k, v) => [el('dt', {}, k), el('dd', {}, v)];
      this.facts.replaceChildren(
        ...fact('Status', statusLabel(t.status)), ...fact('Final result', finalText(t.metric, t.final)),
        ...fact('Intermediate results', t.intermediate ? `${t.intermediate} (last step ${t.steps})` : 'none'),
        ...fact('Exit code', fmtValue(t.exit_code)),
        ...fact('Restarts', t.restarts), ...fact('Priority', t.priority), ...fact('Reason', t.reason || '—'),
        ...fact('GPUs', t.gpus ? (t.gpus.join(',') || 'none') : '—'),
        ...fact('Submitted', fmtTime(t.created)), ...fact('Started', fmtTime(t.started)),
        ...fact('Ended', fmtTime(t.ended)),
        ...fact('Duration', fmtDuration(t.duration)), ...fact('Trial dir', t.trial_dir || '—'),
        ...fact('Checkpoint dir', t.checkpoint_dir || '—'),
        ...(t.went_on_from ? fact(t.started_afresh ? 'Started afresh' : 'Went on from', t.went_on_from) : []));
      this.params.replaceChildren(paramsTable(t.parameters));
      this.elasticPanel.hidden = !t.elastic;
      if (t.elastic) {
        // adaptdl-ray's last decision: the goodput model's speedup over one worker for each worker count
        // (integer keys: JavaScript lists them in ascending order).
        const predicted = Object.entries(t.elastic.predicted)
          .map(([count, speedup]) => `${count}: ${speedup.toFixed(2)}x`).join('  ');
        this.elastic.replaceChildren(...fact('Workers now', t.elastic.workers),
          ...fact('Predicted speedup', predicted || 'no hints yet'), ...fact('Last decision', t.elastic.reason),
          ...fact('At', fmtTime(t.elastic.time)));
      }
      this.history.replaceChildren(...t.history.map((h) => el('tr', {},
        el('td', {}, fmtTime(h.time)), el('td', {}, statusBadge(h.status)), el('td', {}, fmtValue(h.exit_code)),
        el('td', {}, h.reason || ''), el('td', {}, h.source))));
      if (!t.history.length) this.history.append(el('tr', {}, el('td', {colspan: 5, class: 'muted empty'}, 'no status yet')));
      this.gpuPanel.hidden = !t.gpu_samples.length;
      this.metricPick.show(curves, (name) => { this.metric = name; this.load(); });
      // Read from the store (maybe an object store): when the trial's status or restarts change, not at each record.
      const seen = `${t.status}:${t.restarts}`;
      if (this.checkpointsSeen !== seen) { this.checkpointsSeen = seen; await this.loadCheckpoints(); }
      await Promise.all([drawCurves(this.chart, curves, FINAL.includes(t.status)), this.pollLog(),
        t.gpu_samples.length ? drawGpuUse(this.gpuChart, t.gpu_samples) : null]);
      markReady('trial');
    }

    async loadCheckpoints() {
      const row = (...cells) => el('tr', {}, ...cells.map((c) => el('td', {}, c)));
      try {
        const found = await api(`${expPath(this.exp)}/trials/${enc(this.trial)}/checkpoints`);
        this.checkpointsWhere.textContent = `Kept in ${found.where}.`;
        this.checkpoints.replaceChildren(...found.checkpoints.map((c) => row(c.uuid, c.run, fmtValue(c.steps),
          fmtValue(c.metric), fmtBytes(c.size), c.kept_by.join(' + ') || 'nothing: deleted once the trial stops',
          c.where)));
        // A PBT trial of NNI's code saves into its save_checkpoint_dir, which no store lists: say where that is.
        const saves = this.data.save_checkpoint_dir;
        if (!found.checkpoints.length) {
          this.checkpoints.append(el('tr', {}, el('td', {colspan: 7, class: 'muted empty'}, saves
            ? `none in the store: this trial saves into its save_checkpoint_dir (NNI's PBT), ${saves}`
            : 'no checkpoint stored')));
        }
      } catch (err) {
        this.checkpointsWhere.textContent = `The checkpoints cannot be read: ${problemFrom(err)}`;
        this.checkpoints.replaceChildren();
      }
    }

    showBlank(words) { this.log.textContent = words; this.blank = true; this.log.classList.add('empty'); }
    showText(text) { this.log.textContent = text; this.blank = false; this.log.classList.remove('empty'); }

    switchLog(name) {
      this.logChosen = true;
      this.logName = name;
      this.offset = null;
      this.log.textContent = '';
      this.pollLog();
    }

    // An ended trial without this stream (a command that never started) may have its keeper's words in its
    // log file (trial.log): shown under the words that the stream is not there, as `trialkit trial logs` prints it.
    async showKeeperLog(name) {
      const own = await api(`${expPath(this.exp)}/trials/${enc(this.trial)}/log?name=trial`);
      if (!own.exists || !own.text) { this.showBlank(`(no ${name})`); return; }
      this.showBlank(`(no ${name}; the trial's log, as \`trialkit trial logs ${this.trial}\` prints it:)\n`);
      this.log.append(el('span', {class: 'keeper-log'}, own.text));
    }

    // Follow the log while the trial runs: ask only for what was added since the last answer.
    async pollLog() {
      clearTimeout(this.timer);
      for (const b of this.logTabs.querySelectorAll('button')) b.classList.toggle('on', b.dataset.log === this.logName);
      const name = this.logName;
      const offset = this.offset === null ? '' : `&offset=${this.offset}`;
      const rank = /^\d+$/.test(this.rank) ? `&rank=${this.rank}` : '';
      try {
        const part = await api(`${expPath(this.exp)}/trials/${enc(this.trial)}/log?name=${name}${offset}${rank}`);
        if (name !== this.logName) return;
        const atBottom = this.log.scrollTop + this.log.clientHeight >= this.log.scrollHeight - 4;
        // What is not there (no file yet, an empty one) is said in words, not shown as a dark empty bar.
        const ended = this.data && FINAL.includes(this.data.status);
        if (!part.exists && ended) await this.showKeeperLog(name);
        else if (!part.exists) this.showBlank(`(no ${name} yet)`);
        else if (this.offset === null || part.start < this.offset || this.blank) this.showText(part.text);
        else if (part.text) this.log.append(part.text);
        if (part.exists && !this.log.textContent) this.showBlank(`(${name} is empty: the trial has written nothing to it)`);
        this.offset = part.exists ? part.end : null;
        if (atBottom) this.log.scrollTop = this.log.scrollHeight;
      } catch (err) {
        showProblem(problemFrom(err));
      }
      const running = this.data && !FINAL.includes(this.data.status);
      if (running && current === this) this.timer = setTimeout(() => this.pollLog(), LOG_POLL_MS);
    }
  }

  // ---------------------------------------------------------------- router, live updates
  let current = null;

  function viewFor(hash) {
    const parts = hash.replace(/^#/, '').split('?')[0].split('/').filter(Boolean).map(decodeURIComponent);
    if (!parts.length || (parts[0] === 'exp' && parts.length === 1)) return new ExperimentsView();
    if (parts[0] !== 'exp') return new NotFoundView(null, parts);
    const exp = parts[1];
    const [view, ...rest] = parts.slice(2);
    if (view === undefined) return new OverviewView(exp);
    if (view === 'trials' && !rest.length) return new TrialsView(exp);
    if (view === 'params' && !rest.length) return new HyperView(exp);
    if (view === 'queue' && !rest.length) return new QueueView(exp);
    if (view === 'trial' && rest.length === 1) return new TrialView(exp, rest[0]);
    return new NotFoundView(exp, parts);
  }

  // An address that names no view (a mistyped or an old bookmark) says so and links the views there are,
  // rather than show another view as if it were the one asked for.
  class NotFoundView {
    constructor(exp, parts) { this.exp = exp; this.parts = parts; this.key = 'not-found:' + parts.join('/'); }
    mount(main) {
      const asked = el('code', {}, '#/' + this.parts.join('/'));
      if (this.exp === null) {
        crumbs(el('a', {href: '#/'}, 'experiments'));
        main.replaceChildren(el('h1', {}, 'No such view'), el('p', {id: 'not-found'}, 'The page has no view at ',
          asked, ': open the ', el('a', {href: '#/'}, 'experiments'), ' list.'));
      } else {
        const at = `#/exp/${enc(this.exp)}`;
        main.replaceChildren(...experimentHeader(this.exp, null), el('p', {id: 'not-found'},
          'The page has no view at ', asked, '. An experiment\'s views: ',
          el('a', {href: at}, 'Overview'), ', ', el('a', {href: `${at}/trials`}, 'Trials'), ', ',
          el('a', {href: `${at}/params`}, 'Hyperparameters'), ', ', el('a', {href: `${at}/queue`}, 'Queue'),
          ', and a trial\'s page at ', el('code', {}, `${at}/trial/TRIAL_ID`), '.'));
      }
    }
    async load() { markReady('not-found'); }
  }

  async function show(live) {
    const next = viewFor(location.hash);
    const fresh = !current || next.key !== current.key;
    if (fresh) {
      if (current && current.unmount) current.unmount();
      resized.disconnect();  // the charts it followed went with their view
      current = next;
      delete document.body.dataset.ready;
      delete document.body.dataset.tableAt;
      delete document.body.dataset.paintedAt;
    }
    const view = current;
    // A view whose load touches its frame only once its answer is in (asksFirst) asks before the frame is built:
    // the page's first view then waits for its data while it builds it, not after. It builds it out of sight
    // (main.waiting: its contents neither styled nor laid out nor painted) until the answer is in (reveal): an
    // empty frame laid out and painted while the answer came held the answer back (bench/bench_web.py).
    const loading = view.asksFirst ? view.load(live) : null;
    if (fresh) {
      $('main').classList.toggle('waiting', loading !== null);
      view.mount($('main'));
    }
    try {
      await (loading || view.load(live));
      showProblem('');
    } catch (err) {
      if (view === current) showProblem(problemFrom(err));
    } finally {
      reveal();
    }
  }

  // Shows the view show() built out of sight; `chart`, a curves chart of it, gets the width it will have, reckoned
  // without laying the view out: main's (laid out without its contents) less its padding and the padding, borders
  // and margins of the chart's containers in it. Reading the chart's own would lay out the whole view first (~20 ms
  // of a cold page).
  function reveal(chart) {
    const main = $('main');
    if (!main.classList.contains('waiting')) return;
    if (chart) {
      let width = main.clientWidth;
      for (let node = chart.parentElement; node !== main.parentElement; node = node.parentElement) {
        const style = getComputedStyle(node);
        for (const side of ['Left', 'Right']) {
          width -= parseFloat(style['padding' + side]);
          if (node !== main) width -= parseFloat(style[`border${side}Width`]) + parseFloat(style['margin' + side]);
        }
      }
      widths.set(chart, Math.round(width));
    }
    main.classList.remove('waiting');
  }

  let refreshing = false, pending = false, lastRefresh = 0;
  function refreshSoon() {
    if (refreshing) { pending = true; return; }
    const wait = Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now());
    refreshing = true;
    setTimeout(async () => {
      await show(true);
      lastRefresh = Date.now();
      refreshing = false;
      if (pending) { pending = false; refreshSoon(); }
    }, wait);
  }

  // Server-sent events through fetch (EventSource cannot send the token header). A page left (another address,
  // the back/forward cache) lets go of its stream: a browser holds six connections to a host, and the streams of
  // pages no longer shown kept them all, so the seventh load of the page waited for good.
  let following = null;
  window.addEventListener('pagehide', () => { if (following) following.abort(); });
  window.addEventListener('pageshow', (e) => { if (e.persisted && token) follow(); });
  async function follow() {
    const live = $('live');
    const stop = new AbortController();
    following = stop;
    let lost = false;  // the stream ended: changes may have been missed, and the server may come back another
    for (;;) {
      try {
        const resp = await fetch('/api/ui/events', {headers: {Authorization: 'Bearer ' + token}, signal: stop.signal});
        if (resp.status === 401 || resp.status === 403) return;
        if (lost) {  // back: take the server's mode, then show everything anew (its change events start from now)
          lost = false;
          infoAsked = null;
          await infoReady();
          refreshSoon();
        }
        live.textContent = 'live';
        live.classList.add('on');
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            if (/^event: change$/m.test(block)) refreshSoon();
            else if (/^event: closing$/m.test(block)) await closing(block, reader);
          }
        }
      } catch (err) {
        // the manager went away: try again below
      }
      if (stop.signal.aborted) return;  // the page was left; pageshow follows again if it comes back
      lost = true;
      live.textContent = 'offline';
      live.classList.remove('on');
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  // The server's last event: it stops (the run ended), and holds the stream open until the page has read its last
  // state. Shown once more as it ended, the view stays, read-only, with why its server went (the event's note);
  // letting go of the stream lets the server go. follow() then waits for the address to answer again.
  async function closing(block, reader) {
    const note = JSON.parse(block.slice(block.indexOf('data:') + 5)).note;
    info = {read_only: true, actions: []};
    infoAsked = Promise.resolve();
    clearInterval(diskPoll);
    while (refreshing) await new Promise((r) => setTimeout(r, 50));  // a refresh asked for before: let it end
    await show(true);
    Object.assign($('mode'), {textContent: `read-only: ${note}`, hidden: false});
    $('live').hidden = true;
    reader.cancel();
  }

  // The bare address (http://host:port/, as NNI users open it) has no token: ask for the printed URL
  // (or its token) rather than show an empty, offline page.
  function askToken() {
    const input = el('input', {id: 'token-input', size: '60', placeholder: 'http://…/?token=…  or the token'});
    const take = () => {
      const text = input.value.trim();
      let given = text;
      try { given = new URL(text).searchParams.get('token') || text; } catch (err) { /* the token itself */ }
      if (!given) return;
      sessionStorage.setItem(TOKEN_KEY, given);
      location.reload();
    };
    $('main').replaceChildren(el('div', {class: 'panel', id: 'needs-token'},
      el('h2', {}, 'This page needs its token'),
      el('p', {}, 'Open the page at the URL trialkit printed where the experiment started (the line ',
        el('code', {}, 'page: http://…/?token=…'), '; `trialkit experiment show ID` prints it again), or paste it here:'),
      el('form', {onsubmit: (e) => { e.preventDefault(); take(); }}, input, ' ', el('button', {type: 'submit'}, 'open'))));
    markReady('token');
  }

  async function start() {
    if (!token) { askToken(); return; }
    window.addEventListener('hashchange', () => show(false));
    await show(false);
    infoReady();
    keepToken();
    follow();
  }

  // From a microtask, once this script has run: a request records the script stack that made it where DevTools
  // is attached (chromedriver: the tests, bench/bench_web.py), and a stack through this whole function had V8
  // parse all of it again for its source positions, 2-5 ms before the first view's request went out.
  queueMicrotask(start);
})();
