// llama-server's native routes on `mlxcel serve` (src/server/api_llama.c), with llama.cpp's
// own server unit tests (tools/server/tests/unit: test_completion.py, test_infill.py,
// test_props.py, test_slot_save.py's /slots reads) rewritten for the tiny default model:
// /completion and /completions (non-streamed and streamed objects field by field as
// llama-server's server_task_result_cmpl_final / _partial have them, token-id and mixed
// prompts, stop words, n_predict, cache_prompt, seeds, n_probs, n_cmpl, logit_bias, the
// context), /infill on checkpoints whose vocabulary has FIM tokens (made here by renaming
// llama-tiny's added tokens: Qwen's <|fim_prefix|>... and the repo-level <|file_sep|>),
// /props, POST /props, /slots (while a request runs, ?fail_on_no_slot, --no-slots), the
// LLAMA_ARG_ENDPOINT_* variables, and bad input answered 400 in llama-server's error body
// {"error": {"code", "message", "type"}}.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL, MODEL_DIR, CONTEXT, SLOW, startServer, get, post, request } from './harness.mjs';

// llama-server's final object keys, in its order (to_json_non_oaicompat)
const FINAL_KEYS = ['index', 'content', 'tokens', 'id_slot', 'stop', 'model', 'tokens_predicted', 'tokens_evaluated',
    'generation_settings', 'prompt', 'has_new_line', 'truncated', 'stop_type', 'stopping_word', 'tokens_cached',
    'timings'];
const PARTIAL_KEYS = ['index', 'content', 'tokens', 'stop', 'id_slot', 'tokens_predicted', 'tokens_evaluated'];
const TIMING_KEYS = ['cache_n', 'prompt_n', 'prompt_ms', 'prompt_per_token_ms', 'prompt_per_second', 'predicted_n',
    'predicted_ms', 'predicted_per_token_ms', 'predicted_per_second'];
const PARAM_KEYS = ['seed', 'temperature', 'dynatemp_range', 'dynatemp_exponent', 'top_k', 'top_p', 'min_p',
    'top_n_sigma', 'xtc_probability', 'xtc_threshold', 'typical_p', 'repeat_last_n', 'repeat_penalty',
    'presence_penalty', 'frequency_penalty', 'dry_multiplier', 'dry_base', 'dry_allowed_length', 'dry_penalty_last_n',
    'mirostat', 'mirostat_tau', 'mirostat_eta', 'max_tokens', 'n_predict', 'n_keep', 'n_discard', 'ignore_eos',
    'stream', 'n_probs', 'min_keep', 'chat_format', 'reasoning_format', 'reasoning_in_content', 'thinking_forced_open',
    'samplers', 'timings_per_token', 'post_sampling_probs', 'lora'];
const PROMPT = 'I believe the meaning of life is';

// A /completion (or another route) that must answer 200 with a JSON body.
async function ok(base, route, body) {
    const r = await post(base, route, body);
    assert.equal(r.status, 200, `${route} ${JSON.stringify(body).slice(0, 200)}: ${r.status} ${r.text.slice(0, 400)}`);
    return r.json;
}

// llama-server's error body: exactly {"error": {"code", "message", "type"}}, code the status.
function assertLlamaError(r, status, type, what) {
    assert.equal(r.status, status, `${what}: status ${r.status}, want ${status}: ${r.text.slice(0, 300)}`);
    assert.match(r.headers.get('content-type') || '', /application\/json/, what);
    assert.deepEqual(Object.keys(r.json), ['error'], `${what}: ${r.text}`);
    const e = r.json.error;
    assert.deepEqual(Object.keys(e).slice(0, 3), ['code', 'message', 'type'], `${what}: ${r.text}`);
    assert.equal(e.code, status, what);
    assert.equal(typeof e.message, 'string', what);
    assert.ok(e.message.length > 0, what);
    if (type) assert.equal(e.type, type, `${what}: ${r.text}`);
    return e;
}

// A llama-server event stream: `data: {json}\n\n` events, no [DONE].
function parseLlamaSSE(text, what = 'stream') {
    assert.ok(!text.includes('[DONE]'), `${what}: llama-server's routes send no [DONE]`);
    const events = text.split('\n\n');
    assert.equal(events.pop(), '', `${what}: trailing bytes: ${JSON.stringify(text.slice(-100))}`);
    return events.map((ev, i) => {
        assert.ok(ev.startsWith('data: ') && !ev.includes('\n'), `${what}: event ${i}: ${JSON.stringify(ev.slice(0, 200))}`);
        return JSON.parse(ev.slice(6));
    });
}

async function stream(base, route, body) {
    const r = await post(base, route, { ...body, stream: true });
    assert.equal(r.status, 200, `${route}: ${r.status} ${r.text.slice(0, 300)}`);
    assert.match(r.headers.get('content-type') || '', /text\/event-stream/);
    return parseLlamaSSE(r.text, route);
}

function checkFinal(d, what, model = MODEL) {
    assert.deepEqual(Object.keys(d), FINAL_KEYS, `${what}: keys`);
    assert.equal(d.stop, true, what);
    assert.equal(typeof d.content, 'string', what);
    assert.ok(Array.isArray(d.tokens) && d.tokens.every(Number.isInteger), what);
    assert.equal(d.model, model, what);
    assert.equal(typeof d.has_new_line, 'boolean', what);
    assert.equal(typeof d.truncated, 'boolean', what);
    assert.ok(['eos', 'limit', 'word'].includes(d.stop_type), `${what}: stop_type ${d.stop_type}`);
    assert.equal(typeof d.stopping_word, 'string', what);
    assert.equal(typeof d.prompt, 'string', what);
    assert.ok(Number.isInteger(d.tokens_predicted) && Number.isInteger(d.tokens_evaluated), what);
    assert.ok(Number.isInteger(d.tokens_cached), what);
    assert.deepEqual(Object.keys(d.timings), TIMING_KEYS, `${what}: timings keys`);
    for (const k of TIMING_KEYS) assert.ok(Number.isFinite(d.timings[k]) && d.timings[k] >= 0, `${what}: timings.${k}`);
    assert.equal(d.timings.predicted_n, d.tokens_predicted, `${what}: predicted_n`);
    // n_predict 0 runs nothing (docs/server.md): no prompt was evaluated
    if (d.generation_settings.n_predict !== 0)
        assert.equal(d.timings.prompt_n + d.timings.cache_n, d.tokens_evaluated, `${what}: prompt_n + cache_n`);
    const gs = d.generation_settings;
    for (const k of PARAM_KEYS) assert.ok(k in gs, `${what}: generation_settings.${k} missing`);
    for (const k of ['stop', 'logit_bias', 'grammar', 'dry_sequence_breakers']) assert.ok(k in gs, `${what}: generation_settings.${k}`);
    assert.ok(Number.isInteger(gs.seed) && gs.seed >= 0 && gs.seed < 2 ** 32, `${what}: seed ${gs.seed}`);
    assert.equal(gs.max_tokens, gs.n_predict, what);
}

let srv;
const ids = async (text) => (await ok(srv.base, '/tokenize', { content: text })).tokens;
const detok = async (tokens) => (await ok(srv.base, '/detokenize', { tokens })).content;

describe('llama-server /completion', { timeout: 300_000 * SLOW }, () => {
    before(async () => { srv = await startServer(['--parallel', '2']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('non-streamed: the final object field by field (test_completion)', async () => {
        for (const [n, returnTokens] of [[8, false], [16, true]]) {
            const d = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: n, return_tokens: returnTokens });
            checkFinal(d, `n_predict ${n}`);
            assert.equal(d.index, 0);
            assert.equal(d.id_slot, -1);
            assert.equal(d.tokens_predicted, n);
            assert.equal(d.timings.predicted_n, n);
            assert.equal(d.tokens_evaluated, (await ids(PROMPT)).length);
            assert.equal(d.truncated, false);
            assert.equal(d.stop_type, 'limit');
            assert.equal(d.stopping_word, '');
            assert.equal(d.prompt, PROMPT);
            assert.equal(d.has_new_line, d.content.includes('\n'));
            assert.equal(d.generation_settings.n_predict, n);
            assert.equal(d.generation_settings.stream, false);
            if (returnTokens) {
                assert.equal(d.tokens.length, n);
                assert.equal(await detok(d.tokens), d.content);
            } else {
                assert.deepEqual(d.tokens, []);
            }
            assert.ok(!('completion_probabilities' in d));
        }
    });

    it('/completions is the same route', async () => {
        const body = { prompt: PROMPT, n_predict: 6, temperature: 0 };
        const a = await ok(srv.base, '/completion', body), b = await ok(srv.base, '/completions', body);
        checkFinal(b, '/completions');
        assert.equal(b.content, a.content);
    });

    it('streamed: one chunk per token, then the final object; equal to non-streamed (test_completion_stream)', async () => {
        const body = { prompt: PROMPT, n_predict: 8, temperature: 0 };
        const events = await stream(srv.base, '/completion', body);
        const full = await ok(srv.base, '/completion', body);
        let content = '';
        const toks = [];
        events.forEach((e, i) => {
            assert.equal(typeof e.stop, 'boolean');
            if (i < events.length - 1) {
                assert.equal(e.stop, false, `chunk ${i}`);
                assert.deepEqual(Object.keys(e), PARTIAL_KEYS, `chunk ${i}`);
                assert.ok(e.tokens.length > 0 && e.tokens.every(Number.isInteger), `chunk ${i}`);
                assert.equal(e.tokens_predicted, toks.length + e.tokens.length);
                toks.push(...e.tokens);
            } else {
                assert.equal(e.stop, true);
                checkFinal(e, 'final chunk');
                assert.equal(e.stop_type, 'limit');
                assert.equal(e.truncated, false);
                assert.equal(e.timings.predicted_n, 8);
                assert.equal(e.generation_settings.n_predict, 8);
                assert.equal(e.generation_settings.stream, true);
            }
            content += e.content;
        });
        assert.equal(toks.length, 8);
        assert.equal(content, full.content);
    });

    it('token-id prompts, mixed prompts and a one-prompt list (test_completion_with_tokens_input)', async () => {
        const t = await ids(PROMPT);
        const base = { n_predict: 8, temperature: 0 };
        const s = await ok(srv.base, '/completion', { ...base, prompt: PROMPT });
        const a = await ok(srv.base, '/completion', { ...base, prompt: t });
        assert.equal(a.content, s.content);
        assert.equal(a.tokens_evaluated, t.length);
        const b = await ok(srv.base, '/completion', { ...base, prompt: [PROMPT] });
        assert.equal(b.content, s.content);
        const c = await ok(srv.base, '/completion', { ...base, prompt: [t] });
        assert.equal(c.content, s.content);
        // ids and strings in one sequence: each string encoded where it stands
        const mixed = [1, 2, 3, PROMPT, 7, 8, PROMPT];
        const m = await ok(srv.base, '/completion', { ...base, prompt: mixed });
        assert.equal(typeof m.content, 'string');
        assert.equal(m.tokens_evaluated, 5 + 2 * t.length);
        const want = await ok(srv.base, '/completion', { ...base, prompt: [1, 2, 3, ...t, 7, 8, ...t] });
        assert.equal(m.content, want.content);
        // a list of prompts: an array of results, in order (llama-server's batch completion)
        const batch = await ok(srv.base, '/completion', { ...base, prompt: [t, t] });
        assert.ok(Array.isArray(batch) && batch.length === 2, JSON.stringify(batch).slice(0, 200));
        batch.forEach((x, i) => { checkFinal(x, `batch ${i}`); assert.equal(x.index, i); assert.equal(x.content, s.content); });
        const mix = await ok(srv.base, '/completion', { ...base, prompt: [t, PROMPT, 'Hello there', { prompt_string: PROMPT }] });
        assert.equal(mix.length, 4);
        assert.equal(mix[1].content, s.content);
        assert.equal(mix[3].content, s.content);
        assert.equal(mix[2].prompt, 'Hello there');
        assert.equal(mix[2].tokens_evaluated, (await ids('Hello there')).length);
        // sampled with a seed: the same prompt twice, the same text; n_cmpl copies differ by seed
        const seeded = await ok(srv.base, '/completion', { prompt: [PROMPT, PROMPT], n_predict: 12, temperature: 1, seed: 3 });
        assert.equal(seeded[0].content, seeded[1].content);
        const ev = await stream(srv.base, '/completion', { ...base, prompt: [t, 'Hello there'] });
        assert.equal(ev.filter((e) => e.stop).length, 2);
        assert.equal(ev.filter((e) => e.index === 0).map((e) => e.content).join(''), s.content);
        // {"prompt_string"} without media
        const o = await ok(srv.base, '/completion', { ...base, prompt: { prompt_string: PROMPT } });
        assert.equal(o.content, s.content);
    });

    it('stop words: the text ends before the word, stop_type word, stopping_word', async () => {
        const g = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: 24, temperature: 0 });
        const words = g.content.split(' ').filter((w) => w.length >= 2);
        assert.ok(words.length >= 3, `too few words to stop on: ${JSON.stringify(g.content)}`);
        const word = words[2];
        const want = g.content.slice(0, g.content.indexOf(word));
        const d = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: 24, temperature: 0, stop: ['', word] });
        checkFinal(d, 'stop');
        assert.equal(d.content, want);
        assert.equal(d.stop_type, 'word');
        assert.equal(d.stopping_word, word);
        assert.deepEqual(d.generation_settings.stop, [word]);
        // streamed: the same text, the final chunk says so
        const ev = await stream(srv.base, '/completion', { prompt: PROMPT, n_predict: 24, temperature: 0, stop: [word] });
        assert.equal(ev.map((e) => e.content).join(''), want);
        assert.equal(ev.at(-1).stop_type, 'word');
        assert.equal(ev.at(-1).stopping_word, word);
    });

    it('n_predict: 0 generates nothing, -1 and more than the context stop at the context (truncated)', async () => {
        const z = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: 0 });
        checkFinal(z, 'n_predict 0');
        assert.equal(z.content, '');
        assert.equal(z.tokens_predicted, 0);
        assert.equal(z.stop_type, 'limit');
        const n = (await ids(PROMPT)).length;
        for (const np of [-1, 100000]) {
            const d = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: np, temperature: 0, ignore_eos: true });
            checkFinal(d, `n_predict ${np}`);
            assert.equal(d.tokens_predicted, CONTEXT - n, `n_predict ${np}`);
            assert.equal(d.stop_type, 'limit');
            assert.equal(d.truncated, true);
            assert.equal(d.generation_settings.ignore_eos, true);
        }
        // max_tokens is n_predict's alias
        const m = await ok(srv.base, '/completion', { prompt: PROMPT, max_tokens: 3 });
        assert.equal(m.tokens_predicted, 3);
    });

    it('a prompt longer than the context: 400 exceed_context_size_error (test_nocache_long_input_prompt)', async () => {
        const r = await post(srv.base, '/completion', { prompt: PROMPT.repeat(80), cache_prompt: false });
        const e = assertLlamaError(r, 400, 'exceed_context_size_error', 'long prompt');
        assert.equal(e.n_ctx, CONTEXT);
        assert.ok(e.n_prompt_tokens >= CONTEXT, JSON.stringify(e));
    });

    it('cache_prompt: the second request finds its prompt cached (tokens_cached, timings.cache_n)', async () => {
        const prompt = 'To be, or not to be, that is the question: '.repeat(8);
        const body = { prompt, n_predict: 4, temperature: 0, cache_prompt: true };
        const a = await ok(srv.base, '/completion', body);
        const b = await ok(srv.base, '/completion', body);
        assert.equal(b.content, a.content);
        assert.ok(b.tokens_cached > 0 && b.timings.cache_n === b.tokens_cached, JSON.stringify(b.timings));
        assert.equal(b.timings.prompt_n, b.tokens_evaluated - b.timings.cache_n);
        const c = await ok(srv.base, '/completion', { ...body, cache_prompt: false });
        assert.equal(c.content, a.content);
    });

    it('seeds: the same seed the same text, other seeds other texts, a random seed is reported and replays', async () => {
        const body = { prompt: PROMPT, n_predict: 16, temperature: 1.0, cache_prompt: false };
        const same = [];
        for (let i = 0; i < 3; i++) same.push((await ok(srv.base, '/completion', { ...body, seed: 42 })).content);
        assert.equal(new Set(same).size, 1, JSON.stringify(same));
        const diff = new Set();
        for (let seed = 0; seed < 4; seed++) diff.add((await ok(srv.base, '/completion', { ...body, seed })).content);
        assert.ok(diff.size >= 3, `seeds 0..3 gave ${diff.size} texts`);
        const r = await ok(srv.base, '/completion', body);
        const again = await ok(srv.base, '/completion', { ...body, seed: r.generation_settings.seed });
        assert.equal(again.content, r.content);
        const minus = await ok(srv.base, '/completion', { ...body, seed: -1 });
        assert.notEqual(minus.generation_settings.seed, 4294967295);
    });

    it('n_probs: completion_probabilities per token, streamed one per chunk (test_n_probs)', async () => {
        const d = await ok(srv.base, '/completion', { prompt: PROMPT, n_probs: 10, temperature: 0, n_predict: 5, return_tokens: true });
        assert.equal(d.completion_probabilities.length, 5);
        d.completion_probabilities.forEach((tok, k) => {
            assert.deepEqual(Object.keys(tok), ['id', 'token', 'bytes', 'logprob', 'top_logprobs']);
            assert.equal(tok.id, d.tokens[k]);
            assert.equal(typeof tok.token, 'string');
            assert.ok(tok.logprob <= 0);
            assert.ok(Array.isArray(tok.bytes) && tok.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
            assert.equal(tok.top_logprobs.length, 10);
            assert.equal(tok.top_logprobs[0].id, tok.id, 'greedy: the chosen token is the most likely');
            for (const p of tok.top_logprobs) {
                assert.deepEqual(Object.keys(p), ['id', 'token', 'bytes', 'logprob']);
                assert.ok(Number.isInteger(p.id) && p.logprob <= 0);
            }
            for (let i = 1; i < 10; i++) assert.ok(tok.top_logprobs[i].logprob <= tok.top_logprobs[i - 1].logprob);
        });
        assert.equal(d.generation_settings.n_probs, 10);
        const ev = await stream(srv.base, '/completion', { prompt: PROMPT, n_probs: 3, temperature: 0, n_predict: 5 });
        for (const e of ev.slice(0, -1)) {
            assert.equal(e.completion_probabilities.length, e.tokens.length);
            assert.equal(e.completion_probabilities[0].top_logprobs.length, 3);
        }
        assert.ok(!('completion_probabilities' in ev.at(-1)));
    });

    it('n_cmpl: an array of completions, each its own index; more than the slots is 400', async () => {
        const d = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: 4, n_cmpl: 2, seed: 7 });
        assert.ok(Array.isArray(d) && d.length === 2, JSON.stringify(d).slice(0, 200));
        d.forEach((x, i) => { checkFinal(x, `choice ${i}`); assert.equal(x.index, i); });
        const ev = await stream(srv.base, '/completion', { prompt: PROMPT, n_predict: 3, n: 2 });
        assert.deepEqual([...new Set(ev.map((e) => e.index))].sort(), [0, 1]);
        assert.equal(ev.filter((e) => e.stop).length, 2);
        assertLlamaError(await post(srv.base, '/completion', { prompt: PROMPT, n_cmpl: 3 }), 400, 'invalid_request_error', 'n_cmpl 3');
    });

    it('sampling fields reach the sampler and generation_settings; logit_bias bans a token', async () => {
        const body = { prompt: PROMPT, n_predict: 4, temperature: 0.5, top_k: 7, top_p: 0.5, min_p: 0.1, repeat_penalty: 1.2,
            presence_penalty: 0.5, frequency_penalty: 0.25, seed: 5 };
        const gs = (await ok(srv.base, '/completion', body)).generation_settings;
        for (const k of ['temperature', 'top_p', 'min_p', 'repeat_penalty', 'presence_penalty', 'frequency_penalty'])
            assert.ok(Math.abs(gs[k] - body[k]) < 1e-6, `${k}: ${gs[k]}`);
        assert.equal(gs.top_k, 7);
        assert.equal(gs.seed, 5);
        const g = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: 1, temperature: 0, return_tokens: true });
        const first = g.tokens[0];
        for (const lb of [[[first, false]], { [String(first)]: -100 }]) {
            const d = await ok(srv.base, '/completion', { prompt: PROMPT, n_predict: 1, temperature: 0, return_tokens: true, logit_bias: lb });
            assert.notEqual(d.tokens[0], first, `logit_bias ${JSON.stringify(lb)}`);
            assert.deepEqual(d.generation_settings.logit_bias, [{ bias: -100, token: first }]);
        }
    });

    it('bad input: 400 in llama-server\'s error body', async () => {
        const cases = [
            {}, { prompt: 5 }, { prompt: true }, { prompt: null }, { prompt: [[1], 5] }, { prompt: [['a', 'b']] },
            { prompt: Array(17).fill('a') }, { prompt: Array(9).fill('a'), n_cmpl: 2, n_predict: 1 }, { prompt: ['a', ''] },
            { prompt: [-1] }, { prompt: [1 << 20] }, { prompt: [1.5] }, { prompt: [true] }, { prompt: [] }, { prompt: '' },
            { prompt: { prompt_string: 'x', multimodal_data: ['AAAA'] } }, { prompt: { prompt_string: 3 } },
            { prompt: 'x', n_predict: -2 }, { prompt: 'x', n_predict: '5' }, { prompt: 'x', n_predict: 1.5 },
            { prompt: 'x', temperature: 'hot' }, { prompt: 'x', temperature: 1000 }, { prompt: 'x', top_k: 'x' },
            { prompt: 'x', stop: 'x' }, { prompt: 'x', stop: [1] }, { prompt: 'x', stop: Array(17).fill('ab') },
            { prompt: 'x', stream: 'yes' }, { prompt: 'x', n_probs: 21 }, { prompt: 'x', n_probs: -1 },
            { prompt: 'x', seed: 'x' }, { prompt: 'x', seed: 1.5 }, { prompt: 'x', mirostat: 2 }, { prompt: 'x', typical_p: 0.5 },
            { prompt: 'x', grammar: 'root ::= "a"' }, { prompt: 'x', json_schema: {} }, { prompt: 'x', post_sampling_probs: true },
            { prompt: 'x', logit_bias: 'x' }, { prompt: 'x', logit_bias: [[1]] }, { prompt: 'x', logit_bias: [[1, 'x']] },
            { prompt: 'x', n_cmpl: 0 }, { prompt: 'x', return_tokens: 1 }, { prompt: 'x', presence_penalty: 5 },
            { prompt: 'x', lora: {} }, { prompt: 'x', lora: [{ id: 0, scale: 1 }] },
        ];
        for (const body of cases)
            assertLlamaError(await post(srv.base, '/completion', body), 400, 'invalid_request_error', JSON.stringify(body));
        // a huge id array: bounded
        const huge = `{"prompt":[${'1,'.repeat((1 << 20))}1]}`;
        assertLlamaError(await post(srv.base, '/completion', huge), 400, 'invalid_request_error', 'huge prompt');
        assertLlamaError(await post(srv.base, '/completion', '{"prompt":'), 400, 'invalid_request_error', 'broken JSON');
        assertLlamaError(await get(srv.base, '/completion'), 405, null, 'GET /completion');
        srv.assertAlive('after bad input');
    });
});

describe('llama-server /props and /slots', { timeout: 180_000 * SLOW }, () => {
    let one;
    before(async () => {
        srv = await startServer(['--parallel', '2']);
        one = await startServer(['--parallel', '1', '--props']);
    });
    after(async () => {
        for (const s of [srv, one]) if (s && !s.stopped) await s.stop();
    });

    it('GET /props (test_props)', async () => {
        const r = await get(srv.base, '/props');
        assert.equal(r.status, 200, r.text);
        const p = r.json;
        assert.deepEqual(Object.keys(p), ['default_generation_settings', 'total_slots', 'model_alias', 'model_path',
            'modalities', 'endpoint_slots', 'endpoint_props', 'endpoint_metrics', 'webui', 'chat_template', 'bos_token',
            'eos_token', 'build_info', 'is_sleeping']);
        assert.deepEqual(Object.keys(p.default_generation_settings), ['params', 'n_ctx']);
        assert.equal(p.default_generation_settings.n_ctx, CONTEXT);
        const params = p.default_generation_settings.params;
        assert.deepEqual(Object.keys(params), PARAM_KEYS);
        assert.equal(params.seed, 4294967295);
        assert.equal(params.n_predict, -1);
        assert.equal(params.top_k, 40);           // llama-server's default; generation_config.json has none
        assert.ok(Math.abs(params.temperature - 0.8) < 1e-6);  // generation_config.json's
        assert.equal(p.total_slots, 2);
        assert.equal(p.model_alias, MODEL);
        assert.ok(p.model_path.replace(/\/+$/, '').endsWith(MODEL_DIR.replace(/\/+$/, '')), p.model_path);
        assert.deepEqual(p.modalities, { vision: false, audio: false });
        assert.equal(p.endpoint_slots, true);
        assert.equal(p.endpoint_props, false);
        const cfg = JSON.parse(fs.readFileSync(path.join(MODEL_DIR, 'tokenizer_config.json'), 'utf8'));
        assert.equal(p.chat_template, cfg.chat_template);
        assert.equal(p.bos_token, cfg.bos_token);
        assert.equal(p.eos_token, cfg.eos_token);
        assert.match(p.build_info, /^mlxcel /);
    });

    it('POST /props: 501 unless --props, then {"success": true}', async () => {
        assertLlamaError(await post(srv.base, '/props', {}), 501, 'not_supported_error', 'POST /props');
        const r = await post(one.base, '/props', {});
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.json, { success: true });
        assert.equal((await get(one.base, '/props')).json.endpoint_props, true);
        assertLlamaError(await post(one.base, '/props', '[1'), 400, 'invalid_request_error', 'POST /props bad JSON');
    });

    it('GET /slots: idle slots, a running request in slot 0, ?fail_on_no_slot', async () => {
        const idle = await get(srv.base, '/slots');
        assert.equal(idle.status, 200, idle.text);
        assert.equal(idle.json.length, 2);
        idle.json.forEach((s, i) => {
            assert.deepEqual(Object.keys(s), ['id', 'id_task', 'n_ctx', 'speculative', 'is_processing', 'params', 'next_token']);
            assert.equal(s.id, i);
            assert.equal(s.id_task, -1);
            assert.equal(s.n_ctx, CONTEXT);
            assert.equal(s.is_processing, false);
            assert.deepEqual(Object.keys(s.params), PARAM_KEYS);
            assert.deepEqual(Object.keys(s.next_token), ['has_next_token', 'has_new_line', 'n_remain', 'n_decoded']);
        });
        assert.equal((await get(one.base, '/slots?fail_on_no_slot=1')).status, 200);
        // a long streamed request holds a slot while it runs
        for (const [s, n] of [[srv, 2], [one, 1]]) {
            const ac = new AbortController();
            const res = await fetch(`${s.base}/completion`, {
                method: 'POST', headers: { 'content-type': 'application/json' }, signal: ac.signal,
                body: JSON.stringify({ prompt: PROMPT, n_predict: 400, ignore_eos: true, stream: true, top_k: 3, seed: 11 }),
            });
            const reader = res.body.getReader();
            await reader.read();  // the first token is out: the job holds a sequence
            const r = await get(s.base, '/slots');
            assert.equal(r.json.length, n);
            const busy = r.json.filter((x) => x.is_processing);
            assert.equal(busy.length, 1, r.text.slice(0, 300));
            assert.equal(busy[0].id, 0);
            assert.equal(busy[0].params.n_predict, 400);
            assert.equal(busy[0].params.top_k, 3);
            assert.equal(busy[0].params.seed, 11);
            assert.ok(busy[0].next_token.n_decoded >= 1, JSON.stringify(busy[0].next_token));
            assert.equal(busy[0].next_token.n_remain, 400 - busy[0].next_token.n_decoded);
            if (n === 1)
                assertLlamaError(await get(s.base, '/slots?fail_on_no_slot=1'), 503, 'unavailable_error', 'no slot');
            ac.abort();
            await reader.cancel().catch(() => {});
        }
    });

    it('--no-slots and the LLAMA_ARG_ENDPOINT_* variables', async () => {
        const off = await startServer(['--no-slots']);
        try {
            assertLlamaError(await get(off.base, '/slots'), 501, 'not_supported_error', '--no-slots');
            assert.equal((await get(off.base, '/props')).json.endpoint_slots, false);
        } finally { await off.stop(); }
        const env = await startServer([], { LLAMA_ARG_ENDPOINT_SLOTS: 'disabled', LLAMA_ARG_ENDPOINT_PROPS: 'true' });
        try {
            assertLlamaError(await get(env.base, '/slots'), 501, 'not_supported_error', 'LLAMA_ARG_ENDPOINT_SLOTS');
            assert.equal((await post(env.base, '/props', {})).status, 200);
        } finally { await env.stop(); }
        const flag = await startServer(['--slots'], { LLAMA_ARG_ENDPOINT_SLOTS: 'off' });  // the flag wins
        try {
            assert.equal((await get(flag.base, '/slots')).status, 200);
        } finally { await flag.stop(); }
    });

    it('an API key: 401 in llama-server\'s body on its routes', async () => {
        const k = await startServer(['--api-key', 'sekrit']);
        try {
            for (const route of ['/completion', '/infill', '/props', '/slots']) {
                const r = route === '/props' || route === '/slots' ? await get(k.base, route) : await post(k.base, route, { prompt: 'x' });
                assertLlamaError(r, 401, 'authentication_error', route);
            }
            const r = await get(k.base, '/props', { headers: { authorization: 'Bearer sekrit' } });
            assert.equal(r.status, 200);
        } finally { await k.stop(); }
    });
});

// A copy of llama-tiny whose added tokens 1..4 are renamed (and the chat template dropped).
function fimCheckpoint(names) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxcel-fim-'));
    for (const f of fs.readdirSync(MODEL_DIR)) fs.copyFileSync(path.join(MODEL_DIR, f), path.join(dir, f));
    const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
    const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
    for (const [id, name] of Object.entries(names)) {
        const t = tj.added_tokens.find((x) => x.id === Number(id));
        delete tj.model.vocab[t.content];
        tj.model.vocab[name] = Number(id);
        t.content = name;
        cfg.added_tokens_decoder[id].content = name;
    }
    delete cfg.chat_template;
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
    return dir;
}

describe('llama-server /infill', { timeout: 180_000 * SLOW }, () => {
    let qwen, repo, plain;
    const dirs = [];
    before(async () => {
        dirs.push(fimCheckpoint({ 1: '<|fim_prefix|>', 2: '<|fim_suffix|>', 3: '<|fim_middle|>' }));
        dirs.push(fimCheckpoint({ 1: '▁<PRE>', 2: '▁<SUF>', 3: '▁<MID>', 4: '<|file_sep|>' }));
        qwen = await startServer(['-m', dirs[0]]);
        repo = await startServer(['-m', dirs[1]]);
        plain = await startServer();
    });
    after(async () => {
        for (const s of [qwen, repo, plain]) if (s && !s.stopped) await s.stop();
        for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
    });

    const tok = async (s, text) => (await ok(s.base, '/tokenize', { content: text })).tokens;
    const detokOn = async (s, tokens) => (await ok(s.base, '/detokenize', { tokens })).content;

    it('a model without FIM tokens: 501 not_supported_error', async () => {
        const e = assertLlamaError(await post(plain.base, '/infill', { input_prefix: 'a', input_suffix: 'b' }), 501,
            'not_supported_error', 'no FIM');
        assert.match(e.message, /Infill is not supported by this model: prefix token is missing/);
    });

    it('the PSM prompt: [PRE]prefix prompt[SUF]suffix[MID] (test_infill_without_input_extra)', async () => {
        const body = { input_prefix: '#include <cstdio>\n#include "llama.h"\n\nint main() {\n',
            prompt: '    int n_threads = llama_', input_suffix: '}\n', n_predict: 8, temperature: 0, return_tokens: true };
        const d = await ok(qwen.base, '/infill', body);
        checkFinal(d, 'infill', path.basename(dirs[0]));
        const want = [1, ...await tok(qwen, body.input_prefix), ...await tok(qwen, body.prompt), 2,
            ...await tok(qwen, body.input_suffix), 3];
        assert.equal(d.tokens_evaluated, want.length);
        assert.equal(d.prompt, await detokOn(qwen, want));
        assert.ok(d.prompt.startsWith('<|fim_prefix|>') && d.prompt.endsWith('<|fim_middle|>'), d.prompt);
        assert.equal(d.tokens_predicted, 8);
        // the same ids through /completion give the same text
        const c = await ok(qwen.base, '/completion', { prompt: want, n_predict: 8, temperature: 0 });
        assert.equal(d.content, c.content);
        // streamed, as llama-server's /infill streams
        const ev = await stream(qwen.base, '/infill', body);
        assert.equal(ev.map((e) => e.content).join(''), d.content);
        assert.equal(ev.at(-1).stop, true);
        // the prefix as token ids
        const ids = await ok(qwen.base, '/infill', { ...body, input_prefix: await tok(qwen, body.input_prefix) });
        assert.equal(ids.content, d.content);
    });

    it('input_extra: the snippet separator, or the repo-level <|file_sep|> pattern (test_infill_with_input_extra)', async () => {
        const body = { input_extra: [{ filename: 'llama.h', text: 'LLAMA_API int32_t llama_n_threads();\n' }],
            input_prefix: '#include <cstdio>\n', prompt: '    int n = llama_', input_suffix: '}\n', n_predict: 4, temperature: 0 };
        const d = await ok(qwen.base, '/infill', body);
        const want = [...await tok(qwen, '\n\n--- snippet ---\n\n'), ...await tok(qwen, body.input_extra[0].text), 1,
            ...await tok(qwen, body.input_prefix), ...await tok(qwen, body.prompt), 2, ...await tok(qwen, body.input_suffix), 3];
        assert.equal(d.prompt, await detokOn(qwen, want));
        assert.equal(d.tokens_evaluated, want.length);
        // CodeLlama's ▁<PRE> names and Qwen's <|file_sep|>: FIM_SEP filename, text, FIM_SEP "filename"
        const r = await ok(repo.base, '/infill', body);
        const wantRepo = [4, ...await tok(repo, 'llama.h\n'), ...await tok(repo, body.input_extra[0].text), 4,
            ...await tok(repo, 'filename\n'), 1, ...await tok(repo, body.input_prefix), ...await tok(repo, body.prompt), 2,
            ...await tok(repo, body.input_suffix), 3];
        assert.equal(r.tokens_evaluated, wantRepo.length);
        assert.equal(r.prompt, await detokOn(repo, wantRepo));
        // a chunk without a filename is "tmp"
        const t = await ok(repo.base, '/infill', { ...body, input_extra: [{ text: 'x' }] });
        assert.ok(t.prompt.startsWith('<|file_sep|>') && t.prompt.includes('tmp\n'), t.prompt);
    });

    it('a long prefix keeps its end, a long suffix its start, within the context', async () => {
        const long = 'int x = 1;\n'.repeat(200);
        const d = await ok(qwen.base, '/infill', { input_prefix: long, input_suffix: long, n_predict: 4 });
        assert.ok(d.tokens_evaluated + 4 <= CONTEXT, `${d.tokens_evaluated} prompt tokens`);
        const [pre, suf] = d.prompt.split('<|fim_suffix|>');
        assert.ok(pre.startsWith('<|fim_prefix|>') && pre.endsWith('int x = 1;\n'), 'the prefix keeps its end');
        assert.ok(pre.length < long.length, 'the prefix is cut');
        assert.ok(suf.startsWith('int x = 1;\n') && suf.endsWith('<|fim_middle|>'), 'the suffix keeps its start');
        assert.ok(suf.length < long.length && suf.length < pre.length, 'the suffix is cut to a quarter');
    });

    it('bad input: 400 (test_invalid_input_extra_req)', async () => {
        const cases = [
            { input_suffix: 'b' }, { input_prefix: 'a' }, { input_prefix: 'a', input_suffix: 'b', prompt: 5 },
            { input_prefix: 'a', input_suffix: 'b', input_extra: 'x' }, { input_prefix: 'a', input_suffix: 'b', input_extra: [{ text: 1 }] },
            { input_prefix: 'a', input_suffix: 'b', input_extra: [{ filename: 'x' }] },
            { input_prefix: 'a', input_suffix: 'b', input_extra: [{ text: 'a', filename: 2 }] },
            { input_prefix: 5, input_suffix: 'b' }, { input_prefix: [-1], input_suffix: 'b' }, { input_prefix: 'a', input_suffix: {} },
            { input_prefix: 'a', input_suffix: 'b', n_predict: -3 },
        ];
        for (const body of cases)
            assertLlamaError(await post(qwen.base, '/infill', body), 400, 'invalid_request_error', JSON.stringify(body));
        qwen.assertAlive('after bad input');
    });
});
