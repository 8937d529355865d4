// Cross-request batching of /v1/embeddings and /v1/rerank (ADR 0114): 16 requests fired at
// once, each of a different mix of inputs, get exactly what the same request gets alone (within
// the encoder tests' batched-vs-alone bound, 1e-5 of the vector's largest value), in their own
// order, with their own usage; a bad request among them is answered 400 on its own; /metrics
// shows that requests shared batches (mlxcel_embed_batch_max_requests >= 2, fewer batches than
// requests). Cases: bert_st (the official `openai` client's embeddings.create), qwen3_emb (a
// decoder embedding model, same client), bert_ce (a cross-encoder, fetch to /v1/rerank).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const { startServer, client, get, post, rawRequest, httpBytes, sleep, SLOW } = await import('./harness.mjs');

const G = 'tests/fixtures/golden';
const load = (c) => existsSync(join(G, c, 'embed.json')) ? JSON.parse(readFileSync(join(G, c, 'embed.json'), 'utf8')) : null;
const N_REQ = 16;
const ROUNDS = 6;   // rounds of N_REQ concurrent requests until some shared a batch

function close(got, want, what, tol) {
    assert.equal(got.length, want.length, `${what}: length`);
    const mr = Math.max(...want.map(Math.abs));
    const md = Math.max(...got.map((g, i) => Math.abs(g - want[i])));
    assert.ok(md <= tol * Math.max(mr, 1e-3), `${what}: max difference ${md} over max ${mr}`);
}

async function metric(base, name) {
    const r = await get(base, '/metrics');
    assert.equal(r.status, 200);
    const m = r.text.match(new RegExp(`^${name} (\\d+)$`, 'm'));
    assert.ok(m, `/metrics has ${name}`);
    return Number(m[1]);
}

// Request j: texts j, j+1, ... (j % 4 + 1 of them, wrapping), rep times over (a forward long
// enough that requests arrive while one runs).
const pick = (arr, j, rep = 1) => Array.from({ length: (j % 4 + 1) * rep }, (_, i) => arr[(j + i) % arr.length]);
const REP = 6;

// Fire the requests alone, then N_REQ at once (rounds until some shared a batch); each equal alone.
async function batchedEqualsAlone(base, run, check) {
    const alone = [];
    for (let j = 0; j < N_REQ; j++)
        alone.push(await run(j));
    const b0 = await metric(base, 'mlxcel_embed_batches_total');
    const r0 = await metric(base, 'mlxcel_embed_batch_requests_total');
    assert.equal(r0, b0, 'requests one at a time run alone');
    let shared = 0, round = 0;
    for (; round < ROUNDS && shared < 2; round++) {
        const got = await Promise.all(Array.from({ length: N_REQ }, (_, j) => run(j)));
        got.forEach((g, j) => check(g, alone[j], `round ${round} request ${j}`));
        shared = await metric(base, 'mlxcel_embed_batch_max_requests');
    }
    const batches = await metric(base, 'mlxcel_embed_batches_total') - b0;
    const reqs = await metric(base, 'mlxcel_embed_batch_requests_total') - r0;
    assert.ok(shared >= 2, `no batch held two requests in ${round} rounds`);
    assert.equal(reqs, round * N_REQ, 'every request went through the batcher once');
    assert.ok(batches < reqs, `${batches} batches for ${reqs} requests`);
}

describe('cross-request batching of embeddings and rerank', { timeout: 300_000 * SLOW }, () => {
    for (const name of ['bert_st', 'qwen3_emb']) {
        describe(`${name}: /v1/embeddings`, () => {
            const ref = load(name);
            let srv;
            before(async () => { srv = await startServer(['-m', join(G, name)]); });
            after(async () => { if (srv) await srv.stop(); });

            it('has its reference', () => assert.ok(ref, `${G}/${name}/embed.json is missing (cmake unpacks the archives)`));

            it(`${N_REQ} concurrent embeddings.create equal each alone`, async () => {
                const oa = client(srv.base);
                const texts = ref.texts.map((t, i) => ({ ...t, i }));
                const run = async (j) => {
                    const ts = pick(texts, j, REP);
                    const r = await oa.embeddings.create({ model: name, input: ts.map((t) => t.text), encoding_format: 'float' });
                    return { r, ts };
                };
                await batchedEqualsAlone(srv.base, run, ({ r, ts }, want, what) => {
                    assert.equal(r.data.length, ts.length, what);
                    r.data.forEach((d, i) => {
                        assert.equal(d.index, i, what);
                        close(d.embedding, want.r.data[i].embedding, `${what} input ${i}`, 1e-5);
                        close(d.embedding, ts[i].embedding, `${what} input ${i} vs reference`, 1e-4);
                    });
                    assert.equal(r.usage.prompt_tokens, ts.reduce((s, t) => s + t.ids.length, 0), `${what} usage`);
                    assert.deepEqual(r.usage, want.r.usage, `${what} usage alone`);
                });
            });

            it('requests whose clients hang up while queued leave the queue; the others are answered', async () => {
                if (name !== 'bert_st') return;
                const texts = ref.texts.map((t) => t.text);
                const big = Array.from({ length: 2048 }, (_, i) => texts[i % texts.length]);
                const body = JSON.stringify({ input: texts.slice(0, 2) });
                let dropped = 0;
                for (let round = 0; round < 4 && dropped === 0; round++) {
                    const r0 = await metric(srv.base, 'mlxcel_embed_batch_requests_total');
                    const long = post(srv.base, '/v1/embeddings', { input: big, encoding_format: 'float' });
                    // until its batch has started (counted before its forward runs)
                    for (let i = 0; i < 500 && await metric(srv.base, 'mlxcel_embed_batch_requests_total') === r0; i++)
                        await sleep(5);
                    // sent whole, then half-closed: nobody will read the answer
                    const gone = await Promise.all(Array.from({ length: 6 }, () => rawRequest(srv.port,
                        httpBytes({ path: '/v1/embeddings', headers: { 'content-type': 'application/json' }, body }),
                        { end: true, timeout: 30_000 * SLOW })));
                    const lr = await long;
                    assert.equal(lr.status, 200, lr.text);
                    assert.equal(lr.json.data.length, big.length);
                    const ok = await post(srv.base, '/v1/embeddings', { input: texts.slice(0, 2) });
                    assert.equal(ok.status, 200, ok.text);
                    const ran = await metric(srv.base, 'mlxcel_embed_batch_requests_total') - r0;
                    dropped = 6 + 2 - ran;
                    assert.ok(dropped >= 0 && gone.length === 6, `ran ${ran}`);
                }
                assert.ok(dropped > 0, 'no hung-up request left the queue');
            });

            it('a bad request among concurrent ones is answered 400 alone', async () => {
                const oa = client(srv.base);
                const texts = ref.texts.map((t) => t.text);
                const bodies = Array.from({ length: 8 }, (_, j) => (j === 3 ? { input: [texts[0], ''] }
                    : j === 5 ? { input: [[0, ref.texts.length > 0 ? 1 << 30 : 0]] } : { input: pick(texts, j) }));
                const res = await Promise.all(bodies.map((b) => post(srv.base, '/v1/embeddings', b)));
                res.forEach((r, j) => assert.equal(r.status, j === 3 || j === 5 ? 400 : 200, `request ${j}: ${r.text}`));
                const solo = await oa.embeddings.create({ input: pick(texts, 2), encoding_format: 'float' });
                res[2].json.data.forEach((d, i) => close(d.embedding, solo.data[i].embedding, `request 2 input ${i}`, 1e-5));
            });
        });
    }

    describe('bert_ce: /v1/rerank', () => {
        const ref = load('bert_ce');
        let srv;
        before(async () => { srv = await startServer(['-m', join(G, 'bert_ce')]); });
        after(async () => { if (srv) await srv.stop(); });

        it('has its reference', () => assert.ok(ref, `${G}/bert_ce/embed.json is missing`));

        it(`${N_REQ} concurrent fetch /v1/rerank equal each alone`, async () => {
            // each request: one query of the reference, a mix of its documents
            const docs = ref.pairs.map((p) => p[1]);
            const run = async (j) => {
                const query = ref.pairs[j % ref.pairs.length][0];
                const documents = pick(docs, j, REP);
                const r = await post(srv.base, '/v1/rerank', { query, documents, return_documents: false });
                assert.equal(r.status, 200, r.text);
                return { r: r.json, query, documents };
            };
            await batchedEqualsAlone(srv.base, run, ({ r, query, documents }, want, what) => {
                assert.equal(r.results.length, documents.length, what);
                const byIndex = (x) => Object.fromEntries(x.results.map((e) => [e.index, e.relevance_score]));
                const got = byIndex(r), solo = byIndex(want.r);
                for (let i = 0; i < documents.length; i++) {
                    close([got[i]], [solo[i]], `${what} document ${i}`, 1e-5);
                    // the reference's score of the same pair
                    const k = ref.pairs.findIndex((p) => p[0] === query && p[1] === documents[i]);
                    if (k >= 0)
                        close([got[i]], [ref.scores[k]], `${what} document ${i} vs reference`, 1e-4);
                }
                // the order: highest score first, each document once. Scores that agree within
                // the tolerance (a document given twice: batched, its copies may round apart in
                // the last bits) may rank either way, so the order is checked against the scores
                // alone rather than against the alone run's order
                const order = r.results.map((e) => e.index);
                assert.deepEqual([...order].sort((a, b) => a - b), [...documents.keys()], `${what} order: each once`);
                for (let i = 1; i < order.length; i++) {
                    const a = order[i - 1], b = order[i];
                    assert.ok(got[a] >= got[b], `${what} order at ${i}: ${got[a]} before ${got[b]}`);
                    assert.ok(solo[a] >= solo[b] - 1e-5 * Math.max(1, Math.abs(solo[b])),
                        `${what} order at ${i}: alone, ${solo[a]} ranks below ${solo[b]}`);
                }
                assert.deepEqual(r.usage, want.r.usage, `${what} usage`);
            });
        });
    });
});
