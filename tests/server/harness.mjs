// Test harness for `mlxcel serve`: start the server as a child process on an
// ephemeral port of 127.0.0.1, wait (bounded) for its ready line, collect its
// stderr (access log, sanitizer reports), stop it with SIGTERM (bounded) and
// check that it exited 0 with no sanitizer report. Plus small wire helpers:
// JSON requests over fetch, raw HTTP over node:net, an SSE reader, and the
// OpenAI error-shape check. Every wait here is bounded in time.
import { spawn } from 'node:child_process';
import net from 'node:net';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

export const BIN = process.env.MLXCEL_BIN;
// The model every server here serves (-m, relative to the repo root, where the
// tests run); its id in the API is the folder's name. models/llama-tiny: a
// 512-token context and the '<|role|>\n...<|end|>\n' chat template.
export const MODEL_DIR = process.env.MLXCEL_TEST_MODEL || 'models/llama-tiny';
export const MODEL = MODEL_DIR.replace(/\/+$/, '').split('/').pop();
export const CONTEXT = 512;

// Sanitized builds are several times slower: every time bound scales by SLOW.
export const SLOW = Number(process.env.MLXCEL_TEST_SLOW) ||
    (process.env.ASAN_OPTIONS || process.env.UBSAN_OPTIONS ? 5 : 1);

const READY_MS = 60_000;
const STOP_MS = 30_000;
const READY_RE = /listening on (http:\/\/127\.0\.0\.1:\d+)/;
const SANITIZER_RE = /ERROR: AddressSanitizer|runtime error:|LeakSanitizer/;
const STDERR_HEAD = 1 << 20;      // keep the first 1 MiB of stderr ...
const STDERR_TAIL = 4 << 20;      // ... and the last 4 MiB (a sanitizer report comes last)

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Reject after ms with a message naming what was awaited.
export function withTimeout(promise, ms, what) {
    let timer;
    const t = new Promise((_, rej) => {
        timer = setTimeout(() => rej(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    });
    return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

class Server {
    constructor(args, env) {
        this.args = args;
        this.head = '';
        this.tail = '';
        this.stdout = '';
        this.exit = null;          // {code, signal} once exited
        this.stopping = false;
        // the default model unless args name one (a second -m is router mode: ADR 0099)
        const named = args.some((a) => a === '-m' || a === '--model' || a === '--models-dir');
        this.proc = spawn(BIN, ['serve', '--port', '0', ...(named ? [] : ['-m', MODEL_DIR]), ...args], {
            env: { ...process.env, ...env },
            stdio: ['ignore', 'pipe', 'pipe'],
        });
        this.exited = new Promise((resolve) => {
            this.proc.on('exit', (code, signal) => {
                this.exit = { code, signal };
                resolve(this.exit);
            });
            this.proc.on('error', (e) => {
                this.exit = { code: null, signal: null, error: e };
                resolve(this.exit);
            });
        });
        this.proc.stderr.setEncoding('utf8');
        this.proc.stderr.on('data', (s) => this._stderr(s));
        this.proc.stdout.setEncoding('utf8');
        this.proc.stdout.on('data', (s) => {
            if (this.stdout.length < STDERR_HEAD) this.stdout += s;
        });
    }

    _stderr(s) {
        if (this.head.length < STDERR_HEAD) {
            const room = STDERR_HEAD - this.head.length;
            this.head += s.slice(0, room);
            s = s.slice(room);
        }
        if (s.length) {
            this.tail += s;
            if (this.tail.length > STDERR_TAIL) this.tail = this.tail.slice(-STDERR_TAIL);
        }
    }

    stderr() { return this.head + this.tail; }
    stderrTail(n = 4000) { return this.stderr().slice(-n); }
    get alive() { return this.exit === null; }
    get port() { return Number(new URL(this.base).port); }

    async ready() {
        const seen = new Promise((resolve) => {
            const check = () => {
                const m = READY_RE.exec(this.stdout);
                if (m) { resolve(m[1]); return true; }
                return false;
            };
            if (!check()) this.proc.stdout.on('data', () => check());
        });
        const died = this.exited.then((e) => { throw this._startError(e); });
        try {
            this.base = await withTimeout(Promise.race([seen, died]), READY_MS,
                `the ready line of \`mlxcel serve ${this.args.join(' ')}\` on stdout`);
        } catch (e) {
            if (this.alive) this.proc.kill('SIGKILL');
            throw new Error(`${e.message}\n--- server stdout:\n${this.stdout}\n--- server stderr:\n${this.stderrTail()}`);
        }
        return this;
    }

    _startError(e) {
        const err = this.stderr();
        if (e.error) return new Error(`cannot run ${BIN}: ${e.error.message}`);
        if (/unknown command 'serve'/.test(err))
            return new Error(`${BIN} has no \`serve\` command (this build predates the server)`);
        return new Error(`\`mlxcel serve ${this.args.join(' ')}\` exited (code ${e.code}, signal ${e.signal}) before it was ready`);
    }

    // SIGTERM, wait (bounded), check the exit status and stderr. Idempotent.
    async stop() {
        if (this.stopped) return this.stopped;
        this.stopped = this._stop();
        return this.stopped;
    }

    async _stop() {
        this.stopping = true;
        if (this.alive) this.proc.kill('SIGTERM');
        let e;
        try {
            e = await withTimeout(this.exited, STOP_MS, 'the server to exit after SIGTERM');
        } catch (err) {
            this.proc.kill('SIGKILL');
            await withTimeout(this.exited, 10_000, 'the server to exit after SIGKILL').catch(() => {});
            throw new Error(`${err.message} (killed)\n--- server stderr:\n${this.stderrTail()}`);
        }
        this.checkSanitizer();
        if (e.code !== 0)
            throw new Error(`server exited with code ${e.code}, signal ${e.signal} (want 0)\n--- server stderr:\n${this.stderrTail()}`);
    }

    checkSanitizer() {
        const err = this.stderr();
        const m = SANITIZER_RE.exec(err);
        if (m) {
            const at = Math.max(0, m.index - 200);
            throw new Error(`sanitizer report in server stderr:\n${err.slice(at, at + 8000)}`);
        }
    }

    // Fail when the server died under us (use between steps of a long test).
    assertAlive(what = '') {
        if (!this.alive)
            throw new Error(`server died ${what} (code ${this.exit.code}, signal ${this.exit.signal})\n--- server stderr:\n${this.stderrTail()}`);
    }
}

// Start `mlxcel serve --port 0 ...args` and wait for it to be ready.
export async function startServer(args = [], env = {}) {
    if (!BIN) throw new Error('MLXCEL_BIN is not set (run through tests/cli/server.sh)');
    const s = new Server(args, env);
    return s.ready();
}

export function client(base, opts = {}) {
    return new OpenAI({
        baseURL: base + '/v1',
        apiKey: 'x',
        maxRetries: 0,
        timeout: 60_000 * SLOW,
        ...opts,
    });
}

// fetch with a JSON (or raw string/Buffer) body; returns {status, headers, text, json}.
export async function request(base, path, { method = 'POST', body, headers = {}, timeout = 60_000 * SLOW } = {}) {
    const h = { ...headers };
    let payload = body;
    if (body !== undefined && typeof body !== 'string' && !(body instanceof Uint8Array)) {
        payload = JSON.stringify(body);
    }
    if (payload !== undefined && !Object.keys(h).some((k) => k.toLowerCase() === 'content-type'))
        h['content-type'] = 'application/json';
    const res = await fetch(base + path, {
        method,
        headers: h,
        body: method === 'GET' || method === 'HEAD' ? undefined : payload,
        signal: AbortSignal.timeout(timeout),
    });
    const text = await res.text();
    let json;
    if ((res.headers.get('content-type') || '').includes('json')) {
        try { json = JSON.parse(text); } catch (e) {
            throw new Error(`${method} ${path}: ${res.status} with an unparsable JSON body: ${text.slice(0, 300)}`);
        }
    }
    return { status: res.status, headers: res.headers, text, json };
}

export const get = (base, path, opts = {}) => request(base, path, { ...opts, method: 'GET' });
export const post = (base, path, body, opts = {}) => request(base, path, { ...opts, method: 'POST', body });

// A greedy /v1/completions body (temperature 0, max_tokens n); anything but 200 throws.
export async function completeGreedy(base, prompt, n) {
    const r = await post(base, '/v1/completions', { prompt, max_tokens: n, temperature: 0 });
    if (r.status !== 200) throw new Error(`completion of ${JSON.stringify(prompt)}: ${r.status} ${r.text.slice(0, 300)}`);
    return r.json;
}

// Each prompt alone, then all of them at once: every concurrent greedy completion must equal
// its solo one (text and usage). Returns the solo completions.
export async function assertConcurrentEqualsSolo(base, prompts, n) {
    const solo = [];
    for (const p of prompts) solo.push(await completeGreedy(base, p, n));
    const all = await withTimeout(Promise.all(prompts.map((p) => completeGreedy(base, p, n))),
        120_000 * SLOW, `${prompts.length} concurrent completions`);
    prompts.forEach((p, i) => {
        if (!(solo[i].choices[0].text.length > 0)) throw new Error(`empty completion for ${JSON.stringify(p)}`);
        if (all[i].choices[0].text !== solo[i].choices[0].text)
            throw new Error(`${JSON.stringify(p)}: concurrent ${JSON.stringify(all[i].choices[0].text)} != alone ${JSON.stringify(solo[i].choices[0].text)}`);
        if (JSON.stringify(all[i].usage) !== JSON.stringify(solo[i].usage))
            throw new Error(`${JSON.stringify(p)}: usage ${JSON.stringify(all[i].usage)} != alone ${JSON.stringify(solo[i].usage)}`);
    });
    return solo;
}

// The OpenAI error shape: {"error": {"message": str, "type": str, "param": str|null, "code": str|null}}.
export function assertErrorShape(json, what = '') {
    assert.ok(json && typeof json === 'object', `${what}: error body is not a JSON object: ${JSON.stringify(json)}`);
    const e = json.error;
    assert.ok(e && typeof e === 'object', `${what}: no "error" object: ${JSON.stringify(json)}`);
    assert.equal(typeof e.message, 'string', `${what}: error.message: ${JSON.stringify(json)}`);
    assert.ok(e.message.length > 0, `${what}: empty error.message`);
    assert.equal(typeof e.type, 'string', `${what}: error.type: ${JSON.stringify(json)}`);
    assert.ok('param' in e, `${what}: error.param missing: ${JSON.stringify(json)}`);
    assert.ok(e.param === null || typeof e.param === 'string', `${what}: error.param: ${JSON.stringify(json)}`);
    assert.ok('code' in e, `${what}: error.code missing: ${JSON.stringify(json)}`);
    assert.ok(e.code === null || typeof e.code === 'string', `${what}: error.code: ${JSON.stringify(json)}`);
    return e;
}

// A status + error-shaped JSON body check on a request() result.
export function assertError(res, status, what, { param, code, type } = {}) {
    assert.equal(res.status, status, `${what}: status ${res.status}, want ${status}; body: ${res.text.slice(0, 300)}`);
    assert.ok((res.headers.get('content-type') || '').includes('application/json'),
        `${what}: content-type ${res.headers.get('content-type')}`);
    const e = assertErrorShape(res.json, what);
    if (param !== undefined) assert.equal(e.param, param, `${what}: param ${JSON.stringify(e)}`);
    if (code !== undefined) assert.equal(e.code, code, `${what}: code ${JSON.stringify(e)}`);
    if (type !== undefined) assert.equal(e.type, type, `${what}: type ${JSON.stringify(e)}`);
    return e;
}

// Read a text/event-stream body: the raw text and the parsed events. Checks the
// framing: each event is exactly `data: <payload>\n\n`, the last one `data: [DONE]`.
export function parseSSE(text, what = 'SSE') {
    assert.ok(text.endsWith('data: [DONE]\n\n'), `${what}: stream does not end with data: [DONE]: ...${JSON.stringify(text.slice(-200))}`);
    const events = text.split('\n\n');
    assert.equal(events.pop(), '', `${what}: trailing bytes after the last event`);
    const out = [];
    for (const [i, ev] of events.entries()) {
        assert.ok(ev.startsWith('data: '), `${what}: event ${i} is not 'data: ...': ${JSON.stringify(ev.slice(0, 200))}`);
        assert.ok(!ev.includes('\n'), `${what}: event ${i} spans lines: ${JSON.stringify(ev.slice(0, 200))}`);
        const payload = ev.slice(6);
        if (i === events.length - 1) {
            assert.equal(payload, '[DONE]', `${what}: last event`);
        } else {
            assert.notEqual(payload, '[DONE]', `${what}: [DONE] before the end`);
            try { out.push(JSON.parse(payload)); } catch {
                assert.fail(`${what}: event ${i} is not JSON: ${payload.slice(0, 200)}`);
            }
        }
    }
    return out;
}

// ---- raw HTTP over node:net ------------------------------------------------

// Incremental HTTP/1.1 response parser (Content-Length, chunked, or until close).
export function parseResponse(buf) {
    let end = buf.indexOf('\r\n\r\n');
    // skip interim 1xx responses (100 Continue)
    while (end >= 0 && /^HTTP\/1\.[01] 1\d\d/.test(buf.subarray(0, 16).toString('latin1'))) {
        buf = buf.subarray(end + 4);
        end = buf.indexOf('\r\n\r\n');
    }
    if (end < 0) return null;
    const head = buf.subarray(0, end).toString('latin1');
    const lines = head.split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
    if (!m) return { bad: `bad status line: ${JSON.stringify(lines[0].slice(0, 100))}` };
    const headers = {};
    for (const l of lines.slice(1)) {
        const i = l.indexOf(':');
        if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    const status = Number(m[1]);
    const rest = buf.subarray(end + 4);
    const te = (headers['transfer-encoding'] || '').toLowerCase();
    if (te.includes('chunked')) {
        const parts = [];
        let off = 0;
        for (;;) {
            const le = rest.indexOf('\r\n', off);
            if (le < 0) return { status, headers, incomplete: true };
            const size = parseInt(rest.subarray(off, le).toString('latin1'), 16);
            if (!Number.isFinite(size)) return { bad: 'bad chunk size' };
            if (size === 0) {
                if (rest.indexOf('\r\n', le + 2) < 0) return { status, headers, incomplete: true };
                return { status, headers, body: Buffer.concat(parts), complete: true };
            }
            if (rest.length < le + 2 + size + 2) return { status, headers, incomplete: true };
            parts.push(rest.subarray(le + 2, le + 2 + size));
            off = le + 2 + size + 2;
        }
    }
    if (headers['content-length'] !== undefined) {
        const n = Number(headers['content-length']);
        if (rest.length < n) return { status, headers, incomplete: true };
        return { status, headers, body: rest.subarray(0, n), complete: true };
    }
    if (status === 204 || status === 304)
        return { status, headers, body: Buffer.alloc(0), complete: true };
    return { status, headers, body: rest, untilClose: true };
}

// Send raw bytes (a Buffer, or an array of Buffers written with delayMs between
// them) to 127.0.0.1:port and collect the first response. Resolves with
// {status, headers, body, closed, timedOut, error}; status is undefined when
// the server closed without answering. `end: true` half-closes after writing.
export function rawRequest(port, chunks, { timeout = 10_000 * SLOW, delayMs = 0, end = false, keepOpen = false } = {}) {
    if (!Array.isArray(chunks)) chunks = [chunks];
    return new Promise((resolve) => {
        const sock = net.connect({ host: '127.0.0.1', port });
        let buf = Buffer.alloc(0);
        let done = false;
        let timer;
        const finish = (extra) => {
            if (done) return;
            done = true;
            clearTimeout(timer);
            const r = parseResponse(buf) || {};
            sock.destroy();
            resolve({ ...r, raw: buf, ...extra });
        };
        timer = setTimeout(() => finish({ timedOut: true }), timeout);
        sock.on('data', (d) => {
            buf = Buffer.concat([buf, d]);
            const r = parseResponse(buf);
            if (r && (r.complete || r.bad) && !keepOpen) finish({ closed: false });
        });
        sock.on('error', (e) => finish({ error: e.code || e.message, closed: true }));
        sock.on('close', () => finish({ closed: true }));
        sock.on('connect', async () => {
            for (let i = 0; i < chunks.length && !done; i++) {
                if (i && delayMs) await sleep(delayMs);
                if (done || sock.destroyed) return;
                sock.write(chunks[i]);
            }
            if (end && !done && !sock.destroyed) sock.end();
        });
    });
}

// Build a request's bytes.
export function httpBytes({ method = 'POST', path = '/', headers = {}, body = '' }) {
    const b = Buffer.isBuffer(body) ? body : Buffer.from(body);
    const h = { host: '127.0.0.1', connection: 'close', ...headers };
    if (method !== 'GET' && !Object.keys(h).some((k) => k.toLowerCase() === 'content-length' || k.toLowerCase() === 'transfer-encoding'))
        h['content-length'] = String(b.length);
    let head = `${method} ${path} HTTP/1.1\r\n`;
    for (const [k, v] of Object.entries(h)) if (v !== undefined) head += `${k}: ${v}\r\n`;
    return Buffer.concat([Buffer.from(head + '\r\n', 'latin1'), b]);
}

// Run f over items with at most `limit` at a time; returns the results in order.
export async function pool(items, limit, f) {
    const out = new Array(items.length);
    let next = 0;
    const worker = async () => {
        while (next < items.length) {
            const i = next++;
            out[i] = await f(items[i], i);
        }
    };
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
    return out;
}
