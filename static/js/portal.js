// Behaviour of every portal page, kept out of the HTML: the Content-Security-Policy runs no
// inline script or event handler. A <select data-submit-on-change> submits its form when
// changed (the organisation switcher). The browser's time zone goes to the server in the
// `spur_tz` cookie, so pages show times in it, with the zone (spurcloud/portal/timezones.py).
(function () {
  "use strict";
  for (const select of document.querySelectorAll("select[data-submit-on-change]")) {
    select.addEventListener("change", function () { select.form.submit(); });
  }
  try {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    const current = document.cookie.split("; ").find(function (c) { return c.startsWith("spur_tz="); });
    // IANA names (Europe/Paris) are plain cookie characters: sent as they are, unencoded.
    if (zone && /^[A-Za-z0-9_+\-\/]{1,64}$/.test(zone) && current !== "spur_tz=" + zone) {
      document.cookie = "spur_tz=" + zone + "; path=/; max-age=31536000; SameSite=Lax";
    }
  } catch (e) {
    // No Intl time zone: the pages stay in UTC, and say so.
  }
})();
