// Decoder embedding models and the LM reranker on `mlxcel serve` (issue 44, ADR 0097 / 0098),
// against the float64 references of tests/fixtures/gen/gen_embed_dec.py (unpacked by cmake):
//  - qwen3_emb (Qwen3-Embedding's shape: causal, last-token pooling): the official `openai`
//    client's embeddings.create on the texts (strings, through the tokenizer) equals
//    SentenceTransformer.encode within 1e-4, in one request and one text at a time; usage
//    counts the reference's tokens; chat answers 400 naming /v1/embeddings;
//  - embgemma (EmbeddingGemma's shape: bidirectional, mean pooling, two Dense layers): the
//    same through base64 (the client's default);
//  - qwen3_rr with --reranker qwen3: /v1/rerank and /rerank give the model card's P(yes)
//    for each document (best first), equal to `mlxcel rerank --reranker qwen3 --json`; without
//    the flag the folder is a causal LM and answers /v1/rerank with 400;
//  - qwen3_rr converted to Qwen3ForSequenceClassification (tests/cli/make_seqcls_checkpoint.py,
//    as vLLM's convert_model_to_seq_cls.py; ADR 0136): /v1/rerank gives the same P(yes) with no
//    flag, and chat answers 400 naming /v1/rerank.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.MLXCEL_BIN;
const G = 'tests/fixtures/golden';
const load = (c) => existsSync(join(G, c, 'embed.json')) ? JSON.parse(readFileSync(join(G, c, 'embed.json'), 'utf8')) : null;
const refs = { qwen3_emb: load('qwen3_emb'), embgemma: load('embgemma'), qwen3_rr: load('qwen3_rr') };
const work = mkdtempSync(join(tmpdir(), 'mlxcel-embdec-'));
const { startServer, client, post, assertError, SLOW } = await import('./harness.mjs');

function close(got, want, what, tol = 1e-4) {
    assert.equal(got.length, want.length, `${what}: length`);
    const mr = Math.max(...want.map(Math.abs));
    const md = Math.max(...got.map((g, i) => Math.abs(g - want[i])));
    assert.ok(md <= tol * mr, `${what}: max difference ${md} over max ${mr}`);
}

describe('decoder embedding models and the LM reranker on serve', { timeout: 300_000 * SLOW }, () => {
    after(() => rmSync(work, { recursive: true, force: true }));

    for (const [name, fmt] of [['qwen3_emb', 'float'], ['embgemma', undefined]]) {
        describe(name, () => {
            let srv;
            const ref = refs[name];
            before(async () => { srv = await startServer(['-m', join(G, name)]); });
            after(async () => { if (srv) await srv.stop(); });

            it('has its reference', () => assert.ok(ref, `${G}/${name}/embed.json is missing (cmake unpacks the archives)`));

            it('openai embeddings.create on texts equals SentenceTransformer.encode', async () => {
                const oa = client(srv.base);
                const texts = ref.texts.map((t) => t.text);
                const r = await oa.embeddings.create({ model: name, input: texts, ...(fmt ? { encoding_format: fmt } : {}) });
                assert.equal(r.data.length, texts.length);
                r.data.forEach((d, i) => close(Array.from(d.embedding), ref.texts[i].embedding, `text ${i}`));
                const n = ref.texts.reduce((s, t) => s + t.ids.length, 0);
                assert.equal(r.usage.prompt_tokens, n);
                for (const i of [0, 7]) {
                    const one = await oa.embeddings.create({ model: name, input: texts[i], encoding_format: 'float' });
                    close(one.data[0].embedding, ref.texts[i].embedding, `text ${i} alone`);
                }
            });

            it('chat answers 400 naming /v1/embeddings; the server keeps serving', async () => {
                const e = assertError(await post(srv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }),
                    400, 'chat on an embedding model');
                assert.match(e.message, /\/v1\/embeddings/);
                const r = await post(srv.base, '/v1/embeddings', { input: 'Hello.' });
                assert.equal(r.status, 200, r.text);
            });
        });
    }

    describe('qwen3_rr --reranker qwen3', () => {
        let srv;
        const ref = refs.qwen3_rr;
        // the pairs within the reference's max_length (the last one is truncated there at 128
        // tokens, here at the model's own limit)
        const n = ref ? ref.ids.filter((x) => x.length < ref.max_length).length : 0;
        const query = ref ? ref.pairs[0][0] : '';
        before(async () => { srv = await startServer(['-m', join(G, 'qwen3_rr'), '--reranker', 'qwen3']); });
        after(async () => { if (srv) await srv.stop(); });

        it('has its reference', () => assert.ok(ref && n >= 2, `${G}/qwen3_rr/embed.json is missing`));

        it('/v1/rerank and /rerank give the model card\'s P(yes), best first, as mlxcel rerank does', async () => {
            const idx = ref.pairs.map((p, i) => i).filter((i) => i < n && ref.pairs[i][0] === query);
            const docs = idx.map((i) => ref.pairs[i][1]);
            const r = await post(srv.base, '/v1/rerank', { query, documents: docs });
            assert.equal(r.status, 200, r.text);
            const res = r.json.results;
            assert.equal(res.length, docs.length);
            for (let i = 1; i < res.length; i++) assert.ok(res[i - 1].relevance_score >= res[i].relevance_score);
            for (const x of res) {
                const want = ref.scores[idx[x.index]];
                assert.ok(Math.abs(x.relevance_score - want) <= 1e-4 * Math.max(Math.abs(want), 1e-6),
                    `document ${x.index}: ${x.relevance_score} vs ${want}`);
            }
            const t = await post(srv.base, '/rerank', { query, documents: docs, top_n: 1, return_documents: false });
            assert.equal(t.status, 200, t.text);
            assert.equal(t.json.results[0].index, res[0].index);
            writeFileSync(join(work, 'docs.txt'), docs.join('\n') + '\n');
            const cli = JSON.parse(execFileSync(BIN, ['rerank', '-m', join(G, 'qwen3_rr'), '--reranker', 'qwen3', '-q', query,
                '-f', join(work, 'docs.txt'), '--json'], { encoding: 'utf8' }));
            assert.deepEqual(cli.results.map((x) => x.index), res.map((x) => x.index));
            cli.results.forEach((x, i) => assert.ok(Math.abs(x.relevance_score - res[i].relevance_score) < 1e-6));
            assertError(await post(srv.base, '/v1/embeddings', { input: 'x' }), 400, 'embeddings on a reranker');
            const c = assertError(await post(srv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }),
                400, 'chat on a reranker');
            assert.match(c.message, /\/v1\/rerank/);
        });
    });

    describe('qwen3_rr converted to Qwen3ForSequenceClassification', () => {
        let srv;
        const ref = refs.qwen3_rr;
        const dir = join(work, 'seqcls');
        before(async () => {
            execFileSync('python3', ['tests/cli/make_seqcls_checkpoint.py', join(G, 'qwen3_rr'), dir]);
            srv = await startServer(['-m', dir]);
        });
        after(async () => { if (srv) await srv.stop(); });
        it('/v1/rerank gives the model card\'s P(yes) without a flag', async () => {
            const n = ref.ids.filter((x) => x.length < ref.max_length).length;
            const query = ref.pairs[0][0];
            const idx = ref.pairs.map((p, i) => i).filter((i) => i < n && ref.pairs[i][0] === query);
            const r = await post(srv.base, '/v1/rerank', { query, documents: idx.map((i) => ref.pairs[i][1]) });
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.results.length, idx.length);
            for (const x of r.json.results) {
                const want = ref.scores[idx[x.index]];
                assert.ok(Math.abs(x.relevance_score - want) <= 1e-4 * Math.max(Math.abs(want), 1e-6),
                    `document ${x.index}: ${x.relevance_score} vs ${want}`);
            }
            const c = assertError(await post(srv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }),
                400, 'chat on a converted reranker');
            assert.match(c.message, /\/v1\/rerank/);
        });
    });

    describe('qwen3_rr without the flag', () => {
        let srv;
        before(async () => { srv = await startServer(['-m', join(G, 'qwen3_rr')]); });
        after(async () => { if (srv) await srv.stop(); });
        it('is a causal LM: /v1/rerank answers 400', async () => {
            assertError(await post(srv.base, '/v1/rerank', { query: 'a', documents: ['b'] }), 400, 'rerank on an LM');
        });
    });
});
