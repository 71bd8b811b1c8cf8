// The chat page: conversations kept in this browser's localStorage, each
// answer streamed from /v1/chat/completions (OpenAI SSE), with its reasoning
// collapsed, its tool calls, time to first token and tokens/s, and the
// prompt's prefill progress (return_progress) while a long prompt is read.
"use strict";

const $ = (sel) => document.querySelector(sel);
const STORE = { conversations: "mlx-serve.conversations", settings: "mlx-serve.settings", current: "mlx-serve.current" };
const SETTINGS = ["system-prompt", "temperature", "top-p", "max-tokens", "thinking", "tools", "tool-choice", "api-key"];

let conversations = load(STORE.conversations, []);
let currentId = localStorage.getItem(STORE.current);
let running = null; // {controller, conversation, message}

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v ?? fallback;
  } catch {
    return fallback;
  }
}

function save() {
  localStorage.setItem(STORE.conversations, JSON.stringify(conversations));
  if (currentId) localStorage.setItem(STORE.current, currentId);
}

function current() {
  return conversations.find((c) => c.id === currentId);
}

function newConversation() {
  const c = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat", messages: [] };
  conversations.unshift(c);
  currentId = c.id;
  save();
  render();
  $("#prompt").focus();
}

function authHeaders() {
  const key = $("#api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// ---- settings ------------------------------------------------------------

function loadSettings() {
  const s = load(STORE.settings, {});
  for (const id of SETTINGS) if (s[id] !== undefined) $(`#${id}`).value = s[id];
}

function saveSettings() {
  const s = {};
  for (const id of SETTINGS) s[id] = $(`#${id}`).value;
  localStorage.setItem(STORE.settings, JSON.stringify(s));
}

// ---- rendering -------------------------------------------------------------

function render() {
  renderList();
  renderMessages();
}

function renderList() {
  const ul = $("#conversations");
  ul.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    li.className = c.id === currentId ? "active" : "";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = c.title;
    open.onclick = () => {
      currentId = c.id;
      save();
      render();
    };
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.title = "Delete this conversation";
    del.textContent = "×";
    del.onclick = () => {
      if (running && running.conversation === c) running.controller.abort();
      conversations = conversations.filter((x) => x !== c);
      if (currentId === c.id) currentId = conversations[0]?.id ?? null;
      save();
      render();
    };
    li.append(open, del);
    ul.append(li);
  }
}

function renderMessages() {
  const box = $("#messages");
  box.replaceChildren();
  const c = current();
  if (!c) return;
  for (const m of c.messages) box.append(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

function messageElement(m) {
  const div = document.createElement("div");
  div.className = `message ${m.role}`;
  fillMessage(div, m);
  return div;
}

function fillMessage(div, m) {
  div.replaceChildren();
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role === "user" ? "You" : "Assistant";
  div.append(role);
  if (m.reasoning) {
    const d = document.createElement("details");
    d.className = "reasoning";
    d.open = !!m.reasoningOpen;
    d.ontoggle = () => (m.reasoningOpen = d.open);
    const s = document.createElement("summary");
    s.textContent = m.pending && !m.content && !m.toolCalls?.length ? "Thinking…" : "Thought";
    const body = document.createElement("div");
    body.className = "reasoning-text";
    body.textContent = m.reasoning;
    d.append(s, body);
    div.append(d);
  }
  const body = document.createElement("div");
  body.className = "content";
  if (m.role === "user") body.textContent = m.content;
  else body.innerHTML = Markdown.render(m.content || "");
  div.append(body);
  for (const call of m.toolCalls || []) {
    const t = document.createElement("div");
    t.className = "tool-call";
    const name = document.createElement("span");
    name.className = "tool-name";
    name.textContent = `${call.name}(…)`;
    const args = document.createElement("pre");
    args.textContent = prettyJson(call.arguments);
    t.append("Tool call: ", name, args);
    div.append(t);
  }
  if (m.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = m.error;
    div.append(e);
  }
  if (m.stats) {
    const s = document.createElement("div");
    s.className = "stats";
    const parts = [];
    if (m.stats.ttftMs != null) parts.push(`TTFT ${(m.stats.ttftMs / 1000).toFixed(2)} s`);
    if (m.stats.tokens != null) parts.push(`${m.stats.tokens} tokens`);
    if (m.stats.tokPerS != null) parts.push(`${m.stats.tokPerS.toFixed(1)} tok/s`);
    if (m.stats.cached) parts.push(`${m.stats.cached} prompt token${m.stats.cached === 1 ? "" : "s"} cached`);
    if (m.stats.finish) parts.push(m.stats.finish);
    s.textContent = parts.join(" · ");
    div.append(s);
  }
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// Code blocks' copy buttons (the markup is re-rendered as text streams in).
document.addEventListener("click", (e) => {
  const b = e.target.closest("button.copy");
  if (!b) return;
  const code = b.closest("pre").querySelector("code").textContent;
  navigator.clipboard?.writeText(code).then(() => (b.textContent = "copied"), () => (b.textContent = "copy failed"));
});

// ---- the request -----------------------------------------------------------

function requestBody(c) {
  const messages = [];
  const system = $("#system-prompt").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of c.messages) {
    if (m.pending) continue;
    if (m.role === "user") messages.push({ role: "user", content: m.content });
    else if (m.content) messages.push({ role: "assistant", content: m.content });
  }
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
    return_progress: true,
    temperature: Number($("#temperature").value),
    top_p: Number($("#top-p").value),
    max_tokens: Number($("#max-tokens").value),
  };
  const thinking = $("#thinking").value;
  if (thinking) body.chat_template_kwargs = { enable_thinking: thinking === "on" };
  const tools = $("#tools").value.trim();
  if (tools) {
    body.tools = JSON.parse(tools); // a syntax error is shown by send()
    body.tool_choice = $("#tool-choice").value;
  }
  return body;
}

async function send(text) {
  if (running || !text.trim()) return;
  if (!current()) newConversation();
  const c = current();
  let body;
  c.messages.push({ role: "user", content: text });
  try {
    body = requestBody(c);
  } catch (e) {
    c.messages.push({ role: "assistant", content: "", error: `Tools: ${e.message}` });
    save();
    render();
    return;
  }
  if (c.title === "New chat") c.title = text.slice(0, 40);
  const m = { role: "assistant", content: "", reasoning: "", toolCalls: [], pending: true, stats: null };
  c.messages.push(m);
  save();
  render();
  const div = $("#messages").lastElementChild;
  const controller = new AbortController();
  running = { controller, conversation: c, message: m };
  setRunning(true);
  const started = performance.now();
  let firstToken = null;
  let promptRead = null; // when the last prefill chunk was done: decoding starts
  let usage = null;
  let finish = null;
  const redraw = () => {
    fillMessage(div, m);
    $("#messages").scrollTop = $("#messages").scrollHeight;
  };
  // At most one redraw a frame: a fast model sends many tokens per frame, and
  // each redraw renders the whole answer's Markdown again.
  let drawQueued = false;
  const scheduleRedraw = () => {
    if (drawQueued) return;
    drawQueued = true;
    requestAnimationFrame(() => {
      drawQueued = false;
      redraw();
    });
  };
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!r.ok) {
      const err = await r.json().catch(() => null);
      throw new Error(err?.error?.message || `HTTP ${r.status}`);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (!data || data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.prompt_progress) {
          showProgress(chunk.prompt_progress);
          if (chunk.prompt_progress.processed >= chunk.prompt_progress.total) promptRead = performance.now();
        }
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices?.[0];
        if (!choice) continue;
        const d = choice.delta || {};
        const piece = (d.content || "") + (d.reasoning_content || "");
        if ((piece || d.tool_calls) && firstToken === null) {
          firstToken = performance.now();
          showProgress(null);
        }
        if (d.content) m.content += d.content;
        if (d.reasoning_content) m.reasoning += d.reasoning_content;
        for (const t of d.tool_calls || []) {
          const slot = (m.toolCalls[t.index ?? m.toolCalls.length] ??= { name: "", arguments: "" });
          if (t.function?.name) slot.name = t.function.name;
          if (t.function?.arguments) slot.arguments += t.function.arguments;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
        if (piece || d.tool_calls) scheduleRedraw();
      }
    }
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped";
    else m.error = e.message;
  } finally {
    const end = performance.now();
    const tokens = usage?.completion_tokens ?? null;
    // Decoding starts when the prompt is read (a tool call's text shows only
    // once the call is whole, so its first visible token comes late).
    const decodeStart = promptRead ?? firstToken;
    m.stats = {
      ttftMs: firstToken === null ? null : firstToken - started,
      tokens,
      tokPerS: tokens > 0 && decodeStart !== null && end > decodeStart ? tokens / ((end - decodeStart) / 1000) : null,
      cached: usage?.prompt_tokens_details?.cached_tokens || 0,
      finish,
    };
    delete m.pending;
    running = null;
    setRunning(false);
    showProgress(null);
    save();
    redraw();
    renderList();
  }
}

function showProgress(p) {
  const box = $("#progress");
  if (!p) {
    box.hidden = true;
    return;
  }
  const todo = Math.max(p.total - p.cache, 1);
  const share = Math.min(1, Math.max(0, (p.processed - p.cache) / todo));
  box.hidden = false;
  $("#progress-bar").style.width = `${(share * 100).toFixed(1)}%`;
  $("#progress-text").textContent = `Reading the prompt: ${p.processed} / ${p.total} tokens` +
    (p.cache ? ` (${p.cache} cached)` : "");
}

function setRunning(on) {
  $("#send").hidden = on;
  $("#stop").hidden = !on;
  document.body.classList.toggle("running", on);
}

// ---- the server's state ----------------------------------------------------

async function refreshHealth() {
  try {
    const r = await fetch("/health", { headers: authHeaders() });
    const h = await r.json();
    $("#status-dot").className = "dot ok";
    if (!h.model) {
      $("#model-name").textContent = "mlx-serve";
      $("#device").textContent = "";
      $("#memory").textContent = "enter the API key in Settings for details";
      return;
    }
    $("#model-name").textContent = h.model;
    $("#device").textContent = `${h.backend} · ${h.device_name}`;
    const gb = (b) => (b >= 1e9 ? `${(b / 1e9).toFixed(2)} GB` : `${(b / 1e6).toFixed(0)} MB`);
    $("#memory").textContent = `memory ${gb(h.memory.active_bytes)} (peak ${gb(h.memory.peak_bytes)}) · ` +
      `${h.engine.running} running, ${h.engine.queued} queued`;
  } catch {
    $("#status-dot").className = "dot down";
    $("#memory").textContent = "server unreachable";
  }
}

// ---- wiring ----------------------------------------------------------------

$("#composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("#prompt").value;
  $("#prompt").value = "";
  send(text);
});
$("#prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("#composer").requestSubmit();
  }
});
$("#stop").addEventListener("click", () => running?.controller.abort());
$("#new-chat").addEventListener("click", newConversation);
for (const id of SETTINGS) $(`#${id}`).addEventListener("change", () => {
  saveSettings();
  if (id === "api-key") refreshHealth();
});

loadSettings();
// A conversation left mid-answer (the page was closed) keeps what had come.
for (const c of conversations) for (const m of c.messages) delete m.pending;
if (!current()) currentId = conversations[0]?.id ?? null;
render();
refreshHealth();
setInterval(() => running || refreshHealth(), 5000);
