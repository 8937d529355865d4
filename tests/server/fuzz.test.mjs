// The hostile-request fuzzer: raw node:net connections to one `mlxcel serve
// --timeout 2` on 127.0.0.1 send, from a seeded PRNG, random bytes; valid HTTP
// with mutated chat/completions JSON bodies (truncation, byte flips, swapped
// types, huge numbers, 10^5-deep nesting, invalid UTF-8, NULs, thousands of
// stop strings or logit_bias keys, out-of-range n/top_logprobs/max_tokens);
// wrong Content-Length; bodies in tiny chunks; chunked transfer-encoding
// (valid and broken); 64 KiB header lines; thousands of headers; random
// methods and paths (llama-server's routes too, their errors in its body); malformed
// request lines and headers. Then stalled uploads
// (the server must time them out) and 64 simultaneous connections.
// Checks: never a 5xx; every JSON response parses, and has the error shape when
// its status is >= 400; the server stays alive; a greedy chat request answers
// the same after the fuzzing as before; SIGTERM exits 0 with no sanitizer report.
// Bounds: MLXCEL_FUZZ_REQUESTS requests (default 1500) or 60 s, whichever comes
// first. The seed is printed; MLXCEL_FUZZ_SEED=<seed> replays a run, and
// MLXCEL_FUZZ_CASES=i,j,... (with the seed) replays only those cases.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
    MODEL, SLOW, startServer, client, get, httpBytes, rawRequest, assertErrorShape, withTimeout,
} from './harness.mjs';
import { caseAt, checkResponse } from './fuzzgen.mjs';

const SEED = process.env.MLXCEL_FUZZ_SEED !== undefined
    ? Number(process.env.MLXCEL_FUZZ_SEED) >>> 0
    : (Date.now() ^ (process.pid << 16)) >>> 0;
const ONLY = process.env.MLXCEL_FUZZ_CASES ? process.env.MLXCEL_FUZZ_CASES.split(',').map(Number) : null;
const N_REQUESTS = ONLY ? ONLY.length : Number(process.env.MLXCEL_FUZZ_REQUESTS) || 1500;
const DEADLINE_MS = 60_000;
const CONCURRENCY = 4;
const SERVER_TIMEOUT_S = 2;

const user = (content) => [{ role: 'user', content }];

describe('fuzz', { timeout: 400_000 * SLOW }, () => {
    let srv;
    let reference;
    const ref = { model: MODEL, messages: user('ROMEO:'), temperature: 0, max_tokens: 16 };
    before(async () => {
        srv = await startServer(['--timeout', String(SERVER_TIMEOUT_S)]);
        reference = await client(srv.base).chat.completions.create(ref);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it(`hostile requests (seed ${SEED})`, async (t) => {
        const msg = `fuzz seed ${SEED} (replay: MLXCEL_FUZZ_SEED=${SEED}), up to ${N_REQUESTS} requests or ${DEADLINE_MS / 1000} s`;
        t.diagnostic(msg);
        console.error(`# ${msg}`);
        const t0 = Date.now();
        const failures = [];
        const kinds = {};
        const statuses = {};
        let done = 0;
        let next = 0;
        const inFlight = new Set();
        const worker = async () => {
            while (next < N_REQUESTS && Date.now() - t0 < DEADLINE_MS && failures.length < 20 && srv.alive) {
                const k = next++;
                const c = caseAt(SEED, ONLY ? ONLY[k] : k);
                inFlight.add(c);
                const res = await rawRequest(srv.port, c.chunks, { ...c.opts, timeout: (SERVER_TIMEOUT_S + 10) * 1000 * SLOW });
                inFlight.delete(c);
                done++;
                kinds[c.kind] = (kinds[c.kind] || 0) + 1;
                const st = res.status ?? (res.timedOut ? 'timeout' : 'closed');
                statuses[st] = (statuses[st] || 0) + 1;
                const f = checkResponse(res, c);
                if (f) {
                    failures.push(`${f}\n    request: ${JSON.stringify(Buffer.concat(c.chunks).toString('latin1').slice(0, 1000))}` +
                        `\n    answer: ${JSON.stringify(res.raw.toString('latin1').slice(-600))}`);
                }
                if (!srv.alive) {
                    failures.push(`server died during ${c.kind} #${c.index} (or one of ${[...inFlight].map((x) => `${x.kind} #${x.index}`).join(', ')})`);
                }
            }
        };
        await Promise.all(Array.from({ length: CONCURRENCY }, worker));
        const summary = `${done} requests in ${Date.now() - t0} ms; kinds ${JSON.stringify(kinds)}; answers ${JSON.stringify(statuses)}`;
        t.diagnostic(summary);
        console.error(`# ${summary}`);
        srv.assertAlive('during the fuzzing');
        assert.deepEqual(failures, [], `seed ${SEED}: ${failures.length} failures:\n${failures.join('\n')}`);
        assert.ok(done >= Math.min(N_REQUESTS, 100), `only ${done} requests in the time bound`);
    });

    it('stalled uploads and idle connections time out', async () => {
        const body = Buffer.from(JSON.stringify({ model: MODEL, messages: user('ROMEO:'), max_tokens: 4 }));
        const full = httpBytes({ path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body });
        const headEnd = full.indexOf('\r\n\r\n') + 4;
        const stalls = [
            ['idle', Buffer.alloc(0)],
            ['half a request line', full.subarray(0, 10)],
            ['headers only', full.subarray(0, headEnd - 2)],
            ['headers + half the body', full.subarray(0, headEnd + (body.length >> 1))],
            ['headers + all but one byte', full.subarray(0, full.length - 1)],
            ['chunked, no end', httpBytes({ path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' }, body: '5\r\n{"mod\r\n' })],
        ];
        const bound = (SERVER_TIMEOUT_S + 8) * 1000 * SLOW;
        const t0 = Date.now();
        const res = await Promise.all(stalls.map(([, bytes]) =>
            rawRequest(srv.port, bytes.length ? [bytes] : [], { timeout: bound, keepOpen: true })
                .then((r) => ({ ...r, ms: Date.now() - t0 }))));
        res.forEach((r, i) => {
            const what = stalls[i][0];
            assert.ok(!r.timedOut, `${what}: still open after ${bound} ms (--timeout ${SERVER_TIMEOUT_S})`);
            assert.ok(r.ms >= (SERVER_TIMEOUT_S * 1000) / 2 - 100, `${what}: closed after ${r.ms} ms, before the timeout`);
            if (r.status !== undefined) {
                assert.ok(r.status < 500 && r.status >= 400, `${what}: status ${r.status}`);
                if ((r.headers['content-type'] || '').includes('json') && r.body)
                    assertErrorShape(JSON.parse(r.body.toString('utf8')), what);
            }
        });
        console.error(`# stalls closed after ${res.map((r) => r.ms).join(', ')} ms, answers ${res.map((r) => r.status ?? 'none').join(', ')}`);
        srv.assertAlive('after the stalled uploads');
    });

    it('64 simultaneous connections', async () => {
        const chat = Buffer.from(JSON.stringify({ model: MODEL, messages: user('ROMEO:'), temperature: 0, max_tokens: 2 }));
        const res = await withTimeout(Promise.all(Array.from({ length: 64 }, (_, i) => {
            const req = i % 4 === 0
                ? httpBytes({ path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body: chat })
                : i % 4 === 1 ? httpBytes({ path: '/tokenize', headers: { 'content-type': 'application/json' }, body: '{"content":"ROMEO:"}' })
                    : httpBytes({ method: 'GET', path: i % 4 === 2 ? '/health' : '/v1/models' });
            return rawRequest(srv.port, req, { timeout: 60_000 * SLOW });
        })), 90_000 * SLOW, '64 simultaneous connections');
        const statuses = res.map((r) => r.status ?? (r.timedOut ? 'timeout' : 'closed'));
        console.error(`# 64 connections: ${JSON.stringify(statuses.reduce((a, s) => ({ ...a, [s]: (a[s] || 0) + 1 }), {}))}`);
        for (const [i, r] of res.entries()) {
            assert.ok(!r.timedOut, `connection ${i} timed out`);
            if (r.status !== undefined) assert.ok(r.status < 500, `connection ${i}: status ${r.status}`);
        }
        const ok = statuses.filter((s) => s === 200).length;
        assert.ok(ok >= 32, `only ${ok} of 64 simultaneous connections answered 200: ${JSON.stringify(statuses)}`);
        srv.assertAlive('after 64 connections');
    });

    it('still answers the same; exits 0 on SIGTERM', async () => {
        const h = await get(srv.base, '/health');
        assert.equal(h.status, 200);
        const again = await client(srv.base).chat.completions.create(ref);
        assert.equal(again.choices[0].message.content, reference.choices[0].message.content);
        assert.deepEqual(again.usage, reference.usage);
        await srv.stop();
    });
});
