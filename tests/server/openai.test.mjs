// /v1/chat/completions and /v1/completions through the official `openai`
// client (and raw fetch for the SSE framing), on the default model: response
// shapes and usage, finish_reason 'length', greedy determinism, content parts,
// streaming == non-streaming (deltas, role, one finish_reason, include_usage),
// completions (echo, token-id prompts, suffix rejected, streaming), stop
// strings (also across token boundaries, also streamed), seeded sampling,
// logprobs (chat and completions), n > 1, and the context-length errors.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, CONTEXT, SLOW, startServer, client, post, parseSSE, assertError } from './harness.mjs';

// usage without the prefix-cache counts, which a repeated prompt changes
const noCache = (u) => { if (!u) return u; const { prompt_tokens_details, input_tokens_details, ...r } = u; return r; };
import { prng } from './fuzzgen.mjs';

let srv;
let api;

const user = (content) => [{ role: 'user', content }];
const chat = (content, extra = {}) => api.chat.completions.create({
    model: MODEL, messages: user(content), temperature: 0, max_tokens: 16, ...extra,
});
const complete = (prompt, extra = {}) => api.completions.create({
    model: MODEL, prompt, temperature: 0, max_tokens: 8, ...extra,
});

async function collect(stream, limit = 2000) {
    const chunks = [];
    for await (const c of stream) {
        chunks.push(c);
        assert.ok(chunks.length <= limit, 'too many chunks');
    }
    return chunks;
}

function checkUsage(u, maxTokens) {
    assert.ok(u, 'usage missing');
    for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
        assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `usage.${k}: ${JSON.stringify(u)}`);
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens, JSON.stringify(u));
    assert.ok(u.prompt_tokens > 0, JSON.stringify(u));
    if (maxTokens !== undefined) assert.ok(u.completion_tokens <= maxTokens, JSON.stringify(u));
}

// A slice S of t (len 2..4) whose first occurrence starts at index >= 4, near frac of t.
function pickStop(t, frac, len = 3) {
    for (let d = 0; d < t.length; d++) {
        for (const p of [Math.floor(t.length * frac) + d, Math.floor(t.length * frac) - d]) {
            if (p < 4 || p + len > t.length) continue;
            const s = t.slice(p, p + len);
            if (t.indexOf(s) >= 4) return s;
        }
    }
    return null;
}

describe('openai API', { timeout: 300_000 * SLOW }, () => {
    before(async () => {
        srv = await startServer();
        api = client(srv.base);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('chat completion: shape and usage', async () => {
        const c = await chat('ROMEO:');
        assert.equal(typeof c.id, 'string');
        assert.ok(c.id.length > 0);
        assert.equal(c.object, 'chat.completion');
        assert.ok(Number.isInteger(c.created), `created: ${c.created}`);
        assert.ok(Math.abs(c.created - Date.now() / 1000) < 3600, `created is a Unix time in seconds: ${c.created}`);
        assert.equal(typeof c.model, 'string');
        assert.equal(c.choices.length, 1);
        const ch = c.choices[0];
        assert.equal(ch.index, 0);
        assert.equal(ch.message.role, 'assistant');
        assert.equal(typeof ch.message.content, 'string');
        assert.ok(['stop', 'length'].includes(ch.finish_reason), ch.finish_reason);
        checkUsage(c.usage, 16);
        if (ch.finish_reason === 'length') assert.equal(c.usage.completion_tokens, 16);
        // issue 39 item 9: the fields OpenAI's message and response carry
        assert.equal(ch.message.refusal, null);
        assert.deepEqual(ch.message.annotations, []);
        assert.match(c.system_fingerprint, /^fp_[0-9a-f]{12}$/);
        const chunks = await collect(await chat('ROMEO:', { stream: true, max_tokens: 3 }));
        assert.ok(chunks.every((k) => k.system_fingerprint === c.system_fingerprint), JSON.stringify(chunks[0]));
        assert.equal(chunks[0].choices[0].delta.refusal, null);
    });

    it('max_tokens 3 -> finish_reason length, 3 completion tokens', async () => {
        const c = await chat('ROMEO:', { max_tokens: 3 });
        assert.equal(c.choices[0].finish_reason, 'length');
        assert.equal(c.usage.completion_tokens, 3);
        checkUsage(c.usage, 3);
        // max_completion_tokens is the newer name of the same limit
        const d = await chat('ROMEO:', { max_tokens: undefined, max_completion_tokens: 3 });
        assert.equal(d.choices[0].finish_reason, 'length');
        assert.equal(d.usage.completion_tokens, 3);
        assert.equal(d.choices[0].message.content, c.choices[0].message.content);
    });

    it('greedy is deterministic; content parts == plain string', async () => {
        const a = await chat('ROMEO:');
        const b = await chat('ROMEO:');
        assert.equal(a.choices[0].message.content, b.choices[0].message.content);
        const p = await api.chat.completions.create({
            model: MODEL, temperature: 0, max_tokens: 16,
            messages: [{ role: 'user', content: [{ type: 'text', text: 'ROM' }, { type: 'text', text: 'EO:' }] }],
        });
        assert.equal(p.choices[0].message.content, a.choices[0].message.content);
        assert.deepEqual(noCache(p.usage), noCache(a.usage));
    });

    it('streamed chat == non-streamed chat', async () => {
        const ref = await chat('JULIET:');
        const chunks = await collect(await chat('JULIET:', { stream: true, stream_options: { include_usage: true } }));
        assert.ok(chunks.length >= 2, `${chunks.length} chunks`);
        const id = chunks[0].id;
        let text = '';
        let finishes = [];
        for (const [i, c] of chunks.entries()) {
            assert.equal(c.object, 'chat.completion.chunk', JSON.stringify(c));
            assert.equal(c.id, id, 'every chunk has the same id');
            assert.ok(Number.isInteger(c.created), JSON.stringify(c));
            assert.equal(typeof c.model, 'string');
            if (i < chunks.length - 1) {
                assert.equal(c.choices.length, 1, JSON.stringify(c));
                assert.ok(c.usage === undefined || c.usage === null, `usage only on the last chunk: ${JSON.stringify(c)}`);
                const ch = c.choices[0];
                assert.equal(ch.index, 0);
                if (typeof ch.delta.content === 'string') text += ch.delta.content;
                if (ch.finish_reason !== null && ch.finish_reason !== undefined) finishes.push(ch.finish_reason);
            }
        }
        assert.equal(chunks[0].choices[0].delta.role, 'assistant', JSON.stringify(chunks[0]));
        assert.deepEqual(finishes, [ref.choices[0].finish_reason], 'exactly one finish_reason, the non-streamed one');
        assert.equal(text, ref.choices[0].message.content);
        const last = chunks[chunks.length - 1];
        assert.deepEqual(last.choices, [], `usage chunk: ${JSON.stringify(last)}`);
        assert.deepEqual(noCache(last.usage), noCache(ref.usage));

        // without include_usage: no usage anywhere, same text
        const plain = await collect(await chat('JULIET:', { stream: true }));
        assert.ok(plain.every((c) => c.usage === undefined || c.usage === null), 'no usage without include_usage');
        assert.equal(plain.map((c) => c.choices[0]?.delta?.content ?? '').join(''), ref.choices[0].message.content);
    });

    it('SSE framing on the wire', async () => {
        const body = { model: MODEL, messages: user('ROMEO:'), temperature: 0, max_tokens: 8, stream: true };
        const r = await post(srv.base, '/v1/chat/completions', body);
        assert.equal(r.status, 200, r.text);
        assert.match(r.headers.get('content-type') || '', /^text\/event-stream/);
        const events = parseSSE(r.text, 'chat stream');
        assert.ok(events.length >= 2);
        const ref = await chat('ROMEO:', { max_tokens: 8 });
        assert.equal(events.map((e) => e.choices[0]?.delta?.content ?? '').join(''), ref.choices[0].message.content);

        const c = await post(srv.base, '/v1/completions',
            { model: MODEL, prompt: 'ROMEO:', temperature: 0, max_tokens: 8, stream: true });
        assert.equal(c.status, 200, c.text);
        assert.match(c.headers.get('content-type') || '', /^text\/event-stream/);
        parseSSE(c.text, 'completions stream');
    });

    it('completions: shape, echo, token-id prompt, suffix rejected, streaming', async () => {
        const c = await complete('ROMEO:');
        assert.equal(c.object, 'text_completion');
        assert.equal(typeof c.id, 'string');
        assert.ok(Number.isInteger(c.created));
        assert.equal(c.choices.length, 1);
        assert.equal(c.choices[0].index, 0);
        assert.equal(typeof c.choices[0].text, 'string');
        assert.ok(['stop', 'length'].includes(c.choices[0].finish_reason));
        checkUsage(c.usage, 8);
        const text = c.choices[0].text;

        const e = await complete('ROMEO:', { echo: true });
        assert.ok(e.choices[0].text.startsWith('ROMEO:'), JSON.stringify(e.choices[0].text));
        assert.equal(e.choices[0].text, 'ROMEO:' + text);

        const tok = await post(srv.base, '/tokenize', { content: 'ROMEO:' });
        assert.equal(tok.status, 200, tok.text);
        const ids = await complete(tok.json.tokens);
        assert.equal(ids.choices[0].text, text);
        assert.deepEqual(noCache(ids.usage), noCache(c.usage));

        const s = await post(srv.base, '/v1/completions', { model: MODEL, prompt: 'ROMEO:', max_tokens: 8, suffix: 'x' });
        assertError(s, 400, 'suffix');

        const chunks = await collect(await complete('ROMEO:', { stream: true }));
        for (const ch of chunks) assert.equal(ch.object, 'text_completion', JSON.stringify(ch));
        assert.equal(chunks.map((ch) => ch.choices[0]?.text ?? '').join(''), text);
        const fin = chunks.filter((ch) => ch.choices[0]?.finish_reason);
        assert.equal(fin.length, 1, 'exactly one finish_reason');
        assert.equal(fin[0].choices[0].finish_reason, c.choices[0].finish_reason);

        // echo streamed: the prompt comes first, as in the non-streamed answer
        const echoed = await collect(await complete('ROMEO:', { echo: true, stream: true }));
        assert.equal(echoed.map((ch) => ch.choices[0]?.text ?? '').join(''), e.choices[0].text, 'streamed echo');
    });

    it('stop strings, non-streamed and streamed', async () => {
        const full = await chat('ROMEO:', { max_tokens: 32, logprobs: true });
        const t = full.choices[0].message.content;
        assert.ok(t.length >= 12, `greedy text too short for the test: ${JSON.stringify(t)}`);
        const cases = [];
        const s1 = pickStop(t, 0.5, 3);
        assert.ok(s1, `no stop candidate in ${JSON.stringify(t)}`);
        cases.push([s1]);
        // several strings: the earliest match wins whatever the list order
        const s2 = pickStop(t, 0.75, 2);
        const s3 = pickStop(t, 0.3, 4);
        if (s2 && s3) cases.push([s2, 'zzzzqqq', s3]);
        // a stop string across a token boundary
        const toks = (full.choices[0].logprobs?.content ?? []).map((x) => x.token);
        let off = 0;
        for (let i = 0; i + 1 < toks.length; i++) {
            off += toks[i].length;
            if (off >= 6 && toks[i].length >= 2 && toks[i + 1].length >= 2) {
                const s = t.slice(off - 2, off + 2);
                if (t.indexOf(s) >= 4) { cases.push([s]); break; }
            }
        }
        for (const stop of cases) {
            const at = Math.min(...stop.map((s) => t.indexOf(s)).filter((i) => i >= 0));
            const want = t.slice(0, at);
            const c = await chat('ROMEO:', { max_tokens: 32, stop });
            assert.equal(c.choices[0].message.content, want, `stop ${JSON.stringify(stop)} in ${JSON.stringify(t)}`);
            assert.equal(c.choices[0].finish_reason, 'stop');
            checkUsage(c.usage, 32);
            const chunks = await collect(await chat('ROMEO:', { max_tokens: 32, stop, stream: true }));
            let got = '';
            for (const ch of chunks) {
                const d = ch.choices[0]?.delta?.content ?? '';
                for (const s of stop) assert.ok(!d.includes(s), `a chunk holds the stop string ${JSON.stringify(s)}`);
                got += d;
            }
            assert.equal(got, want, `streamed stop ${JSON.stringify(stop)}`);
            for (const s of stop) assert.ok(!got.includes(s));
            assert.equal(chunks.filter((ch) => ch.choices[0]?.finish_reason).map((ch) => ch.choices[0].finish_reason).join(), 'stop');
        }
        // a single string (not an array) is a stop too; completions honour stop
        const one = await chat('ROMEO:', { max_tokens: 32, stop: s1 });
        assert.equal(one.choices[0].message.content, t.slice(0, t.indexOf(s1)));
        const comp = await complete('ROMEO:', { max_tokens: 32 });
        const ct = comp.choices[0].text;
        const cs = pickStop(ct, 0.5, 3);
        if (cs) {
            const cc = await complete('ROMEO:', { max_tokens: 32, stop: [cs] });
            assert.equal(cc.choices[0].text, ct.slice(0, ct.indexOf(cs)));
            assert.equal(cc.choices[0].finish_reason, 'stop');
        }
    });

    it('seeded sampling is reproducible', async () => {
        const a = await chat('ROMEO:', { temperature: 1, seed: 42 });
        const b = await chat('ROMEO:', { temperature: 1, seed: 42 });
        assert.equal(a.choices[0].message.content, b.choices[0].message.content);
        const c = await complete('ROMEO:', { temperature: 1, seed: 42, max_tokens: 16 });
        const d = await complete('ROMEO:', { temperature: 1, seed: 42, max_tokens: 16 });
        assert.equal(c.choices[0].text, d.choices[0].text);
    });

    it('chat logprobs', async () => {
        const c = await chat('ROMEO:', { logprobs: true, top_logprobs: 3 });
        const content = c.choices[0].message.content;
        const lp = c.choices[0].logprobs?.content;
        assert.ok(Array.isArray(lp), `logprobs.content: ${JSON.stringify(c.choices[0].logprobs)}`);
        assert.equal(lp.length, c.usage.completion_tokens, 'one entry per completion token');
        for (const e of lp) {
            assert.equal(typeof e.token, 'string');
            assert.ok(Number.isFinite(e.logprob) && e.logprob <= 0, JSON.stringify(e));
            assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256), JSON.stringify(e));
            assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token, `bytes of ${JSON.stringify(e)}`);
            assert.equal(e.top_logprobs.length, 3, JSON.stringify(e));
            for (let i = 0; i < 3; i++) {
                const t = e.top_logprobs[i];
                assert.equal(typeof t.token, 'string');
                assert.ok(Number.isFinite(t.logprob) && t.logprob <= 0, JSON.stringify(t));
                assert.ok(Array.isArray(t.bytes), JSON.stringify(t));
                if (i) assert.ok(e.top_logprobs[i - 1].logprob >= t.logprob, `sorted: ${JSON.stringify(e.top_logprobs)}`);
            }
            assert.equal(e.token, e.top_logprobs[0].token, 'greedy picks the most likely token');
            assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) <= 1e-6, JSON.stringify(e));
        }
        assert.equal(lp.map((e) => e.token).join(''), content);
        // logprobs without top_logprobs: entries, empty alternatives; without logprobs: null
        const d = await chat('ROMEO:', { logprobs: true, max_tokens: 4 });
        assert.equal(d.choices[0].logprobs.content.length, d.usage.completion_tokens);
        const n = await chat('ROMEO:', { max_tokens: 4 });
        assert.ok(n.choices[0].logprobs === null || n.choices[0].logprobs === undefined);
        // streamed logprobs concatenate to the same entries
        const chunks = await collect(await chat('ROMEO:', { logprobs: true, top_logprobs: 3, stream: true }));
        const slp = chunks.flatMap((ch) => ch.choices[0]?.logprobs?.content ?? []);
        assert.deepEqual(slp.map((e) => e.token), lp.map((e) => e.token));
        slp.forEach((e, i) => assert.ok(Math.abs(e.logprob - lp[i].logprob) <= 1e-6));
        // one token per chunk, as OpenAI streams (a fast engine does not merge tokens into one event)
        const per = chunks.map((ch) => ch.choices[0]?.logprobs?.content?.length ?? 0).filter((k) => k > 0);
        assert.ok(per.length > 1 && per.every((k) => k === 1), `tokens per chunk: ${JSON.stringify(per)}`);
    });

    // issue 39 item 8: tokens that split a UTF-8 character (the bias leaves only the byte tokens
    // of 'ü', so every token is half a character): each entry carries its own token's bytes, the
    // tokens concatenate to the content (the character on the token that completes it, "" before),
    // streamed entries equal the non-streamed ones, also when the output ends mid-character
    it('chat logprobs where tokens split characters: own bytes, tokens concatenate to the content', async () => {
        const ids = (await post(srv.base, '/tokenize', { content: 'ü' })).json.tokens;
        assert.equal(ids.length, 2, 'ü is two byte tokens in this vocabulary');
        const logit_bias = Object.fromEntries(ids.map((i) => [String(i), 100]));
        let splits = 0;
        for (const [temperature, max_tokens, seed] of [[0, 2, 1], [0, 5, 1], [1, 6, 2], [1, 7, 3], [1, 6, 4]]) {
            const body = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], temperature, seed, max_tokens,
                logprobs: true, top_logprobs: 2, logit_bias };
            const c = await api.chat.completions.create(body);
            const content = c.choices[0].message.content, lp = c.choices[0].logprobs.content;
            const what = `${JSON.stringify(content)} ${JSON.stringify(lp.map((e) => [e.token, e.bytes]))}`;
            assert.equal(lp.length, c.usage.completion_tokens, what);
            assert.equal(lp.map((e) => e.token).join(''), content, what);
            for (const e of lp) {
                assert.equal(e.bytes.length, 1, `each byte token's own byte: ${what}`);
                for (const t of e.top_logprobs) if (t.token !== '') assert.ok(t.bytes.length > 0, `${what} ${JSON.stringify(t)}`);
                splits += e.token === '';
            }
            if (!content.includes('\ufffd')) assert.equal(Buffer.from(lp.flatMap((e) => e.bytes)).toString('utf8'), content, what);
            const slp = (await collect(await api.chat.completions.create({ ...body, stream: true })))
                .flatMap((k) => k.choices[0]?.logprobs?.content ?? []);
            assert.deepEqual(slp.map((e) => [e.token, e.bytes]), lp.map((e) => [e.token, e.bytes]), what);
        }
        assert.ok(splits > 0);
    });

    it('chat logprobs with a stop string: the tokens run through the stop string', async () => {
        const full = await chat('First Citizen:', { max_tokens: 24, logprobs: true });
        const t = full.choices[0].message.content;
        const toks = full.choices[0].logprobs.content.map((x) => x.token);
        // a stop string that begins inside a token of two or more characters
        let off = 0;
        let stop = null;
        for (const tok of toks) {
            if (off >= 4 && tok.length >= 2 && t.indexOf(tok.slice(1)) === off + 1) { stop = tok.slice(1); break; }
            off += tok.length;
        }
        assert.ok(stop, `no token to cut in ${JSON.stringify(toks)}`);
        const c = await chat('First Citizen:', { max_tokens: 24, logprobs: true, stop: [stop] });
        const content = c.choices[0].message.content;
        assert.equal(content, t.slice(0, t.indexOf(stop)));
        // docs/server.md: the tokens are what was generated, so they run on to the end of the
        // token that completed the stop string (as vLLM's): the content, the stop string, the rest
        // of that token
        const got = c.choices[0].logprobs.content.map((x) => x.token).join('');
        assert.ok(got.startsWith(content + stop), `stop ${JSON.stringify(stop)}: logprob tokens ${JSON.stringify(c.choices[0].logprobs.content.map((x) => x.token))}`);
    });

    it('completions logprobs', async () => {
        const c = await complete('ROMEO:', { logprobs: 2 });
        const lp = c.choices[0].logprobs;
        const n = c.usage.completion_tokens;
        assert.ok(lp && typeof lp === 'object', JSON.stringify(c.choices[0]));
        assert.equal(lp.tokens.length, n, JSON.stringify(lp));
        assert.equal(lp.token_logprobs.length, n);
        assert.equal(lp.top_logprobs.length, n);
        assert.equal(lp.text_offset.length, n);
        assert.equal(lp.tokens.join(''), c.choices[0].text);
        for (let i = 0; i < n; i++) {
            assert.equal(typeof lp.tokens[i], 'string');
            assert.ok(Number.isFinite(lp.token_logprobs[i]) && lp.token_logprobs[i] <= 0);
            const top = lp.top_logprobs[i];
            assert.ok(top && typeof top === 'object' && !Array.isArray(top), JSON.stringify(top));
            const vals = Object.values(top);
            assert.ok(vals.length >= 1 && vals.length <= 2, JSON.stringify(top));
            assert.ok(vals.every((v) => Number.isFinite(v) && v <= 0), JSON.stringify(top));
            assert.ok(Math.abs(Math.max(...vals) - lp.token_logprobs[i]) <= 1e-6, `greedy: ${JSON.stringify(top)}`);
            assert.ok(Number.isInteger(lp.text_offset[i]));
            if (i) assert.equal(lp.text_offset[i] - lp.text_offset[i - 1], [...lp.tokens[i - 1]].length, 'text_offset steps by the token length');
        }
    });

    it('completions text_offset counts characters, as OpenAI and vLLM do (Python len), not bytes', async () => {
        const prompt = 'é😀x';
        const c = await complete(prompt, { logprobs: 1, echo: true, max_tokens: 6 });
        const lp = c.choices[0].logprobs;
        assert.equal(lp.text_offset[0], [...prompt].length, JSON.stringify(lp.text_offset));
        for (let i = 1; i < lp.tokens.length; i++)
            assert.equal(lp.text_offset[i] - lp.text_offset[i - 1], [...lp.tokens[i - 1]].length);
    });

    it('n: 2', async () => {
        const one = await chat('ROMEO:', { max_tokens: 8 });
        const c = await chat('ROMEO:', { max_tokens: 8, n: 2 });
        assert.equal(c.choices.length, 2);
        assert.deepEqual(c.choices.map((x) => x.index), [0, 1]);
        assert.equal(c.choices[0].message.content, c.choices[1].message.content);
        assert.equal(c.choices[0].message.content, one.choices[0].message.content);
        assert.equal(c.usage.completion_tokens, 2 * one.usage.completion_tokens);
        assert.equal(c.usage.prompt_tokens, one.usage.prompt_tokens);
        checkUsage(c.usage);
        const k = await complete('ROMEO:', { n: 2 });
        assert.deepEqual(k.choices.map((x) => x.index), [0, 1]);
        assert.equal(k.choices[0].text, k.choices[1].text);
    });

    it('context length exceeded', async () => {
        let r = await post(srv.base, '/v1/chat/completions',
            { model: MODEL, messages: user('ROMEO:'), max_tokens: CONTEXT + 88 });
        assertError(r, 400, 'max_tokens > context', { code: 'context_length_exceeded' });
        r = await post(srv.base, '/v1/chat/completions',
            { model: MODEL, messages: user('ROMEO: '.repeat(2000)), max_tokens: 4 });
        const e = assertError(r, 400, 'prompt > context', { code: 'context_length_exceeded' });
        assert.match(e.message, /\d/, 'the message gives the token counts');
        assert.match(e.message, new RegExp(String(CONTEXT)), `the message names the context (${CONTEXT}): ${e.message}`);
        r = await post(srv.base, '/v1/completions', { model: MODEL, prompt: 'ROMEO: '.repeat(2000), max_tokens: 4 });
        assertError(r, 400, 'completions prompt > context', { code: 'context_length_exceeded' });
        // and through the client
        await assert.rejects(chat('ROMEO:', { max_tokens: CONTEXT + 88 }),
            (err) => err.status === 400 && err.code === 'context_length_exceeded');
    });

    it('a partial stop-string match at the end of the output is flushed', async () => {
        const ref = await chat('ROMEO:', { max_tokens: 12 });
        const t = ref.choices[0].message.content;
        assert.equal(ref.choices[0].finish_reason, 'length');
        // the last 1-2 characters begin a stop string that never completes
        const stop = [t.slice(-1) + '\u0001\u0002', t.slice(-2) + '\u0003'];
        const c = await chat('ROMEO:', { max_tokens: 12, stop });
        assert.equal(c.choices[0].message.content, t, `held-back text lost: ${JSON.stringify(stop)}`);
        assert.equal(c.choices[0].finish_reason, 'length');
        const chunks = await collect(await chat('ROMEO:', { max_tokens: 12, stop, stream: true }));
        assert.equal(chunks.map((ch) => ch.choices[0]?.delta?.content ?? '').join(''), t, 'streamed');
    });

    it('n: 2 streamed: per-index deltas, one finish_reason each', async () => {
        const ref = await chat('ROMEO:', { max_tokens: 8, n: 2 });
        const chunks = await collect(await chat('ROMEO:', { max_tokens: 8, n: 2, stream: true, stream_options: { include_usage: true } }));
        const text = ['', ''];
        const fin = [[], []];
        const roles = [0, 0];
        for (const ch of chunks) {
            for (const x of ch.choices) {
                assert.ok(x.index === 0 || x.index === 1, JSON.stringify(ch));
                if (x.delta?.role) roles[x.index]++;
                text[x.index] += x.delta?.content ?? '';
                if (x.finish_reason) fin[x.index].push(x.finish_reason);
            }
        }
        assert.deepEqual(roles, [1, 1], 'one role delta per choice');
        assert.deepEqual(text, ref.choices.map((x) => x.message.content));
        assert.deepEqual(fin, ref.choices.map((x) => [x.finish_reason]));
        assert.deepEqual(chunks[chunks.length - 1].usage, ref.usage);
    });

    it('ids are unique; usage without max_tokens fills the context', async () => {
        const a = await chat('ROMEO:', { max_tokens: 1 });
        const b = await chat('ROMEO:', { max_tokens: 1 });
        assert.notEqual(a.id, b.id);
        const full = await chat('ROMEO:', { max_tokens: undefined });
        assert.equal(full.choices[0].finish_reason, 'length', 'this model does not stop on its own');
        assert.equal(full.usage.prompt_tokens + full.usage.completion_tokens, CONTEXT, JSON.stringify(full.usage));
    });

    it('prompt + max_tokens at the context boundary', async () => {
        const p = (await chat('ROMEO:', { max_tokens: 1 })).usage.prompt_tokens;
        const fit = await chat('ROMEO:', { max_tokens: CONTEXT - p });
        assert.equal(fit.usage.completion_tokens, CONTEXT - p, 'prompt + max_tokens == context is allowed');
        const over = await post(srv.base, '/v1/chat/completions', { model: MODEL, messages: user('ROMEO:'), max_tokens: CONTEXT - p + 1 });
        if (over.status === 200) assert.ok(over.json.usage.total_tokens <= CONTEXT, JSON.stringify(over.json.usage));
        else assertError(over, 400, 'prompt + max_tokens = context + 1', { code: 'context_length_exceeded' });
    });

    it('logit_bias steers the choice', async () => {
        const ref = await chat('ROMEO:', { max_tokens: 4, logprobs: true });
        const first = (await post(srv.base, '/tokenize', { content: ref.choices[0].logprobs.content[0].token })).json.tokens;
        assert.equal(first.length, 1, `the first token re-tokenizes to one id: ${JSON.stringify(first)}`);
        const banned = await chat('ROMEO:', { max_tokens: 4, logprobs: true, logit_bias: { [first[0]]: -100 } });
        assert.notEqual(banned.choices[0].logprobs.content[0].token, ref.choices[0].logprobs.content[0].token, '-100 bans the token');
        const forced = await chat('ROMEO:', { max_tokens: 4, logit_bias: { 818: 100 } });
        const piece = (await post(srv.base, '/detokenize', { tokens: [818] })).json.content;
        assert.equal(forced.choices[0].message.content, piece.repeat(4), '+100 forces token 818');
    });

    it('differential: 40 random valid requests, streamed == non-streamed', async () => {
        const r = prng(Number(process.env.MLXCEL_FUZZ_SEED ?? 7) >>> 0);
        const prompts = ['ROMEO:', 'JULIET:', 'First Citizen:', 'KING RICHARD III:', 'O, ', 'What say you?'];
        for (let k = 0; k < 40; k++) {
            const ep = r.chance(0.6) ? 'chat' : 'completions';
            const p = r.pick(prompts);
            const body = { model: MODEL, max_tokens: r.range(1, 24), n: r.range(1, 3) };
            if (r.chance(0.5)) body.temperature = 0; else { body.temperature = r.pick([0.5, 1, 1.5]); body.seed = r.int(1e6); }
            if (r.chance(0.3)) body.top_p = r.pick([0.5, 0.9]);
            if (r.chance(0.3)) body.top_k = r.range(1, 40);
            if (r.chance(0.2)) body.min_p = r.pick([0.05, 0.2]);
            if (r.chance(0.2)) body.presence_penalty = r.pick([-1, 0.5, 2]);
            if (r.chance(0.2)) body.frequency_penalty = r.pick([-1, 0.5, 2]);
            if (r.chance(0.2)) body.repetition_penalty = r.pick([1.1, 1.5]);
            if (r.chance(0.4)) body.stop = Array.from({ length: r.range(1, 4) }, () => r.pick(['e', 'th', ',', '\n', 'an', ' I', 'a', 'o', ':', '!']));
            if (r.chance(0.3)) { if (ep === 'chat') { body.logprobs = true; body.top_logprobs = r.range(0, 4); } else body.logprobs = r.range(0, 3); }
            if (ep === 'chat') body.messages = user(p); else body.prompt = p;      // (echo streamed has its own test)
            const path = ep === 'chat' ? '/v1/chat/completions' : '/v1/completions';
            const what = `#${k} ${JSON.stringify(body)}`;
            const plain = await post(srv.base, path, body);
            assert.equal(plain.status, 200, `${what}: ${plain.text.slice(0, 300)}`);
            const streamed = await post(srv.base, path, { ...body, stream: true, stream_options: { include_usage: true } });
            assert.equal(streamed.status, 200, `${what}: ${streamed.text.slice(0, 300)}`);
            const events = parseSSE(streamed.text, what);
            const n = body.n;
            const text = Array(n).fill('');
            const fin = Array.from({ length: n }, () => []);
            const toks = Array.from({ length: n }, () => []);
            for (const ev of events) {
                for (const c of ev.choices ?? []) {
                    text[c.index] += (ep === 'chat' ? c.delta?.content : c.text) ?? '';
                    if (c.finish_reason) fin[c.index].push(c.finish_reason);
                    if (ep === 'chat') toks[c.index].push(...(c.logprobs?.content ?? []).map((x) => x.token));
                }
            }
            const want = plain.json.choices.map((c) => (ep === 'chat' ? c.message.content : c.text));
            assert.deepEqual(text, want, `${what}: streamed text`);
            assert.deepEqual(fin, plain.json.choices.map((c) => [c.finish_reason]), `${what}: finish reasons`);
            assert.deepEqual(events[events.length - 1].usage, plain.json.usage, `${what}: usage`);
            for (const [i, c] of plain.json.choices.entries()) {
                for (const s of body.stop ?? []) assert.ok(!want[i].includes(s), `${what}: choice ${i} holds stop ${JSON.stringify(s)}`);
                if (c.finish_reason === 'length' && !(body.stop)) assert.ok(plain.json.usage.completion_tokens >= body.max_tokens, `${what}: length before max_tokens`);
                if (ep === 'chat' && body.logprobs) {
                    // (with a stop string: its own test, 'chat logprobs with a stop string')
                    if (!body.stop) assert.equal(c.logprobs.content.map((x) => x.token).join(''), want[i], `${what}: logprob tokens of choice ${i}`);
                    assert.deepEqual(toks[i], c.logprobs.content.map((x) => x.token), `${what}: streamed logprobs of choice ${i}`);
                }
            }
            if (body.temperature === 0 && n > 1) assert.ok(want.every((t) => t === want[0]), `${what}: greedy choices differ`);
        }
    });

    it('stops cleanly on SIGTERM', async () => {
        await srv.stop();
    });
});
