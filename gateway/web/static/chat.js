// The operator's web chat: the WebSocket authenticates by the session cookie (sent by the browser);
// admin slash commands go to /dashboard/chat/command (with the CSRF token), everything else to the model.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const log = $("log");
  const session = log.dataset.session;
  const csrf = log.dataset.csrf;
  let ws = null, pending = null;

  function add(kind, text, explain) {
    const row = document.createElement("div"); row.className = "msg " + kind;
    const b = document.createElement("div"); b.className = "bubble"; b.textContent = text;
    row.appendChild(b);
    if (explain) { const a = document.createElement("a"); a.className = "explain"; a.href = explain; a.textContent = "Explain"; row.appendChild(a); }
    log.appendChild(row); window.scrollTo(0, document.body.scrollHeight); return b;
  }
  function done() { pending = null; $("send").disabled = false; $("text").focus(); }

  function connect() {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    ws = new WebSocket(`${proto}://${location.host}/v1/ws`);
    ws.onmessage = (ev) => {
      const f = JSON.parse(ev.data);
      if (f.type === "ready") { $("status").textContent = "connected as " + f.user; $("composer").hidden = false; $("text").focus(); }
      else if (f.type === "chunk") { if (!pending) pending = add("agent", ""); pending.textContent += f.text; }
      else if (f.type === "reply") {
        // The chunks were the model's text as it streamed; "reply" is what was stored. They differ
        // (chunks_match false) when a tool round wrote text first, or on a fallback or failure: show what was stored.
        if (!pending) pending = add("agent", f.reply || ""); else if (!f.chunks_match) pending.textContent = f.reply || pending.textContent;
        if (f.explain) { const a = document.createElement("a"); a.className = "explain"; a.href = f.explain; a.textContent = "Explain"; pending.parentNode.appendChild(a); }
        done();
      } else if (f.type === "error") {
        if (f.status === 401 || f.status === 403) { $("status").textContent = "not logged in: reload the page"; }
        else { add("error", f.error); done(); }
      }
    };
    ws.onclose = () => { $("status").textContent = "disconnected (reload to reconnect)"; $("send").disabled = true; };
  }

  async function command(text) {
    const body = new URLSearchParams({ text: text, csrf: csrf });
    const r = await fetch("/dashboard/chat/command", { method: "POST", body: body, headers: { "X-CSRF-Token": csrf }, credentials: "same-origin" });
    if (!r.ok) return { command: true, reply: "error " + r.status + ": the command was not run" };
    return r.json();
  }

  $("composer").onsubmit = async (e) => {
    e.preventDefault();
    const text = $("text").value.trim();
    if (!text || !ws || ws.readyState !== 1) return;
    add("me", text); $("text").value = ""; $("send").disabled = true; pending = null;
    if (text.startsWith("/")) {
      const answer = await command(text);
      if (answer.command) { add("agent command", answer.reply || ""); done(); return; }
    }
    ws.send(JSON.stringify({ session: session, text: text }));
  };
  connect();
})();
