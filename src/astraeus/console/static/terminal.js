// Astraeus console: the run page's Terminal panel. xterm.js (vendor/xterm) on the exec stream the CLI's
// `astra astraeus shell` uses: a WebSocket to the API's /runs/{name}/exec?tty=true, signed in by the console's
// cookie (the page's Origin and its CSRF token go with it). Frames ("exec" in astraeus.protocol): binary, first
// byte the stream (0 stdin, 1 stdout, 2 stderr); text, JSON controls (resize, eof, exit, error).
// The panel is hidden while no worker runs; it comes in when the page's live part lists a running worker
// ([data-running-workers] in #run-live), and an open session is left as it is when that part is refreshed.
(function () {
  "use strict";
  var el = document.querySelector("[data-terminal]");
  if (!el || !window.Terminal) { return; }
  var openButton = document.querySelector("[data-terminal-open]");
  var statusEl = document.querySelector("[data-terminal-status]");
  var select = document.querySelector("[data-terminal-worker]");
  var panel = document.getElementById("terminal-panel");
  var live = document.getElementById("run-live");
  var encoder = new TextEncoder();
  var term = null, fit = null, sock = null, shown = null;

  function start() {  // xterm measures its element: made once the panel is visible
    if (term) { return; }
    term = new window.Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000,
      theme: { background: "#0d1117", foreground: "#d1d7e0" } });
    fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(el);
    fit.fit();
    term.onData(function (d) { send(0, d); });
    if (window.ResizeObserver) { new ResizeObserver(resize).observe(el); }
    status("not connected");  // a session is recorded as an event and keeps the worker attached: opened on a click
  }

  function status(text) { statusEl.textContent = text; el.setAttribute("data-state", text); }

  function send(stream, text) {
    if (!sock || sock.readyState !== WebSocket.OPEN) { return; }
    var data = encoder.encode(text);
    var frame = new Uint8Array(data.length + 1);
    frame[0] = stream;
    frame.set(data, 1);
    sock.send(frame);
  }

  function resize() {
    if (!term) { return; }
    fit.fit();
    if (sock && sock.readyState === WebSocket.OPEN) {
      sock.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    }
  }

  function open() {
    start();
    if (sock) { sock.close(); }
    var worker = select.value || el.getAttribute("data-worker");
    var url = new URL(el.getAttribute("data-terminal"), window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.search = "worker=" + encodeURIComponent(worker) + "&tty=true&cols=" + term.cols + "&rows=" + term.rows
      + "&csrf=" + encodeURIComponent(el.getAttribute("data-csrf"));
    term.reset();
    var s = new WebSocket(url.toString());
    s.binaryType = "arraybuffer";
    var ended = false;
    sock = s;
    status("connecting…");
    s.onopen = function () { status("connected"); term.focus(); };
    s.onmessage = function (ev) {
      if (typeof ev.data === "string") {
        var msg = JSON.parse(ev.data);
        if (msg.type === "exit") {
          ended = true;
          status("exited with code " + msg.code);
          term.write("\r\n[exited with code " + msg.code + "]\r\n");
        } else if (msg.type === "error") {
          ended = true;
          status("error: " + msg.message);
          term.write("\r\n[error: " + msg.message + "]\r\n");
        }
        return;
      }
      var bytes = new Uint8Array(ev.data);
      if (bytes.length > 1 && bytes[0] !== 0) { term.write(bytes.subarray(1)); }
    };
    s.onclose = function (ev) {
      if (sock === s) { sock = null; }
      if (!ended) {
        status(ev.code === 1006 ? "could not connect: reload the page (signed out, or the worker is no longer running)"
          : "closed (" + ev.code + ")");
      }
      openButton.textContent = "Open a shell";
    };
    openButton.textContent = "Reconnect";
  }

  // The running workers the live part lists ("0:name-0,1:name-1"): the chooser follows them, and the panel comes
  // in when the first one starts. None running: the panel stays as it is (an open session says why it ended).
  function update() {
    var marker = live && live.querySelector("[data-running-workers]");
    var key = marker ? marker.getAttribute("data-running-workers") : "";
    if (key === shown) { return; }
    shown = key;
    if (!key) { return; }
    var workers = key.split(",").map(function (x) { var i = x.indexOf(":"); return [x.slice(0, i), x.slice(i + 1)]; });
    var current = select.value;
    select.textContent = "";
    workers.forEach(function (w) {
      var o = document.createElement("option");
      o.value = w[0];
      o.textContent = w[1];
      select.appendChild(o);
    });
    if (workers.some(function (w) { return w[0] === current; })) { select.value = current; }
    document.querySelector("[data-terminal-chooser]").hidden = workers.length < 2;
    var one = document.querySelector("[data-terminal-one]");
    one.hidden = workers.length > 1;
    one.textContent = "Worker " + workers[0][1];
    document.querySelector("[data-port-worker]").value = select.value;
    if (panel.hidden) { panel.hidden = false; }
    start();
  }

  openButton.addEventListener("click", open);
  select.addEventListener("change", function () {
    document.querySelector("[data-port-worker]").value = select.value;
    open();
  });
  window.addEventListener("resize", resize);
  if (!panel.hidden) { start(); }
  update();
  if (live && window.MutationObserver) {
    new MutationObserver(update).observe(live, { childList: true, subtree: true });
  }
})();
