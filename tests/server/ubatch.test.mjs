// --ubatch-size: the rows of one engine step. Below --parallel, the decode rows of the running
// requests no longer fit in one step and a prompt goes in chunks of a few tokens; every request
// must still finish, and greedy completions of 4 concurrent requests equal each one alone (the
// trained model's argmax margins are clear, so chunking that differs by last bits cannot flip a
// token).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, assertConcurrentEqualsSolo, SLOW } from './harness.mjs';

const PROMPTS = ['ROMEO:', 'JULIET:\nO Romeo, Romeo, wherefore art thou', 'First Citizen:', 'MENENIUS:'];

describe('--ubatch-size below --parallel', { timeout: 240_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '4', '-ub', '3']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('4 concurrent greedy completions == each alone', async () => {
        const solo = await assertConcurrentEqualsSolo(srv.base, PROMPTS, 16);
        solo.forEach((r) => assert.equal(r.usage.completion_tokens, 16, JSON.stringify(r.usage)));
        assert.ok(solo.some((r) => r.usage.prompt_tokens > 6), 'a prompt longer than two steps');
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
