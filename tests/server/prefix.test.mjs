// The prefix cache through the API (docs/server.md, ADR 0022): a system prompt shared by several
// requests is found in the KV cache (usage.prompt_tokens_details.cached_tokens, Anthropic's
// cache_read_input_tokens, /metrics), and the output is the same as on a server without the cache.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, SLOW } from './harness.mjs';

const SYSTEM = 'You are a player in a company of actors. Answer every line as the Bard would, in verse, '.repeat(6);
const ask = (base, user) => fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: user }],
                           max_tokens: 12, temperature: 0 }),
}).then(async (r) => { assert.equal(r.status, 200); return r.json(); });
const tokens = (base, text) => fetch(`${base}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ content: text }) })
    .then((r) => r.json()).then((j) => j.tokens.length);

describe('prefix cache', { timeout: 240_000 * SLOW }, () => {
    let warm, cold;
    before(async () => {
        warm = await startServer(['-m', 'models/llama-tiny']);
        cold = await startServer(['-m', 'models/llama-tiny', '--no-prefix-cache']);
    });
    after(async () => {
        for (const s of [warm, cold]) if (s && !s.stopped) await s.stop();
    });

    it('a repeated system prompt is cached and the output equals a cold run', async () => {
        const n_sys = await tokens(warm.base, SYSTEM);
        assert.ok(n_sys >= 64, `system prompt of ${n_sys} tokens`);
        const first = await ask(warm.base, 'ROMEO:');
        assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
        for (const user of ['JULIET:', 'First Citizen:']) {
            const hit = await ask(warm.base, user);
            const ref = await ask(cold.base, user);
            // block-granular (16 tokens): at least the system prompt's full blocks
            assert.ok(hit.usage.prompt_tokens_details.cached_tokens >= n_sys - 15,
                `${user}: cached ${hit.usage.prompt_tokens_details.cached_tokens} of a ${n_sys}-token system prompt`);
            assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
            assert.equal(hit.choices[0].message.content, ref.choices[0].message.content, `${user}: output differs`);
            assert.equal(hit.usage.prompt_tokens, ref.usage.prompt_tokens);
        }
        const m = await fetch(`${warm.base}/metrics`).then((r) => r.text());
        const hits = Number(/mlxcel_prefix_cache_hit_tokens_total (\d+)/.exec(m)[1]);
        assert.ok(hits >= 2 * (n_sys - 15), `metrics: ${hits} hit tokens`);
    });

    it('stops cleanly', async () => { await warm.stop(); await cold.stop(); });
});
