// The non-generation endpoints of `mlxcel serve` on the default model
// (models/llama-tiny): /health, /v1/models (list and one), /tokenize (ids and
// pieces; the ids agree with `mlxcel tokenize`), /detokenize, /apply-template
// (the model's chat template) and /metrics (Prometheus counters that grow
// after a request). One server for the whole file; it must stop cleanly.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { BIN, MODEL, MODEL_DIR, SLOW, startServer, client, get, post, assertError } from './harness.mjs';

let srv;
let api;

// The samples of one metric (summed over its label sets), or undefined when absent.
function metric(text, name) {
    let sum;
    for (const line of text.split('\n')) {
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
        if (m && m[1] === name) sum = (sum ?? 0) + Number(m[3]);
    }
    return sum;
}

describe('endpoints', { timeout: 120_000 * SLOW }, () => {
    before(async () => {
        srv = await startServer();
        api = client(srv.base);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('GET /health -> 200 {"status":"ok"}', async () => {
        const r = await get(srv.base, '/health');
        assert.equal(r.status, 200);
        assert.match(r.headers.get('content-type') || '', /application\/json/);
        assert.deepEqual(r.json, { status: 'ok' });
    });

    it('GET /v1/models lists the one model', async () => {
        const r = await get(srv.base, '/v1/models');
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.object, 'list');
        assert.ok(Array.isArray(r.json.data), r.text);
        assert.equal(r.json.data.length, 1, r.text);
        const m = r.json.data[0];
        assert.equal(m.id, MODEL);
        assert.equal(m.object, 'model');
        assert.ok(Number.isInteger(m.created), `created: ${m.created}`);
        assert.equal(typeof m.owned_by, 'string');
        // and through the client
        const page = await api.models.list();
        assert.deepEqual(page.data.map((x) => x.id), [MODEL]);
    });

    it('GET /v1/models/llama-tiny -> the model; /v1/models/other -> 404', async () => {
        const r = await get(srv.base, `/v1/models/${MODEL}`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.id, MODEL);
        assert.equal(r.json.object, 'model');
        assert.ok(Number.isInteger(r.json.created));
        assert.equal(typeof r.json.owned_by, 'string');
        const m = await api.models.retrieve(MODEL);
        assert.equal(m.id, MODEL);
        assertError(await get(srv.base, '/v1/models/other'), 404, '/v1/models/other');
    });

    it('/tokenize, /detokenize', async () => {
        const want = JSON.parse(execFileSync(BIN, ['tokenize', '-m', MODEL_DIR, '-p', 'ROMEO:'], { encoding: 'utf8' }));
        let r = await post(srv.base, '/tokenize', { content: 'ROMEO:' });
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.json, { tokens: want }, `the CLI says ${JSON.stringify(want)}`);
        assert.ok(r.json.tokens.every(Number.isInteger));

        r = await post(srv.base, '/tokenize', { content: 'ROMEO:', with_pieces: true });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.tokens.length, want.length, r.text);
        r.json.tokens.forEach((t, i) => {
            assert.equal(t.id, want[i], r.text);
            assert.equal(typeof t.piece, 'string', r.text);
        });
        assert.equal(r.json.tokens.map((t) => t.piece).join(''), 'ROMEO:', 'pieces of an ASCII text join to it');

        r = await post(srv.base, '/detokenize', { tokens: want });
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.json, { content: 'ROMEO:' });

        r = await post(srv.base, '/tokenize', { content: '' });
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.json, { tokens: [] });

        assertError(await post(srv.base, '/tokenize', { content: 5 }), 400, '/tokenize content 5');
        assertError(await post(srv.base, '/tokenize', {}), 400, '/tokenize without content');
        assertError(await post(srv.base, '/detokenize', { tokens: [1e9] }), 400, '/detokenize id 1e9');
        assertError(await post(srv.base, '/detokenize', { tokens: [-1] }), 400, '/detokenize id -1');
        assertError(await post(srv.base, '/detokenize', { tokens: 'x' }), 400, '/detokenize tokens "x"');
    });

    it('/apply-template renders the chat template', async () => {
        const r = await post(srv.base, '/apply-template', { messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.json, { prompt: '<|user|>\nhi<|end|>\n<|assistant|>\n' });
        assertError(await post(srv.base, '/apply-template', {}), 400, '/apply-template without messages');
    });

    it('GET /metrics: Prometheus counters that grow', async () => {
        const names = ['mlxcel_requests_total', 'mlxcel_prompt_tokens_total', 'mlxcel_generated_tokens_total'];
        const read = async () => {
            const r = await get(srv.base, '/metrics');
            assert.equal(r.status, 200, r.text);
            assert.match(r.headers.get('content-type') || '', /^text\/plain/);
            const v = {};
            for (const n of names) {
                v[n] = metric(r.text, n);
                assert.ok(Number.isFinite(v[n]), `${n} missing from /metrics:\n${r.text}`);
            }
            return v;
        };
        const before = await read();
        const c = await api.chat.completions.create({
            model: MODEL, messages: [{ role: 'user', content: 'ROMEO:' }], temperature: 0, max_tokens: 4,
        });
        const after = await read();
        assert.ok(after.mlxcel_requests_total > before.mlxcel_requests_total, JSON.stringify({ before, after }));
        assert.ok(after.mlxcel_prompt_tokens_total >= before.mlxcel_prompt_tokens_total + c.usage.prompt_tokens,
            JSON.stringify({ before, after, usage: c.usage }));
        assert.ok(after.mlxcel_generated_tokens_total >= before.mlxcel_generated_tokens_total + c.usage.completion_tokens,
            JSON.stringify({ before, after, usage: c.usage }));
        // a stream's tokens are counted too (the server counts them before its last chunk goes
        // out; a count made later, at completion, would only sometimes lose this race)
        const stream = await api.chat.completions.create({
            model: MODEL, messages: [{ role: 'user', content: 'JULIET:' }], temperature: 0, max_tokens: 4,
            stream: true, stream_options: { include_usage: true },
        });
        let usage = null;
        for await (const chunk of stream)
            if (chunk.usage) usage = chunk.usage;
        assert.ok(usage, 'the stream carried a usage chunk');
        const end = await read();
        assert.ok(end.mlxcel_prompt_tokens_total >= after.mlxcel_prompt_tokens_total + usage.prompt_tokens,
            JSON.stringify({ after, end, usage }));
        assert.ok(end.mlxcel_generated_tokens_total >= after.mlxcel_generated_tokens_total + usage.completion_tokens,
            JSON.stringify({ after, end, usage }));
    });

    it('stops cleanly on SIGTERM', async () => {
        await srv.stop();
    });
});

describe('--served-model-name', { timeout: 60_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--served-model-name', 'bard-1']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('the model answers to its served name only', async () => {
        const r = await get(srv.base, '/v1/models');
        assert.deepEqual(r.json.data.map((m) => m.id), ['bard-1']);
        assert.equal((await get(srv.base, '/v1/models/bard-1')).status, 200);
        assertError(await get(srv.base, `/v1/models/${MODEL}`), 404, 'the folder name');
        const c = await client(srv.base).chat.completions.create({ model: 'bard-1', messages: [{ role: 'user', content: 'ROMEO:' }], max_tokens: 2 });
        assert.equal(c.model, 'bard-1');
        assertError(await post(srv.base, '/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 }),
            404, 'the folder name in a request', { code: 'model_not_found' });
    });

    it('stops cleanly on SIGTERM', async () => { await srv.stop(); });
});
