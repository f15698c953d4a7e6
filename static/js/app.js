/*
 * evalsite progressive-enhancement glue. Load once per page, after htmx:
 *
 *   <script src="{% static 'vendor/htmx.min.js' %}" defer></script>
 *   <script src="{% static 'js/app.js' %}" defer></script>
 *
 * Everything here is optional: without JS the pages still work (textareas stay
 * textareas, charts are simply absent, hotkeys/copy buttons do nothing).
 * Runs on page load and again on every `htmx:load` (swapped-in content).
 *
 * The CodeMirror bundle (static/vendor/codemirror.bundle.js) and Chart.js
 * (static/vendor/chart.umd.min.js) are loaded lazily, only when the page (or a
 * swapped fragment) contains a textarea[data-editor] / canvas[data-chart].
 * Their URLs are derived from this script's own URL (../vendor/...), or taken
 * from data-editor-src / data-chart-src on this <script> tag. If a page already
 * includes either script itself, that copy is used.
 *
 * See docs/ui-kit.md for the full contract.
 */
(function () {
  "use strict";

  var doc = document;
  var root = doc.documentElement;
  root.classList.add("js");

  var self = doc.currentScript;

  function assetUrl(attr, relative) {
    if (self && self.getAttribute(attr)) return self.getAttribute(attr);
    var meta = doc.querySelector('meta[name="evalsite:' + attr + '"]');
    if (meta && meta.content) return meta.content;
    var base = (self && self.src) || doc.baseURI;
    return new URL(relative, base).href;
  }

  var EDITOR_SRC = assetUrl("data-editor-src", "../vendor/codemirror.bundle.js");
  var CHART_SRC = assetUrl("data-chart-src", "../vendor/chart.umd.min.js");

  /* ------------------------------------------------------------------ utils */

  function qsa(scope, selector) {
    var out = [];
    if (!scope || !scope.querySelectorAll) return out;
    if (scope.matches && scope.matches(selector)) out.push(scope);
    var found = scope.querySelectorAll(selector);
    for (var i = 0; i < found.length; i++) out.push(found[i]);
    return out;
  }

  var loading = {};
  function ensureGlobal(name, src) {
    if (window[name]) return Promise.resolve(window[name]);
    if (!loading[name]) {
      loading[name] = new Promise(function (resolve, reject) {
        var s = doc.createElement("script");
        s.src = src;
        s.async = true;
        s.onload = function () {
          window[name] ? resolve(window[name]) : reject(new Error(name + " missing after loading " + src));
        };
        s.onerror = function () {
          delete loading[name];
          reject(new Error("could not load " + src));
        };
        doc.head.appendChild(s);
      });
    }
    return loading[name];
  }

  function isVisible(el) {
    return !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length);
  }

  var EDITABLE =
    'input:not([type="checkbox"]):not([type="radio"]):not([type="button"]):not([type="submit"])' +
    ':not([type="reset"]):not([type="range"]):not([type="color"]):not([type="file"]),' +
    'textarea, select, [contenteditable]:not([contenteditable="false"]), .cm-editor';

  function isEditable(el) {
    return !!(el && el.closest && el.closest(EDITABLE));
  }

  var liveRegion;
  function announce(text) {
    if (!liveRegion) {
      liveRegion = doc.createElement("div");
      liveRegion.className = "sr-only";
      liveRegion.setAttribute("aria-live", "polite");
      doc.body.appendChild(liveRegion);
    }
    liveRegion.textContent = "";
    setTimeout(function () {
      liveRegion.textContent = text;
    }, 30);
  }

  /* ------------------------------------------------------- (a) code editors */

  function languageControlFor(textarea) {
    if (!textarea.id) return null;
    var sel = '[data-editor-language-for="' + (window.CSS && CSS.escape ? CSS.escape(textarea.id) : textarea.id) + '"]';
    return doc.querySelector(sel);
  }

  function controlValue(ctl) {
    if (!ctl) return "";
    if ("value" in ctl && ctl.tagName !== "FIELDSET" && ctl.tagName !== "DIV") return ctl.value;
    var checked = ctl.querySelector("input:checked");
    return checked ? checked.value : "";
  }

  function initEditors(scope) {
    var areas = qsa(scope, "textarea[data-editor]");
    if (!areas.length) return;
    ensureGlobal("EvalsiteEditor", EDITOR_SRC).then(
      function (Editor) {
        areas.forEach(function (ta) {
          if (!ta.isConnected || Editor.get(ta)) return;
          var lang = controlValue(languageControlFor(ta)) || ta.getAttribute("data-editor");
          try {
            Editor.attach(ta, { language: lang });
          } catch (err) {
            console.error("evalsite: editor failed to attach", ta, err);
          }
        });
      },
      function (err) {
        console.warn("evalsite: code editor unavailable, using plain textareas.", err);
      }
    );
  }

  doc.addEventListener("change", function (e) {
    var ctl = e.target && e.target.closest && e.target.closest("[data-editor-language-for]");
    if (!ctl) return;
    var ta = doc.getElementById(ctl.getAttribute("data-editor-language-for"));
    if (!ta) return;
    var lang = e.target.value;
    if (window.EvalsiteEditor) window.EvalsiteEditor.setLanguage(ta, lang);
    else ta.setAttribute("data-editor", lang);
  });

  /* ------------------------------------------------------------- (b) charts */

  var FALLBACK_PALETTE = ["#4f46e5", "#0d9488", "#d97706", "#db2777", "#0284c7", "#7c3aed", "#65a30d", "#64748b"];
  var FALLBACK_TOKENS = {
    accent: "#4f46e5", primary: "#4f46e5",
    success: "#16a34a", pass: "#16a34a", passed: "#16a34a", completed: "#16a34a",
    failure: "#dc2626", fail: "#dc2626", failed: "#dc2626", danger: "#dc2626",
    error: "#ea580c", errors: "#ea580c", warning: "#d97706",
    running: "#2563eb", info: "#2563eb",
    queued: "#7c3aed", pending: "#94a3b8",
    cancelled: "#64748b", canceled: "#64748b",
    skipped: "#cbd5e1", muted: "#94a3b8", neutral: "#94a3b8",
  };
  var palette = null;
  var tokens = null;
  var charts = [];

  function cssVar(name) {
    return getComputedStyle(root).getPropertyValue(name).trim();
  }

  function loadColors() {
    palette = FALLBACK_PALETTE.map(function (c, i) {
      return cssVar("--chart-" + (i + 1)) || c;
    });
    tokens = {};
    Object.keys(FALLBACK_TOKENS).forEach(function (k) {
      tokens[k] = cssVar("--chart-" + k) || FALLBACK_TOKENS[k];
    });
  }

  function resolveColor(c) {
    if (Array.isArray(c)) return c.map(resolveColor);
    if (typeof c !== "string") return c;
    var t = tokens[c.toLowerCase()];
    return t || c;
  }

  function alpha(color, a) {
    var m = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i.exec(color || "");
    if (!m) return color;
    var h = m[1];
    if (h.length === 3) h = h[0] + h[0] + h[1] + h[1] + h[2] + h[2];
    var n = parseInt(h, 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  var FORMATS = {
    percent: function (v) { return +(v * 100).toFixed(1) + "%"; }, // 0..1 -> %
    pct: function (v) { return +(+v).toFixed(1) + "%"; }, // already 0..100
    ms: function (v) { return v >= 1000 ? +(v / 1000).toFixed(2) + " s" : Math.round(v) + " ms"; },
    s: function (v) { return +(+v).toFixed(2) + " s"; },
    usd: function (v) { return "$" + (Math.abs(v) > 0 && Math.abs(v) < 0.01 ? (+v).toFixed(4) : (+v).toFixed(2)); },
    int: function (v) { return Math.round(v).toLocaleString(); },
    number: function (v) { return (+v).toLocaleString(undefined, { maximumFractionDigits: 3 }); },
  };
  FORMATS.seconds = FORMATS.s;
  FORMATS.cost = FORMATS.usd;
  FORMATS.tokens = FORMATS.int;

  function isPlainObject(o) {
    return o && typeof o === "object" && !Array.isArray(o);
  }

  function merge(target, src) {
    Object.keys(src || {}).forEach(function (k) {
      if (isPlainObject(src[k]) && isPlainObject(target[k])) merge(target[k], src[k]);
      else target[k] = src[k];
    });
    return target;
  }

  var RADIAL = { pie: 1, doughnut: 1, polarArea: 1 };

  function styleDataset(ds, i, chartType, compact) {
    var type = ds.type || chartType;
    var base = resolveColor(ds.color) || palette[i % palette.length];
    var perPoint = ds.colors ? resolveColor(ds.colors) : null;
    if (ds.backgroundColor) ds.backgroundColor = resolveColor(ds.backgroundColor);
    if (ds.borderColor) ds.borderColor = resolveColor(ds.borderColor);
    delete ds.color;
    delete ds.colors;
    var n = (ds.data || []).length;

    if (RADIAL[type]) {
      if (!ds.backgroundColor) {
        ds.backgroundColor = perPoint || (ds.data || []).map(function (_, j) { return palette[j % palette.length]; });
      }
      if (!ds.borderColor) ds.borderColor = cssVar("--surface") || "#fff";
      if (ds.borderWidth == null) ds.borderWidth = 1;
    } else if (type === "line" || type === "radar") {
      if (!ds.borderColor) ds.borderColor = base;
      if (!ds.backgroundColor) ds.backgroundColor = alpha(base, compact ? 0.14 : 0.12);
      if (ds.borderWidth == null) ds.borderWidth = compact ? 1.5 : 2;
      if (ds.pointRadius == null) ds.pointRadius = compact || n > 40 ? 0 : 2.5;
      if (ds.pointHoverRadius == null) ds.pointHoverRadius = 4;
      if (ds.pointBackgroundColor == null) ds.pointBackgroundColor = ds.borderColor;
      if (ds.tension == null) ds.tension = 0.25;
      if (ds.fill == null && compact) ds.fill = "origin";
    } else if (type === "scatter" || type === "bubble") {
      if (!ds.backgroundColor) ds.backgroundColor = alpha(base, 0.65);
      if (!ds.borderColor) ds.borderColor = base;
      if (ds.pointRadius == null && type === "scatter") ds.pointRadius = 3;
    } else {
      if (!ds.backgroundColor) ds.backgroundColor = perPoint || base;
      if (!ds.borderColor) ds.borderColor = ds.backgroundColor;
      if (ds.borderWidth == null) ds.borderWidth = 0;
      if (ds.borderRadius == null) ds.borderRadius = compact ? 2 : 3;
      if (ds.maxBarThickness == null) ds.maxBarThickness = 48;
    }
    return ds;
  }

  function buildChartConfig(raw, canvas) {
    if (!palette) loadColors();
    var type = raw.type || "bar";
    var data;
    if (isPlainObject(raw.data)) {
      data = raw.data;
    } else {
      var datasets =
        raw.datasets ||
        (Array.isArray(raw.data) ? [{ label: raw.label || "", data: raw.data, color: raw.color, colors: raw.colors }] : []);
      data = { labels: raw.labels || [], datasets: datasets };
    }
    var compact = raw.compact != null ? !!raw.compact : !!canvas.closest(".metric-card");
    data.datasets = (data.datasets || []).map(function (ds, i) {
      return styleDataset(ds, i, type, compact);
    });

    var fmt = FORMATS[raw.format] || null;
    var radial = !!RADIAL[type];
    var horizontal = !!raw.horizontal;
    var valueAxis = horizontal ? "x" : "y";
    var indexAxis = horizontal ? "y" : "x";
    var gridColor = cssVar("--chart-grid") || "#e8eaee";

    var options = {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      layout: { padding: compact ? 2 : 0 },
      plugins: {
        legend: {
          display: raw.legend != null ? !!raw.legend : !compact && (radial || data.datasets.length > 1),
          position: raw.legendPosition || (radial ? "right" : "bottom"),
        },
        title: raw.title
          ? { display: !compact, text: raw.title, align: "start", padding: { top: 0, bottom: 8 } }
          : { display: false },
        tooltip: {
          enabled: raw.tooltip !== false,
          callbacks: fmt
            ? {
                label: function (ctx) {
                  var v = ctx.parsed;
                  if (v && typeof v === "object") v = horizontal ? v.x : v.y;
                  if (radial) v = ctx.raw;
                  var name = ctx.dataset.label || (radial ? ctx.label : "");
                  return (name ? name + ": " : "") + fmt(v);
                },
              }
            : {},
        },
      },
    };

    if (!radial && type !== "radar") {
      options.indexAxis = indexAxis;
      options.interaction = type === "scatter" || type === "bubble" ? { mode: "nearest", intersect: true } : { mode: "index", intersect: false };
      var scales = {};
      scales[indexAxis] = {
        display: !compact,
        stacked: !!raw.stacked,
        grid: { display: type === "scatter" || type === "bubble", color: gridColor },
        border: { color: gridColor },
        ticks: { maxRotation: 0, autoSkip: true, autoSkipPadding: 12 },
        title: raw[indexAxis + "Label"] ? { display: true, text: raw[indexAxis + "Label"] } : { display: false },
      };
      scales[valueAxis] = {
        display: !compact,
        stacked: !!raw.stacked,
        // Sparklines (compact line charts) zoom to the data; everything else starts at 0.
        beginAtZero: raw.beginAtZero != null ? !!raw.beginAtZero : type !== "scatter" && !(compact && type === "line"),
        grid: { color: gridColor },
        border: { display: false },
        ticks: { maxTicksLimit: 6, callback: fmt ? function (v) { return fmt(v); } : undefined },
        title: raw[valueAxis + "Label"] ? { display: true, text: raw[valueAxis + "Label"] } : { display: false },
      };
      if (raw.min != null) scales[valueAxis].min = raw.min;
      if (raw.max != null) scales[valueAxis].max = raw.max;
      if (!scales[valueAxis].ticks.callback) delete scales[valueAxis].ticks.callback;
      options.scales = scales;
    }

    return { type: type, data: data, options: merge(options, raw.options || {}) };
  }

  var chartDefaultsSet = false;
  function setChartDefaults(Chart) {
    if (chartDefaultsSet) return;
    chartDefaultsSet = true;
    loadColors();
    var d = Chart.defaults;
    d.font.family = cssVar("--font-sans") || "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    d.font.size = 11;
    d.color = cssVar("--text-2") || "#4b5260";
    d.borderColor = cssVar("--chart-grid") || "#e8eaee";
    d.animation = false;
    d.plugins.legend.labels.boxWidth = 10;
    d.plugins.legend.labels.boxHeight = 10;
    d.plugins.legend.labels.padding = 10;
    d.plugins.title.color = cssVar("--text") || "#1b1f27";
    d.plugins.title.font = { size: 12, weight: "600" };
    d.plugins.tooltip.backgroundColor = "rgba(23, 27, 36, 0.92)";
    d.plugins.tooltip.padding = 8;
    d.plugins.tooltip.cornerRadius = 6;
    d.plugins.tooltip.boxPadding = 4;
  }

  function renderChart(Chart, canvas) {
    if (!canvas.isConnected || Chart.getChart(canvas)) return;
    var raw;
    try {
      raw = JSON.parse(canvas.getAttribute("data-chart"));
    } catch (err) {
      console.warn("evalsite: invalid data-chart JSON", canvas, err);
      canvas.setAttribute("data-chart-error", "invalid JSON");
      return;
    }
    var box = canvas.parentElement;
    if (!box || !box.classList.contains("chart")) {
      box = doc.createElement("div");
      box.className = "chart";
      var h = canvas.getAttribute("data-chart-height") || canvas.getAttribute("height");
      if (h) box.style.height = /^\d+$/.test(h) ? h + "px" : h;
      canvas.parentNode.insertBefore(box, canvas);
      box.appendChild(canvas);
    }
    if (!canvas.hasAttribute("role")) canvas.setAttribute("role", "img");
    if (!canvas.hasAttribute("aria-label")) canvas.setAttribute("aria-label", raw.title || raw.label || "Chart");
    try {
      charts.push(new Chart(canvas, buildChartConfig(raw, canvas)));
    } catch (err) {
      console.warn("evalsite: chart failed to render", canvas, err);
      canvas.setAttribute("data-chart-error", String(err && err.message));
    }
  }

  function initCharts(scope) {
    // Drop charts whose canvas was swapped out of the page.
    charts = charts.filter(function (c) {
      if (c.canvas && c.canvas.isConnected) return true;
      c.destroy();
      return false;
    });
    var canvases = qsa(scope, "canvas[data-chart]");
    if (!canvases.length) return;
    ensureGlobal("Chart", CHART_SRC).then(
      function (Chart) {
        setChartDefaults(Chart);
        canvases.forEach(function (c) {
          renderChart(Chart, c);
        });
      },
      function (err) {
        console.warn("evalsite: Chart.js unavailable.", err);
      }
    );
  }

  /* ----------------------------------------------------------- (c) hotkeys */

  function parseHotkey(spec) {
    var parts = spec.split("+");
    var key = parts.pop();
    if (key === "" && parts.length) {
      parts.pop();
      key = "+";
    }
    var want = { key: key, ctrl: false, alt: false, meta: false, shift: false, mod: false };
    parts.forEach(function (p) {
      p = p.toLowerCase();
      if (p === "mod") want.mod = true;
      else if (p === "ctrl" || p === "control") want.ctrl = true;
      else if (p === "alt" || p === "option") want.alt = true;
      else if (p === "meta" || p === "cmd" || p === "command") want.meta = true;
      else if (p === "shift") want.shift = true;
    });
    if (key === "Space") want.key = " ";
    if (key === "Esc") want.key = "Escape";
    return want;
  }

  function hotkeyMatches(spec, e) {
    var w = parseHotkey(spec);
    if (w.mod) {
      if (!(e.ctrlKey || e.metaKey)) return false;
    } else if (e.ctrlKey !== w.ctrl || e.metaKey !== w.meta) return false;
    if (e.altKey !== w.alt) return false;
    var single = w.key.length === 1;
    if (!single && e.shiftKey !== w.shift) return false;
    if (single && w.shift && !e.shiftKey) return false;
    if (single && (e.ctrlKey || e.metaKey || e.altKey)) return e.key.toLowerCase() === w.key.toLowerCase();
    return e.key === w.key;
  }

  function ariaShortcut(spec) {
    return spec
      .split(/\s+/)
      .filter(Boolean)
      .map(function (s) {
        return s.replace(/\bMod\+/g, /Mac|iPhone|iPad/.test(navigator.platform) ? "Meta+" : "Control+").replace(/\bCtrl\+/g, "Control+");
      })
      .join(" ");
  }

  function initHotkeys(scope) {
    qsa(scope, "[data-hotkey]").forEach(function (el) {
      if (!el.hasAttribute("aria-keyshortcuts")) el.setAttribute("aria-keyshortcuts", ariaShortcut(el.getAttribute("data-hotkey")));
    });
  }

  function activate(el) {
    if (el.matches("input:not([type=checkbox]):not([type=radio]):not([type=submit]):not([type=button]), textarea, select")) {
      el.focus();
      if (el.select && el.type !== "number") el.select();
    } else if (el.matches("textarea[data-editor-attached]") && window.EvalsiteEditor) {
      window.EvalsiteEditor.get(el).focus();
    } else {
      el.click();
    }
  }

  doc.addEventListener(
    "keydown",
    function (e) {
      if (e.defaultPrevented || e.isComposing || e.repeat) return;
      if (/^(Shift|Control|Alt|Meta|CapsLock|Dead|Unidentified)$/.test(e.key)) return;
      var hasMod = e.ctrlKey || e.metaKey || e.altKey;
      var editable = isEditable(e.target);
      if (editable && !hasMod) return; // plain keys never steal typing
      var els = qsa(doc, "[data-hotkey]");
      var hit = null;
      var fallback = null;
      for (var i = 0; i < els.length && !hit; i++) {
        var el = els[i];
        if (el.disabled || el.getAttribute("aria-disabled") === "true") continue;
        var specs = el.getAttribute("data-hotkey").split(/\s+/);
        for (var j = 0; j < specs.length; j++) {
          if (specs[j] && hotkeyMatches(specs[j], e)) {
            if (isVisible(el)) hit = el;
            else if (!fallback) fallback = el;
            break;
          }
        }
      }
      hit = hit || fallback;
      if (!hit) {
        // Ctrl/Cmd+Enter inside a form field submits its form (htmx forms included).
        if (editable && e.key === "Enter" && (e.ctrlKey || e.metaKey) && !e.altKey) {
          var field = e.target.closest(".editor") ? e.target.closest(".editor").previousElementSibling : e.target;
          var form = field && (field.form || field.closest("form"));
          if (form) {
            e.preventDefault();
            e.stopPropagation();
            if (form.requestSubmit) form.requestSubmit();
            else form.submit();
          }
        }
        return;
      }
      e.preventDefault();
      e.stopPropagation();
      activate(hit);
    },
    true
  );

  /* ------------------------------------------------------------- (e) copy */

  function copyTarget(btn) {
    var ref = btn.getAttribute("data-copy");
    if (!ref) return btn.previousElementSibling;
    var el = doc.getElementById(ref.replace(/^#/, ""));
    if (el) return el;
    try {
      return doc.querySelector(ref);
    } catch (err) {
      return null;
    }
  }

  function copyText(btn) {
    if (btn.hasAttribute("data-copy-text")) return btn.getAttribute("data-copy-text");
    var el = copyTarget(btn);
    if (!el) return null;
    if (el.tagName === "TEXTAREA" && window.EvalsiteEditor && window.EvalsiteEditor.get(el)) {
      return window.EvalsiteEditor.get(el).getValue();
    }
    if ("value" in el && /^(INPUT|TEXTAREA|SELECT|OUTPUT)$/.test(el.tagName)) return el.value;
    return el.textContent;
  }

  function legacyCopy(text) {
    var active = doc.activeElement;
    var ta = doc.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.style.cssText = "position:fixed;top:0;left:-9999px;opacity:0";
    doc.body.appendChild(ta);
    ta.select();
    var ok = false;
    try {
      ok = doc.execCommand("copy");
    } catch (err) {
      ok = false;
    }
    ta.remove();
    if (active && active.focus) active.focus();
    return ok;
  }

  function writeClipboard(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).then(
        function () { return true; },
        function () { return legacyCopy(text); }
      );
    }
    return Promise.resolve(legacyCopy(text));
  }

  function copyFeedback(btn, ok) {
    clearTimeout(btn._copyTimer);
    btn.classList.remove("is-copied", "is-copy-failed");
    btn.classList.add(ok ? "is-copied" : "is-copy-failed");
    var label = ok ? btn.getAttribute("data-copy-done") || "Copied" : "Copy failed";
    var textOnly = btn.children.length === 0 && btn.textContent.trim() !== "";
    if (textOnly) {
      if (btn._copyLabel == null) btn._copyLabel = btn.textContent;
      btn.textContent = label;
    }
    announce(ok ? "Copied to clipboard" : "Copy failed");
    btn._copyTimer = setTimeout(function () {
      btn.classList.remove("is-copied", "is-copy-failed");
      if (textOnly && btn._copyLabel != null) {
        btn.textContent = btn._copyLabel;
        btn._copyLabel = null;
      }
    }, 1500);
  }

  /* ------------------------------------------------ small click behaviours */

  function setDetails(selector, open) {
    var targets;
    try {
      targets = doc.querySelectorAll(selector);
    } catch (err) {
      return;
    }
    for (var i = 0; i < targets.length; i++) {
      qsa(targets[i], "details").forEach(function (d) {
        d.open = open;
      });
    }
  }

  doc.addEventListener("click", function (e) {
    var t = e.target;
    if (!t || !t.closest) return;
    var btn = t.closest("[data-copy], [data-copy-text]");
    if (btn) {
      e.preventDefault();
      var text = copyText(btn);
      if (text == null) return copyFeedback(btn, false);
      writeClipboard(text).then(function (ok) {
        copyFeedback(btn, ok);
      });
      return;
    }
    var exp = t.closest("[data-expand-all]");
    if (exp) return setDetails(exp.getAttribute("data-expand-all"), true);
    var col = t.closest("[data-collapse-all]");
    if (col) return setDetails(col.getAttribute("data-collapse-all"), false);
    var dis = t.closest("[data-dismiss]");
    if (dis) {
      var box = null;
      try {
        box = dis.closest(dis.getAttribute("data-dismiss") || ".message, [data-dismissible]");
      } catch (err) {
        box = null;
      }
      if (box) box.remove();
    }
  });

  /* ------------------------------------------------ htmx: CSRF for Django */

  function csrfToken() {
    var meta = doc.querySelector('meta[name="csrf-token"]');
    if (meta && meta.content) return meta.content;
    var input = doc.querySelector('input[name="csrfmiddlewaretoken"]');
    if (input && input.value) return input.value;
    var m = /(?:^|;\s*)csrftoken=([^;]+)/.exec(doc.cookie);
    return m ? decodeURIComponent(m[1]) : null;
  }

  doc.addEventListener("htmx:configRequest", function (e) {
    var d = e.detail;
    if (!d || !d.headers || /^get$/i.test(d.verb || "")) return;
    if (d.headers["X-CSRFToken"]) return;
    var token = csrfToken();
    if (token) d.headers["X-CSRFToken"] = token;
  });

  /* ------------------------------------------------------------------ init */

  function init(scope) {
    scope = scope || doc.body;
    initEditors(scope);
    initCharts(scope);
    initHotkeys(scope);
  }

  window.Evalsite = { init: init, buildChartConfig: buildChartConfig };

  doc.addEventListener("htmx:load", function (e) {
    init(e.target);
  });
  if (doc.readyState === "loading") {
    doc.addEventListener("DOMContentLoaded", function () {
      init(doc.body);
    });
  } else {
    init(doc.body);
  }
})();
