// --tensor-parallel through the server (models/tp.h, ADR 0139): a server whose model is split
// over 2 CPU ranks answers greedy completions with the unsplit server's text, alone, four at
// once (continuous batching: the ranks run every batch together) and again as prefix-cache
// hits (the cached blocks hold every rank's K/V).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, completeGreedy, assertConcurrentEqualsSolo, SLOW } from './harness.mjs';

const PROMPTS = ['ROMEO:', 'JULIET:\nO Romeo, Romeo',
                 'First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n'.repeat(3),
                 'KING HENRY:\nOnce more unto the breach'];

describe('--tensor-parallel', { timeout: 240_000 * SLOW }, () => {
    let one, two;
    before(async () => {
        one = await startServer(['-m', 'models/llama-tiny', '-t', '2']);
        two = await startServer(['-m', 'models/llama-tiny', '-t', '2', '--tensor-parallel', '2']);
    });
    after(async () => {
        for (const s of [one, two]) if (s && !s.stopped) await s.stop();
    });

    it('greedy text over 2 ranks equals the unsplit server, twice (the second a prefix hit)', async () => {
        for (let round = 0; round < 2; round++)
            for (const p of PROMPTS) {
                const ref = await completeGreedy(one.base, p, 24);
                const got = await completeGreedy(two.base, p, 24);
                assert.equal(got.choices[0].text, ref.choices[0].text, `round ${round}: ${JSON.stringify(p)}`);
                assert.equal(got.usage.completion_tokens, ref.usage.completion_tokens);
                if (round === 1 && p.length > 100)
                    assert.ok(got.usage.prompt_tokens_details.cached_tokens >= 16,
                        `cached ${got.usage.prompt_tokens_details.cached_tokens} of ${got.usage.prompt_tokens}`);
            }
    });

    it('four requests at once over 2 ranks equal each alone', async () => {
        await assertConcurrentEqualsSolo(two.base, PROMPTS, 24);
    });

    it('stops cleanly', async () => { for (const s of [one, two]) await s.stop(); });
});
