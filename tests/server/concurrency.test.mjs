// Concurrent requests on `mlxcel serve`: 16 different greedy chat requests at
// once give, each, the text they give alone (with --parallel 16: batched; with
// --parallel 4: queued); a stream aborted by the client frees its slot (later
// requests complete, and equal their solo result); SIGTERM while a stream is
// in flight ends the stream (or errors it) and the server exits 0, no hang;
// a stream queued longer than --timeout is still answered in full.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
    MODEL, SLOW, startServer, client, withTimeout, post, rawRequest, httpBytes, parseSSE, sleep, assertErrorShape,
} from './harness.mjs';

const PROMPTS = [
    'ROMEO:', 'JULIET:', 'First Citizen:', 'Second Citizen:', 'MENENIUS:', 'KING HENRY VI:',
    'GLOUCESTER:', 'LADY ANNE:', 'BRUTUS:', 'CORIOLANUS:', 'QUEEN ELIZABETH:', 'DUKE VINCENTIO:',
    'ISABELLA:', 'PETRUCHIO:', 'KATHARINA:', 'Nurse:',
];
const req = (prompt, extra = {}) => ({
    model: MODEL, messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 24, ...extra,
});
const text = (c) => c.choices[0].message.content;

for (const parallel of [16, 4]) {
    describe(`--parallel ${parallel}`, { timeout: 180_000 * SLOW }, () => {
        let srv;
        let api;
        const solo = new Map();
        before(async () => {
            srv = await startServer(['--parallel', String(parallel)]);
            api = client(srv.base);
        });
        after(async () => { if (srv && !srv.stopped) await srv.stop(); });

        it('16 concurrent greedy requests == each alone', async () => {
            for (const p of PROMPTS) solo.set(p, await api.chat.completions.create(req(p)));
            const t0 = Date.now();
            const all = await withTimeout(Promise.all(PROMPTS.map((p) => api.chat.completions.create(req(p)))),
                120_000 * SLOW, '16 concurrent requests');
            for (const [i, p] of PROMPTS.entries()) {
                assert.equal(text(all[i]), text(solo.get(p)), `prompt ${JSON.stringify(p)}`);
                assert.deepEqual(all[i].usage, solo.get(p).usage, `usage of ${JSON.stringify(p)}`);
                assert.equal(all[i].choices[0].finish_reason, solo.get(p).choices[0].finish_reason);
            }
            // and streamed, mixed with non-streamed
            const mixed = await withTimeout(Promise.all(PROMPTS.map(async (p, i) => {
                if (i % 2) return text(await api.chat.completions.create(req(p)));
                let s = '';
                for await (const c of await api.chat.completions.create(req(p, { stream: true }))) s += c.choices[0]?.delta?.content ?? '';
                return s;
            })), 120_000 * SLOW, '16 concurrent mixed requests');
            PROMPTS.forEach((p, i) => assert.equal(mixed[i], text(solo.get(p)), `mixed: ${JSON.stringify(p)}`));
            // seeded sampling is per request: batched with others it draws what it draws alone
            const sampled = (p, i) => req(p, { temperature: 1, top_p: 0.9, seed: 1000 + i, max_tokens: 16 });
            const sSolo = [];
            for (const [i, p] of PROMPTS.slice(0, 8).entries()) sSolo.push(text(await api.chat.completions.create(sampled(p, i))));
            const sAll = await withTimeout(Promise.all(PROMPTS.map((p, i) => api.chat.completions.create(i < 8 ? sampled(p, i) : req(p)))),
                120_000 * SLOW, '16 concurrent sampled/greedy requests');
            sSolo.forEach((t, i) => assert.equal(text(sAll[i]), t, `seeded ${JSON.stringify(PROMPTS[i])} batched`));
            PROMPTS.slice(8).forEach((p, i) => assert.equal(text(sAll[8 + i]), text(solo.get(p)), `greedy ${JSON.stringify(p)} beside sampled ones`));
            console.error(`# --parallel ${parallel}: 16 concurrent requests in ${Date.now() - t0} ms`);
        });

        it('an aborted stream frees its slot', async () => {
            const generated = async () => {
                const m = await fetch(srv.base + '/metrics', { signal: AbortSignal.timeout(10_000 * SLOW) }).then((r) => r.text());
                let v = 0;
                for (const l of m.split('\n')) {
                    const x = /^mlxcel_generated_tokens_total(\{[^}]*\})?\s+(\S+)/.exec(l);
                    if (x) v += Number(x[2]);
                }
                return v;
            };
            const gauge = async (name) => {
                const m = await fetch(srv.base + '/metrics', { signal: AbortSignal.timeout(10_000 * SLOW) }).then((r) => r.text());
                const x = new RegExp(`^${name}\\s+(\\S+)`, 'm').exec(m);
                return x ? Number(x[1]) : undefined;
            };
            const g0 = await generated();
            const K = parallel + 1;
            for (let k = 0; k < K; k++) {
                const ac = new AbortController();
                const stream = await api.chat.completions.create(req('ROMEO:', { max_tokens: 400, stream: true }), { signal: ac.signal });
                let n = 0;
                await withTimeout((async () => {
                    try {
                        for await (const _ of stream) {
                            if (++n === 2) { ac.abort(); break; }
                        }
                    } catch (e) {
                        if (!ac.signal.aborted) throw e;
                    }
                })(), 30_000 * SLOW, 'the aborted stream');
                assert.equal(n, 2);
            }
            // the slots empty (bounded wait), where the server reports them
            if ((await gauge('mlxcel_busy_slots')) !== undefined) {
                const t0 = Date.now();
                let busy;
                while ((busy = await gauge('mlxcel_busy_slots')) !== 0 && Date.now() - t0 < 10_000 * SLOW) await sleep(50);
                assert.equal(busy, 0, `mlxcel_busy_slots still ${busy} ${Date.now() - t0} ms after the aborts`);
                assert.equal(await gauge('mlxcel_queue_depth'), 0, 'mlxcel_queue_depth after the aborts');
            }
            // more aborts than slots: if the aborted ones kept their slots, these would wait
            const again = await withTimeout(api.chat.completions.create(req('JULIET:')), 30_000 * SLOW, 'a request after the aborts');
            assert.equal(text(again), text(solo.get('JULIET:')));
            const four = await withTimeout(Promise.all(PROMPTS.slice(0, 4).map((p) => api.chat.completions.create(req(p)))),
                30_000 * SLOW, '4 requests after the aborts');
            PROMPTS.slice(0, 4).forEach((p, i) => assert.equal(text(four[i]), text(solo.get(p))));
            // the aborted requests stopped generating: far fewer than K x 400 tokens were made
            const followers = [again, ...four].reduce((a, c) => a + c.usage.completion_tokens, 0);
            const aborted = (await generated()) - g0 - followers;
            assert.ok(aborted < K * 400 / 2, `${K} streams aborted after 2 chunks still generated ${aborted} tokens`);
        });

        it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
    });
}

describe('shutdown', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(); });
    after(async () => { if (srv && !srv.stopped) await srv.stop().catch(() => {}); });

    it('SIGTERM with a stream in flight: the stream ends, the server exits 0', async () => {
        const api = client(srv.base);
        const streams = await Promise.all([0, 1].map(() =>
            api.chat.completions.create(req('ROMEO:', { max_tokens: 480, stream: true }))));
        const consume = streams.map(async (stream, i) => {
            let n = 0;
            let finish = null;
            try {
                for await (const c of stream) {
                    if (++n === 2 && i === 0) srv.proc.kill('SIGTERM');
                    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
                }
                return { n, finish };
            } catch (e) {
                return { n, error: e.message };
            }
        });
        const outcomes = await withTimeout(Promise.all(consume), 30_000 * SLOW, 'the streams to end after SIGTERM');
        console.error(`# shutdown: ${JSON.stringify(outcomes)}`);
        await srv.stop();   // bounded wait for the exit (SIGTERM already sent); exit 0, no sanitizer report
        // and nothing listens any more
        await assert.rejects(fetch(srv.base + '/health', { signal: AbortSignal.timeout(5000) }));
    });
});

// docs/server.md: on SIGINT/SIGTERM "a stream ends with an error event and
// `data: [DONE]`; a request still waiting (streamed or not) gets 503", before any 200.
describe('shutdown, as documented', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '1']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop().catch(() => {}); });

    it('a running stream ends with an error event and [DONE]; queued requests, streamed or not, get 503', async () => {
        const go = (stream, n) => rawRequest(srv.port, httpBytes({
            path: '/v1/chat/completions', headers: { 'content-type': 'application/json' },
            body: JSON.stringify(req('ROMEO:', { max_tokens: 480, n, stream })),
        }), { timeout: 40_000 * SLOW });
        const running = go(true, 4);
        await sleep(50 * SLOW);
        const queuedStream = go(true, 1);
        const queued = go(false, 1);
        await sleep(150 * SLOW);
        srv.proc.kill('SIGTERM');
        const [a, b, c] = await Promise.all([running, queuedStream, queued]);
        await srv.stop();
        const problems = [];
        for (const [what, r] of [['running stream', a]]) {
            if (r.status !== 200 || r.incomplete || r.timedOut) {
                problems.push(`${what}: status ${r.status}, ${r.incomplete ? 'chunked body not terminated' : 'complete'}: ...${JSON.stringify(r.raw.toString('latin1').slice(-160))}`);
                continue;
            }
            const text = r.body.toString('utf8');
            if (!text.endsWith('data: [DONE]\n\n')) problems.push(`${what}: no [DONE]: ...${JSON.stringify(text.slice(-160))}`);
            else if (!/^data: \{"error":/m.test(text) && !/"finish_reason":"(stop|length)"/.test(text))
                problems.push(`${what}: neither an error event nor a finish_reason`);
        }
        for (const [what, r] of [['queued request', c], ['queued stream', b]]) {
            if (r.status !== 503) problems.push(`${what}: ${r.status === undefined ? 'closed without an answer' : `status ${r.status}`}, want 503`);
            else assertErrorShape(JSON.parse(r.body.toString('utf8')), `${what} at shutdown`);
        }
        assert.deepEqual(problems, []);
    });
});

// Clients that vanish at any moment: before the answer, mid-prefill, while
// queued, mid-stream; streamed or not, n 1 or 3. Afterwards the slots and the
// queue drain and a greedy request answers as before.
describe('abort storm', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '4']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('48 requests aborted at random times', async () => {
        const api = client(srv.base);
        const ref = text(await api.chat.completions.create(req('ROMEO:')));
        let seed = 12345;
        const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 4294967296; };
        const jobs = Array.from({ length: 48 }, (_, i) => ({
            stream: rnd() < 0.6, n: rnd() < 0.2 ? 3 : 1, delay: rnd() < 0.25 ? null : Math.floor(rnd() * 1000 * SLOW), prompt: PROMPTS[i % PROMPTS.length],
        }));
        const outcomes = await withTimeout(Promise.all(jobs.map(async (j) => {
            const ac = new AbortController();
            const timer = j.delay === null ? undefined : setTimeout(() => ac.abort(), j.delay);
            try {
                const r = await fetch(srv.base + '/v1/chat/completions', {
                    method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
                    body: JSON.stringify(req(j.prompt, { max_tokens: 100, n: j.n, stream: j.stream })),
                });
                await r.text();
                return r.status;
            } catch {
                return 'aborted';
            } finally {
                clearTimeout(timer);
            }
        })), 60_000 * SLOW, 'the abort storm');
        const counts = outcomes.reduce((a, o) => ({ ...a, [o]: (a[o] || 0) + 1 }), {});
        console.error(`# abort storm: ${JSON.stringify(counts)}`);
        for (const o of outcomes) assert.ok(o === 200 || o === 'aborted', `outcome ${o}`);
        const t0 = Date.now();
        let m = '';
        for (;;) {
            m = await fetch(srv.base + '/metrics', { signal: AbortSignal.timeout(10_000 * SLOW) }).then((r) => r.text());
            const busy = /^mlxcel_busy_slots\s+(\S+)/m.exec(m);
            const queue = /^mlxcel_queue_depth\s+(\S+)/m.exec(m);
            if ((!busy || Number(busy[1]) === 0) && (!queue || Number(queue[1]) === 0)) break;
            assert.ok(Date.now() - t0 < 15_000 * SLOW, `slots or queue not drained: ${m.split('\n').filter((l) => /busy|queue/.test(l)).join('; ')}`);
            await sleep(50);
        }
        assert.equal(text(await api.chat.completions.create(req('ROMEO:'))), ref);
        srv.assertAlive('after the abort storm');
    });

    it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
});

describe('SIGINT', { timeout: 60_000 * SLOW }, () => {
    it('SIGINT also stops the server cleanly', async () => {
        const srv = await startServer();
        try {
            const c = await client(srv.base).chat.completions.create(req('ROMEO:', { max_tokens: 2 }));
            assert.equal(c.object, 'chat.completion');
            srv.proc.kill('SIGINT');
        } finally {
            await srv.stop();
        }
    });
});

// --timeout closes *idle* connections: a stream that waits for a slot (queued
// behind a long request, --parallel 1) longer than that must still be answered
// in full, as a non-streamed request in the same place is.
describe('--timeout 1 with a queued stream', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '1', '--timeout', '1', '-t', '1']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('a queued request outlives --timeout and is answered in full', async (t) => {
        const t0 = Date.now();
        const long = post(srv.base, '/v1/chat/completions', req('ROMEO:', { max_tokens: 480, n: 12 }));
        await sleep(100);
        const queued = [true, false].map((stream) => rawRequest(srv.port,
            httpBytes({ path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body: JSON.stringify(req('JULIET:', { max_tokens: 8, stream })) }),
            { timeout: 90_000 * SLOW }));
        const a = await long;
        const ms = Date.now() - t0;
        assert.equal(a.status, 200, a.text.slice(0, 300));
        const [s, n] = await Promise.all(queued);
        if (ms < 1500) { t.skip(`the long request took only ${ms} ms: inconclusive`); return; }
        assert.equal(n.status, 200, `non-streamed: ${n.raw.toString('latin1').slice(0, 300)}`);
        assert.ok(!n.incomplete && !n.timedOut, 'non-streamed answer cut short');
        assert.equal(s.status, 200, `streamed: ${s.raw.toString('latin1').slice(0, 300)}`);
        assert.ok(!s.incomplete && !s.timedOut,
            `streamed answer cut short after ${ms} ms in the queue: ...${JSON.stringify(s.raw.toString('latin1').slice(-200))}`);
        parseSSE(s.body.toString('utf8'), 'queued stream');
    });

    it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
});
