// Behaviour of every portal page, kept out of the HTML: the Content-Security-Policy runs no
// inline script or event handler. A <select data-submit-on-change> submits its form when
// changed (the organisation switcher).
(function () {
  "use strict";
  for (const select of document.querySelectorAll("select[data-submit-on-change]")) {
    select.addEventListener("change", function () { select.form.submit(); });
  }
})();
