// Live job table: listens on /ws/jobs/ and patches the row of each job it hears about
// (adding it at the top when new). Messages are {"type": "job", "job": <job object>};
// a row keeps the seq it shows, so an older update never overwrites a newer one.
(function () {
  "use strict";
  const table = document.getElementById("jobs-table");
  if (!table) return;
  const body = table.tBodies[0];
  const status = document.getElementById("live-status");
  const FIELDS = ["job_id", "name", "user", "partition", "state", "reason", "num_gpus",
                  "nodes", "submit_time", "end_time", "exit_code"];
  const MAX_ROWS = 200;
  let retryMs = 1000;

  function setStatus(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function showTime(iso) {
    // "2025-01-02T03:04:05Z" -> "2025-01-02 03:04:05" (UTC, as the server renders it)
    return iso ? iso.replace("T", " ").replace(/Z$/, "") : "";
  }

  function cellText(job, field) {
    const value = job[field];
    if (value === null || value === undefined) return "";
    if (field === "nodes") return Array.isArray(value) ? value.join(",") : String(value);
    if (field === "submit_time" || field === "end_time") return showTime(value);
    return String(value);
  }

  function fillRow(row, job) {
    row.dataset.jobId = job.job_id;
    row.dataset.seq = job.seq || 0;
    FIELDS.forEach(function (field) {
      let cell = row.querySelector('[data-field="' + field + '"]');
      if (!cell) {
        cell = document.createElement("td");
        cell.dataset.field = field;
        row.appendChild(cell);
      }
      if (field === "state") {
        const badge = document.createElement("span");
        badge.className = "state state-" + String(job.state || "").toLowerCase();
        badge.textContent = job.state || "";
        cell.replaceChildren(badge);
      } else {
        cell.textContent = cellText(job, field);
      }
    });
  }

  function apply(job) {
    let row = body.querySelector('tr[data-job-id="' + job.job_id + '"]');
    if (row && Number(row.dataset.seq || 0) > Number(job.seq || 0)) return;
    if (!row) {
      const empty = body.querySelector("tr.empty");
      if (empty) empty.remove();
      row = document.createElement("tr");
      // Newest job first, as the server renders the table.
      let before = null;
      for (const other of body.rows) {
        if (Number(other.dataset.jobId) < Number(job.job_id)) { before = other; break; }
      }
      body.insertBefore(row, before);
      while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
    }
    fillRow(row, job);
    row.classList.remove("flash");
    void row.offsetWidth; // restart the highlight animation
    row.classList.add("flash");
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + table.dataset.wsPath);
    socket.onopen = function () { retryMs = 1000; setStatus("live", "live"); };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "job" && message.job) apply(message.job);
    };
    socket.onclose = function (event) {
      if (event.code === 4401 || event.code === 4403) {
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
