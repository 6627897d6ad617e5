// Berth's web UI: what htmx does not. The pages read without it.
//  - A job's log streams: the page rendered the log up to data-offset;
//    an event stream sends what follows as ops (a line, a section's
//    start or end), nested here as the server nests them.
//  - Sections of the log can all be opened or closed; the log follows
//    its end while the reader is at the bottom.
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  function streamLog(log) {
    var url = log.getAttribute("data-stream");
    if (!url) { return; }
    var body = log.querySelector(".log-body");
    var empty = log.querySelector(".empty");
    // The innermost open (not ended) section receives new lines.
    var stack = [body];
    (function findOpen(el) {
      var last = el.lastElementChild;
      if (last && last.tagName === "DETAILS" && !last.hasAttribute("data-ended")) {
        stack.push(last);
        findOpen(last);
      }
    })(body);
    var follow = true;
    log.addEventListener("scroll", function () {
      follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 30;
    });
    function head(op) {
      var h = "";
      if (op.n) { h += '<a class="ln" id="L' + op.n + '" href="#L' + op.n + '" aria-hidden="true" tabindex="-1">' + op.n + "</a>"; }
      if (op.t) { h += '<time class="ts" datetime="' + op.t + '">' + op.t.substr(11, 8) + "</time>"; }
      return h;
    }
    function apply(ops) {
      if (empty) { empty.remove(); empty = null; }
      ops.forEach(function (op) {
        var top = stack[stack.length - 1];
        if (op.op === "start") {
          var d = document.createElement("details");
          d.className = "section";
          d.setAttribute("data-section", op.section);
          if (!op.collapsed) { d.open = true; }
          // op.html is the server's escaped rendering of the header.
          d.innerHTML = '<summary class="line section-header">' + head(op) + '<span class="txt">' + op.html +
            '</span><span class="section-duration"></span></summary>';
          top.appendChild(d);
          stack.push(d);
        } else if (op.op === "end") {
          if (stack.length > 1) {
            var s = stack.pop();
            s.setAttribute("data-ended", "");
            var dur = s.querySelector(":scope > summary .section-duration");
            if (dur && op.duration) { dur.textContent = op.duration; }
          }
        } else {
          var div = document.createElement("div");
          div.className = "line";
          div.innerHTML = head(op) + '<span class="txt">' + op.html + "</span>";
          top.appendChild(div);
        }
      });
      if (follow) { log.scrollTop = log.scrollHeight; }
    }
    var es = new EventSource(url);
    var header = document.getElementById("job-header");
    function refreshHeader() {
      if (window.htmx && header) {
        window.htmx.ajax("GET", window.location.pathname, { target: "#job-header", select: "#job-header", swap: "outerHTML" });
      }
    }
    es.addEventListener("log", function (e) {
      var ev = JSON.parse(e.data);
      apply(ev.ops);
      log.setAttribute("data-offset", ev.offset);
    });
    es.addEventListener("status", refreshHeader);
    es.addEventListener("end", function () {
      es.close();
      log.removeAttribute("data-stream");
      log.setAttribute("data-complete", "");
      refreshHeader();
    });
    es.onerror = function () {
      // Reconnect from where the page is now (EventSource itself would
      // start again from the first offset), a few times.
      es.close();
      if (log.hasAttribute("data-complete")) { return; }
      var tries = Number(log.getAttribute("data-retries") || "0");
      if (tries >= 30) { return; }
      log.setAttribute("data-retries", String(tries + 1));
      url = url.replace(/offset=\d+/, "offset=" + log.getAttribute("data-offset"));
      log.setAttribute("data-stream", url);
      setTimeout(function () { streamLog(log); }, 2000);
    };
  }

  function sections(open) {
    document.querySelectorAll(".log details.section").forEach(function (d) { d.open = open; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".log[data-stream]").forEach(streamLog);
    var ex = document.getElementById("expand-all");
    if (ex) { ex.addEventListener("click", function () { sections(true); }); }
    var co = document.getElementById("collapse-all");
    if (co) { co.addEventListener("click", function () { sections(false); }); }
    var bottom = document.getElementById("log-bottom");
    if (bottom) {
      bottom.addEventListener("click", function () {
        var log = document.querySelector(".log");
        if (log) { log.scrollTop = log.scrollHeight; }
      });
    }
  });
})();
