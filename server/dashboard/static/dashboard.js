/* Veil dashboard: draws each <figure class="chart"> from its data-chart attribute (the
   chart's description and the points of its table, the same rows as the page's JSON twin)
   with uPlot. No inline scripts, nothing from other hosts. Each figure keeps what it drew
   in figure.veilData ({x, series: [{name, y, low, high}]}) for tests and the curious. */
(function () {
  "use strict";
  var COLORS = ["#1f5fa8", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207",
                "#be185d", "#4d7c0f", "#475569"];
  var DAY = 86400;

  function daySeconds(day) { return Date.parse(day + "T00:00:00Z") / 1000; }

  function dayLabel(seconds) {
    return new Date(seconds * 1000).toLocaleDateString("en", {month: "short", day: "numeric", timeZone: "UTC"});
  }

  function shortLabel(text, width) {
    text = String(text);
    return text.length > width ? text.slice(0, width - 1) + "\u2026" : text;
  }

  function format(value) {
    if (value === null || value === undefined) { return "\u2014"; }
    var magnitude = Math.abs(value);
    if (magnitude !== 0 && (magnitude < 0.001 || magnitude >= 1e6)) { return value.toExponential(2); }
    return Number(value.toPrecision(4)).toString();
  }

  /* {x, series} from the chart's points: one series per value of chart.series (or one). */
  function collect(chart) {
    var points = chart.points, names = [], bySeries = {}, xs = [], seen = {};
    points.forEach(function (point) {
      var name = chart.series ? String(point[chart.series]) : chart.y_label;
      if (!(name in bySeries)) { bySeries[name] = {}; names.push(name); }
      var x = chart.type === "bars" ? String(point[chart.x]) : daySeconds(point[chart.x]);
      if (!(x in seen)) { seen[x] = true; xs.push(x); }
      bySeries[name][x] = point;
    });
    if (chart.type !== "bars") { xs.sort(function (a, b) { return a - b; }); }
    var series = names.map(function (name) {
      function column(key) {
        return xs.map(function (x) {
          var point = bySeries[name][x];
          return point === undefined || !key ? null : point[key];
        });
      }
      return {name: name, y: column(chart.y), low: column(chart.low), high: column(chart.high)};
    });
    return {x: xs, series: series};
  }

  /* A series' colour: the palette's in order, greys for the muted aggregates. */
  function colorOf(chart, name, index) {
    var muted = (chart.muted || []).indexOf(name);
    if (muted >= 0) { return ["#334155", "#6b7280"][muted % 2]; }
    return COLORS[index % COLORS.length];
  }

  /* Intervals: whiskers for bars, a translucent band for lines. */
  function intervalHook(chart, data, bars) {
    return function (u) {
      var ctx = u.ctx;
      ctx.save();
      data.series.forEach(function (s, i) {
        if (!u.series[i + 1].show) { return; }
        var color = colorOf(chart, s.name, i);
        ctx.strokeStyle = color;
        ctx.fillStyle = color + "1a";
        ctx.lineWidth = 1.5 * devicePixelRatio;
        var upper = [], lower = [];
        u.data[0].forEach(function (x, j) {
          if (s.low[j] === null || s.high[j] === null || s.y[j] === null) { return; }
          var cx = u.valToPos(x, "x", true);
          var top = u.valToPos(s.high[j], "y", true), bottom = u.valToPos(s.low[j], "y", true);
          if (bars) {
            var half = 6 * devicePixelRatio;
            ctx.beginPath();
            ctx.moveTo(cx, top); ctx.lineTo(cx, bottom);
            ctx.moveTo(cx - half, top); ctx.lineTo(cx + half, top);
            ctx.moveTo(cx - half, bottom); ctx.lineTo(cx + half, bottom);
            ctx.stroke();
          } else {
            upper.push([cx, top]); lower.unshift([cx, bottom]);
          }
        });
        if (!bars && upper.length > 1) {
          ctx.beginPath();
          upper.concat(lower).forEach(function (p, k) { if (k) { ctx.lineTo(p[0], p[1]); } else { ctx.moveTo(p[0], p[1]); } });
          ctx.closePath();
          ctx.fill();
        }
      });
      ctx.restore();
    };
  }

  function options(chart, data, width) {
    var bars = chart.type === "bars", spark = chart.type === "spark";
    var muted = chart.muted || [];
    var series = [{label: bars ? "value" : "day"}].concat(data.series.map(function (s, i) {
      var color = colorOf(chart, s.name, i);
      return {
        label: s.name, stroke: color, width: bars ? 0 : 2, fill: bars ? color + "b3" : undefined,
        dash: muted.indexOf(s.name) >= 0 ? [6, 4] : undefined,
        points: {show: !spark, size: 6},
        paths: bars ? uPlot.paths.bars({size: [0.6, 60]}) : undefined,
        value: function (u, v) { return format(v); }
      };
    }));
    var labels = data.x;
    var top = Math.max.apply(null, [0].concat.apply([], data.series.map(function (s) {
      return s.y.concat(s.high).filter(function (v) { return v !== null; });
    })));
    var bottom = Math.min.apply(null, [0].concat.apply([], data.series.map(function (s) {
      return s.y.concat(s.low).filter(function (v) { return v !== null; });
    })));
    return {
      width: width,
      height: spark ? 36 : (bars ? 300 : 320),
      legend: {show: !spark && !bars},
      cursor: {show: !spark, drag: {x: false, y: false}},
      scales: {x: {time: !bars, range: bars ? [-0.5, labels.length - 0.5] : undefined},
               y: {range: function () { return [bottom, top > 0 ? top * 1.08 : 1]; }}},
      axes: spark ? [{show: false}, {show: false}] : [
        bars ? {splits: function () { return labels.map(function (_, i) { return i; }); },
                values: function () { return labels.map(function (l) { return shortLabel(l, 22); }); },
                rotate: -35, gap: 4,
                size: Math.min(120, 24 + 6 * Math.max.apply(null, labels.map(function (l) { return Math.min(String(l).length, 22); })))}
             : {space: 60, incrs: [DAY, 2 * DAY, 7 * DAY, 14 * DAY, 28 * DAY],
                values: function (u, vals) { return vals.map(dayLabel); }},
        {label: chart.y_label, values: function (u, vals) { return vals.map(format); }, size: 60}
      ],
      series: series,
      hooks: (chart.low && !spark) ? {draw: [intervalHook(chart, data, bars)]} : {}
    };
  }

  function draw(figure) {
    var chart = JSON.parse(figure.getAttribute("data-chart"));
    var data = collect(chart);
    var holder = figure.querySelector(".plot");
    var x = chart.type === "bars" ? data.x.map(function (_, i) { return i; }) : data.x;
    var aligned = [x].concat(data.series.map(function (s) { return s.y; }));
    var width = Math.max(holder.clientWidth, chart.type === "spark" ? 100 : 320);
    figure.veilData = data;
    figure.veilPlot = new uPlot(options(chart, data, width), aligned, holder);
    figure.setAttribute("data-drawn", String(data.series.reduce(function (n, s) {
      return n + s.y.filter(function (v) { return v !== null; }).length;
    }, 0)));
  }

  function drawAll() {
    Array.prototype.forEach.call(document.querySelectorAll("figure.chart"), function (figure) {
      try { draw(figure); } catch (error) { figure.setAttribute("data-error", String(error)); throw error; }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
}());
