// Astraeus console: the live parts. No library, no build step; works offline.
// [data-live=URL]   the element's HTML is replaced by URL's answer about once a second.
// [data-follow=URL] logs: lines after the last one seen are appended (URL?worker=W&after=ID → {lines, after}).
(function () {
  "use strict";
  var PERIOD = 1000;

  function poll(el) {
    var url = el.getAttribute("data-live");
    var last = null;
    function tick() {
      if (document.hidden) { return setTimeout(tick, PERIOD); }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) {
          if (r.status === 404 && !el.getAttribute("data-gone")) {
            el.setAttribute("data-gone", "1");
            var note = document.createElement("div");
            note.className = "alert warn";
            note.textContent = "This no longer exists (deleted, or no longer visible to this token).";
            var anchor = el.closest("table") || el;
            anchor.parentNode.insertBefore(note, anchor);
          }
          return r.ok ? r.text() : null;
        })
        .then(function (html) {
          if (html !== null && html !== last) {
            last = html;
            el.innerHTML = html;
          }
        })
        .catch(function () { /* the server may be restarting: try again */ })
        .then(function () { setTimeout(tick, PERIOD); });
    }
    setTimeout(tick, PERIOD);
  }

  function follow(el) {
    var base = el.getAttribute("data-follow");
    var after = 0;
    var worker = el.getAttribute("data-worker") || "";
    var select = document.querySelector("[data-log-worker]");
    if (select) {
      select.addEventListener("change", function () { worker = select.value; after = 0; el.textContent = ""; });
    }
    function tick() {
      if (!worker || document.hidden) { return setTimeout(tick, PERIOD); }
      var w = worker;
      var url = base + "?worker=" + encodeURIComponent(w) + "&after=" + after;
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data || w !== worker || !data.lines.length) { return; }
          var atEnd = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
          el.appendChild(document.createTextNode(data.lines.join("\n") + "\n"));
          after = data.after;
          if (atEnd) { el.scrollTop = el.scrollHeight; }
        })
        .catch(function () {})
        .then(function () { setTimeout(tick, PERIOD); });
    }
    tick();
  }

  function switcher(sel) {
    sel.addEventListener("change", function () {
      var org = sel.getAttribute("data-org");
      window.location.href = "/o/" + encodeURIComponent(org) + "/w/" + encodeURIComponent(sel.value) + "/runs";
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), poll);
    Array.prototype.forEach.call(document.querySelectorAll("[data-follow]"), follow);
    Array.prototype.forEach.call(document.querySelectorAll("[data-ws-select]"), switcher);
    Array.prototype.forEach.call(document.querySelectorAll("[data-autosubmit]"), function (sel) {
      sel.addEventListener("change", function () { sel.form.submit(); });  // New run → from a template
    });
  });
})();
