// --fast through the server (ADR 0031): the ready line says so (or stderr says the CPU has no
// fast form and the server runs exact), requests are answered, and greedy completions of the
// trained 4-bit model beside 7 others equal each one alone: the fast kernels give a 4-bit
// token the same bits whatever batch it is in, as the exact ones do.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, withTimeout, SLOW } from './harness.mjs';

const PROMPTS = ['ROMEO:', 'JULIET:', 'First Citizen:', 'MENENIUS:', 'GLOUCESTER:', 'BRUTUS:',
                 'ISABELLA:', 'KING HENRY VI:\nWhat, will the aspiring blood of Lancaster'];
const complete = (base, prompt) => fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 24, temperature: 0 }),
}).then(async (r) => { assert.equal(r.status, 200); return r.json(); });

describe('--fast', { timeout: 240_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['-m', 'models/phixtral-tiny-4bit', '--fast', '--parallel', '8']); });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('the ready line names it, or stderr says it changes nothing here', () => {
        if (/--fast changes nothing on/.test(srv.stderr()))
            assert.ok(!/, fast\)/.test(srv.stdout), srv.stdout);
        else
            assert.match(srv.stdout, /tokens per request, fast\)/);
    });

    it('8 concurrent greedy completions == each alone', async () => {
        const solo = [];
        for (const p of PROMPTS) solo.push(await complete(srv.base, p));
        const all = await withTimeout(Promise.all(PROMPTS.map((p) => complete(srv.base, p))),
            120_000 * SLOW, '8 concurrent completions');
        PROMPTS.forEach((p, i) => {
            assert.ok(solo[i].choices[0].text.length > 0, `empty completion for ${JSON.stringify(p)}`);
            assert.equal(all[i].choices[0].text, solo[i].choices[0].text, JSON.stringify(p));
            assert.deepEqual(all[i].usage, solo[i].usage);
        });
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
