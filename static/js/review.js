/*
 * Keyboard-first reviewing: the review and adjudication pages of an annotation queue
 * (templates/runs/review/review.html, adjudicate.html). Plain script, no build step, loaded only
 * on those pages. Without it the pages are plain forms and links.
 *
 *   1..9   pick the n-th choice of a choice field (fieldset[data-choice-field]): the field that
 *          has the focus; else the first one not answered yet; else the first one
 *   Enter  submit ([data-review-action=submit])     s  skip ([data-review-action=skip])
 *   j / k  next / previous ([data-review-nav=next|prev])     ?  the help panel (#review-help)
 *
 * Keys are ignored while typing in a text box, a number box, a select or a textarea, and with
 * Ctrl, Alt or Cmd held (app.js keeps Ctrl+Enter). The document listener reads the page at each
 * key press, so regions swapped in by htmx need no setup.
 */
(function () {
  "use strict";

  var TYPED = /^(text|search|email|url|tel|password|number|date|datetime-local|month|time|week)$/;

  function typing(el) {
    if (!el || !el.tagName) return false;
    if (el.isContentEditable) return true;
    if (el.tagName === "TEXTAREA" || el.tagName === "SELECT") return true;
    if (el.tagName === "INPUT") return TYPED.test((el.getAttribute("type") || "text").toLowerCase());
    return !!(el.closest && el.closest(".cm-editor"));
  }

  function region() {
    return document.querySelector("[data-review-region]");
  }

  function enabledRadios(field) {
    return Array.prototype.filter.call(field.querySelectorAll("input[type=radio]"), function (radio) {
      return !radio.matches(":disabled");
    });
  }

  function targetField(scope) {
    var fields = Array.prototype.filter.call(scope.querySelectorAll("fieldset[data-choice-field]"), function (field) {
      return enabledRadios(field).length > 0;
    });
    var active = document.activeElement;
    var i;
    for (i = 0; i < fields.length; i++) if (fields[i].contains(active)) return fields[i];
    for (i = 0; i < fields.length; i++) if (!fields[i].querySelector("input[type=radio]:checked")) return fields[i];
    return fields[0] || null;
  }

  function pick(n) {
    var scope = region();
    var field = scope && targetField(scope);
    var radio = field && enabledRadios(field)[n - 1];
    if (!radio) return false;
    radio.checked = true;
    radio.dispatchEvent(new Event("input", { bubbles: true }));
    radio.dispatchEvent(new Event("change", { bubbles: true }));
    return true;
  }

  function press(selector) {
    var scope = region();
    var el = scope && scope.querySelector(selector);
    if (!el || el.matches(":disabled")) return false;
    el.click();
    return true;
  }

  function help(show) {
    var panel = document.getElementById("review-help");
    if (!panel) return false;
    panel.hidden = show === undefined ? !panel.hidden : !show;
    return true;
  }

  document.addEventListener("keydown", function (e) {
    if (e.defaultPrevented || e.isComposing || e.ctrlKey || e.metaKey || e.altKey) return;
    var panel = document.getElementById("review-help");
    if (e.key === "Escape" && panel && !panel.hidden) {
      help(false);
      e.preventDefault();
      return;
    }
    if (typing(e.target)) return;
    var done = false;
    if (/^[1-9]$/.test(e.key)) {
      done = pick(Number(e.key));
    } else if (e.key === "Enter") {
      // A focused button, link or summary keeps its own Enter.
      if (e.target.closest && e.target.closest("button, a, summary")) return;
      done = press("[data-review-action=submit]");
    } else if (e.key === "s") {
      done = press("[data-review-action=skip]");
    } else if (e.key === "j") {
      done = press("[data-review-nav=next]");
    } else if (e.key === "k") {
      done = press("[data-review-nav=prev]");
    } else if (e.key === "?") {
      done = help();
    }
    if (done) e.preventDefault();
  });

  document.addEventListener("click", function (e) {
    if (e.target.closest && e.target.closest("[data-review-help-close]")) help(false);
  });
})();
