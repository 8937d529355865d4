// Speculative decoding on `mlxcel serve --spec ngram` (ADR 0079): greedy answers, alone and
// 8 at once (drafted rows and plain rows in the same steps), equal a server without it,
// streamed and not; logprobs come one token per chunk with the same values; sampled
// requests complete; /metrics counts drafted and accepted tokens, and each answer's usage its
// own (completion_tokens_details' accepted / rejected_prediction_tokens). With `--model-draft` (the
// served model as its own draft: every greedy draft is accepted), 8 concurrent requests,
// each drafting in its own sequence of the draft's cache, equal the server without it.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, MODEL_DIR, SLOW, startServer, client, get, withTimeout } from './harness.mjs';

// prompts that repeat themselves, so that prompt lookup has something to draft from
const PROMPTS = [
    'ROMEO: ROMEO: ROMEO: what light', 'JULIET: O Romeo, Romeo, wherefore art thou Romeo? O Romeo,',
    'First Citizen: we are accounted poor citizens, the patricians good. we are accounted',
    'KING HENRY VI: KING HENRY VI: KING', 'Nurse: Nurse: Nurse: Nurse:', 'BRUTUS: peace, peace, peace,',
    'GLOUCESTER: now is the winter, now is the winter, now is', 'ISABELLA: ISABELLA: ISABELLA:',
];
const req = (prompt, extra = {}) => ({
    model: MODEL, messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 40, ...extra,
});
const text = (c) => c.choices[0].message.content;
const metric = (body, name) => Number((body.match(new RegExp(`^${name} (\\d+)$`, 'm')) || [])[1]);

describe('serve --spec ngram', { timeout: 180_000 * SLOW }, () => {
    let plain, spec;
    const want = new Map();
    before(async () => {
        plain = await startServer(['--parallel', '8']);
        spec = await startServer(['--parallel', '8', '--spec', 'ngram', '--draft-max', '6']);
        for (const p of PROMPTS) want.set(p, text(await client(plain.base).chat.completions.create(req(p))));
    });
    after(async () => {
        if (plain) await plain.stop();
        if (spec) await spec.stop();
    });

    it('greedy answers equal plain decoding, one at a time and 8 at once', async () => {
        const api = client(spec.base);
        let accepted = 0, rejected = 0;
        for (const p of PROMPTS) {
            const c = await api.chat.completions.create(req(p));
            assert.equal(text(c), want.get(p), p);
            // the drafts in usage, as OpenAI counts a prediction's tokens
            const d = c.usage.completion_tokens_details;
            if (d) {
                assert.ok(d.accepted_prediction_tokens <= c.usage.completion_tokens, JSON.stringify(c.usage));
                accepted += d.accepted_prediction_tokens;
                rejected += d.rejected_prediction_tokens;
            }
        }
        assert.ok(accepted > 0 && rejected >= 0, `accepted ${accepted}, rejected ${rejected}`);
        const c0 = await client(plain.base).chat.completions.create(req(PROMPTS[0]));
        assert.equal(c0.usage.completion_tokens_details, undefined, 'no drafts, no details');
        const all = await withTimeout(Promise.all(PROMPTS.map((p) => api.chat.completions.create(req(p)))),
            120_000 * SLOW, '8 concurrent requests');
        PROMPTS.forEach((p, i) => assert.equal(text(all[i]), want.get(p), `concurrent: ${p}`));
    });

    it('streamed, with logprobs: the same text, one token per chunk, the same logprobs', async () => {
        const p = PROMPTS[1];
        const ref = await client(plain.base).chat.completions.create(req(p, { logprobs: true }));
        const stream = await client(spec.base).chat.completions.create(req(p, { logprobs: true, stream: true }));
        let s = '';
        const lps = [];
        for await (const ch of stream) {
            const c = ch.choices[0];
            if (!c) continue;
            s += c.delta?.content ?? '';
            const lp = c.logprobs?.content ?? [];
            assert.ok(lp.length <= 1, `tokens in one chunk: ${lp.length}`);
            lps.push(...lp);
        }
        assert.equal(s, want.get(p));
        const r = ref.choices[0].logprobs.content;
        assert.deepEqual(lps.map((e) => e.token), r.map((e) => e.token));
        lps.forEach((e, i) => assert.ok(Math.abs(e.logprob - r[i].logprob) <= 1e-4, `logprob ${i}`));
    });

    it('sampled requests complete; /metrics counts the drafts', async () => {
        const api = client(spec.base);
        for (let seed = 1; seed <= 3; seed++) {
            const c = await api.chat.completions.create(req(PROMPTS[4], { temperature: 0.9, top_p: 0.95, seed }));
            assert.ok(c.usage.completion_tokens > 0);
        }
        const m = (await get(spec.base, '/metrics')).text;
        const drafted = metric(m, 'mlxcel_spec_draft_tokens_total');
        const accepted = metric(m, 'mlxcel_spec_accepted_tokens_total');
        assert.ok(drafted > 0 && accepted > 0 && accepted <= drafted, `drafted ${drafted}, accepted ${accepted}`);
        const none = (await get(plain.base, '/metrics')).text;
        assert.equal(metric(none, 'mlxcel_spec_draft_tokens_total'), 0);
    });
});

describe('serve --model-draft', { timeout: 180_000 * SLOW }, () => {
    let plain, spec;
    before(async () => {
        plain = await startServer(['--parallel', '8']);
        spec = await startServer(['--parallel', '8', '--model-draft', MODEL_DIR, '--draft-max', '5']);
    });
    after(async () => {
        if (plain) await plain.stop();
        if (spec) await spec.stop();
    });

    it('8 concurrent greedy answers equal plain decoding; every draft of the model itself is accepted', async () => {
        const want = await Promise.all(PROMPTS.map((p) => client(plain.base).chat.completions.create(req(p))));
        for (let round = 0; round < 2; round++) {  // the second round reuses the draft's sequences
            const all = await withTimeout(Promise.all(PROMPTS.map((p) => client(spec.base).chat.completions.create(req(p)))),
                120_000 * SLOW, '8 concurrent requests');
            PROMPTS.forEach((p, i) => assert.equal(text(all[i]), text(want[i]), `round ${round}: ${p}`));
        }
        // one request alone for 160 tokens: past the clock gate's first rounds (ADR 0148), which
        // time the steps it has to itself, the answer stays plain decoding's
        const long = req(PROMPTS[3], { max_tokens: 160 });
        assert.equal(text(await client(spec.base).chat.completions.create(long)),
            text(await client(plain.base).chat.completions.create(long)));
        const u = (await client(spec.base).chat.completions.create(req(PROMPTS[2]))).usage;
        assert.ok(u.completion_tokens_details.accepted_prediction_tokens > 0 &&
                  u.completion_tokens_details.rejected_prediction_tokens === 0, JSON.stringify(u));
        // counted after the lone requests: whether the 8 sharing their steps draft at all
        // depends on the timing (rows taken by prompts still being fed)
        const m = (await get(spec.base, '/metrics')).text;
        const drafted = metric(m, 'mlxcel_spec_draft_tokens_total');
        const accepted = metric(m, 'mlxcel_spec_accepted_tokens_total');
        assert.ok(drafted > 0 && accepted === drafted, `drafted ${drafted}, accepted ${accepted}`);
    });
});
