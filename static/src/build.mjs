// Build the committed front-end vendor files:  npm run build
//
//   static/src/editor.js                      -> static/vendor/codemirror.bundle.js (esbuild, minified IIFE)
//   node_modules/htmx.org/dist/htmx.min.js    -> static/vendor/htmx.min.js
//   node_modules/chart.js/dist/chart.umd.min.js -> static/vendor/chart.umd.min.js
//
// Source-map comments are stripped from copied files: Django's
// ManifestStaticFilesStorage (and whitenoise's) rewrites `sourceMappingURL`
// references during collectstatic and fails if the .map file is missing.
import { build } from "esbuild";
import { readFile, writeFile, mkdir, stat } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");
const vendor = path.join(root, "static", "vendor");
const nm = (...parts) => path.join(root, "node_modules", ...parts);

// Read package.json directly: several packages restrict `exports`.
const versions = {};
async function loadVersions(pkgs) {
  for (const pkg of pkgs) versions[pkg] = JSON.parse(await readFile(nm(pkg, "package.json"), "utf8")).version;
}
const version = (pkg) => versions[pkg];
const stripSourceMap = (code) => code.replace(/\n?\/\/# sourceMappingURL=\S+\s*$/, "\n");

async function main() {
  await mkdir(vendor, { recursive: true });
  await loadVersions(["codemirror", "@codemirror/view", "@codemirror/lang-python", "@codemirror/lang-javascript", "@codemirror/lang-json", "htmx.org"]);

  const banner =
    `/*! evalsite editor bundle: CodeMirror ${version("codemirror")} ` +
    `(@codemirror/view ${version("@codemirror/view")}, lang-python ${version("@codemirror/lang-python")}, ` +
    `lang-javascript ${version("@codemirror/lang-javascript")}, lang-json ${version("@codemirror/lang-json")}) ` +
    `| MIT License, (c) Marijn Haverbeke and others | https://codemirror.net */`;

  await build({
    entryPoints: [path.join(here, "editor.js")],
    outfile: path.join(vendor, "codemirror.bundle.js"),
    bundle: true,
    format: "iife",
    minify: true,
    target: ["es2020", "chrome90", "firefox90", "safari15"],
    legalComments: "none",
    banner: { js: banner },
    sourcemap: false,
    logLevel: "warning",
    absWorkingDir: root,
  });

  const htmx = await readFile(nm("htmx.org", "dist", "htmx.min.js"), "utf8");
  await writeFile(
    path.join(vendor, "htmx.min.js"),
    `/*! htmx ${version("htmx.org")} | 0BSD License | https://htmx.org */\n` + stripSourceMap(htmx).trimEnd() + "\n",
  );

  const chart = await readFile(nm("chart.js", "dist", "chart.umd.min.js"), "utf8");
  await writeFile(path.join(vendor, "chart.umd.min.js"), stripSourceMap(chart).trimEnd() + "\n");

  for (const f of ["codemirror.bundle.js", "htmx.min.js", "chart.umd.min.js"]) {
    const { size } = await stat(path.join(vendor, f));
    console.log(`static/vendor/${f.padEnd(22)} ${(size / 1024).toFixed(1).padStart(7)} KiB`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
