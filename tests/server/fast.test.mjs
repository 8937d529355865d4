// --fast through the server (ADR 0031): the ready line says so (or stderr says the CPU has no
// fast form and the server runs exact), requests are answered, and greedy completions of the
// trained 4-bit model beside 7 others equal each one alone: the fast kernels give a 4-bit
// token the same bits whatever batch it is in, as the exact ones do.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, assertConcurrentEqualsSolo, SLOW } from './harness.mjs';

const PROMPTS = ['ROMEO:', 'JULIET:', 'First Citizen:', 'MENENIUS:', 'GLOUCESTER:', 'BRUTUS:',
                 'ISABELLA:', 'KING HENRY VI:\nWhat, will the aspiring blood of Lancaster'];

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
        await assertConcurrentEqualsSolo(srv.base, PROMPTS, 24);
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
