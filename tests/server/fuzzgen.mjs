// Case generator of the hostile-request fuzzer (fuzz.test.mjs): a seeded
// PRNG, hostile JSON values and body mutations, and makeCase(r), which builds
// one request's bytes; checkResponse judges what the server answered.
import { MODEL, httpBytes, assertErrorShape } from './harness.mjs';

// mulberry32
export function prng(seed) {
    let a = seed >>> 0;
    const next = () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    const r = {
        next,
        int: (n) => Math.floor(next() * n),                  // [0, n)
        range: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
        pick: (xs) => xs[Math.floor(next() * xs.length)],
        chance: (p) => next() < p,
        bytes: (n) => {
            const b = Buffer.alloc(n);
            for (let i = 0; i < n; i++) b[i] = Math.floor(next() * 256);
            return b;
        },
    };
    return r;
}

// ---- hostile JSON values (raw JSON text; RAW placeholders survive JSON.stringify) ----

const deep = (n, open = '[', close = ']') => open.repeat(n) + close.repeat(n);
const INVALID_UTF8 = [
    Buffer.from([0xff]), Buffer.from([0xc0, 0xaf]), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from([0xe2, 0x82]),
    Buffer.from([0xf4, 0x90, 0x80, 0x80]), Buffer.from([0x80]), Buffer.from([0xf0, 0x9f, 0x98]),
];
function hostileValue(r) {
    const k = r.int(30);
    switch (k) {
    case 0: return '1e308';
    case 1: return '-1e400';
    case 2: return '123456789012345678901234567890';
    case 3: return r.pick(['-1', '0', '-0', '1e10', '-1e10', '2147483648', '4294967297', '18446744073709551616', '-9223372036854775809']);
    case 4: return r.pick(['1.5', '0.0000001', '1e-400', '3', '2.0000001', '-2.5', '100.0']);
    case 5: return r.pick(['NaN', 'Infinity', '-Infinity', 'nan', 'undefined', '0x10', '01', '+1', '.5', '1.', '1e', '--1']);
    case 6: return r.pick(['true', 'false', 'null']);
    case 7: return r.pick(['""', '"x"', '"ROMEO:"', '"llama-tiny"', '"user"', '"assistant"', '"system"', '"tool"']);
    case 8: return r.pick(['[]', '{}', '[null]', '[[]]', '{"":""}', '[1,2,3]', '["a","b"]', '[{"type":"text","text":"x"}]']);
    case 9: return '"' + r.pick(['\\u0000', 'a\\u0000b', '\\ud800', '\\udfff\\ud800', '\\uffff', '\\u00', '\\x41', '\\', '\\q']) + '"';
    case 10: return deep(r.pick([10, 63, 64, 65, 1000, 100000]));
    case 11: return deep(r.pick([64, 65, 5000, 100000]), '{"a":', '}').replace(/\}+$/, (m) => '1' + m);
    case 12: return JSON.stringify('x'.repeat(r.pick([256, 257, 4096, 100000])));
    case 13: return '"' + '\\u0041'.repeat(r.pick([100, 10000])) + '"';
    case 14: return JSON.stringify(Array.from({ length: r.pick([16, 17, 1000, 10000]) }, (_, i) => `s${i}`));
    case 15: { // logit_bias with many keys
        const o = {};
        const n = r.pick([1024, 1025, 3000]);
        for (let i = 0; i < n; i++) o[i % 2048] = -100 + (i % 201);
        return JSON.stringify(o);
    }
    case 16: return JSON.stringify({ [r.pick(['-1', '2048', '99999', 'abc', '', '1e3', '0x5', ' 5', '5 '])]: r.pick([1, -101, 101, 'x']) });
    case 17: return r.pick(['1000', '17', '21', '6', '65536', '1e10', '-1']);
    case 18: return JSON.stringify(Array.from({ length: r.pick([100, 4097, 20000]) }, () => ({ role: 'user', content: 'a' })));
    case 19: return JSON.stringify([{ role: r.pick(['user', 'wizard', '', 'USER', 'developer', 'tool', 'function']), content: r.pick(['hi', null, 5, [], [{ type: 'image_url', image_url: { url: 'http://x' } }], [{ type: 'text' }], [{ type: 'text', text: 7 }]]) }]);
    case 20: return JSON.stringify(Array.from({ length: r.pick([257, 1000]) }, () => ({ type: 'text', text: 'a' })));
    case 21: return JSON.stringify(Array.from({ length: r.pick([10, 1000, 100000]) }, () => r.int(2048)));
    case 22: return JSON.stringify([r.pick([-1, 2048, 1e9, 1.5, 'x', null])]);
    case 23: return JSON.stringify({ include_usage: r.pick([true, 'yes', null, 1]) });
    case 24: return '"' + 'é'.repeat(r.pick([10, 300])) + '"';
    case 25: return r.pick(['"\u2028"', '"\ud83d\ude00"', '"🙂"', '"\\ud83d\\ude00"']);
    case 26: return 'INVALIDUTF8';       // replaced by raw bytes after serialization
    case 27: return r.pick(['{"a":1,"a":2}', '[1,]', '{,}', '{"a"}', '[', ']', '}', '{']);
    case 28: return String(r.range(0, 5000));
    default: return JSON.stringify(r.bytes(r.range(1, 40)).toString('latin1'));
    }
}

const FIELDS = [
    'model', 'messages', 'prompt', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'top_k', 'min_p',
    'repetition_penalty', 'presence_penalty', 'frequency_penalty', 'seed', 'stop', 'n', 'logprobs', 'top_logprobs',
    'logit_bias', 'stream', 'stream_options', 'echo', 'suffix', 'user', 'response_format', 'tools', 'tool_choice',
    'best_of', '', '\u0000', 'x'.repeat(300),
];

function baseBody(r, ep) {
    const b = { model: r.chance(0.9) ? MODEL : r.pick(['nope', '', 'LLAMA-TINY', 'llama-tiny ']) };
    if (ep === 'chat') {
        b.messages = [];
        if (r.chance(0.3)) b.messages.push({ role: 'system', content: 'Speak.' });
        b.messages.push({ role: 'user', content: r.chance(0.8) ? r.pick(['ROMEO:', 'JULIET:', 'hi']) : [{ type: 'text', text: 'ROM' }, { type: 'text', text: 'EO:' }] });
        if (r.chance(0.2)) b.messages.push({ role: 'assistant', content: 'Ay.' }, { role: 'user', content: 'More.' });
    } else {
        b.prompt = r.chance(0.8) ? r.pick(['ROMEO:', 'JULIET:', '']) : [818, 30];
        if (r.chance(0.2)) b.echo = true;
    }
    b.temperature = r.pick([0, 0, 0.7, 1]);
    if (r.chance(0.3)) b.stream = true;
    if (b.stream && r.chance(0.5)) b.stream_options = { include_usage: true };
    if (r.chance(0.2)) b.stop = r.pick([['\n'], ['e', 'o'], 'the', []]);
    if (r.chance(0.2)) b.seed = r.int(1 << 30);
    if (r.chance(0.2)) b.n = r.range(1, 3);
    if (r.chance(0.2)) {
        if (ep === 'chat') { b.logprobs = true; b.top_logprobs = r.range(0, 5); } else b.logprobs = r.range(0, 5);
    }
    if (r.chance(0.1)) b.logit_bias = { [r.int(2048)]: r.range(-100, 100) };
    if (r.chance(0.1)) b.top_p = r.pick([0.5, 1]);
    if (r.chance(0.1)) b.top_k = r.pick([0, 5, -1]);
    b.max_tokens = 4;    // last, so the protected span is easy to find
    return b;
}

// Serialize body b with one to three structural mutations; returns a Buffer.
function mutateBody(r, b) {
    const raws = [];
    const raw = (text) => { raws.push(text); return `@@RAW${raws.length - 1}@@`; };
    const muts = r.range(1, 3);
    for (let m = 0; m < muts; m++) {
        const what = r.int(6);
        if (what === 0) {                              // a top-level field gets a hostile value
            let f = r.pick(FIELDS);
            if (f === 'max_tokens' || f === 'max_completion_tokens') f = 'max_tokens';
            b[f] = raw(hostileValue(r));
        } else if (what === 1 && Array.isArray(b.messages)) {         // a message part
            const i = r.int(b.messages.length + 1);
            if (i === b.messages.length) b.messages.push(raw(hostileValue(r)));
            else if (b.messages[i] && typeof b.messages[i] === 'object') b.messages[i] = { ...b.messages[i], [r.pick(['content', 'role', 'name', 'content', ''])]: raw(hostileValue(r)) };
        } else if (what === 2) {                       // swap a present field's type
            const keys = Object.keys(b).filter((k) => k !== 'max_tokens');
            const k = r.pick(keys);
            if (k) b[k] = raw(r.pick(['"4"', '4', 'true', 'null', '[]', '{}', '"ROMEO:"', '[4]', '1e308']));
        } else if (what === 3) {                       // delete a field (never max_tokens)
            const keys = Object.keys(b).filter((k) => k !== 'max_tokens');
            delete b[r.pick(keys)];
        } else if (what === 4 && b.stop !== undefined) {
            b.stop = raw(r.pick([
                JSON.stringify(Array.from({ length: r.pick([17, 1000, 5000]) }, (_, i) => 'x' + i)),
                JSON.stringify(['a'.repeat(r.pick([256, 257, 10000]))]), '[""]', '["a\\u0000"]', '[1]', '[["a"]]',
            ]));
        } else {
            b[r.pick(['n', 'top_logprobs', 'max_tokens', 'logprobs', 'seed', 'temperature', 'top_k'])] =
                raw(r.pick(['1000', '-1', '1e10', '1e308', '-1e400', '123456789012345678901234567890', '0', '21', '6', '17']));
        }
    }
    // max_tokens stays last and small unless a mutation above replaced it
    const mt = b.max_tokens;
    delete b.max_tokens;
    if (mt !== undefined) b.max_tokens = mt;
    let text = JSON.stringify(b);
    text = text.replace(/"@@RAW(\d+)@@"/g, (_, i) => raws[Number(i)]);
    let buf = Buffer.from(text, 'utf8');
    // INVALIDUTF8 markers: raw bytes inside a string
    while (buf.includes('INVALIDUTF8')) {
        const at = buf.indexOf('INVALIDUTF8');
        buf = Buffer.concat([buf.subarray(0, at), Buffer.from('"x'), r.pick(INVALID_UTF8), Buffer.from('y"'), buf.subarray(at + 11)]);
    }
    return buf;
}

// Byte-level damage to a serialized body, never inside `"max_tokens":4`.
function damage(r, buf) {
    const prot = buf.indexOf('"max_tokens":4');
    const ok = (i) => prot < 0 || i < prot || i >= prot + 14;
    const pos = () => { for (let k = 0; k < 20; k++) { const i = r.int(Math.max(1, buf.length)); if (ok(i)) return i; } return 0; };
    switch (r.int(6)) {
    case 0: return buf.subarray(0, r.int(buf.length));                                   // truncate
    case 1: { const b = Buffer.from(buf); for (let k = r.range(1, 4); k > 0; k--) { const i = pos(); b[i] ^= 1 << r.int(8); } return b; }
    case 2: { const i = pos(); return Buffer.concat([buf.subarray(0, i), r.bytes(r.range(1, 8)), buf.subarray(i)]); }
    case 3: { const i = pos(); const j = Math.min(buf.length, i + r.range(1, 16)); return ok(j) ? Buffer.concat([buf.subarray(0, i), buf.subarray(j)]) : buf; }
    case 4: { const b = Buffer.from(buf); const i = pos(); b[i] = r.pick([0x22, 0x7b, 0x7d, 0x5b, 0x5d, 0x5c, 0x2c, 0x3a, 0x00, 0x0a]); return b; }
    default: { const i = pos(); return Buffer.concat([buf.subarray(0, i), r.pick(INVALID_UTF8), buf.subarray(i)]); }
    }
}

const PATHS = ['/v1/chat/completions', '/v1/completions', '/tokenize', '/detokenize', '/apply-template', '/health',
    '/metrics', '/v1/models', `/v1/models/${MODEL}`, '/v1/models/', '/', '/v1', '/v1/', '//v1/chat/completions',
    '/v1/chat/completions/', '/v1/chat/completions?x=1', '/v1/chat/completions#f', '/../../etc/passwd', '/%00',
    '/v1/models/%2e%2e', '/v1/models/' + 'a'.repeat(5000), '*', 'http://127.0.0.1/health', '/health?' + 'q'.repeat(3000),
    '/v1/embeddings', '/v1/chat', '/%ff%fe', '/v1/models/llama-tiny%00', '/completion', '/infill', '/props', '/slots',
    '/slots?fail_on_no_slot=1'];
// llama-server's routes answer in its error body, and 501 where it does (/infill without FIM
// tokens, POST /props without --props)
const LLAMA_PATHS = new Set(['/completion', '/completions', '/infill', '/props', '/slots']);
const METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS', 'TRACE', 'CONNECT', 'FOO', 'get', 'POS', 'POSTT', ''];

function jsonRequest(r, { path, body, extraHeaders = {} } = {}) {
    const ep = r.chance(0.6) ? 'chat' : 'completions';
    const p = path ?? (r.chance(0.9) ? (ep === 'chat' ? '/v1/chat/completions' : '/v1/completions')
        : r.pick(['/tokenize', '/detokenize', '/apply-template', '/completion', '/infill']));
    let b = body ?? mutateBody(r, baseBody(r, ep));
    if (!body && r.chance(0.35)) b = damage(r, b);
    const headers = { 'content-type': r.chance(0.9) ? 'application/json' : r.pick(['text/plain', undefined, 'application/json; charset=utf-8', 'multipart/form-data; boundary=x']), ...extraHeaders };
    return { path: p, body: b, headers };
}

// One fuzz case: {kind, chunks, opts, head}
export function makeCase(r) {
    const k = r.int(100);
    if (k < 8) {                                                     // random bytes
        const pre = r.chance(0.5) ? Buffer.from(r.pick(['POST /v1/chat/completions HTTP/1.1\r\n', 'GET / HTTP/1.1\r\n', 'POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n', ''])) : Buffer.alloc(0);
        return { kind: 'random-bytes', chunks: [Buffer.concat([pre, r.bytes(r.range(0, 2048))])], opts: { end: true } };
    }
    if (k < 55) {                                                    // mutated JSON, valid framing
        const q = jsonRequest(r);
        const req = httpBytes({ path: q.path, headers: q.headers, body: q.body });
        if (r.chance(0.1)) {                                         // pipelined behind a keep-alive request
            const first = httpBytes({ method: 'GET', path: '/health', headers: { connection: 'keep-alive' } });
            return { kind: 'pipelined-json', chunks: [Buffer.concat([first, req])], opts: {} };
        }
        return { kind: 'json', chunks: [req], opts: {}, body: q.body, path: q.path };
    }
    if (k < 62) {                                                    // wrong Content-Length
        const q = jsonRequest(r);
        const len = q.body.length;
        const cl = r.pick([Math.max(0, len - r.range(1, 20)), len + r.range(1, 100), 0, len * 2 + 1]);
        const clText = r.chance(0.85) ? String(cl) : r.pick(['-1', 'abc', '99999999999999999999', '1e3', ' 5', '0x10', `${len}, ${len}`, '']);
        const headers = { ...q.headers, 'content-length': clText };
        const extra = r.chance(0.1) ? { 'Content-Length': String(len + 1) } : {};
        return { kind: 'content-length', chunks: [httpBytes({ path: q.path, headers: { ...headers, ...extra }, body: q.body })], opts: { end: true }, path: q.path };
    }
    if (k < 69) {                                                    // tiny chunks
        const q = jsonRequest(r, r.chance(0.5) ? { body: Buffer.from(JSON.stringify(baseBody(r, 'chat'))), path: '/v1/chat/completions' } : {});
        const all = httpBytes({ path: q.path, headers: q.headers, body: q.body });
        const chunks = [];
        const size = Math.max(r.range(1, 16), Math.ceil(all.length / 150));
        for (let i = 0; i < all.length; i += size) chunks.push(all.subarray(i, i + size));
        return { kind: 'tiny-chunks', chunks, opts: { delayMs: r.range(0, 2) }, path: q.path };
    }
    if (k < 77) {                                                    // chunked transfer-encoding
        const q = jsonRequest(r, r.chance(0.5) ? { body: Buffer.from(JSON.stringify(baseBody(r, 'chat'))), path: '/v1/chat/completions' } : {});
        const parts = [];
        for (let i = 0; i < q.body.length;) {
            const n = r.range(1, 64);
            const c = q.body.subarray(i, i + n);
            parts.push(Buffer.from(c.length.toString(16) + (r.chance(0.05) ? ';ext=1' : '') + '\r\n'), c, Buffer.from('\r\n'));
            i += n;
        }
        parts.push(Buffer.from('0\r\n\r\n'));
        let body = Buffer.concat(parts);
        let end = false;
        const broken = r.int(8);
        if (broken === 0) { body = Buffer.concat([Buffer.from('ffffffffffffffff\r\n'), q.body]); end = true; }
        else if (broken === 1) { body = Buffer.concat([Buffer.from('-5\r\nabc\r\n0\r\n\r\n')]); end = true; }
        else if (broken === 2) { body = body.subarray(0, r.int(body.length)); end = true; }
        else if (broken === 3) { body = Buffer.concat([Buffer.from('zz\r\n'), q.body, Buffer.from('\r\n0\r\n\r\n')]); end = true; }
        else if (broken === 4) { body = Buffer.concat([Buffer.from('3\r\nabcdef\r\n0\r\n\r\n')]); end = true; }
        const te = r.pick(['chunked', 'chunked', 'Chunked', 'gzip, chunked', 'chunked, identity', 'identity', 'xchunked', ' chunked']);
        const headers = { ...q.headers, 'transfer-encoding': te };
        if (r.chance(0.2)) headers['content-length'] = String(r.range(0, 50));       // smuggling shape
        return { kind: 'chunked', chunks: [httpBytes({ path: q.path, headers, body })], opts: { end }, path: q.path };
    }
    if (k < 81) {                                                    // huge header line / request target
        const big = 'a'.repeat(r.pick([8192, 65536, 65536 * 2]));
        const w = r.int(3);
        const q = httpBytes(w === 0 ? { method: 'GET', path: '/health', headers: { 'x-big': big } }
            : w === 1 ? { method: 'GET', path: '/health?' + big }
                : { method: 'GET', path: '/health', headers: { [big]: 'v' } });
        return { kind: 'huge-header', chunks: [q], opts: { end: r.chance(0.5) } };
    }
    if (k < 85) {                                                    // many headers
        const headers = {};
        const n = r.pick([100, 1000, 5000]);
        for (let i = 0; i < n; i++) headers[`x-h${i}`] = String(i);
        return { kind: 'many-headers', chunks: [httpBytes({ method: 'GET', path: '/health', headers })], opts: { end: r.chance(0.5) } };
    }
    if (k < 93) {                                                    // random method and path
        const method = r.chance(0.85) ? r.pick(METHODS) : r.bytes(r.range(1, 10)).toString('latin1').replace(/[\r\n ]/g, 'x');
        const path = r.chance(0.85) ? r.pick(PATHS) : '/' + r.bytes(r.range(0, 60)).toString('latin1').replace(/[\r\n ]/g, '_');
        const body = r.chance(0.5) ? JSON.stringify(baseBody(r, 'chat')) : '';
        const head = method === 'HEAD';
        return { kind: 'method-path', method, chunks: [httpBytes({ method, path, headers: body ? { 'content-type': 'application/json' } : {}, body })], opts: { head }, path };
    }
    // malformed request lines and headers
    const body = JSON.stringify(baseBody(r, 'chat'));
    const cl = `Content-Length: ${Buffer.byteLength(body)}`;
    const shapes = [
        `POST /v1/chat/completions HTTP/1.0\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/2.0\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\n${cl}\n\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\n${cl}\r\nX: a\r\n b\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\n${cl}\r\nNoColonHere\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\nContent-Length : 5\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\n${cl}\r\nX: a\0b\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\n${cl}\rX: y\r\n\r\n${body}`,
        `POST  /v1/chat/completions  HTTP/1.1\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1 extra\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\n${cl}\r\nExpect: 100-continue\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\n${cl}\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 300\r\n\r\n${body}`,
        `\r\n\r\nGET /health HTTP/1.1\r\n\r\n`,
        `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`,
        `GET /health HTTP/9.9\r\n\r\n`,
        `GET /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
        `POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer ${'k'.repeat(2000)}\r\n${cl}\r\n\r\n${body}`,
        `POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n`,
        `GET\r\n\r\n`, ` / HTTP/1.1\r\n\r\n`, `GET /health HTTP/1.1\r\n: empty-name\r\n\r\n`,
        `GET /health HTTP/1.1\r\n\x7f\x80\xff: v\r\n\r\n`,
    ];
    // not half-closed: most of these are complete requests (a half-close is its own test in errors.test.mjs)
    const shape = r.pick(shapes);
    return { kind: 'malformed', chunks: [Buffer.from(shape, 'latin1')], opts: {}, version: /^\S* \S* (HTTP\/[\d.]+)/.exec(shape)?.[1] };
}

const STANDARD_METHODS = ['GET', 'HEAD', 'POST', 'OPTIONS', 'PUT', 'DELETE', 'PATCH', 'CONNECT', 'TRACE'];

export function checkResponse(res, c) {
    const what = `${c.kind} #${c.index}`;
    if (res.bad) return `${what}: unparsable response: ${res.bad}`;
    if (res.status === undefined) {
        if (res.timedOut) return `${what}: the server neither answered nor closed the connection`;
        return null;                                         // closed without an answer: fine
    }
    // 505 is the right answer to an HTTP version other than 1.0 and 1.1
    if (res.status === 505 && c.version && !/^HTTP\/1\.[01]$/.test(c.version)) return null;
    // 501 to a Transfer-Encoding other than chunked (RFC 9112 6.1)
    if (res.status === 501 && c.kind === 'chunked' && res.headers['content-type']?.includes('json')) return null;
    // 501 to a method the server does not recognize ('FOO', 'get': methods are case-sensitive, RFC 9110 9.1)
    if (res.status === 501 && c.kind === 'method-path' && !STANDARD_METHODS.includes(c.method) &&
        res.headers['content-type']?.includes('json')) return null;
    const llama = LLAMA_PATHS.has((c.path || '').split('?')[0]);
    if (res.status === 501 && llama && res.headers['content-type']?.includes('json')) return null;
    // llama-server's /slots?fail_on_no_slot=1: 503 while no slot is idle (the fuzz's own
    // concurrent requests keep them busy), in its error body
    if (res.status === 503 && /^\/slots\?(.*&)?fail_on_no_slot=1\b/.test(c.path || '') &&
        res.headers['content-type']?.includes('json')) return null;
    if (res.status >= 500) return `${what}: status ${res.status}: ${res.body?.toString('utf8').slice(0, 300) ?? ''}`;
    if (res.incomplete && !c.opts.head) return `${what}: status ${res.status}, response cut short (${res.timedOut ? 'timed out' : 'closed'})`;
    const ct = (res.headers['content-type'] || '').toLowerCase();
    if (ct.includes('json') && res.body && !c.opts.head) {
        let j;
        try { j = JSON.parse(res.body.toString('utf8')); } catch {
            return `${what}: status ${res.status} with an unparsable JSON body: ${res.body.toString('latin1').slice(0, 200)}`;
        }
        if (res.status >= 400 && llama) {
            const e = j && j.error;
            if (!e || e.code !== res.status || typeof e.message !== 'string' || typeof e.type !== 'string')
                return `${what}: status ${res.status} without llama-server's error body: ${res.body.toString('utf8').slice(0, 200)}`;
        } else if (res.status >= 400) {
            try { assertErrorShape(j, what); } catch (e) { return e.message; }
        }
    }
    return null;
}


// Case `index` of the run with `seed` (each case has its own PRNG, so a case
// replays alone whatever ran before or beside it).
export function caseAt(seed, index) {
    const c = makeCase(prng((seed ^ Math.imul(index + 1, 0x9e3779b1)) >>> 0));
    c.index = index;
    return c;
}
