// Live job table: listens on /ws/jobs/ and puts each job it hears about in place (at the
// top when new). Messages are {"type": "job", "job": <job object>, "row": "<tr>...</tr>"}:
// the server renders the row with the page's own template, so nothing is formatted here.
// A row keeps the seq it shows, so an older update never overwrites a newer one. Where the
// table is a filtered list or a later page (data-live-insert="off"), only the rows it
// shows are updated: a job that does not belong there never joins it. The table is looked
// up for each message: a filter or a page (htmx) replaces it with another.
(function () {
  "use strict";
  const first = document.getElementById("jobs-table");
  if (!first) return;
  const wsPath = first.dataset.wsPath;
  const status = document.getElementById("live-status");
  const MAX_ROWS = 200;
  let retryMs = 1000;

  function setStatus(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function rowOf(html) {
    const holder = document.createElement("tbody");
    holder.innerHTML = html;
    return holder.rows[0];
  }

  function apply(job, html) {
    const table = document.getElementById("jobs-table");
    const fresh = rowOf(html);
    if (!table || !fresh) return;
    const body = table.tBodies[0];
    const insert = table.dataset.liveInsert !== "off";
    const old = body.querySelector('tr[data-job-id="' + job.job_id + '"]');
    if (old && Number(old.dataset.seq || 0) > Number(job.seq || 0)) return;
    if (old) {
      old.replaceWith(fresh);
    } else if (insert) {
      const empty = body.querySelector("tr.empty");
      if (empty) empty.remove();
      // Newest job first, as the server renders the table.
      let before = null;
      for (const other of body.rows) {
        if (Number(other.dataset.jobId) < Number(job.job_id)) { before = other; break; }
      }
      body.insertBefore(fresh, before);
      while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
    } else {
      return;
    }
    fresh.classList.add("flash");
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + wsPath);
    socket.onopen = function () { retryMs = 1000; setStatus("live", "live"); };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "job" && message.job && message.row) apply(message.job, message.row);
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
