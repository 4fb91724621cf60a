// A session's web terminal (templates/portal/session_detail.html): xterm.js on the
// websocket /ws/sessions/<id>/terminal/ (spurcloud/portal/terminal_consumer.py).
// Binary frames are the terminal's bytes both ways; the page sends its size as
// {"resize": [cols, rows]} whenever the box changes. Every (re)connection is a new shell
// (each tab its own); a dropped connection is retried with a growing delay, and the
// Reconnect button starts one at once.
(function () {
  "use strict";
  const card = document.getElementById("session-terminal");
  if (!card || typeof window.Terminal !== "function") { return; }
  const screen = document.getElementById("terminal-screen");
  const status = document.getElementById("terminal-status");
  const button = document.getElementById("terminal-reconnect");
  const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
  const url = scheme + window.location.host + card.dataset.wsPath;
  // Codes after which trying again at once changes nothing (terminal_consumer.py).
  const FINAL = { 1000: true, 4403: true, 4404: true, 4429: true };
  const MAX_FRAME = 65536;
  const encoder = new TextEncoder();

  const term = new window.Terminal({ cursorBlink: true, scrollback: 5000, convertEol: false });
  term.open(screen);
  let socket = null;
  let delay = 1000;
  let retry = null;
  let sent = "";

  const say = function (text) { status.textContent = text; };

  // The columns and rows that fit the box, from the size of one cell as the terminal
  // draws it: what xterm's fit addon reads (not vendored: it is these few lines).
  const fit = function () {
    const service = term._core && term._core._renderService;
    const cell = service && service.dimensions && service.dimensions.css.cell;
    if (!cell || !cell.width || !cell.height) { return; }
    const style = window.getComputedStyle(screen);
    const width = screen.clientWidth - parseFloat(style.paddingLeft) -
      parseFloat(style.paddingRight) - 14;  // the scroll bar
    const height = screen.clientHeight - parseFloat(style.paddingTop) -
      parseFloat(style.paddingBottom);
    const cols = Math.max(2, Math.floor(width / cell.width));
    const lines = Math.max(2, Math.floor(height / cell.height));
    if (cols !== term.cols || lines !== term.rows) { term.resize(cols, lines); }
    sendSize();
  };

  const sendSize = function () {
    const size = JSON.stringify({ resize: [term.cols, term.rows] });
    if (socket && socket.readyState === WebSocket.OPEN && size !== sent) {
      socket.send(size);
      sent = size;
    }
  };

  const connect = function () {
    window.clearTimeout(retry);
    if (socket) { socket.onclose = null; socket.close(); }
    say("Connecting…");
    sent = "";
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    socket.onopen = function () {
      say("Connected: a shell in the session, as your organisation.");
      delay = 1000;
      fit();
      sendSize();
      term.focus();
    };
    socket.onmessage = function (event) {
      if (typeof event.data === "string") {
        const message = JSON.parse(event.data);
        if (message.type === "status" && message.text) { say(message.text); }
        return;
      }
      term.write(new Uint8Array(event.data));
    };
    socket.onclose = function (event) {
      socket = null;
      if (FINAL[event.code]) {
        if (event.code === 1000) { say("The shell exited. Reconnect for a new one."); }
        return;
      }
      say((status.textContent || "Disconnected.") + " Trying again in " +
        Math.round(delay / 1000) + " s.");
      retry = window.setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  };

  term.onData(function (data) {
    if (!socket || socket.readyState !== WebSocket.OPEN) { return; }
    const bytes = encoder.encode(data);
    for (let start = 0; start < bytes.length; start += MAX_FRAME) {
      socket.send(bytes.subarray(start, start + MAX_FRAME));
    }
  });
  term.onResize(sendSize);
  if (typeof ResizeObserver === "function") {
    new ResizeObserver(fit).observe(screen);
  } else {
    window.addEventListener("resize", fit);
  }
  button.addEventListener("click", function () { delay = 1000; connect(); });
  connect();
})();
