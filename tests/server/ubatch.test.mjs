// --ubatch-size: the rows of one engine step. Below --parallel, the decode rows of the running
// requests no longer fit in one step and a prompt goes in chunks of a few tokens; every request
// must still finish, and greedy completions of 4 concurrent requests equal each one alone (the
// trained model's argmax margins are clear, so chunking that differs by last bits cannot flip a
// token).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, withTimeout, SLOW } from './harness.mjs';

const PROMPTS = ['ROMEO:', 'JULIET:\nO Romeo, Romeo, wherefore art thou', 'First Citizen:', 'MENENIUS:'];
const complete = (base, prompt) => fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 16, temperature: 0 }),
}).then(async (r) => { assert.equal(r.status, 200); return r.json(); });

describe('--ubatch-size below --parallel', { timeout: 240_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '4', '-ub', '3']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('4 concurrent greedy completions == each alone', async () => {
        const solo = [];
        for (const p of PROMPTS) solo.push(await complete(srv.base, p));
        const all = await withTimeout(Promise.all(PROMPTS.map((p) => complete(srv.base, p))),
            120_000 * SLOW, '4 concurrent completions');
        assert.ok(solo.some((r) => r.usage.prompt_tokens > 6), 'a prompt longer than two steps');
        PROMPTS.forEach((p, i) => {
            assert.equal(solo[i].usage.completion_tokens, 16, JSON.stringify(solo[i].usage));
            assert.equal(all[i].choices[0].text, solo[i].choices[0].text, JSON.stringify(p));
            assert.deepEqual(all[i].usage, solo[i].usage);
        });
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
