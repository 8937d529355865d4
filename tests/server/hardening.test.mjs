// The HTTP layer under hostile clients (docs/server.md "Limits and errors", "Host, Origin and
// CORS"), over raw node:net sockets:
// - deadlines: a request line and headers sent a byte at a time get 408 JSON after
//   --header-timeout, a body sent slowly 408 after --request-timeout, however busy the
//   socket looks to the idle --timeout; an idle kept-alive connection stays open (it is under
//   --timeout), but the next request on it is under the deadlines again;
// - the connection limit: with --max-connections full of such clients, /health still answers
//   200 and other requests get 503 JSON with Retry-After, then the server recovers; past the
//   64 connections of the reserve, new connections are answered 503 JSON at once;
// - framing (RFC 9112): Content-Length twice, Content-Length with Transfer-Encoding, an
//   unknown Transfer-Encoding (501, promptly), no Host or two Hosts, a field name with a space
//   before the colon: each answered 4xx/501 JSON and the connection closed;
// - sizes: headers over 64 KiB (431), a request target over 8 KiB (414), as JSON;
// - Host allowlist, Origin, CORS preflights and Content-Type (403, 415; the official client,
//   which sends no Origin, still works; the chat page's same-origin fetch too);
// - GET /favicon.ico is an icon.
// Every deadline here is a few seconds, passed by flags, so the file runs in about 30 s.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import {
    MODEL, SLOW, startServer, client, get, post, request, rawRequest, httpBytes, assertError, assertErrorShape,
    sleep, withTimeout,
} from './harness.mjs';

const HEADER_S = 2;
const REQUEST_S = 3;
const chat = (extra = {}) => JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'ROMEO:' }],
    max_tokens: 2, temperature: 0, ...extra });

// The JSON error shape of a raw response (status, content type, body).
function rawError(r, status, what) {
    assert.ok(!r.timedOut, `${what}: no answer in time`);
    assert.equal(r.status, status, `${what}: status ${r.status}, want ${status}: ${r.raw?.toString('latin1').slice(0, 300)}`);
    assert.match(r.headers['content-type'] || '', /application\/json/, `${what}: content-type`);
    return assertErrorShape(JSON.parse(r.body.toString('utf8')), what);
}

// A request's bytes one at a time, gapMs apart (a slow-loris client): never finishes within
// the test, so only the server can end it.
function slowly(port, bytes, gapMs = 250, timeout = 15_000 * SLOW) {
    const chunks = [];
    for (let i = 0; i < bytes.length; i++) chunks.push(bytes.subarray(i, i + 1));
    return rawRequest(port, chunks, { delayMs: gapMs, timeout, keepOpen: true });
}

// One socket, several requests in turn: send(bytes) resolves with the next response.
function keptAlive(port) {
    const sock = net.connect({ host: '127.0.0.1', port });
    let buf = Buffer.alloc(0), waiter = null, closed = false;
    const parse = () => {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return null;
        const head = buf.subarray(0, end).toString('latin1');
        const n = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + n) return null;
        const res = { status: Number(head.slice(9, 12)), head, body: buf.subarray(end + 4, end + 4 + n).toString() };
        buf = buf.subarray(end + 4 + n);
        return res;
    };
    const wake = () => {
        if (!waiter) return;
        const r = parse();
        if (r) { const w = waiter; waiter = null; w(r); } else if (closed) { const w = waiter; waiter = null; w({ closed: true }); }
    };
    sock.on('data', (d) => { buf = Buffer.concat([buf, d]); wake(); });
    sock.on('close', () => { closed = true; wake(); });
    sock.on('error', () => {});
    return {
        ready: new Promise((r) => sock.on('connect', r)),
        get closed() { return closed; },
        next: () => new Promise((r) => { waiter = r; wake(); }),
        write: (b) => sock.write(b),
        destroy: () => sock.destroy(),
    };
}

describe('deadlines and the connection limit', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => {
        srv = await startServer(['--header-timeout', String(HEADER_S), '--request-timeout', String(REQUEST_S),
            '--max-connections', '4', '--timeout', '60']);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('headers sent a byte at a time: 408 JSON after --header-timeout', async () => {
        const t0 = Date.now();
        const r = await slowly(srv.port, httpBytes({ method: 'GET', path: '/health', headers: { 'x-pad': 'p'.repeat(100) } }));
        const ms = Date.now() - t0;
        rawError(r, 408, 'slow headers');
        assert.ok(r.closed, 'the connection stays open after the 408');
        assert.ok(ms >= HEADER_S * 1000 - 100 && ms < (HEADER_S + 2) * 1000 * SLOW, `answered after ${ms} ms`);
    });

    it('a body sent slowly: 408 JSON after --request-timeout', async () => {
        const body = Buffer.from(chat());
        const all = httpBytes({ path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body });
        const head = all.subarray(0, all.length - body.length);
        const chunks = [head];
        for (let i = 0; i < body.length; i++) chunks.push(body.subarray(i, i + 1));
        const t0 = Date.now();
        const r = await rawRequest(srv.port, chunks, { delayMs: 250, timeout: 15_000 * SLOW, keepOpen: true });
        const ms = Date.now() - t0;
        rawError(r, 408, 'slow body');
        assert.ok(ms >= REQUEST_S * 1000 - 300 && ms < (REQUEST_S + 2) * 1000 * SLOW, `answered after ${ms} ms`);
    });

    it('an idle kept-alive connection stays; its next request is under the deadline again', async () => {
        const k = keptAlive(srv.port);
        await k.ready;
        const health = httpBytes({ method: 'GET', path: '/health', headers: { connection: 'keep-alive' } });
        k.write(health);
        assert.equal((await k.next()).status, 200);
        await sleep((HEADER_S + 1) * 1000);          // idle longer than --header-timeout
        assert.ok(!k.closed, 'an idle kept-alive connection was closed before --timeout');
        k.write(health);
        assert.equal((await withTimeout(k.next(), 5000 * SLOW, 'the second answer')).status, 200);
        // the third request, a byte at a time: 408 after --header-timeout from its first byte
        const t0 = Date.now();
        const slow = (async () => {
            for (const b of health) { if (k.closed) break; k.write(Buffer.from([b])); await sleep(300); }
        })();
        const third = await withTimeout(k.next(), (HEADER_S + 4) * 1000 * SLOW, 'the slow third request');
        const ms = Date.now() - t0;
        assert.equal(third.status, 408, `third request: ${JSON.stringify(third)}`);
        assert.ok(ms >= HEADER_S * 1000 - 200, `408 after ${ms} ms`);
        assertErrorShape(JSON.parse(third.body), 'kept-alive 408');
        k.destroy();
        await slow;
    });

    it('--max-connections full of slow clients: /health 200, others 503 JSON, then recovery', async () => {
        const slow = Array.from({ length: 4 }, () => slowly(srv.port, httpBytes({ method: 'GET', path: '/v1/models',
            headers: { 'x-pad': 'p'.repeat(200) } })));
        await sleep(400);
        const t0 = Date.now();
        const h = await rawRequest(srv.port, httpBytes({ method: 'GET', path: '/health' }), { timeout: 3000 * SLOW });
        assert.equal(h.status, 200, `/health under the flood: ${h.status ?? (h.timedOut ? 'no answer' : 'closed')}`);
        const busy = await rawRequest(srv.port, httpBytes({ path: '/v1/chat/completions',
            headers: { 'content-type': 'application/json' }, body: chat() }), { timeout: 3000 * SLOW });
        const e = rawError(busy, 503, 'over --max-connections');
        assert.equal(e.code, 'too_many_connections');
        assert.equal(busy.headers['retry-after'], '1');
        assert.ok(Date.now() - t0 < 2500 * SLOW, `answers under the flood took ${Date.now() - t0} ms`);
        const ends = await Promise.all(slow);
        for (const r of ends) rawError(r, 408, 'a slow client of the flood');
        const ok = await post(srv.base, '/v1/chat/completions', JSON.parse(chat()));
        assert.equal(ok.status, 200, `after the flood: ${ok.text.slice(0, 200)}`);
    });

    it('a flood past the reserve: /health answered while it lasts, then 503 JSON at once, never silence', async () => {
        // 4 served + 26 of the 64 reserve, all slow: /health is still answered
        let slow = Array.from({ length: 30 }, () => slowly(srv.port, httpBytes({ method: 'GET', path: '/v1/models',
            headers: { 'x-pad': 'p'.repeat(200) } })));
        await sleep(400);
        const h = await rawRequest(srv.port, httpBytes({ method: 'GET', path: '/health' }), { timeout: 3000 * SLOW });
        assert.equal(h.status, 200, `/health in the reserve: ${h.status ?? (h.timedOut ? 'no answer' : 'closed')}`);
        for (const r of await Promise.all(slow)) rawError(r, 408, 'a slow client of the flood');
        // 100 slow clients: past 4 + 64, each is answered 503 as it opens; every one gets JSON
        slow = Array.from({ length: 100 }, () => slowly(srv.port, httpBytes({ method: 'GET', path: '/v1/models',
            headers: { 'x-pad': 'p'.repeat(200) } })));
        const all = await Promise.all(slow);
        const counts = {};
        for (const r of all) {
            const st = r.status ?? (r.timedOut ? 'timeout' : 'closed');
            counts[st] = (counts[st] || 0) + 1;
            if (r.status === 503 || r.status === 408) rawError(r, r.status, `a client of the flood (${r.status})`);
        }
        console.error(`# 100 slow clients: ${JSON.stringify(counts)}`);
        assert.equal((counts[408] || 0) + (counts[503] || 0), 100, `answers: ${JSON.stringify(counts)}`);
        assert.ok(counts[503] >= 20, `too few immediate 503s: ${JSON.stringify(counts)}`);
        assert.equal((await get(srv.base, '/health')).status, 200, 'after the flood');
    });
});

describe('framing, sizes, Host, Origin, CORS, Content-Type', { timeout: 120_000 * SLOW }, () => {
    let srv, cors, star;
    before(async () => {
        srv = await startServer(['--allowed-host', 'models.example.org', '--allowed-host', '.lan.test']);
        cors = await startServer(['--cors-origin', 'http://app.test:3000', '--cors-origin', 'https://b.test']);
        star = await startServer(['--cors-origin', '*']);
    });
    after(async () => {
        for (const s of [srv, cors, star]) if (s && !s.stopped) await s.stop();
    });

    const raw = (s, text, opts = {}) => rawRequest(s.port, Buffer.from(text, 'latin1'),
        { timeout: 5000 * SLOW, keepOpen: true, ...opts });
    const body = chat();
    const cl = `Content-Length: ${body.length}`;
    const json = 'Content-Type: application/json';

    it('RFC 9112 framing: 400/501 JSON, the connection closed', async () => {
        const cases = [
            ['two different Content-Length', 400, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nContent-Length: 3\r\n${cl}\r\n\r\n${body}`],
            ['the same Content-Length twice', 400, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\n${cl}\r\n${cl}\r\n\r\n${body}`],
            ['Content-Length with chunked', 400, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\n${cl}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
            ['an unknown Transfer-Encoding', 501, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nTransfer-Encoding: gzip\r\n\r\nxx`],
            // libmicrohttpd keeps the whitespace after a value and reads 'chunked ' as another
            // coding, waiting for the body until the connection closes: 501 at once
            ['chunked with a space after', 501, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nTransfer-Encoding: chunked \r\n\r\n0\r\n\r\n`],
            ['chunked with a tab after', 501, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nTransfer-Encoding: Chunked\t\r\n\r\n0\r\n\r\n`],
            // libmicrohttpd glues a continuation line (obs-fold) onto the field's name: the framing
            // field would vanish and the body be read as the next request (smuggling behind a proxy
            // that reads the fold as a space, as RFC 9112 5.2 allows)
            ['Transfer-Encoding folded', 400, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n`],
            ['Content-Length folded', 400, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nContent-Length:\r\n\t${body.length}\r\n\r\n${body}`],
            ['gzip, chunked', 501, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n`],
            ['Transfer-Encoding in HTTP/1.0', 400, `POST /v1/chat/completions HTTP/1.0\r\n${json}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
            ['HTTP/1.1 without Host', 400, `GET /health HTTP/1.1\r\n\r\n`],
            ['two Host fields', 400, `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: localhost\r\n\r\n`],
            ['a space before the colon', 400, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${json}\r\nContent-Length : 5\r\n\r\n${body}`],
        ];
        for (const [what, status, text] of cases) {
            const t0 = Date.now();
            // a second request behind it must not be answered: the connection closes
            const r = await raw(srv, text + 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
            rawError(r, status, what);
            assert.ok(r.closed, `${what}: the connection was not closed`);
            assert.ok(!/HTTP\/1\.1 200/.test(r.raw.toString('latin1')), `${what}: a request behind it was answered`);
            assert.match(r.headers.connection || '', /close/i, `${what}: Connection: close`);
            assert.ok(Date.now() - t0 < 2000 * SLOW, `${what}: answered after ${Date.now() - t0} ms`);
        }
        const ok = await raw(srv, 'GET /health HTTP/1.0\r\n\r\n');
        assert.equal(ok.status, 200, 'HTTP/1.0 needs no Host');
    });

    it('headers over 64 KiB: 431 JSON; a request target over 8 KiB: 414 JSON', async () => {
        const many = {};
        for (let i = 0; i < 3000; i++) many[`x-h${i}`] = 'v'.repeat(20);
        const cases = [
            ['a 100 KB header', 431, httpBytes({ method: 'GET', path: '/health', headers: { 'x-big': 'a'.repeat(100_000) } })],
            ['3000 headers', 431, httpBytes({ method: 'GET', path: '/health', headers: many })],
            ['a 10 KB path', 414, httpBytes({ method: 'GET', path: '/v1/models/' + 'm'.repeat(10_000) })],
            ['a 10 KB query', 414, httpBytes({ method: 'GET', path: '/health?q=' + 'q'.repeat(10_000) })],
        ];
        for (const [what, status, bytes] of cases) {
            const r = await rawRequest(srv.port, bytes, { timeout: 5000 * SLOW });
            rawError(r, status, what);
        }
        // just under the limits: answered
        const fine = await rawRequest(srv.port, httpBytes({ method: 'GET', path: '/health', headers: { 'x-big': 'a'.repeat(60_000) } }));
        assert.equal(fine.status, 200);
    });

    it('Host: IP literals, localhost and --allowed-host only (403 JSON otherwise)', async () => {
        const host = async (h) => (await raw(srv, `GET /health HTTP/1.1\r\nHost: ${h}\r\nConnection: close\r\n\r\n`));
        for (const h of ['127.0.0.1', `127.0.0.1:${srv.port}`, 'localhost', 'LOCALHOST:9', 'chat.localhost:80', '[::1]:8080',
            '10.1.2.3:8080', '127.0.0.1:', 'models.example.org', 'Models.Example.Org:443', 'lan.test', 'gpu.lan.test:8080'])
            assert.equal((await host(h)).status, 200, `Host ${h}`);
        for (const h of ['evil.test', `evil.test:${srv.port}`, 'localhost.evil.test', 'example.org', 'xmodels.example.org',
            'notlan.test', '127.0.0.1.nip.io', 'a b', '127.0.0.1:99999', 'localhost:x']) {
            rawError(await host(h), 403, `Host ${h}`);
        }
        const e = rawError(await host('rebind.evil.test:8080'), 403, 'rebinding');
        assert.equal(e.code, 'host_not_allowed');
    });

    it('absolute-form targets (RFC 9112 3.2.2): routed on the path, the authority checked instead of Host', async () => {
        const abs = (target, h = '127.0.0.1') => raw(srv, `GET ${target} HTTP/1.1\r\nHost: ${h}\r\nConnection: close\r\n\r\n`);
        const counted = async () => Number((await get(srv.base, '/metrics')).text
            .match(/mlxcel_requests_total\{endpoint="\/v1\/models",status="200"\} (\d+)/)?.[1] ?? 0);
        const before = await counted();
        const models = await abs(`http://127.0.0.1:${srv.port}/v1/models`);
        assert.equal(models.status, 200, models.raw.toString('latin1').slice(0, 300));
        assert.equal(JSON.parse(models.body).object, 'list');
        // counted under its endpoint, not as another path (the count lands as the answer completes)
        let after = await counted();
        for (let i = 0; i < 50 && after === before; i++) {
            await new Promise((res) => setTimeout(res, 20));
            after = await counted();
        }
        assert.equal(after, before + 1, 'the absolute-form request is counted under /v1/models');
        for (const t of [`HTTP://localhost:${srv.port}/health`, 'http://models.example.org/health', `https://[::1]:${srv.port}/health`])
            assert.equal((await abs(t, 'evil.test')).status, 200, `${t}: the authority replaces a disallowed Host`);
        assert.equal((await abs(`http://127.0.0.1:${srv.port}`)).status, 200, 'an empty path is /');
        for (const t of [`http://evil.test:${srv.port}/v1/models`, 'http://127.0.0.1.nip.io/health', 'http://user@127.0.0.1/health']) {
            const e = rawError(await abs(t), 403, `${t} with an allowed Host`);
            assert.equal(e.code, 'host_not_allowed');
        }
        rawError(await abs(`http://127.0.0.1:${srv.port}/v1/nope`), 404, 'an unknown path in absolute-form');
    });

    it('methods: an unrecognized or lowercase one is 501 JSON (RFC 9110 9.1); OPTIONS * is 204 with Allow', async () => {
        const req = (m, target = '/v1/models') => raw(srv, `${m} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
        for (const [m, target] of [['get', '/v1/models'], ['FOO', '/v1/models'], ['Post', '/v1/chat/completions'],
            ['FOO', '/nowhere'], ['options', '*']]) {
            const e = rawError(await req(m, target), 501, `${m} ${target}`);
            assert.equal(e.code, 'method_not_implemented');
            assert.match(e.message, new RegExp(`'${m}'`));
        }
        rawError(await req('PUT'), 405, 'PUT, a standard method, on a GET path');
        assert.equal((await req('GET')).status, 200, 'GET still works');
        const star = await req('OPTIONS', '*');
        assert.equal(star.status, 204, star.raw.toString('latin1').slice(0, 300));
        assert.equal(star.headers.allow, 'GET, HEAD, POST, OPTIONS');
        rawError(await req('GET', '*'), 400, 'GET *');
    });

    it('Origin: the server\'s own passes, any other is 403 JSON without --cors-origin', async () => {
        const p = (origin, s = srv, extra = '') => raw(s, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:${s.port}\r\n` +
            `${json}\r\n${cl}\r\nOrigin: ${origin}\r\nConnection: close\r\n${extra}\r\n${body}`);
        const own = await p(`http://127.0.0.1:${srv.port}`);
        assert.equal(own.status, 200, `same origin: ${own.body?.toString().slice(0, 200)}`);
        assert.equal(own.headers['access-control-allow-origin'], undefined, 'CORS headers without --cors-origin');
        for (const o of ['http://evil.test', `http://127.0.0.1:${srv.port + 1}`, 'null', `https://evil.test:${srv.port}`]) {
            const e = rawError(await p(o), 403, `Origin ${o}`);
            assert.equal(e.code, 'origin_not_allowed');
        }
        // a preflight from another site: refused, no CORS headers
        const pre = await raw(srv, `OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.test\r\n` +
            'Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\nConnection: close\r\n\r\n');
        rawError(pre, 403, 'preflight without --cors-origin');
        assert.equal(pre.headers['access-control-allow-origin'], undefined);
    });

    it('--cors-origin: preflights answered 204, allowed origins echoed on every answer', async () => {
        const pre = await raw(cors, `OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://app.test:3000\r\n` +
            'Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type, x-stainless-os\r\nConnection: close\r\n\r\n');
        assert.equal(pre.status, 204);
        assert.equal(pre.headers['access-control-allow-origin'], 'http://app.test:3000');
        assert.match(pre.headers['access-control-allow-methods'], /POST/);
        assert.equal(pre.headers['access-control-allow-headers'], 'authorization, content-type, x-stainless-os');
        assert.match(pre.headers.vary || '', /Origin/);
        const p = (origin, s, path = '/v1/chat/completions', b = body) => raw(s, `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${s.port}\r\n` +
            `${json}\r\nContent-Length: ${b.length}\r\nOrigin: ${origin}\r\nConnection: close\r\n\r\n${b}`);
        const ok = await p('http://app.test:3000', cors);
        assert.equal(ok.status, 200);
        assert.equal(ok.headers['access-control-allow-origin'], 'http://app.test:3000');
        const streamed = await p('https://b.test', cors, '/v1/chat/completions', chat({ stream: true }));
        assert.equal(streamed.status, 200);
        assert.equal(streamed.headers['access-control-allow-origin'], 'https://b.test', 'a stream has the CORS header too');
        const bad = await p('http://app.test:3000', cors, '/v1/chat/completions', '{"messages": 3}');
        rawError(bad, 400, 'an error to an allowed origin');
        assert.equal(bad.headers['access-control-allow-origin'], 'http://app.test:3000', 'errors have the CORS header too');
        rawError(await p('http://app.test:3001', cors), 403, 'an origin not listed');
        const any = await p('http://whatever.test', star);
        assert.equal(any.status, 200);
        assert.equal(any.headers['access-control-allow-origin'], '*');
    });

    it('POST bodies must be application/json (415 JSON otherwise); the official client works', async () => {
        for (const ct of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x',
            'application/jsonx', 'text/json']) {
            const r = await request(srv.base, '/v1/chat/completions', { method: 'POST', body, headers: { 'content-type': ct } });
            assertError(r, 415, `Content-Type ${ct}`, { code: 'unsupported_media_type' });
        }
        const none = await raw(srv, `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${cl}\r\nConnection: close\r\n\r\n${body}`);
        rawError(none, 415, 'no Content-Type');
        const anth = await request(srv.base, '/v1/messages', { method: 'POST', body: '{}', headers: { 'content-type': 'text/plain' } });
        assert.equal(anth.status, 415);
        assert.equal(anth.json.type, 'error', 'the Anthropic route answers in its own shape');
        for (const ct of ['application/json; charset=utf-8', 'Application/JSON', 'application/json ;charset=UTF-8']) {
            const r = await request(srv.base, '/v1/chat/completions', { method: 'POST', body, headers: { 'content-type': ct } });
            assert.equal(r.status, 200, `Content-Type ${ct}: ${r.text.slice(0, 200)}`);
        }
        const c = await client(srv.base).chat.completions.create(JSON.parse(chat()));
        assert.ok(c.choices[0].message.content.length > 0);
    });

    it('GET /favicon.ico: a small SVG icon, without the key', async () => {
        const r = await get(srv.base, '/favicon.ico');
        assert.equal(r.status, 200);
        assert.equal(r.headers.get('content-type'), 'image/svg+xml');
        assert.match(r.text, /^<svg /);
    });
});
