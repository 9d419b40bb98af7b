/* leaktrace's interactive flame graph: draws the views that leaktrace/report/flamegraph.py wrote as JSON in
   the script element "ID-data" into the element "ID" with d3-flame-graph (inlined before this script), as an
   icicle (callers on top). Hover: bytes, share and regions of a frame; click: zoom; search:
   highlights the frames whose name holds the text and sums their bytes. */
(function () {
  "use strict";
  var MB = 1048576;

  function bytes(b) {
    if (b >= MB) return (b / MB).toFixed(2) + " MB";
    if (b >= 1024) return (b / 1024).toFixed(1) + " KiB";
    return b + " B";
  }

  window.leaktraceFlame = function (id) {
    if (document.readyState === "loading") {  // drawn once the page is laid out: the chart takes its width
      document.addEventListener("DOMContentLoaded", function () { window.leaktraceFlame(id); });
      return;
    }
    var el = document.getElementById(id);
    var views = JSON.parse(document.getElementById(id + "-data").textContent);
    var select = document.getElementById(id + "-view");
    var search = document.getElementById(id + "-search");
    var details = document.getElementById(id + "-details");
    var match = document.getElementById(id + "-match");
    var chart = null;
    var total = 1;

    function label(d) {
      var r = d.data.regions;
      return d.data.name + " \u2014 " + bytes(d.data.value) + " (" + (100 * d.data.value / total).toFixed(1) + "%)" +
        (r === undefined || r === null ? "" : ", " + r + " region" + (r === 1 ? "" : "s"));
    }

    function show(i) {
      var view = views[i];
      total = view.tree.value || 1;
      el.innerHTML = "";
      chart = flamegraph.default()
        .width(Math.max(el.clientWidth || 0, 480))
        .cellHeight(18)
        .inverted(true)
        .sort(function (a, b) { return b.value - a.value; })
        .minFrameSize(1)
        .transitionDuration(0)
        .selfValue(false)
        .setLabelHandler(label)
        .setDetailsElement(details)
        .setSearchHandler(function (results, sum, all) {
          match.textContent = results.length ? results.length + " frame(s), " + bytes(sum) + " of " + bytes(all) +
            " (" + (100 * sum / (all || 1)).toFixed(1) + "%)" : "no frame matches";
        });
      d3.select(el).datum(view.tree).call(chart);
      // The library grows new boxes from zero width in an animation: drawn at their width at once instead,
      // so that a page printed or captured right after loading shows the whole graph.
      d3.select(el).selectAll("g.frame").each(function () {
        d3.select(this).select("rect").interrupt().attr("width", this.getAttribute("width"));
      });
      el.setAttribute("data-view", view.id);
      el.setAttribute("data-frames", String(el.querySelectorAll("g").length));
      if (search.value) chart.search(search.value);
    }

    select.addEventListener("change", function () { show(+select.value); });
    search.addEventListener("input", function () {
      if (search.value) { chart.search(search.value); } else { chart.clear(); match.textContent = ""; }
    });
    document.getElementById(id + "-reset").addEventListener("click", function () { chart.resetZoom(); });
    show(0);
  };
})();
