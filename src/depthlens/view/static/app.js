// depthlens view: the run, its voting table, the questions, a question's responses. The URL holds the state:
// #/ (the run), #/q/<question>, #/r/<response>, #/records, each with ?n=&eta=&prefix=&trials=&tie_break=&trial=
// and paging.
"use strict";

let RUN = null;       // /api/run
let generation = 0;   // bumped on every render: a poll of an earlier view stops

const SETTINGS = ["n", "eta", "prefix", "trials", "tie_break", "trial"];

function route() {
  const hash = location.hash.slice(1) || "/";
  const [path, query] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return {parts, params: new URLSearchParams(query || "")};
}

function href(parts, params) {
  const query = params && params.toString();
  return "#/" + parts.map(encodeURIComponent).join("/") + (query ? "?" + query : "");
}

// The voting settings in the URL, over the store's own (its latest thinkn summary's, or the defaults).
function settings(params) {
  const v = RUN.voting;
  return {
    n: params.get("n") || String(v.n), eta: params.get("eta") || String(v.eta),
    prefix: params.get("prefix") || String(v.prefix), trials: params.get("trials") || String(v.trials),
    tie_break: params.get("tie_break") || String(v.tie_break), trial: params.get("trial") || "0",
  };
}

function votingQuery(params, extra = {}) {
  const s = settings(params);
  return new URLSearchParams({n: s.n, eta: s.eta, prefix: s.prefix, trials: s.trials, tie_break: s.tie_break, ...extra});
}

function keep(params, names = SETTINGS) {
  const out = new URLSearchParams();
  for (const name of names) if (params.get(name) !== null) out.set(name, params.get(name));
  return out;
}

function showNotices(lines) {
  const box = $("#notices");
  box.replaceChildren(...lines.map((line) => el("p", {class: "notice"}, line)));
}

function fillSettings(params) {
  const s = settings(params);
  for (const name of SETTINGS) $("#set-" + name).value = s[name];
  $("#settings").hidden = RUN.kind !== "samples";
}

function onSettingChange() {
  const {parts, params} = route();
  for (const name of SETTINGS) {
    const value = $("#set-" + name).value.trim();
    if (value) params.set(name, value); else params.delete(name);
  }
  params.delete("page");
  location.hash = href(parts, params);
}

async function render() {
  const mine = ++generation;
  const {parts, params} = route();
  fillSettings(params);
  const main = $("#main");
  try {
    if (parts[0] === "q") await questionView(main, parts[1], params, mine);
    else if (parts[0] === "r") await responseView(main, parts[1], params, mine);
    else if (RUN.kind === "scores" || parts[0] === "records") await recordsView(main, params, mine);
    else await runView(main, params, mine);
  } catch (error) {
    if (mine === generation) main.replaceChildren(el("p", {class: "error"}, String(error.message || error)));
  }
  const fresh = await getJSON("/api/run");  // notices found while reading (a shard damaged past its footer)
  showNotices(fresh.notices);
}

// ---- the run: settings, the voting table, the questions ----

function runHeader(main) {
  const s = RUN.settings;
  const task = s.task && s.task.name ? s.task.name : "";
  const lines = [
    ["model", `${s.model || "?"}` + (RUN.n_layers ? ` (${RUN.n_layers} layers)` : "")], ["task", task],
    ["input", s.input || ""], ["study", s.study || ""],
    ["records", `${RUN.records} ${RUN.kind === "samples" ? "responses" : "records"}, ${RUN.failed} failed` +
      (RUN.kind === "samples" ? `, ${RUN.questions} questions, pool ${s.pool ?? "?"}` : "")],
    ["DTR", RUN.kind === "tcb" ? "" : `g = ${RUN.dtr.g}, ρ = ${RUN.dtr.rho}, ${RUN.dtr.deep_rule}`],
  ];
  if (s.sampling) lines.push(["sampling", Object.entries(s.sampling).map(([k, v]) => `${k} ${v}`).join(", ")]);
  if (s.readout) lines.push(["readout", `${s.readout.divergence}${s.readout.also && s.readout.also.length ? " + " + s.readout.also.join(", ") : ""}`]);
  if (s.answers) lines.push(["answers", Object.entries(s.answers).map(([k, v]) => `${k} ${v}`).join(", ")]);
  if (s.online) lines.push(["online", Object.entries(s.online).map(([k, v]) => `${k} ${v}`).join(", ")]);
  if (RUN.run_id || RUN.state) lines.push(["store", [RUN.state && `state ${RUN.state}`, RUN.run_id && `run ${RUN.run_id}`].filter(Boolean).join(" · ")]);
  if (RUN.summaries.length) lines.push(["summaries", RUN.summaries.join(", ")]);
  if (s.command) lines.push(["command", s.command]);
  main.append(el("section", {id: "run"}, el("h2", {}, `${s.model || "store"} · ${task || s.study || RUN.kind}`),
    el("dl", {class: "facts"}, lines.filter(([, v]) => v).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]))));
}

async function runView(main, params, mine) {
  main.replaceChildren();
  runHeader(main);
  const section = el("section", {id: "voting-section"}, el("h3", {id: "voting-title"}, "voting"),
    el("div", {id: "voting-body"}, el("p", {class: "wait"}, "voting…")));
  main.append(section);
  const questions = el("section", {id: "questions-section"});
  main.append(questions);
  await Promise.all([votingTable(params, mine), questionsTable(questions, params, mine)]);
}

async function votingTable(params, mine) {
  const data = await getJSON("/api/voting?" + votingQuery(params));
  if (mine !== generation) return;
  const body = $("#voting-body");
  if (data.state === "building" || data.state === "voting") {
    const what = data.state === "building" ? `reading the store for voting: ${data.done} of ${data.total}…`
      : `voting: every method over ${data.trials} draws from each of ${data.questions} questions…`;
    body.replaceChildren(el("p", {class: "wait"}, what));
    setTimeout(() => mine === generation && votingTable(params, mine), 400);
    return;
  }
  if (data.state !== "ready" && data.state !== "partial") {
    body.replaceChildren(el("p", {class: "notice"}, data.note));
    return;
  }
  $("#voting-title").textContent = data.title;
  // exact: the expectation over every draw of n (what the paired tests use); trials: their mean ± draw s.d.
  const head = el("tr", {}, ["method", "exact %", "trials % ± s.d.", "tokens/q", "vs Cons@n", "paper"]
    .map((h) => el("th", {}, h)));
  const rows = data.rows.map((r) => el("tr", {"data-method": r.method, class: r.method === "think@n" ? "think" : null},
    el("td", {class: "method"}, r.method), el("td", {class: "num"}, r.exact), el("td", {class: "num"}, r.accuracy),
    el("td", {class: "num"}, r.tokens), el("td", {class: "num"}, r.vs_cons), el("td", {class: "num"}, r.paper)));
  const paired = data.paired.length ? [el("h4", {}, data.paired_title),
    el("table", {id: "paired"}, el("thead", {}, el("tr", {}, ["method", "Δ points [95 %]", "p · p_BH", "won / lost",
      "95 % vs +2.0 / +3.3 (control: vs 0)"].map((h) => el("th", {}, h)))), el("tbody", {}, data.paired.map((r) => el("tr",
      {"data-method": r.method, class: r.control ? "control" : r.method === "think@n" ? "think" : null},
      el("td", {class: "method"}, r.method), el("td", {class: "num"}, r.difference), el("td", {class: "num"}, r.p),
      el("td", {class: "num"}, r.won_lost), el("td", {class: "num"}, r.gaps)))))]
    : [];
  body.replaceChildren(el("table", {id: "voting", class: data.state}, el("thead", {}, head), el("tbody", {}, rows)),
    el("ul", {id: "voting-notes"}, data.notes.map((n) => el("li", {}, n))), ...paired);
  if (data.state === "partial") setTimeout(() => mine === generation && votingTable(params, mine), 800);
}

async function questionsTable(section, params, mine) {
  const query = votingQuery(params, {page: params.get("page") || "0", size: "50",
    sort: params.get("sort") || "agreement", order: params.get("order") || "asc",
    filter: params.get("filter") || "all", method: params.get("method") || "think@n"});
  const data = await getJSON("/api/questions?" + query);
  if (mine !== generation) return;
  const controls = questionControls(params, query, data);
  const methods = RUN.methods;
  const head = el("tr", {}, el("th", {}, "question"), el("th", {}, "gold"), el("th", {}, "pool's votes"),
    el("th", {}, "agreement"), el("th", {}, "pool right"),
    methods.map((m) => el("th", {class: "vertical", title: m}, m.replace("@n", ""))),
    RUN.online ? el("th", {}, "online run") : null);
  const rows = data.rows.map((q) => el("tr", {"data-id": q.id},
    el("td", {}, el("a", {href: href(["q", q.id], keep(params))}, q.id), el("div", {class: "qtext"}, q.question)),
    el("td", {class: "gold"}, q.gold ?? "—"),
    el("td", {class: "votes"}, q.votes.slice(0, 4).map((v) => el("span", {class: v.correct ? "vote right" : "vote"},
      `${v.answer ?? v.key} ×${v.votes}`)), q.votes.length > 4 ? "…" : "", q.votes.length ? "" : "no answers"),
    el("td", {class: "num"}, pct(q.agreement)), el("td", {class: "num"}, pct(q.pool_right)),
    methods.map((m) => el("td", {class: "mark", "data-method": m}, mark(q.methods ? q.methods[m] : null))),
    RUN.online ? el("td", {}, q.online ? `${q.online.answer ?? "none"} ${q.online.correct ? "✓" : "✗"} · ${q.online.stop} · ${q.online.started} started` : "—") : null));
  const pending = data.state === "building" || data.state === "voting";
  const note = pending ? el("p", {class: "wait"}, "each method's result on each question follows…") : null;
  section.replaceChildren(...[el("h3", {}, `questions (${data.total})`), controls, note,
    el("div", {class: "scroll"}, el("table", {id: "questions"}, el("thead", {}, head), el("tbody", {}, rows)))].filter(Boolean));
  if (pending) setTimeout(() => mine === generation && questionsTable(section, params, mine), 600);
}

function questionControls(params, query, data) {
  const go = (changes) => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) next.set(k, v);
    location.hash = href([], next);
  };
  const select = (id, value, options, key) => {
    const node = el("select", {id}, options.map((o) => el("option", {value: o, selected: o === value}, o)));
    node.addEventListener("change", () => go({[key]: node.value, page: "0"}));
    return node;
  };
  const page = Number(query.get("page")), pages = Math.max(1, Math.ceil(data.total / Number(query.get("size"))));
  return el("div", {class: "controls"},
    el("label", {}, "show ", select("filter", query.get("filter"), ["all", "right", "wrong", "mixed"], "filter")),
    el("label", {}, " for ", select("method", query.get("method"), RUN.methods, "method")),
    el("label", {}, " sort by ", select("sort", query.get("sort"), ["agreement", "accuracy", "responses", "id"], "sort")),
    select("order", query.get("order"), ["asc", "desc"], "order"),
    el("span", {class: "pager"}, el("button", {id: "prev", disabled: page <= 0, onclick: () => go({page: page - 1})}, "‹"),
      ` page ${page + 1} of ${pages} `,
      el("button", {id: "next", disabled: page + 1 >= pages, onclick: () => go({page: page + 1})}, "›")));
}

// ---- a question: its pool, one draw, every method's vote, each response's scores ----

async function questionView(main, qid, params, mine) {
  const data = await getJSON("/api/question?" + votingQuery(params, {id: qid, trial: settings(params).trial}));
  if (mine !== generation) return;
  const s = settings(params);
  const think = data.draw.methods["think@n"];
  const kept = think ? think.kept.length : 0;
  const summary = think
    ? `Think@n keeps ${kept} of the ${data.draw.drawn.length} drawn (⌈η·n⌉, η = ${s.eta}) by prefix DTR over ℓ = ${s.prefix} tokens and answers ${think.answer ?? "nothing"} — ${think.accuracy === 1 ? "right" : "wrong"}; it pays ${think.cost} tokens (Cons@n: ${data.draw.methods["cons@n"].cost}).`
    : data.draw.note;
  const methods = Object.entries(data.draw.methods).map(([m, o]) => el("tr", {"data-method": m},
    el("td", {class: "method"}, m), el("td", {}, o.subsets ? `(over ${o.subsets} subsets)` : o.voted ? (o.answer ?? "none") : "(mean)"),
    el("td", {class: "mark"}, mark(o.accuracy)), el("td", {class: "num"}, o.cost), el("td", {class: "num"}, o.kept.length)));
  const rows = data.rows.map((r) => responseRow(r, params));
  main.replaceChildren(el("section", {id: "question", "data-id": qid},
    el("p", {class: "crumbs"}, el("a", {href: href([], keep(params))}, "run"), " › question"),
    el("h2", {}, qid), el("p", {class: "qtext full"}, data.question ?? ""),
    data.choices.length ? el("ol", {type: "A"}, data.choices.map((c) => el("li", {}, c))) : null,
    el("p", {}, "gold answer: ", el("b", {id: "gold"}, data.gold ?? "—"), ` · ${data.responses} usable responses`,
      data.failed ? `, ${data.failed} failed` : ""),
    el("p", {class: "votes"}, "pool's votes: ", data.votes.length ? data.votes.map((v) =>
      el("span", {class: v.correct ? "vote right" : "vote"}, `${v.answer ?? v.key} ×${v.votes}`)) : "no response answered"),
    data.online_line ? el("p", {class: "online"}, `online run: answered ${data.online_line.answer ?? "nothing"} (${data.online_line.correct ? "right" : "wrong"}) after ${data.online_line.started} responses, ${data.online_line.tokens} tokens, stopped by ${data.online_line.stop}; τ = ${fmt(data.online_line.threshold)}`) : null,
    el("h3", {}, `trial ${data.trial}'s draw`), el("p", {id: "draw-summary"}, summary),
    el("details", {open: true}, el("summary", {}, "every method on this draw"),
      el("table", {id: "draw-methods"}, el("thead", {}, el("tr", {}, ["method", "answer", "right", "tokens", "kept"].map((h) => el("th", {}, h)))),
        el("tbody", {}, methods))),
    el("h3", {}, "responses"),
    el("div", {class: "scroll"}, el("table", {id: "responses"}, el("thead", {}, el("tr", {},
      ["#", "Think@n", `prefix DTR (ℓ=${s.prefix})`, "DTR", "tokens", "finish", "confidence", "answer", "read by",
        "grade", "online"].map((h) => el("th", {}, h)))), el("tbody", {}, rows)))));
}

function responseRow(r, params) {
  const online = r.online ? `${r.online.phase}: ${r.online.reason}${r.online.stopped_at !== null ? ` — stopped at token ${r.online.stopped_at}` : ""}` : (r.phase ? r.phase : "—");
  const link = el("a", {href: href(["r", r.id], keep(params))}, String(r.sample ?? r.id));
  return el("tr", {"data-id": r.id, class: r.think || (r.status === "failed" ? "failed" : "undrawn")},
    el("td", {}, link), el("td", {class: "think"}, r.think ?? (r.status === "failed" ? "failed" : "not drawn")),
    el("td", {class: "num", "data-field": "prefix_dtr", title: r.prefix_note || ""}, fmt(r.prefix_dtr)),
    el("td", {class: "num", "data-field": "dtr"}, fmt(r.dtr)), el("td", {class: "num", "data-field": "token_count"}, r.token_count ?? "—"),
    el("td", {}, r.finish ?? "—"), el("td", {class: "num", "data-field": "confidence"}, fmt(r.confidence)),
    el("td", {"data-field": "answer"}, r.answer ?? "—"), el("td", {}, r.answer_source ?? "—"),
    el("td", {class: r.correct ? "right" : "wrong"}, r.grade ?? r.error ?? "—"), el("td", {class: "online"}, online));
}

// ---- a score store's records ----

async function recordsView(main, params, mine) {
  const query = new URLSearchParams({page: params.get("page") || "0", size: "50",
    sort: params.get("sort") || "store", order: params.get("order") || "asc"});
  const data = await getJSON("/api/records?" + query);
  if (mine !== generation) return;
  main.replaceChildren();
  runHeader(main);
  if (RUN.summary) {
    const s = RUN.summary;
    main.append(el("p", {id: "score-summary"}, `${s.scored} of ${s.records} records scored, ${s.tokens} tokens; mean DTR ${fmt(s.mean_dtr)}, mean settling depth ${fmt(s.mean_settling_depth, 2)}, deep share ${fmt(s.deep_share)}`));
  }
  const sortBy = (column) => {
    const next = new URLSearchParams(params);
    next.set("order", params.get("sort") === column && params.get("order") !== "desc" ? "desc" : "asc");
    next.set("sort", column);
    next.set("page", "0");
    location.hash = href(["records"], next);
  };
  const columns = data.columns.filter((c) => c !== "input_hash");
  const head = el("tr", {}, columns.map((c) => el("th", {class: "sortable", onclick: () => sortBy(c)}, c)));
  const rows = data.rows.map((r) => el("tr", {"data-id": r.id}, columns.map((c) => c === "id"
    ? el("td", {}, el("a", {href: href(["r", String(r.id)], keep(params))}, String(r.id)))
    : el("td", {class: typeof r[c] === "number" ? "num" : null}, typeof r[c] === "number" && !Number.isInteger(r[c]) ? fmt(r[c], 4) : (r[c] ?? "—")))));
  const page = Number(query.get("page")), pages = Math.max(1, Math.ceil(data.total / 50));
  const go = (p) => { const next = new URLSearchParams(params); next.set("page", p); location.hash = href(["records"], next); };
  main.append(el("section", {id: "records-section"}, el("h3", {}, `records (${data.total})`),
    el("div", {class: "controls"}, el("button", {id: "prev", disabled: page <= 0, onclick: () => go(page - 1)}, "‹"),
      ` page ${page + 1} of ${pages} `, el("button", {id: "next", disabled: page + 1 >= pages, onclick: () => go(page + 1)}, "›")),
    el("div", {class: "scroll"}, el("table", {id: "records"}, el("thead", {}, head), el("tbody", {}, rows)))));
}

async function start() {
  RUN = await getJSON("/api/run");
  $("#store").textContent = RUN.path;
  document.title = `depthlens view · ${RUN.path.split("/").pop()}`;
  for (const name of SETTINGS) $("#set-" + name).addEventListener("change", onSettingChange);
  window.addEventListener("hashchange", render);
  await render();
}

start().catch((error) => $("#main").replaceChildren(el("p", {class: "error"}, String(error.message || error))));
