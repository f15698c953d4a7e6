// evalsite code editor: CodeMirror 6 wrapped around a plain <textarea>.
//
// Built by static/src/build.mjs into static/vendor/codemirror.bundle.js (IIFE)
// and exposed as window.EvalsiteEditor:
//
//   const ed = EvalsiteEditor.attach(textarea, {language: "python"});
//   ed.setLanguage("typescript");   // or EvalsiteEditor.setLanguage(textarea, "json")
//   ed.getValue(); ed.setValue("..."); ed.focus(); ed.destroy();
//   EvalsiteEditor.get(textarea)    // -> handle or null
//
// The textarea stays in the form (visually hidden, not display:none, so native
// `required` validation still works) and its value is updated on every change,
// so plain form POSTs and htmx hx-post / hx-include keep sending it. An `input`
// event is dispatched on the textarea after each change, so
// hx-trigger="input changed delay:500ms" style triggers work too.

import { basicSetup } from "codemirror";
import { EditorView, keymap, placeholder } from "@codemirror/view";
import { EditorState, Compartment } from "@codemirror/state";
import { indentWithTab } from "@codemirror/commands";
import { indentUnit } from "@codemirror/language";
import { linter, lintGutter } from "@codemirror/lint";
import { python } from "@codemirror/lang-python";
import { javascript } from "@codemirror/lang-javascript";
import { json, jsonParseLinter } from "@codemirror/lang-json";

const ALIASES = {
  python: "python", py: "python", python3: "python",
  javascript: "javascript", js: "javascript", mjs: "javascript", node: "javascript", ecmascript: "javascript",
  typescript: "typescript", ts: "typescript",
  json: "json", jsonc: "json",
  text: "text", plain: "text", plaintext: "text", "": "text",
};

export const LANGUAGES = ["python", "javascript", "typescript", "json", "text"];

export function normalizeLanguage(lang) {
  const key = String(lang == null ? "" : lang).trim().toLowerCase();
  return ALIASES[key] || "text";
}

function languageExtension(lang) {
  switch (lang) {
    case "python":
      return [python(), indentUnit.of("    ")];
    case "javascript":
      return [javascript(), indentUnit.of("  ")];
    case "typescript":
      return [javascript({ typescript: true }), indentUnit.of("  ")];
    case "json":
      return [json(), indentUnit.of("  "), linter(jsonParseLinter(), { delay: 400 }), lintGutter()];
    default:
      return [indentUnit.of("    ")];
  }
}

const MONO = 'var(--font-mono, ui-monospace, SFMono-Regular, "SF Mono", Menlo, Consolas, "Liberation Mono", monospace)';

const theme = EditorView.theme({
  "&": {
    fontSize: "var(--editor-font-size, 13px)",
    color: "var(--text, #1b1f27)",
    backgroundColor: "var(--surface, #fff)",
    maxHeight: "var(--editor-max-height, 70vh)",
  },
  "&.cm-focused": { outline: "none" },
  ".cm-scroller": { fontFamily: MONO, lineHeight: "1.55", overflow: "auto" },
  ".cm-content": {
    padding: "8px 0",
    minHeight: "calc(var(--editor-min-lines, 10) * 1.55em + 16px)",
    caretColor: "var(--text, #1b1f27)",
  },
  ".cm-gutters": {
    backgroundColor: "var(--surface-2, #f5f6f8)",
    color: "var(--text-3, #626a77)",
    borderRight: "1px solid var(--border, #e3e5e9)",
    minHeight: "calc(var(--editor-min-lines, 10) * 1.55em + 16px)",
  },
  ".cm-lineNumbers .cm-gutterElement": { padding: "0 8px 0 10px" },
  ".cm-activeLine": { backgroundColor: "rgba(79, 70, 229, 0.045)" },
  ".cm-activeLineGutter": { backgroundColor: "rgba(79, 70, 229, 0.09)", color: "var(--text, #1b1f27)" },
  ".cm-placeholder": { color: "var(--text-3, #626a77)" },
  ".cm-tooltip": {
    border: "1px solid var(--border-strong, #cfd3da)",
    borderRadius: "6px",
    boxShadow: "0 4px 16px rgba(16, 24, 40, 0.12)",
    backgroundColor: "var(--surface, #fff)",
    overflow: "hidden",
  },
  ".cm-tooltip-autocomplete > ul": { fontFamily: MONO, fontSize: "12.5px" },
  ".cm-tooltip-autocomplete ul li[aria-selected]": {
    backgroundColor: "var(--accent, #4f46e5)",
    color: "#fff",
  },
  ".cm-panels": { backgroundColor: "var(--surface-2, #f5f6f8)", color: "var(--text, #1b1f27)" },
  ".cm-panels.cm-panels-bottom": { borderTop: "1px solid var(--border, #e3e5e9)" },
  ".cm-panels.cm-panels-top": { borderBottom: "1px solid var(--border, #e3e5e9)" },
  ".cm-foldPlaceholder": {
    backgroundColor: "var(--surface-3, #eceef2)",
    border: "1px solid var(--border, #e3e5e9)",
    color: "var(--text-2, #4b5260)",
  },
});

const registry = new WeakMap();
const HIDE_STYLE = {
  position: "absolute",
  width: "1px",
  height: "1px",
  padding: "0",
  margin: "0",
  border: "0",
  opacity: "0",
  overflow: "hidden",
  pointerEvents: "none",
  resize: "none",
};

function labelFor(textarea) {
  const aria = textarea.getAttribute("aria-label");
  if (aria) return aria;
  if (textarea.labels && textarea.labels.length) return textarea.labels[0].textContent.trim();
  return textarea.name ? `Code editor: ${textarea.name}` : "Code editor";
}

function hideTextarea(textarea) {
  if (!textarea.hasAttribute("data-editor-orig-style")) {
    textarea.setAttribute("data-editor-orig-style", textarea.getAttribute("style") || "");
  }
  Object.assign(textarea.style, HIDE_STYLE);
  textarea.setAttribute("tabindex", "-1");
  textarea.setAttribute("aria-hidden", "true");
}

function restoreTextarea(textarea) {
  const orig = textarea.getAttribute("data-editor-orig-style");
  if (orig !== null) {
    if (orig) textarea.setAttribute("style", orig);
    else textarea.removeAttribute("style");
    textarea.removeAttribute("data-editor-orig-style");
  }
  textarea.removeAttribute("tabindex");
  textarea.removeAttribute("aria-hidden");
  textarea.removeAttribute("data-editor-attached");
}

// After an htmx history restore (or any innerHTML snapshot), the DOM may
// contain a dead editor wrapper next to the textarea: drop it.
function removeStaleWrapper(textarea) {
  const next = textarea.nextElementSibling;
  if (next && next.classList.contains("editor") && next.hasAttribute("data-editor-wrapper")) next.remove();
  if (textarea.hasAttribute("data-editor-attached")) restoreTextarea(textarea);
}

export function get(textarea) {
  return registry.get(textarea) || null;
}

export function attach(textarea, options = {}) {
  if (!textarea || textarea.tagName !== "TEXTAREA") {
    throw new TypeError("EvalsiteEditor.attach expects a <textarea>");
  }
  const existing = registry.get(textarea);
  if (existing) {
    if (options.language) existing.setLanguage(options.language);
    return existing;
  }
  removeStaleWrapper(textarea);

  let language = normalizeLanguage(options.language != null ? options.language : textarea.getAttribute("data-editor"));
  const readOnly = options.readOnly != null ? !!options.readOnly : textarea.readOnly || textarea.disabled;
  const languageConf = new Compartment();
  const readOnlyConf = new Compartment();

  const wrap = document.createElement("div");
  wrap.className = "editor";
  wrap.setAttribute("data-editor-wrapper", "");
  wrap.setAttribute("data-language", language);
  if (readOnly) wrap.classList.add("is-readonly");
  const rowsAttr = parseInt(textarea.getAttribute("rows") || "", 10);
  const minLines = options.minLines || (rowsAttr > 0 ? rowsAttr : 10);
  wrap.style.setProperty("--editor-min-lines", String(minLines));
  if (options.maxHeight) wrap.style.setProperty("--editor-max-height", options.maxHeight);

  let silent = false;
  const sync = () => {
    textarea.value = view.state.doc.toString();
    if (wrap.classList.contains("is-invalid") && textarea.checkValidity()) wrap.classList.remove("is-invalid");
    if (!silent) textarea.dispatchEvent(new Event("input", { bubbles: true }));
  };

  const contentAttrs = { "aria-label": labelFor(textarea) };
  const describedBy = textarea.getAttribute("aria-describedby");
  if (describedBy) contentAttrs["aria-describedby"] = describedBy;
  if (textarea.getAttribute("aria-invalid") === "true") contentAttrs["aria-invalid"] = "true";

  const extensions = [
    basicSetup,
    keymap.of([indentWithTab]),
    EditorState.tabSize.of(4),
    languageConf.of(languageExtension(language)),
    readOnlyConf.of([EditorState.readOnly.of(readOnly), EditorView.editable.of(!readOnly)]),
    theme,
    EditorView.contentAttributes.of(contentAttrs),
    EditorView.updateListener.of((update) => {
      if (update.docChanged) sync();
    }),
  ];
  if (textarea.placeholder) extensions.push(placeholder(textarea.placeholder));
  if (options.extensions) extensions.push(options.extensions);

  // Insert the wrapper before creating the view so CodeMirror measures line
  // heights with the real fonts/theme applied (a detached parent measures 0).
  textarea.insertAdjacentElement("afterend", wrap);
  const view = new EditorView({
    state: EditorState.create({ doc: textarea.value, extensions }),
    parent: wrap,
  });
  hideTextarea(textarea);
  textarea.setAttribute("data-editor-attached", "");
  if (textarea.getAttribute("aria-invalid") === "true") wrap.classList.add("is-invalid");

  // Native validation (e.g. `required`) still runs on the hidden textarea.
  const onInvalid = () => wrap.classList.add("is-invalid");
  const onFocus = () => view.focus();
  textarea.addEventListener("invalid", onInvalid);
  textarea.addEventListener("focus", onFocus);
  const form = textarea.form;
  const onReset = () => setTimeout(() => setValue(textarea.value, true), 0);
  if (form) form.addEventListener("reset", onReset);

  function setValue(text, quiet) {
    text = text == null ? "" : String(text);
    if (text === view.state.doc.toString()) return;
    silent = !!quiet;
    try {
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
    } finally {
      silent = false;
    }
  }

  function setLanguage(lang) {
    const next = normalizeLanguage(lang);
    if (next === language) return handle;
    language = next;
    view.dispatch({ effects: languageConf.reconfigure(languageExtension(language)) });
    textarea.setAttribute("data-editor", language);
    wrap.setAttribute("data-language", language);
    return handle;
  }

  function destroy() {
    textarea.value = view.state.doc.toString();
    view.destroy();
    wrap.remove();
    textarea.removeEventListener("invalid", onInvalid);
    textarea.removeEventListener("focus", onFocus);
    if (form) form.removeEventListener("reset", onReset);
    restoreTextarea(textarea);
    registry.delete(textarea);
  }

  const handle = {
    view,
    textarea,
    wrapper: wrap,
    get language() {
      return language;
    },
    getValue: () => view.state.doc.toString(),
    setValue: (text) => setValue(text, false),
    setLanguage,
    setReadOnly(ro) {
      view.dispatch({ effects: readOnlyConf.reconfigure([EditorState.readOnly.of(!!ro), EditorView.editable.of(!ro)]) });
      wrap.classList.toggle("is-readonly", !!ro);
    },
    focus: () => view.focus(),
    destroy,
  };
  registry.set(textarea, handle);
  return handle;
}

export function detach(textarea) {
  const h = registry.get(textarea);
  if (h) h.destroy();
}

export function setLanguage(textarea, lang) {
  const h = registry.get(textarea);
  if (h) h.setLanguage(lang);
  else if (textarea) textarea.setAttribute("data-editor", normalizeLanguage(lang));
}

if (typeof window !== "undefined") {
  window.EvalsiteEditor = {
    attach,
    get,
    detach,
    setLanguage,
    normalizeLanguage,
    languages: LANGUAGES.slice(),
    EditorView,
  };
}
