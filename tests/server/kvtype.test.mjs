// --kv-type through the server (ADR 0030): the ready line names a narrow cache, and greedy
// completions of the trained model from an f16 cache (K and V rounded) and a bf16 one equal the
// f32 default's text, prefix-cache hits included.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, completeGreedy, SLOW } from './harness.mjs';

const PROMPTS = ['ROMEO:', 'JULIET:\nO Romeo, Romeo',
                 'First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n'.repeat(3)];

describe('--kv-type', { timeout: 240_000 * SLOW }, () => {
    const servers = {};
    before(async () => {
        for (const t of ['f32', 'f16', 'bf16'])
            servers[t] = await startServer(['-m', 'models/llama-tiny', '--kv-type', t]);
    });
    after(async () => {
        for (const s of Object.values(servers)) if (s && !s.stopped) await s.stop();
    });

    it('the ready line names the narrow caches', () => {
        assert.ok(!/, kv /.test(servers.f32.stdout), servers.f32.stdout);
        assert.match(servers.f16.stdout, /tokens per request, kv f16\)/);
        assert.match(servers.bf16.stdout, /tokens per request, kv bf16\)/);
    });

    it('greedy text from f16 and bf16 caches equals f32, twice (the second a prefix hit)', async () => {
        for (let round = 0; round < 2; round++)
            for (const p of PROMPTS) {
                const ref = await completeGreedy(servers.f32.base, p, 24);
                for (const t of ['f16', 'bf16']) {
                    const got = await completeGreedy(servers[t].base, p, 24);
                    assert.equal(got.choices[0].text, ref.choices[0].text, `${t}, round ${round}: ${JSON.stringify(p)}`);
                    assert.equal(got.usage.completion_tokens, ref.usage.completion_tokens);
                    if (round === 1 && p.length > 100) // the long prompt's full blocks come from the cache
                        assert.ok(got.usage.prompt_tokens_details.cached_tokens >= 16,
                            `${t}: cached ${got.usage.prompt_tokens_details.cached_tokens} of ${got.usage.prompt_tokens}`);
                }
            }
    });

    it('stops cleanly', async () => { for (const s of Object.values(servers)) await s.stop(); });
});
