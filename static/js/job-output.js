// A job's output, live: listens on the page's #job-output[data-ws-path] and appends each
// piece to its stream's <pre> as text (never as HTML). Messages (spurcloud/portal/
// output_consumer.py): state {state, kind, reason, exit} (the page's facts, kept current),
// output {stream, offset, data, skipped?}, status {text}, end {state}.
// A page keeps at most MAX_CHARS of each stream; the download links have the whole file.
(function () {
  "use strict";
  const section = document.getElementById("job-output");
  if (!section) return;
  const status = document.getElementById("output-status");
  const panes = {
    stdout: document.getElementById("output-stdout"),
    stderr: document.getElementById("output-stderr"),
  };
  const MAX_CHARS = 256 * 1024;
  let retryMs = 1000;
  let over = false;

  function setStatus(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function showState(message) {
    const badge = document.getElementById("job-state");
    if (badge && message.state) {
      badge.textContent = message.state;
      badge.className = "state state-" + message.kind;
    }
    for (const [id, text] of [["job-reason", message.reason], ["job-exit", message.exit]]) {
      const field = document.getElementById(id);
      if (field) field.textContent = text || "";
    }
  }

  function append(stream, message) {
    const pane = panes[stream];
    if (!pane) return;
    const atBottom = pane.scrollHeight - pane.scrollTop - pane.clientHeight < 24;
    let text = pane.textContent;
    if (message.skipped) text += "[" + message.skipped + " earlier bytes: see the download]\n";
    text += message.data;
    if (text.length > MAX_CHARS) text = text.slice(text.length - MAX_CHARS);
    pane.textContent = text;
    if (atBottom) pane.scrollTop = pane.scrollHeight;
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + section.dataset.wsPath);
    socket.onopen = function () {
      retryMs = 1000;
      // A reconnection starts again from the tail: what was shown is replaced, not doubled.
      for (const pane of Object.values(panes)) if (pane) pane.textContent = "";
      setStatus("live", "live");
    };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "state") showState(message);
      else if (message.type === "output") append(message.stream, message);
      else if (message.type === "status") setStatus(message.text ? "waiting" : "live", message.text || "live");
      else if (message.type === "end") {
        over = true;
        setStatus("over", "ended" + (message.state ? " (" + message.state + ")" : ""));
        socket.close();
      }
    };
    socket.onclose = function (event) {
      if (over) return;
      if (event.code === 4401 || event.code === 4403 || event.code === 4404) {
        setStatus("offline", "not allowed");
        return;
      }
      setStatus("offline", "reconnecting…");
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  connect();
})();
