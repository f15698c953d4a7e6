// JavaScript / TypeScript worker harness. Same wire protocol as worker.py (read its docstring):
// requests are lines on stdin, result frames go to RESULT_FD, one per call, in order.
//
// Started as `node worker.js RESULT_FD LOG_LIMIT RESULT_LIMIT RUNTIME`. Requests are read with
// blocking reads, so nothing a user left scheduled (timers, promises) runs between batches; the
// event loop only turns while an async evaluate() is being awaited.
//
// Like worker.py this is not a security boundary: user code shares this process. The jail is.
'use strict';

const fs = require('fs');
const vm = require('vm');
const util = require('util');
const { createRequire } = require('module');
const { performance } = require('perf_hooks');
const { Writable } = require('stream');

const [RESULT_FD, LOG_LIMIT, RESULT_LIMIT] = process.argv.slice(2, 5).map(Number);
const RUNTIME = process.argv[5];
// Captured once: user code may patch the globals and modules it shares with the harness.
const stringify = JSON.stringify;
const parse = JSON.parse;
const writeSync = fs.writeSync;
const readSync = fs.readSync;
const bufferFrom = Buffer.from;
const MAX_EVALUATORS = 64; // compiled revisions kept per worker, oldest dropped first
const now = performance.now.bind(performance);
const HARNESS = __filename;
const userRequire = createRequire(__filename);
// Loaded up front by TypeScript workers (it takes tens of ms, better spent before the first
// batch), on first use by a JavaScript worker meeting an ES-module evaluator.
let sucrase = RUNTIME === 'typescript' ? require('sucrase') : null;

// ---- output capture --------------------------------------------------------------------------
const logs = { parts: [], size: 0, truncated: false };

function capture(text) {
  const room = LOG_LIMIT - logs.size;
  if (room <= 0) {
    if (text.length) logs.truncated = true;
    return;
  }
  if (text.length > room) {
    logs.truncated = true;
    text = text.slice(0, room);
  }
  logs.parts.push(text);
  logs.size += text.length;
}

function takeLogs() {
  let text = logs.parts.join('');
  if (logs.truncated) text += `\n[output truncated after ${LOG_LIMIT} characters]`;
  logs.parts = [];
  logs.size = 0;
  logs.truncated = false;
  return text;
}

for (const name of ['log', 'info', 'warn', 'error', 'debug', 'trace', 'dir']) {
  console[name] = (...args) => capture(util.format(...args) + '\n');
}
// process.stdout/stderr become capture streams before Node ever opens fds 1 and 2 as streams
// (which would also switch those pipes to non-blocking mode under the user's raw writes).
for (const name of ['stdout', 'stderr']) {
  const stream = new Writable({
    write(chunk, encoding, callback) {
      capture(String(chunk));
      callback();
    },
  });
  stream.isTTY = false;
  Object.defineProperty(process, name, { value: stream, configurable: true, enumerable: true });
}
// Errors thrown from a user's timer or a forgotten promise land in the logs, not in a crash.
process.on('uncaughtException', (error) => capture(`Uncaught ${describeThrown(error)}\n`));
process.on('unhandledRejection', (error) => {
  capture(`Unhandled rejection: ${describeThrown(error)}\n`);
});
// RLIMIT_FSIZE: fail the write with EFBIG instead of killing the worker.
process.on('SIGXFSZ', () => {});

// ---- frames ----------------------------------------------------------------------------------
function send(text) {
  const buffer = bufferFrom(text, 'utf8');
  let offset = 0;
  while (offset < buffer.length) {
    try {
      offset += writeSync(RESULT_FD, buffer, offset);
    } catch (error) {
      if (error.code !== 'EAGAIN') throw error;
    }
  }
}

// Reads lines with blocking reads. A long line (a batch of large sessions) arrives in many reads:
// its earlier pieces are kept aside and joined once, so reading it costs its length, not its
// length squared.
class LineReader {
  constructor(fd) {
    this.fd = fd;
    this.chunk = Buffer.allocUnsafe(1 << 16);
    this.buffer = this.chunk.subarray(0, 0);
    this.start = 0;
    this.pieces = []; // the current line's bytes from earlier reads (copies: chunk is reused)
  }

  next() {
    for (;;) {
      const end = this.buffer.indexOf(10, this.start);
      if (end >= 0) {
        const tail = this.buffer.subarray(this.start, end);
        this.start = end + 1;
        if (!this.pieces.length) return tail.toString('utf8');
        this.pieces.push(tail);
        const line = Buffer.concat(this.pieces).toString('utf8');
        this.pieces = [];
        return line;
      }
      if (this.start < this.buffer.length) {
        this.pieces.push(bufferFrom(this.buffer.subarray(this.start)));
        this.start = this.buffer.length;
      }
      if (!this.fill()) return null;
    }
  }

  fill() {
    let read;
    try {
      read = readSync(this.fd, this.chunk, 0, this.chunk.length, null);
    } catch (error) {
      if (error.code === 'EAGAIN') return true;
      if (error.code === 'EOF') return false;
      throw error;
    }
    if (read === 0) return false;
    this.buffer = this.chunk.subarray(0, read);
    this.start = 0;
    return true;
  }
}

// ---- loading ---------------------------------------------------------------------------------
const evaluators = new Map();

function transpile(code, runtime) {
  const typescript = runtime === 'typescript';
  if (!typescript && !/\b(import|export)\b/.test(code)) return code;
  if (sucrase === null) sucrase = require('sucrase');
  // Sucrase keeps line numbers, so stack traces point at the user's own lines.
  const transforms = typescript ? ['typescript', 'imports'] : ['imports'];
  return sucrase.transform(code, { transforms, filePath: filenameFor(runtime) }).code;
}

function filenameFor(runtime) {
  return runtime === 'typescript' ? 'evaluator.ts' : 'evaluator.js';
}

function compile(code, runtime) {
  const filename = filenameFor(runtime);
  let source;
  try {
    source = transpile(code, runtime);
  } catch (error) {
    return { error: syntaxError(error, filename, error.loc) };
  }
  let body;
  try {
    body = vm.compileFunction(
      `${source}\n;return {` +
        'evaluate: typeof evaluate === "function" ? evaluate : undefined,' +
        'evaluateSession: typeof evaluateSession === "function" ? evaluateSession : ' +
        'typeof evaluate_session === "function" ? evaluate_session : undefined};',
      ['exports', 'require', 'module', '__filename', '__dirname'],
      { filename },
    );
  } catch (error) {
    return { error: syntaxError(error, filename, null) };
  }
  return { body, filename };
}

function instantiate(compiled) {
  const module = { exports: {} };
  let local;
  try {
    local = compiled.body(module.exports, userRequire, module, compiled.filename, '/');
  } catch (error) {
    const failed = { ...errorOf(error), code: 'compile_error' };
    const match = /evaluator\.[jt]s:(\d+)/.exec(failed.stacktrace);
    if (match) failed.line = Number(match[1]);
    return { error: failed };
  }
  // A module that returns early at its top level (`return;`) never reaches the appended
  // `return {evaluate, evaluateSession}`: only its exports count then.
  const own = local && typeof local === 'object' ? local : {};
  const exported = module.exports;
  const fallback = exported && exported.default;
  // Sessions: evaluateSession (the JavaScript spelling), or evaluate_session, exported (also on
  // a default export object) or a top-level function; or a lone function exported under one of
  // those names (`export default function evaluateSession`).
  const evaluateSession = [
    exported && exported.evaluateSession,
    exported && exported.evaluate_session,
    fallback && fallback.evaluateSession,
    fallback && fallback.evaluate_session,
    own.evaluateSession,
    ...[fallback, exported].filter(isSessionFunction),
  ].find((candidate) => typeof candidate === 'function');
  // A lone exported function is evaluate, unless it is the session entry point.
  const evaluate = [
    exported && exported.evaluate,
    fallback && fallback.evaluate,
    ...[fallback, exported].filter((fn) => fn !== evaluateSession && !isSessionFunction(fn)),
    own.evaluate,
  ].find((candidate) => typeof candidate === 'function');
  if (!evaluate && !evaluateSession) {
    return {
      error: {
        code: 'compile_error',
        type: 'MissingEvaluate',
        message:
          'The code does not define an evaluate() function ' +
          '(nor evaluateSession(inputs, outputs, session), for sessions).',
        stacktrace: '',
      },
    };
  }
  return { evaluate, evaluateSession };
}

function isSessionFunction(fn) {
  if (typeof fn !== 'function') return false;
  return fn.name === 'evaluateSession' || fn.name === 'evaluate_session';
}

// The function a batch calls, or the load error when the module does not define it.
function entryPoint(loaded, entry, version) {
  if (entry === 'session') {
    if (loaded.evaluateSession) return { fn: loaded.evaluateSession };
    return {
      error: {
        code: 'session_unsupported',
        type: 'MissingEvaluateSession',
        message:
          'The code does not define evaluateSession(inputs, outputs, session), so it cannot ' +
          'judge sessions. Define it beside evaluate() (export it, or as a top-level function).',
        stacktrace: '',
      },
    };
  }
  if (loaded.evaluate) return { fn: loaded.evaluate };
  return {
    error: {
      code: 'compile_error',
      type: 'MissingEvaluate',
      message:
        version === '1'
          ? 'Interface version 1 calls evaluate(app_params, inputs, output, correct_answer), ' +
            'which the code does not define (evaluateSession judges sessions, with interface ' +
            'version 2 only).'
          : 'The code does not define an evaluate() function ' +
            '(it defines only evaluateSession, which judges sessions).',
      stacktrace: '',
    },
  };
}

function held(rev, code) {
  const cached = evaluators.get(rev);
  return cached && cached.code === code ? cached : null;
}

function load(rev, code, runtime) {
  const cached = held(rev, code);
  if (cached) return cached;
  const compiled = compile(code, runtime);
  if (compiled.error) return compiled;
  const loaded = instantiate(compiled);
  if (!loaded.error) {
    loaded.code = code;
    evaluators.delete(rev);
    evaluators.set(rev, loaded);
    if (evaluators.size > MAX_EVALUATORS) evaluators.delete(evaluators.keys().next().value);
  }
  return loaded;
}

function syntaxError(error, filename, loc) {
  let line = loc ? loc.line : null;
  let column = loc ? loc.column + 1 : null;
  const match = /^evaluator\.[jt]s:(\d+)/.exec(String(error && error.stack));
  if (!line && match) line = Number(match[1]);
  const message = String(error && error.message ? error.message : error);
  const result = {
    code: 'compile_error',
    type: (error && error.name) || 'SyntaxError',
    message: line && !/\(\d+:\d+\)$/.test(message) ? `${message} (line ${line})` : message,
    stacktrace: match
      ? String(error.stack).split('\n    at ')[0]
      : `${filename}:${line || '?'}\n${message}`,
  };
  if (line) result.line = line;
  if (column) result.column = column;
  return result;
}

// ---- calls -----------------------------------------------------------------------------------
function errorOf(error) {
  const isError = error instanceof Error;
  let message;
  try {
    message = isError ? String(error.message) : describeThrown(error);
  } catch {
    message = '<an error with an unprintable message>';
  }
  const type = isError ? String(error.name || error.constructor.name) : typeof error;
  const outOfMemory = /heap out of memory|Invalid array length|Array buffer allocation failed/;
  const code = isError && outOfMemory.test(message) ? 'memory_limit' : 'exception';
  return { code, type, message, stacktrace: isError ? userStack(error) : '' };
}

function userStack(error) {
  let stack;
  try {
    stack = String(error.stack);
  } catch {
    return '';
  }
  return stack
    .split('\n')
    .filter((line) => !line.startsWith('    at ') || !isHarnessFrame(line))
    .join('\n');
}

function isHarnessFrame(line) {
  return line.includes(HARNESS) || line.includes('node:internal');
}

function describeThrown(value) {
  if (value instanceof Error) return String(value.stack || value);
  try {
    return typeof value === 'string' ? value : util.inspect(value);
  } catch {
    return '<unprintable>';
  }
}

function unrepresentable(value, path, seen) {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return null;
    case 'number':
      if (Number.isFinite(value)) return null;
      return at(Number.isNaN(value) ? 'NaN' : value > 0 ? 'Infinity' : '-Infinity', path);
    case 'undefined':
      return at('undefined', path);
    case 'function':
      return at('a function', path);
    case 'symbol':
      return at('a symbol', path);
    case 'bigint':
      return at('a BigInt', path);
    default:
      break;
  }
  if (value === null) return null;
  if (seen.includes(value)) return at('a circular reference', path);
  if (typeof value.toJSON === 'function') {
    return unrepresentable(value.toJSON(), path, seen);
  }
  if (value instanceof Set) return at('a Set', path);
  if (value instanceof Map) return at('a Map', path);
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) return at('a binary buffer', path);
  if (value instanceof Promise) return at('a Promise', path);
  seen.push(value);
  try {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        const found = unrepresentable(value[i], `${path}[${i}]`, seen);
        if (found) return path ? found : `an array containing ${found}`;
      }
      return null;
    }
    for (const key of Object.keys(value)) {
      const found = unrepresentable(value[key], path ? `${path}.${key}` : key, seen);
      if (found) return path ? found : `an object containing ${found}`;
    }
    return null;
  } finally {
    seen.pop();
  }
}

function at(what, path) {
  return path ? `${what} at ${path}` : what;
}

function encodeValue(value) {
  const type = typeof value;
  let encoded;
  if (type === 'boolean' || (type === 'number' && Number.isFinite(value)) || value === null) {
    encoded = String(value);
  } else if (type === 'string') {
    encoded = stringify(value);
  } else {
    let what;
    try {
      what = unrepresentable(value, '', []);
      if (!what) encoded = stringify(value);
    } catch (error) {
      what = `a value JSON cannot carry (${describeThrown(error).split('\n')[0]})`;
    }
    if (what) return `"ok":true,"unrepresentable":${stringify(what)}`;
  }
  if (encoded.length > RESULT_LIMIT) {
    const error = {
      code: 'output_limit',
      type: 'OutputLimit',
      message:
        `evaluate() returned ${encoded.length} characters of JSON; ` +
        `the limit is ${RESULT_LIMIT}.`,
      stacktrace: '',
    };
    return `"ok":false,"error":${stringify(error)}`;
  }
  return `"ok":true,"value":${encoded}`;
}

function frame(started, fields) {
  const ms = (now() - started).toFixed(4);
  const text = logs.parts.length || logs.truncated ? `,"logs":${stringify(takeLogs())}` : '';
  return `{"ms":${ms},${fields}${text}}`;
}

function failure(started, error) {
  return frame(started, `"ok":false,"error":${stringify(errorOf(error))}`);
}

// Returns the encoded result, or a promise of it when evaluate() is async.
function call(evaluate, args) {
  const started = now();
  let value;
  try {
    value = evaluate(...args);
  } catch (error) {
    return failure(started, error);
  }
  if (value !== null && (typeof value === 'object' || typeof value === 'function')) {
    let then;
    try {
      then = value.then;
    } catch (error) {
      return failure(started, error);
    }
    if (typeof then === 'function') {
      return Promise.resolve(value).then(
        (resolved) => frame(started, encodeValue(resolved)),
        (error) => failure(started, error),
      );
    }
  }
  return frame(started, encodeValue(value));
}

// ---- requests --------------------------------------------------------------------------------
async function batch(header, reader) {
  const prefix = `R ${header.nonce} `;
  // Compiling (transpiling) and running the module may take long: the host then blames a
  // fault on the load.
  const compiling = !held(header.rev, header.code);
  if (compiling) send(`K ${header.nonce}\n`);
  const loaded = load(header.rev, header.code, header.runtime);
  const entry = loaded.error
    ? loaded
    : entryPoint(loaded, header.entry || 'evaluate', header.version);
  const answer = { ok: !entry.error };
  if (entry.error) answer.error = entry.error;
  const loadLogs = takeLogs();
  if (loadLogs) answer.logs = loadLogs;
  // For a revision already held, L goes out with the first result: one write, one wake-up of
  // the host. Otherwise the host restarts the first call's clock on it.
  let ahead = `L ${header.nonce} ${stringify(answer)}\n`;
  if (compiling || entry.error) {
    send(ahead);
    ahead = '';
  }
  let index = 0;
  for (let remaining = header.n; remaining > 0; ) {
    const chunk = parse(reader.next());
    remaining -= chunk.length;
    if (!entry.fn) continue;
    for (const args of chunk) {
      let result = call(entry.fn, args);
      if (typeof result !== 'string') result = await settle(result);
      send(`${ahead}${prefix}${index} ${result}\n`);
      ahead = '';
      index += 1;
    }
  }
  if (ahead) send(ahead);
}

// Awaits an evaluate() promise. A timer keeps the event loop alive meanwhile: a promise that
// never settles must end in the host's timeout, not in Node exiting for lack of work.
async function settle(promise) {
  const keepAlive = setInterval(() => {}, 1 << 30);
  try {
    return await promise;
  } finally {
    clearInterval(keepAlive);
  }
}

function check(message) {
  const compiled = compile(message.code, message.runtime);
  let loaded = compiled.error ? compiled : instantiate(compiled);
  // Version 1 calls evaluate() only: a module without it could judge nothing.
  if (!loaded.error && message.version === '1') loaded = entryPoint(loaded, 'evaluate', '1');
  takeLogs();
  send(`C ${message.nonce} ${stringify(loaded.error ? [loaded.error] : [])}\n`);
}

async function main() {
  send(`H ${stringify({ runtime: `node ${process.version}` })}\n`);
  const reader = new LineReader(0);
  for (;;) {
    const line = reader.next();
    if (line === null) break;
    const message = parse(line);
    if (message.op === 'batch') await batch(message, reader);
    else if (message.op === 'check') check(message);
  }
  process.exit(0);
}

main().catch((error) => {
  fs.writeSync(2, `worker.js failed: ${describeThrown(error)}\n`);
  process.exit(70);
});
