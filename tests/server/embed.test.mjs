// Embeddings and reranking on `mlxcel serve` (issue 44, ADR 0084):
//  - the bert_st golden (tests/fixtures/golden/bert_st, unpacked by cmake): the official
//    `openai` client's embeddings.create with token-id inputs (its default base64 encoding and
//    "float") equals the float64 sentence-transformers reference within 1e-4; dimensions
//    truncates and renormalizes; usage counts the tokens; bad inputs are 400s in OpenAI's shape;
//    chat answers 400 naming the model;
//  - a BERT with the llama-tiny tokenizer (`mlxcel synth`): a string equals its token ids (the
//    ids /tokenize gives with the template's special tokens), an array of strings equals each
//    alone;
//  - a BERT cross-encoder (synth, same tokenizer): /v1/rerank and /rerank sort by
//    relevance_score (sigmoid scores in (0, 1)), top_n, return_documents, and equal
//    `mlxcel rerank` of the same query and documents;
//  - llama-tiny (a generating model) answers both endpoints with a 400.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.MLXCEL_BIN;
const GOLDEN = 'tests/fixtures/golden/bert_st';
const work = mkdtempSync(join(tmpdir(), 'mlxcel-embed-'));
const bertDir = join(work, 'bert');
const ceDir = join(work, 'ce');
const bertCfg = {
    model_type: 'bert', vocab_size: 2048, hidden_size: 64, num_hidden_layers: 2,
    num_attention_heads: 4, intermediate_size: 128, max_position_embeddings: 64, type_vocab_size: 2,
};
const synth = (dir, cfg) => {
    const p = join(work, `${dir.split('/').pop()}.json`);
    writeFileSync(p, JSON.stringify(cfg));
    execFileSync(BIN, ['synth', '-c', p, '-o', dir, '--seed', '11', '--tokenizer', 'models/llama-tiny'],
        { stdio: ['ignore', 'ignore', 'inherit'] });
};
if (BIN) {
    synth(bertDir, { ...bertCfg, architectures: ['BertModel'] });
    synth(ceDir, { ...bertCfg, architectures: ['BertForSequenceClassification'], id2label: { 0: 'LABEL_0' } });
}
const { startServer, client, post, assertError, SLOW } = await import('./harness.mjs');

const ref = existsSync(join(GOLDEN, 'embed.json')) ? JSON.parse(readFileSync(join(GOLDEN, 'embed.json'), 'utf8')) : null;

function close(got, want, what) {
    assert.equal(got.length, want.length, `${what}: length`);
    const mr = Math.max(...want.map(Math.abs));
    const md = Math.max(...got.map((g, i) => Math.abs(g - want[i])));
    assert.ok(md <= 1e-4 * mr, `${what}: max difference ${md} over max ${mr}`);
}
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

describe('embeddings and rerank on serve', { timeout: 300_000 * SLOW }, () => {
    after(() => rmSync(work, { recursive: true, force: true }));

    describe('golden BERT (sentence-transformers folder)', () => {
        let srv;
        before(async () => { srv = await startServer(['-m', GOLDEN]); });
        after(async () => { if (srv) await srv.stop(); });

        it('has its reference', () => assert.ok(ref, `${GOLDEN}/embed.json is missing (cmake unpacks the golden archives)`));

        it('openai embeddings.create: token ids, base64 and float, equal the reference', async () => {
            const oa = client(srv.base);
            const texts = ref.texts.slice(0, 6);
            for (const fmt of [undefined, 'float']) {
                const r = await oa.embeddings.create({ model: 'bert_st', input: texts.map((t) => t.ids),
                    ...(fmt ? { encoding_format: fmt } : {}) });
                assert.equal(r.object, 'list');
                assert.equal(r.data.length, texts.length);
                r.data.forEach((d, i) => {
                    assert.equal(d.index, i);
                    close(Array.from(d.embedding), texts[i].embedding, `text ${i} (${fmt || 'base64'})`);
                });
                const n = texts.reduce((s, t) => s + t.ids.length, 0);
                assert.equal(r.usage.prompt_tokens, n);
                assert.equal(r.usage.total_tokens, n);
            }
            // one token array alone
            const one = await oa.embeddings.create({ model: 'bert_st', input: texts[1].ids, encoding_format: 'float' });
            close(one.data[0].embedding, texts[1].embedding, 'a single token array');
        });

        it('dimensions keeps the first N, renormalized', async () => {
            const t = ref.texts[2];
            const r = await post(srv.base, '/v1/embeddings', { input: [t.ids], dimensions: 16 });
            assert.equal(r.status, 200, r.text);
            const v = r.json.data[0].embedding;
            assert.equal(v.length, 16);
            assert.ok(Math.abs(norm(v) - 1) < 1e-5, `norm ${norm(v)}`);
            const head = t.embedding.slice(0, 16), n = norm(head);
            close(v, head.map((x) => x / n), 'dimensions 16');
        });

        it('bad inputs are 400s in the OpenAI shape', async () => {
            const bad = [
                [{ input: [] }, 'input'],
                [{ input: [[]] }, 'input[0]'],
                [{ input: '' }, 'input'],
                [{ input: [[1, 2, 1e9]] }, 'input[0]'],
                [{ input: [[1, 2.5]] }, 'input[0]'],
                [{ input: [{ a: 1 }] }, 'input[0]'],
                [{ input: 5 }, 'input'],
                [{ input: [[2, 3]], encoding_format: 'hex' }, 'encoding_format'],
                [{ input: [[2, 3]], dimensions: 0 }, 'dimensions'],
                [{ input: [[2, 3]], dimensions: 65 }, 'dimensions'],
                [{ input: Array.from({ length: 2049 }, () => [2, 3]) }, 'input'],
                [{ input: [Array.from({ length: 400 }, () => 5)], truncate: false }, 'input[0]'],
            ];
            for (const [body, param] of bad)
                assertError(await post(srv.base, '/v1/embeddings', body), 400, JSON.stringify(body).slice(0, 80), { param });
            assertError(await post(srv.base, '/v1/embeddings', { model: 'other', input: [[2, 3]] }), 404, 'another model',
                { param: 'model', code: 'model_not_found' });
            // too long is truncated by default (sentence-transformers' rule): 128 tokens counted
            const r = await post(srv.base, '/v1/embeddings', { input: [Array.from({ length: 400 }, () => 5)] });
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.usage.prompt_tokens, 128);
        });

        it('chat and rerank answer 400 naming the model; the server keeps serving', async () => {
            const c = await post(srv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] });
            const e = assertError(c, 400, 'chat on an embedding model');
            assert.match(e.message, /bert_st/);
            assertError(await post(srv.base, '/v1/rerank', { query: 'a', documents: ['b'] }), 400, 'rerank on an embedder');
            const r = await post(srv.base, '/v1/embeddings', { input: [ref.texts[0].ids] });
            assert.equal(r.status, 200);
        });
    });

    describe('texts through the tokenizer', () => {
        let srv;
        before(async () => { srv = await startServer(['-m', bertDir]); });
        after(async () => { if (srv) await srv.stop(); });

        it('a string equals its token ids; an array of strings equals each alone', async () => {
            const texts = ['ROMEO: hello there', 'a', 'JULIET: and what of the night, the long night?'];
            const ids = [];
            for (const t of texts) {
                const r = await post(srv.base, '/tokenize', { content: t, add_special: true });
                assert.equal(r.status, 200, r.text);
                ids.push(r.json.tokens);
            }
            const byIds = await post(srv.base, '/v1/embeddings', { input: ids });
            const byText = await post(srv.base, '/v1/embeddings', { input: texts });
            assert.equal(byText.status, 200, byText.text);
            for (let i = 0; i < texts.length; i++) {
                close(byText.json.data[i].embedding, byIds.json.data[i].embedding, `text ${i}`);
                const one = await post(srv.base, '/v1/embeddings', { input: texts[i] });
                close(one.json.data[0].embedding, byText.json.data[i].embedding, `text ${i} alone`);
            }
            assert.equal(byText.json.usage.prompt_tokens, ids.reduce((s, x) => s + x.length, 0));
        });

        it('8 concurrent requests each equal their solo answer; /health answers meanwhile', async () => {
            const bodies = Array.from({ length: 8 }, (_, i) => ({ input: [`ROMEO ${i}: `.repeat(i + 1), 'x'.repeat(3 * i + 1)] }));
            const solo = [];
            for (const b of bodies) solo.push((await post(srv.base, '/v1/embeddings', b)).json);
            const [all, health] = await Promise.all([
                Promise.all(bodies.map((b) => post(srv.base, '/v1/embeddings', b))),
                fetch(srv.base + '/health').then((r) => r.status),
            ]);
            assert.equal(health, 200);
            all.forEach((r, i) => {
                assert.equal(r.status, 200, r.text);
                r.json.data.forEach((d, j) => close(d.embedding, solo[i].data[j].embedding, `request ${i} input ${j}`));
            });
        });
    });

    describe('cross-encoder', () => {
        let srv;
        before(async () => { srv = await startServer(['-m', ceDir]); });
        after(async () => { if (srv) await srv.stop(); });
        const query = 'who is the first citizen';
        const docs = ['First Citizen: Before we proceed any further, hear me speak.', 'We know it, we know it.',
            'Let us kill him, and we will have corn at our own price.', 'Hello.', 'What authority surfeits on'];

        it('/v1/rerank and /rerank sort by score; top_n; return_documents; equal mlxcel rerank', async () => {
            const r = await post(srv.base, '/v1/rerank', { model: 'ce', query, documents: docs });
            assert.equal(r.status, 200, r.text);
            const res = r.json.results;
            assert.equal(res.length, docs.length);
            assert.deepEqual([...res.map((x) => x.index)].sort(), [0, 1, 2, 3, 4]);
            for (let i = 1; i < res.length; i++) assert.ok(res[i - 1].relevance_score >= res[i].relevance_score);
            for (const x of res) {
                assert.ok(x.relevance_score > 0 && x.relevance_score < 1, 'sigmoid of one label');
                assert.equal(x.document.text, docs[x.index]);
            }
            assert.ok(r.json.usage.total_tokens > 0);
            const t = await post(srv.base, '/rerank', { query, documents: docs.map((d) => ({ text: d })), top_n: 2,
                return_documents: false });
            assert.equal(t.status, 200, t.text);
            assert.deepEqual(t.json.results.map((x) => x.index), res.slice(0, 2).map((x) => x.index));
            assert.equal(t.json.results[0].document, undefined);
            writeFileSync(join(work, 'docs.txt'), docs.join('\n') + '\n');
            const cli = JSON.parse(execFileSync(BIN, ['rerank', '-m', ceDir, '-q', query, '-f', join(work, 'docs.txt'),
                '--json'], { encoding: 'utf8' }));
            assert.deepEqual(cli.results.map((x) => x.index), res.map((x) => x.index));
            cli.results.forEach((x, i) => assert.ok(Math.abs(x.relevance_score - res[i].relevance_score) < 1e-6));
        });

        it('bad requests are 400s', async () => {
            for (const [body, param] of [[{ documents: ['a'] }, 'query'], [{ query: 'q', documents: [] }, 'documents'],
                [{ query: 'q', documents: [5] }, 'documents[0]'], [{ query: 'q', documents: ['a'], top_n: 0 }, 'top_n']])
                assertError(await post(srv.base, '/v1/rerank', body), 400, JSON.stringify(body), { param });
            assertError(await post(srv.base, '/v1/embeddings', { input: 'x' }), 400, 'embeddings on a reranker');
        });
    });

    describe('a generating model', () => {
        let srv;
        before(async () => { srv = await startServer([]); });
        after(async () => { if (srv) await srv.stop(); });
        it('answers /v1/embeddings and /v1/rerank with 400', async () => {
            assertError(await post(srv.base, '/v1/embeddings', { input: 'hi' }), 400, 'embeddings on llama-tiny');
            assertError(await post(srv.base, '/v1/rerank', { query: 'a', documents: ['b'] }), 400, 'rerank on llama-tiny');
        });
    });
});
