// Error responses of `mlxcel serve`: status and the OpenAI error shape
// {"error":{"message","type","param","code"}} for malformed JSON, wrong types,
// missing fields (param names the field), unknown model (404 model_not_found),
// unknown path (404), wrong method (405), invalid UTF-8, deep nesting, request
// bounds; --max-body (413); a full queue (429 + Retry-After, with --parallel 1
// --max-queue 1); --api-key and MLXCEL_API_KEY (401 without or with a wrong
// key, the client works with the right one, /health needs none).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
    MODEL, SLOW, startServer, client, get, post, request, assertError, assertErrorShape,
    httpBytes, rawRequest,
} from './harness.mjs';

const chatBody = (extra = {}) => ({
    model: MODEL, messages: [{ role: 'user', content: 'ROMEO:' }], temperature: 0, max_tokens: 4, ...extra,
});
const CHAT = '/v1/chat/completions';

describe('request errors', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('malformed JSON -> 400', async () => {
        for (const body of ['{"model":', '{', 'not json', '{"model":"llama-tiny",}', '{"a":1} trailing', '']) {
            const r = await request(srv.base, CHAT, { body });
            assertError(r, 400, `body ${JSON.stringify(body)}`, { type: 'invalid_request_error' });
        }
        assertError(await post(srv.base, CHAT, '[]'), 400, 'array body');
        assertError(await post(srv.base, CHAT, '"x"'), 400, 'string body');
    });

    it('wrong types and missing fields name the param', async () => {
        const cases = [
            [chatBody({ temperature: 'hot' }), 'temperature'],
            [{ model: MODEL, max_tokens: 4 }, 'messages'],
            [chatBody({ messages: 'hi' }), 'messages'],
            [chatBody({ max_tokens: 'many' }), 'max_tokens'],
            [chatBody({ n: 0 }), 'n'],
            [chatBody({ temperature: 3 }), 'temperature'],
            [chatBody({ top_logprobs: 21, logprobs: true }), 'top_logprobs'],
            [chatBody({ stream: 'yes' }), 'stream'],
            [chatBody({ messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }, { role: 'user', content: 5 }] }), 'messages[2].content'],
            [chatBody({ stop: ['a', 7] }), 'stop[1]'],
            [chatBody({ logit_bias: { 50257: 1 } }), 'logit_bias'],
        ];
        for (const [body, param] of cases) {
            const r = await post(srv.base, CHAT, body);
            assertError(r, 400, `param ${param}`, { param, type: 'invalid_request_error' });
        }
        const r = await post(srv.base, '/v1/completions', { model: MODEL, max_tokens: 4 });
        assertError(r, 400, 'completions without prompt', { param: 'prompt' });
        // through the client: a BadRequestError carrying the param
        await assert.rejects(
            client(srv.base).chat.completions.create(chatBody({ temperature: 'hot' })),
            (e) => e.status === 400 && e.param === 'temperature' && typeof e.type === 'string');
    });

    it('unknown model -> 404 model_not_found', async () => {
        assertError(await post(srv.base, CHAT, chatBody({ model: 'nope' })), 404, 'model nope', { code: 'model_not_found' });
        assertError(await post(srv.base, '/v1/completions', { model: 'nope', prompt: 'x', max_tokens: 1 }), 404,
            'completions model nope', { code: 'model_not_found' });
    });

    it('unknown path -> 404, wrong method -> 405', async () => {
        assertError(await get(srv.base, '/v1/nope'), 404, 'GET /v1/nope');
        assertError(await post(srv.base, '/nope', {}), 404, 'POST /nope');
        const r = await get(srv.base, CHAT);
        assertError(r, 405, 'GET /v1/chat/completions');
        assertError(await request(srv.base, '/v1/completions', { method: 'PUT', body: '{}' }), 405, 'PUT /v1/completions');
        assertError(await post(srv.base, '/health', {}), 405, 'POST /health');
    });

    it('invalid UTF-8 and hostile nesting -> 400', async () => {
        const bad = Buffer.concat([
            Buffer.from('{"model":"llama-tiny","max_tokens":4,"messages":[{"role":"user","content":"RO'),
            Buffer.from([0xff, 0xfe, 0xc3]),
            Buffer.from('"}]}'),
        ]);
        assertError(await request(srv.base, CHAT, { body: bad }), 400, 'invalid UTF-8 body');
        const overlong = Buffer.concat([Buffer.from('{"model":"llama-tiny","max_tokens":4,"messages":[{"role":"user","content":"'),
            Buffer.from([0xc0, 0xaf]), Buffer.from('"}]}')]);
        assertError(await request(srv.base, CHAT, { body: overlong }), 400, 'overlong UTF-8');
        const surrogate = '{"model":"llama-tiny","max_tokens":4,"messages":[{"role":"user","content":"\\ud800"}]}';
        const r = await request(srv.base, CHAT, { body: surrogate });
        assert.ok(r.status === 400 || r.status === 200, `lone surrogate escape: ${r.status}`);
        if (r.status === 400) assertErrorShape(r.json, 'lone surrogate');
        const deep = '{"model":"llama-tiny","messages":' + '['.repeat(100000) + ']'.repeat(100000) + '}';
        assertError(await request(srv.base, CHAT, { body: deep }), 400, '100000-deep nesting');
        const deepObj = '{"a":'.repeat(100000) + '1' + '}'.repeat(100000);
        assertError(await request(srv.base, CHAT, { body: deepObj }), 400, '100000-deep objects');
        const nul = '{"model":"llama-tiny","max_tokens":4,"stop":["a\\u0000b"],"messages":[{"role":"user","content":"x"}]}';
        const e = assertError(await request(srv.base, CHAT, { body: nul }), 400, 'NUL in a stop string');
        assert.ok(e.param === null || e.param === 'stop[0]', `param ${e.param}`);
    });

    it('bounds: n, top_logprobs, stop count, logit_bias size', async () => {
        assertError(await post(srv.base, CHAT, chatBody({ n: 1000 })), 400, 'n 1000', { param: 'n' });
        assertError(await post(srv.base, CHAT, chatBody({ logprobs: true, top_logprobs: 1000 })), 400, 'top_logprobs 1000');
        assertError(await post(srv.base, CHAT, chatBody({ stop: Array.from({ length: 1000 }, (_, i) => `s${i}`) })), 400, '1000 stops');
        const bias = {};
        for (let i = 0; i < 2000; i++) bias[i] = -1;
        assertError(await post(srv.base, CHAT, chatBody({ logit_bias: bias })), 400, '2000 logit_bias keys');
        assertError(await post(srv.base, CHAT, chatBody({ max_tokens: -1 })), 400, 'max_tokens -1', { param: 'max_tokens' });
        assertError(await post(srv.base, CHAT, chatBody({ max_tokens: 1e10 })), 400, 'max_tokens 1e10');
        assertError(await request(srv.base, CHAT, { body: JSON.stringify(chatBody()).replace('"temperature":0', '"temperature":-1e400') }),
            400, 'temperature -1e400');
        assertError(await request(srv.base, CHAT, { body: JSON.stringify(chatBody()).replace('"max_tokens":4', '"max_tokens":123456789012345678901234567890') }),
            400, 'max_tokens 1.2e29');
        assertError(await post(srv.base, CHAT, chatBody({ messages: [] })), 400, 'no messages');
        assertError(await post(srv.base, CHAT, chatBody({ messages: [{ role: 'wizard', content: 'x' }] })), 400, 'role wizard');
        // the server is still fine
        const ok = await post(srv.base, CHAT, chatBody());
        assert.equal(ok.status, 200, ok.text);
    });

    it('a complete request then a half-close (shutdown(SHUT_WR)): no 5xx, no partial non-streamed answer', async () => {
        for (const stream of [false, true]) {
            const body = JSON.stringify(chatBody({ max_tokens: 32, stream }));
            const res = await rawRequest(srv.port,
                httpBytes({ path: CHAT, headers: { 'content-type': 'application/json' }, body }), { end: true });
            const what = `half-closed ${stream ? 'stream' : 'request'}`;
            assert.ok(!res.timedOut, `${what}: timed out`);
            if (res.status !== undefined) {
                assert.ok(res.status < 500, `${what}: status ${res.status}: ${res.body?.toString('utf8').slice(0, 200)}`);
                // docs/server.md: end-of-file counts as a disconnect (a half-close too): a stream
                // may be cut when it is noticed; a non-streamed answer is all or nothing
                if (!stream) assert.ok(!res.incomplete, `${what}: status ${res.status}, answer cut short`);
            }
        }
    });

    it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
});

describe('--max-body', { timeout: 60_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--max-body', '1024']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('a body over the limit -> 413, under it -> 200', async () => {
        const big = JSON.stringify(chatBody({ messages: [{ role: 'user', content: 'ROMEO: '.repeat(4096 / 7) }] }));
        assert.ok(big.length >= 4096);
        // the connection may be closed once the 413 is sent; raw so we see the answer either way
        const raw = await rawRequest(srv.port, httpBytes({ path: CHAT, headers: { 'content-type': 'application/json' }, body: big }));
        assert.equal(raw.status, 413, `raw: ${raw.raw?.toString('latin1').slice(0, 300)}`);
        assertErrorShape(JSON.parse(raw.body.toString('utf8')), '413');
        const r = await post(srv.base, CHAT, chatBody());
        assert.equal(r.status, 200, r.text);
    });

    it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
});

describe('queue full', { timeout: 120_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '1', '--max-queue', '1']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('-> 429 with Retry-After; the others succeed', async () => {
        const body = JSON.stringify(chatBody({ max_tokens: 200 }));
        const req = httpBytes({ path: CHAT, headers: { 'content-type': 'application/json' }, body });
        // Up to three rounds: each sends 6 requests whose last byte leaves at (about) the same moment.
        let results;
        for (let round = 0; round < 3; round++) {
            const cut = req.length - 1;
            results = await Promise.all(Array.from({ length: 6 }, () =>
                rawRequest(srv.port, [req.subarray(0, cut), req.subarray(cut)], { delayMs: 200, timeout: 60_000 * SLOW })));
            if (results.some((r) => r.status === 429)) break;
        }
        const statuses = results.map((r) => r.status);
        assert.ok(statuses.includes(429), `no 429 in ${JSON.stringify(statuses)}`);
        for (const r of results) {
            assert.ok(r.status === 200 || r.status === 429, `status ${r.status}: ${JSON.stringify(r).slice(0, 300)}`);
            if (r.status === 429) {
                assert.ok(r.headers['retry-after'] !== undefined, `429 without Retry-After: ${JSON.stringify(r.headers)}`);
                assert.match(r.headers['retry-after'], /^\d+$/, 'Retry-After in seconds');
                const e = assertErrorShape(JSON.parse(r.body.toString('utf8')), '429');
                assert.equal(e.type, 'rate_limit_error', JSON.stringify(e));
            }
        }
        assert.ok(statuses.filter((s) => s === 200).length >= 1, JSON.stringify(statuses));
        // the queue drains: a request now succeeds
        const r = await post(srv.base, CHAT, chatBody());
        assert.equal(r.status, 200, r.text);
    });

    it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
});

for (const how of ['--api-key', 'MLXCEL_API_KEY']) {
    describe(`${how}`, { timeout: 60_000 * SLOW }, () => {
        let srv;
        const key = how === '--api-key' ? 'sekret' : 'sekret-env';
        before(async () => {
            srv = how === '--api-key' ? await startServer(['--api-key', key]) : await startServer([], { MLXCEL_API_KEY: key });
        });
        after(async () => { if (srv && !srv.stopped) await srv.stop(); });

        it('401 without or with a wrong key; the right key works; /health needs none', async () => {
            for (const [what, headers] of [
                ['no Authorization', {}],
                ['wrong key', { authorization: 'Bearer nope' }],
                ['key as a prefix', { authorization: `Bearer ${key}x` }],
                ['not Bearer', { authorization: `Basic ${key}` }],
                ['empty bearer', { authorization: 'Bearer ' }],
            ]) {
                const r = await post(srv.base, CHAT, chatBody(), { headers });
                const e = assertError(r, 401, what);
                assert.ok(e.type.length > 0, JSON.stringify(e));
                assert.equal(typeof e.code, 'string', `${what}: error.code: ${JSON.stringify(e)}`);
                const m = await get(srv.base, '/v1/models', { headers });
                assertError(m, 401, `${what}: /v1/models`);
            }
            await assert.rejects(client(srv.base, { apiKey: 'wrong' }).chat.completions.create(chatBody()),
                (e) => e.status === 401);
            assertError(await post(srv.base, '/tokenize', { content: 'x' }), 401, '/tokenize without a key');
            assertError(await get(srv.base, '/metrics'), 401, '/metrics without a key');
            const c = await client(srv.base, { apiKey: key }).chat.completions.create(chatBody());
            assert.equal(c.object, 'chat.completion');
            const m = await client(srv.base, { apiKey: key }).models.list();
            assert.equal(m.data[0].id, MODEL);
            // docs/server.md: the key may come as x-api-key too
            const x = await post(srv.base, CHAT, chatBody(), { headers: { 'x-api-key': key } });
            assert.equal(x.status, 200, `x-api-key: ${x.text.slice(0, 200)}`);
            assertError(await post(srv.base, CHAT, chatBody(), { headers: { 'x-api-key': 'nope' } }), 401, 'wrong x-api-key');
            const h = await get(srv.base, '/health');
            assert.equal(h.status, 200, h.text);
            assert.deepEqual(h.json, { status: 'ok' });
            // whitespace after a field value is not part of it (RFC 9110 5.5); libmicrohttpd keeps
            // it, and the key with a space after it was refused (fetch strips it, so raw bytes)
            for (const field of [`Authorization: Bearer ${key} \t`, `x-api-key: ${key} `]) {
                const r = await rawRequest(srv.port, `GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n${field}\r\n\r\n`);
                assert.equal(r.status, 200, `${JSON.stringify(field)}: ${r.raw.toString().slice(0, 300)}`);
            }
            const r = await rawRequest(srv.port, `GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: ${key}x \r\n\r\n`);
            assert.equal(r.status, 401, 'a longer key with a space after it');
        });

        it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
    });
}
