// The case table: sort by a column header, filter by status, predicted flip probability, divergence, metadata and text.
// Rows are rendered (and escaped) by the server; this only reorders and hides them.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var table = document.getElementById("cases");
  var tbody = table.tBodies[0];
  var rows = Array.prototype.slice.call(tbody.rows);
  var status = document.getElementById("f-status");
  var predicted = document.getElementById("f-pred");
  var diverged = document.getElementById("f-diverged");
  var text = document.getElementById("f-text");
  var metas = Array.prototype.slice.call(document.querySelectorAll(".f-meta"));
  var shown = document.getElementById("shown-count");
  var noRows = document.getElementById("no-rows");

  function cell(row, key) { return row.getAttribute("data-" + key) || ""; }

  function compare(key, type, dir) {
    return function (a, b) {
      var x = cell(a, key), y = cell(b, key);
      if (x === "" || y === "") { return (x === "") - (y === ""); }  // missing values last, either way
      var d = type === "num" ? parseFloat(x) - parseFloat(y) : x.localeCompare(y, undefined, {numeric: true});
      return d * dir || cell(a, "id").localeCompare(cell(b, "id"), undefined, {numeric: true});
    };
  }

  function sortBy(th, dir) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    rows.sort(compare(th.getAttribute("data-key"), th.getAttribute("data-type"), dir));
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
    if (!th.hasAttribute("data-key")) { return; }
    th.addEventListener("click", function () {
      var current = th.getAttribute("aria-sort");
      var numeric = th.getAttribute("data-type") === "num";
      // First click: numbers high-to-low (most likely to flip first), text A-Z; a second click reverses.
      sortBy(th, current ? (current === "ascending" ? -1 : 1) : (numeric ? -1 : 1));
    });
  });

  function filter() {
    var want = status.value, minPredicted = parseFloat(predicted.value) || 0, needle = text.value.trim().toLowerCase();
    var visible = 0;
    rows.forEach(function (r) {
      var st = cell(r, "status");
      var ok = (!want || (want === "!stable" ? st !== "stable" : st === want)) &&
        (parseFloat(cell(r, "pred")) || 0) >= minPredicted &&
        (!diverged.checked || cell(r, "div") !== "") &&
        (!needle || cell(r, "search").indexOf(needle) !== -1) &&
        metas.every(function (m) {
          var key = "m-" + data.metadata_keys.indexOf(m.getAttribute("data-key"));
          return !m.value || cell(r, key) === m.value;
        });
      r.hidden = !ok;
      visible += ok ? 1 : 0;
    });
    shown.textContent = visible + " of " + data.n_cases + " cases shown";
    noRows.hidden = visible !== 0;
  }

  [status, predicted, diverged, text].concat(metas).forEach(function (el) {
    el.addEventListener("input", filter);
    el.addEventListener("change", filter);
  });

  // A pill in the header filters by its status.
  Array.prototype.forEach.call(document.querySelectorAll(".pill[data-status]"), function (p) {
    p.style.cursor = "pointer";
    p.addEventListener("click", function () { status.value = p.getAttribute("data-status"); filter(); });
  });

  // Following a case link opens its details.
  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var el = id && document.getElementById(id);
    if (el && el.tagName === "DETAILS") { el.open = true; el.scrollIntoView({block: "start"}); }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  filter();
})();
