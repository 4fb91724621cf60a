// A session's page (templates/portal/session_detail.html): its lifecycle kept live by
// fetching the status fragment every few seconds until the session has ended.
(function () {
  "use strict";
  const box = document.getElementById("session-status");
  if (!box) { return; }
  const url = box.dataset.statusUrl;
  const ended = function () {
    const phase = document.getElementById("session-phase");
    return phase && phase.dataset.phase === "ended";
  };
  const refresh = function () {
    if (ended()) { return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) { if (html !== null) { box.innerHTML = html; } })
      .catch(function () { /* offline a moment: the next tick tries again */ })
      .finally(function () { if (!ended()) { window.setTimeout(refresh, 3000); } });
  };
  window.setTimeout(refresh, 3000);
})();
