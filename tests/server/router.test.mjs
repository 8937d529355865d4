// Router mode of `mlxcel serve` (issue 46, ADR 0099): several models behind one server, as
// llama-server's router mode.
//  - two generating models (models/llama-tiny, tests/fixtures/models/phixtral-tiny) and an
//    encoder (the bert_st golden) at once: the official `openai` client picks each by name,
//    requests interleaved across them (chat, completions, a stream, responses, embeddings,
//    Anthropic messages) equal each model served alone; an unknown model is a 404 naming it;
//  - GET /models and /v1/models list every model with its status; POST /models/load and
//    /models/unload; --no-models-autoload answers an unloaded model 400;
//  - unloading a model while a request streams from it never fails that request: the model
//    goes once the stream is over;
//  - --models-max 1 unloads the least recently used model;
//  - --models-dir: a folder with a broken config.json answers its requests with the load's
//    error while the others keep serving; a symlink leading out of the directory is skipped;
//    thousands of empty folders are scanned within a bounded time;
//  - cycling loads and unloads keeps the RSS bounded (/proc/PID/status VmRSS).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, rmSync, symlinkSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { SLOW, withTimeout, get, post, sleep, assertError, parseSSE } from './harness.mjs';

const BIN = process.env.MLXCEL_BIN;
const LLAMA = 'models/llama-tiny';
const PHI = 'tests/fixtures/models/phixtral-tiny';
const BERT = 'tests/fixtures/golden/bert_st';
const READY_RE = /listening on (http:\/\/127\.0\.0\.1:\d+)/;
const SANITIZER_RE = /ERROR: AddressSanitizer|runtime error:|LeakSanitizer/;
const work = mkdtempSync(join(tmpdir(), 'mlxcel-router-'));

// `mlxcel serve --port 0 ...args` (no implied -m): ready within a bound, stopped with SIGTERM
// (bounded), exit 0 and no sanitizer report.
async function serve(args) {
    const proc = spawn(BIN, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const s = { proc, out: '', err: '', exited: null };
    s.exited = new Promise((res) => proc.on('exit', (code, signal) => res({ code, signal })));
    proc.stdout.setEncoding('utf8');
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => { if (s.err.length < 4 << 20) s.err += d; });
    const t0 = Date.now();
    s.base = await withTimeout(new Promise((res, rej) => {
        proc.stdout.on('data', (d) => {
            s.out += d;
            const m = READY_RE.exec(s.out);
            if (m) res(m[1]);
        });
        s.exited.then((e) => rej(new Error(`serve ${args.join(' ')} exited ${e.code}: ${s.err.slice(-2000)}`)));
    }), 60_000 * SLOW, `serve ${args.join(' ')} ready`).catch((e) => { proc.kill('SIGKILL'); throw e; });
    s.readyMs = Date.now() - t0;
    s.stop = async () => {
        if (s.stopped) return;
        s.stopped = true;
        proc.kill('SIGTERM');
        const e = await withTimeout(s.exited, 30_000 * SLOW, 'serve to exit').catch((err) => {
            proc.kill('SIGKILL');
            throw err;
        });
        assert.ok(!SANITIZER_RE.test(s.err), `sanitizer report:\n${s.err.slice(-6000)}`);
        assert.equal(e.code, 0, `exit ${e.code} ${e.signal}\n${s.err.slice(-3000)}`);
    };
    return s;
}

const openai = (base) => new OpenAI({ baseURL: base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60_000 * SLOW });

// The model's entry of GET /models.
async function entry(base, name) {
    const r = await get(base, '/models');
    assert.equal(r.status, 200);
    return r.json.data.find((m) => m.id === name);
}

// Wait (bounded) until the model's status is `value`.
async function until(base, name, value, ms = 30_000 * SLOW) {
    const t0 = Date.now();
    for (;;) {
        const m = await entry(base, name);
        if (m && m.status.value === value) return m;
        if (Date.now() - t0 > ms) throw new Error(`${name}: status ${JSON.stringify(m && m.status)}, want ${value}`);
        await sleep(20);
    }
}

function rssKiB(pid) {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return Number(m[1]);
}

const PROMPTS = ['ROMEO:', 'JULIET:', 'First Citizen:'];
const N = 12;
const completion = (api, model, prompt) =>
    api.completions.create({ model, prompt, max_tokens: N, temperature: 0 }).then((c) => c.choices[0].text);
const chat = (api, model, content) =>
    api.chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens: N, temperature: 0 })
        .then((c) => c.choices[0].message.content);
async function streamed(api, model, prompt) {
    const s = await api.completions.create({ model, prompt, max_tokens: N, temperature: 0, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.text ?? '';
    return text;
}
const BERT_IDS = existsSync(join(BERT, 'embed.json'))
    ? JSON.parse(readFileSync(join(BERT, 'embed.json'), 'utf8')).texts.slice(0, 2).map((t) => t.ids) : [[2, 3]];
const embed = (api, model) => api.embeddings.create({ model, input: BERT_IDS, encoding_format: 'float' })
    .then((r) => r.data.map((d) => d.embedding));

describe('router mode', { timeout: 600_000 * SLOW }, () => {
    after(() => rmSync(work, { recursive: true, force: true }));

    describe('two models and an encoder at once', () => {
        const solo = {};
        let srv;
        before(async () => {
            // each model served alone (the single-model server: the model field not needed)
            for (const [name, dir] of [['llama-tiny', LLAMA], ['phixtral-tiny', PHI]]) {
                const one = await serve(['-m', dir]);
                const api = openai(one.base);
                solo[name] = {
                    completions: await Promise.all(PROMPTS.map((p) => completion(api, name, p))),
                    chat: await chat(api, name, 'hello'),
                };
                await one.stop();
            }
            const one = await serve(['-m', BERT]);
            solo.bert = await embed(openai(one.base), 'bert_st');
            await one.stop();
            srv = await serve(['-m', LLAMA, '-m', PHI, '-m', `enc=${BERT}`]);
        });
        after(async () => { if (srv) await srv.stop(); });

        it('/v1/models lists every model with its status', async () => {
            const list = await openai(srv.base).models.list();
            const ids = list.data.map((m) => m.id).sort();
            assert.deepEqual(ids, ['enc', 'llama-tiny', 'phixtral-tiny']);
            for (const m of list.data) assert.equal(m.status.value, 'unloaded', m.id);
            const one = await get(srv.base, '/v1/models/enc');
            assert.equal(one.status, 200);
            assert.equal(one.json.id, 'enc');
            assertError(await get(srv.base, '/v1/models/nope'), 404, 'an unknown model id');
        });

        it('interleaved requests across the models equal each served alone', async () => {
            const api = openai(srv.base);
            const jobs = [];
            for (const [i, p] of PROMPTS.entries()) {
                jobs.push(completion(api, 'llama-tiny', p).then((t) => assert.equal(t, solo['llama-tiny'].completions[i], `llama ${p}`)));
                jobs.push(completion(api, 'phixtral-tiny', p).then((t) => assert.equal(t, solo['phixtral-tiny'].completions[i], `phixtral ${p}`)));
                jobs.push(streamed(api, i % 2 ? 'llama-tiny' : 'phixtral-tiny', p).then((t) =>
                    assert.equal(t, solo[i % 2 ? 'llama-tiny' : 'phixtral-tiny'].completions[i], `stream ${p}`)));
            }
            jobs.push(chat(api, 'llama-tiny', 'hello').then((t) => assert.equal(t, solo['llama-tiny'].chat)));
            jobs.push(embed(api, 'enc').then((v) => {
                for (const [i, want] of solo.bert.entries())
                    for (const [j, x] of want.entries()) assert.ok(Math.abs(v[i][j] - x) <= 1e-6, `embedding ${i}[${j}]`);
            }));
            await withTimeout(Promise.all(jobs), 120_000 * SLOW, 'the interleaved requests');
            for (const name of ['llama-tiny', 'phixtral-tiny', 'enc'])
                assert.equal((await entry(srv.base, name)).status.value, 'loaded', name);
        });

        it('responses and Anthropic messages pick the model by name too', async () => {
            const r = await openai(srv.base).responses.create({ model: 'phixtral-tiny', input: 'ROMEO:', max_output_tokens: 8, temperature: 0 });
            assert.equal(r.model, 'phixtral-tiny');
            const a = new Anthropic({ baseURL: srv.base, apiKey: 'x', maxRetries: 0 });
            const m = await a.messages.create({ model: 'llama-tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hello' }], temperature: 0 });
            assert.equal(m.model, 'llama-tiny');
            await assert.rejects(a.messages.create({ model: 'nope', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
                (e) => e.status === 404 && /nope/.test(e.message));
        });

        it('an unknown or missing model is the API\'s error naming it', async () => {
            const api = openai(srv.base);
            await assert.rejects(completion(api, 'gpt-4o', 'x'), (e) => {
                assert.equal(e.status, 404);
                assert.equal(e.code, 'model_not_found');
                assert.match(e.message, /gpt-4o/);
                return true;
            });
            const r = await post(srv.base, '/v1/completions', { prompt: 'x', max_tokens: 2 });
            assert.match(assertError(r, 400, 'no model field').message, /'model' is required/);
            // an encoder does not generate, a generating model does not embed
            assertError(await post(srv.base, '/v1/completions', { model: 'enc', prompt: 'x' }), 400, 'completion on the encoder');
            assertError(await post(srv.base, '/v1/embeddings', { model: 'llama-tiny', input: 'x' }), 400, 'embedding on llama');
        });
    });

    describe('a single -m', () => {
        it('is no router: the model field is not needed, -m NAME=MODEL names it, /models/load is refused', async () => {
            const srv = await serve(['-m', `solo=${LLAMA}`]);
            try {
                const ids = (await get(srv.base, '/v1/models')).json.data.map((m) => m.id);
                assert.deepEqual(ids, ['solo']);
                assert.equal((await post(srv.base, '/v1/completions', { prompt: 'x', max_tokens: 2 })).status, 200);
                assertError(await post(srv.base, '/models/load', { model: 'solo' }), 400, 'load on a single-model server');
                assert.match(srv.out, /\(model solo, /);
            } finally {
                await srv.stop();
            }
        });
    });

    describe('load and unload through the routes', () => {
        let srv;
        before(async () => { srv = await serve(['-m', LLAMA, '-m', PHI, '--no-models-autoload']); });
        after(async () => { if (srv) await srv.stop(); });

        it('--no-models-autoload: an unloaded model answers 400 until POST /models/load', async () => {
            const r = await post(srv.base, '/v1/completions', { model: 'phixtral-tiny', prompt: 'x', max_tokens: 2 });
            assert.match(assertError(r, 400, 'not loaded', { code: 'model_not_loaded' }).message, /models\/load/);
            const l = await post(srv.base, '/models/load', { model: 'phixtral-tiny' });
            assert.equal(l.status, 200);
            assert.deepEqual(l.json, { success: true });
            await until(srv.base, 'phixtral-tiny', 'loaded');
            const c = await post(srv.base, '/v1/completions', { model: 'phixtral-tiny', prompt: 'x', max_tokens: 2 });
            assert.equal(c.status, 200);
            assert.equal((await post(srv.base, '/models/unload', { model: 'phixtral-tiny' })).status, 200);
            await until(srv.base, 'phixtral-tiny', 'unloaded');
            assertError(await post(srv.base, '/models/load', { model: 'nope' }), 404, 'load of an unknown model');
            assertError(await post(srv.base, '/models/load', {}), 400, 'load without a model');
            assertError(await post(srv.base, '/models/load', '{'), 400, 'load with a broken body');
            assertError(await get(srv.base, '/models/load'), 405, 'GET /models/load');
        });

        it('unloading a model while a request streams from it never fails the request', async () => {
            await post(srv.base, '/models/load', { model: 'llama-tiny' });
            await until(srv.base, 'llama-tiny', 'loaded');
            const res = await fetch(srv.base + '/v1/completions', {
                method: 'POST', headers: { 'content-type': 'application/json' },
                body: JSON.stringify({ model: 'llama-tiny', prompt: 'ROMEO:', max_tokens: 400, temperature: 0, stream: true, ignore_eos: true }),
            });
            assert.equal(res.status, 200);
            const reader = res.body.getReader();
            let text = '';
            const first = await reader.read();
            text += new TextDecoder().decode(first.value);
            // unload asked for in the middle of the stream: it waits for the stream
            assert.equal((await post(srv.base, '/models/unload', { model: 'llama-tiny' })).status, 200);
            const during = await entry(srv.base, 'llama-tiny');
            assert.equal(during.status.value, 'loaded', 'unloaded under a stream');
            for (;;) {
                const { done, value } = await reader.read();
                if (done) break;
                text += new TextDecoder().decode(value);
            }
            const events = parseSSE(text, 'the stream');
            const last = events.filter((e) => e.choices && e.choices.length).pop();
            assert.equal(last.choices[0].finish_reason, 'length', 'the stream ran to its end');
            await until(srv.base, 'llama-tiny', 'unloaded');
            // the log: the stream's request completed, then the model went
            const done = srv.err.lastIndexOf('POST /v1/completions 200');
            const gone = srv.err.lastIndexOf("unloading model 'llama-tiny'");
            assert.ok(done >= 0 && gone > done, `the unload came before the stream ended:\n${srv.err.slice(-2000)}`);
        });
    });

    describe('--models-max 1', () => {
        let srv;
        before(async () => { srv = await serve(['-m', LLAMA, '-m', PHI, '--models-max', '1']); });
        after(async () => { if (srv) await srv.stop(); });

        it('evicts the least recently used model', async () => {
            const api = openai(srv.base);
            const a1 = await completion(api, 'llama-tiny', 'ROMEO:');
            assert.equal((await entry(srv.base, 'llama-tiny')).status.value, 'loaded');
            await completion(api, 'phixtral-tiny', 'ROMEO:');
            assert.equal((await entry(srv.base, 'phixtral-tiny')).status.value, 'loaded');
            assert.equal((await entry(srv.base, 'llama-tiny')).status.value, 'unloaded');
            // back again: the same answer, phixtral evicted
            assert.equal(await completion(api, 'llama-tiny', 'ROMEO:'), a1);
            assert.equal((await entry(srv.base, 'phixtral-tiny')).status.value, 'unloaded');
            // concurrent requests for both: each waits its turn, none fails
            const all = await withTimeout(Promise.all([0, 1, 2, 3].map((i) =>
                completion(api, i % 2 ? 'phixtral-tiny' : 'llama-tiny', 'JULIET:'))), 60_000 * SLOW, 'alternating models');
            assert.equal(all[0], all[2]);
            assert.equal(all[1], all[3]);
            assert.match(srv.err, /unloading model 'llama-tiny'/);
        });
    });

    describe('--memory-budget', () => {
        let srv;
        // llama-tiny holds about 9 MiB with 512 tokens of KV cache, phixtral-tiny about 15 MiB
        before(async () => { srv = await serve(['-m', LLAMA, '-m', PHI, '--memory-budget', '20M', '--ctx-size', '512']); });
        after(async () => { if (srv) await srv.stop(); });

        it('unloads the least recently used model to stay within the budget', async () => {
            const api = openai(srv.base);
            await completion(api, 'llama-tiny', 'ROMEO:');
            const l = await entry(srv.base, 'llama-tiny');
            assert.equal(l.status.value, 'loaded');
            await completion(api, 'phixtral-tiny', 'ROMEO:');
            const p = await entry(srv.base, 'phixtral-tiny');
            assert.ok(l.status.bytes + p.status.bytes > 20 << 20, `${l.status.bytes} + ${p.status.bytes} bytes fit 20 MiB`);
            assert.equal((await entry(srv.base, 'llama-tiny')).status.value, 'unloaded');
            let sum = 0;
            for (const m of (await get(srv.base, '/models')).json.data)
                if (m.status.value === 'loaded') sum += m.status.bytes;
            assert.ok(sum <= 20 << 20, `${sum} bytes loaded`);
        });
    });

    describe('a model over the budget', () => {
        let srv;
        before(async () => { srv = await serve(['-m', LLAMA, '-m', PHI, '--memory-budget', '12M', '--ctx-size', '512']); });
        after(async () => { if (srv) await srv.stop(); });

        it('fails to load, saying so; the others serve', async () => {
            const r = await post(srv.base, '/v1/completions', { model: 'phixtral-tiny', prompt: 'x', max_tokens: 2 });
            assert.match(assertError(r, 500, 'a model over the budget', { code: 'model_load_failed' }).message, /memory-budget/);
            assert.equal((await post(srv.base, '/v1/completions', { model: 'llama-tiny', prompt: 'x', max_tokens: 2 })).status, 200);
        });
    });

    describe('load / unload races', () => {
        let srv;
        before(async () => { srv = await serve(['-m', LLAMA, '-m', PHI, '--models-max', '1']); });
        after(async () => { if (srv) await srv.stop(); });

        it('loads, unloads and requests at once: each answer is a completion or a clear 503, nothing crashes', async () => {
            const models = ['llama-tiny', 'phixtral-tiny'];
            const jobs = [];
            for (let i = 0; i < 60; i++) {
                const m = models[i % 2];
                if (i % 3 === 0) jobs.push(post(srv.base, '/models/unload', { model: m }).then((r) => assert.equal(r.status, 200)));
                else if (i % 5 === 0) jobs.push(post(srv.base, '/models/load', { model: m }).then((r) => assert.equal(r.status, 200)));
                else jobs.push(post(srv.base, '/v1/completions', { model: m, prompt: 'ROMEO:', max_tokens: 4, stream: i % 2 === 0 })
                    .then((r) => {
                        if (r.status !== 200) assert.match(assertError(r, 503, `completion ${i}`).message, /did not load|loading/);
                    }));
            }
            await withTimeout(Promise.all(jobs), 120_000 * SLOW, 'the racing requests');
            assert.equal(srv.proc.exitCode, null, 'the server is alive');
            // and it still serves both
            for (const m of models)
                assert.equal((await post(srv.base, '/v1/completions', { model: m, prompt: 'x', max_tokens: 2 })).status, 200);
        });
    });

    describe('--models-dir', () => {
        let srv;
        const dir = join(work, 'models');
        before(async () => {
            mkdirSync(dir);
            mkdirSync(join(dir, 'broken'));
            writeFileSync(join(dir, 'broken', 'config.json'), '{"model_type": "llama", "hidden_size": ');
            symlinkSync(resolve(LLAMA), join(dir, 'escape'));     // leads out of DIR: skipped
            mkdirSync(join(dir, 'org'));
            symlinkSync('../../models/nowhere', join(dir, 'org', 'dangling'));
            for (let i = 0; i < 3000; i++) mkdirSync(join(dir, `empty${i}`));
            srv = await serve(['--models-dir', dir, '-m', `tiny=${LLAMA}`]);
        });
        after(async () => { if (srv) await srv.stop(); });

        it('thousands of empty folders are scanned within a bounded time', () => {
            assert.ok(srv.readyMs < 20_000 * SLOW, `ready after ${srv.readyMs} ms`);
        });

        it('lists the models found, not the symlink escaping the directory', async () => {
            const ids = (await get(srv.base, '/v1/models')).json.data.map((m) => m.id).sort();
            assert.deepEqual(ids, ['broken', 'tiny']);
            assert.match(srv.err, /escape: it leads out of the directory/);
            assertError(await post(srv.base, '/v1/completions', { model: 'escape', prompt: 'x' }), 404, 'the escaping model');
        });

        it('a broken config.json: its requests get the load error, the others keep serving', async () => {
            const api = openai(srv.base);
            for (let i = 0; i < 2; i++) {
                await assert.rejects(completion(api, 'broken', 'x'), (e) => {
                    assert.equal(e.status, 500);
                    assert.match(e.message, /broken/);
                    assert.match(e.message, /load/);
                    return true;
                });
                assert.equal((await completion(api, 'tiny', 'ROMEO:')).length > 0, true);
            }
            const b = await entry(srv.base, 'broken');
            assert.equal(b.status.failed, true);
            assert.equal(b.status.value, 'unloaded');
            assert.match(b.status.error, /config\.json/);
            assert.equal((await entry(srv.base, 'tiny')).status.value, 'loaded');
        });
    });

    describe('memory', () => {
        let srv;
        before(async () => { srv = await serve(['-m', LLAMA, '-m', PHI]); });
        after(async () => { if (srv) await srv.stop(); });

        it('RSS stays bounded when cycling load and unload', async () => {
            const api = openai(srv.base);
            const cycle = async () => {
                for (const m of ['llama-tiny', 'phixtral-tiny']) {
                    await completion(api, m, 'ROMEO:');
                    await post(srv.base, '/models/unload', { model: m });
                    await until(srv.base, m, 'unloaded');
                }
            };
            await cycle();
            await cycle();
            const base = rssKiB(srv.proc.pid);
            for (let i = 0; i < 12; i++) await cycle();
            const grown = rssKiB(srv.proc.pid) - base;
            // each cycle loads about 40 MB of models: a leak of a model a cycle would pass 400 MB
            assert.ok(grown < 64 * 1024 * (SLOW > 1 ? 4 : 1), `RSS grew ${grown} KiB over 12 load/unload cycles`);
        });
    });

    describe('presets', () => {
        let srv;
        before(async () => {
            const ini = join(work, 'presets.ini');
            writeFileSync(ini, '[*]\nctx-size = 256\n\n[llama-tiny]\nparallel = 2\nload-on-startup = true\n');
            srv = await serve(['-m', LLAMA, '-m', PHI, '--models-preset', ini]);
        });
        after(async () => { if (srv) await srv.stop(); });

        it('load-on-startup loads the model unasked; ctx-size bounds each request', async () => {
            await until(srv.base, 'llama-tiny', 'loaded');
            assert.equal((await entry(srv.base, 'phixtral-tiny')).status.value, 'unloaded');
            const long = 'ROMEO: ' + 'and '.repeat(300);
            const r = await post(srv.base, '/v1/completions', { model: 'llama-tiny', prompt: long, max_tokens: 4 });
            assertError(r, 400, 'a prompt over the preset context');
        });

        it('a presets file naming no model is refused at start', async () => {
            const bad = join(work, 'bad.ini');
            writeFileSync(bad, '[nope]\ntemp = 0.5\n');
            const p = spawn(BIN, ['serve', '--port', '0', '-m', LLAMA, '-m', PHI, '--models-preset', bad], { stdio: ['ignore', 'pipe', 'pipe'] });
            let err = '';
            p.stderr.on('data', (d) => { err += d; });
            const code = await withTimeout(new Promise((res) => p.on('exit', res)), 30_000 * SLOW, 'serve to refuse');
            assert.notEqual(code, 0);
            assert.match(err, /\[nope\] names no model/);
        });
    });
});

describe('router mode: llama-server routes', () => {
    let both, one;
    before(async () => {
        both = await serve(['-m', LLAMA, '-m', PHI]);
        one = await serve(['-m', PHI]);
    });
    after(async () => {
        await both?.stop();
        await one?.stop();
    });

    it('/completion takes the body\'s model, equal to the model served alone; /props and /slots take ?model=', async () => {
        const body = { prompt: 'ROMEO:', n_predict: 8, temperature: 0, seed: 1 };
        const alone = await post(one.base, '/completion', body);
        assert.equal(alone.status, 200);
        const r = await post(both.base, '/completion', { ...body, model: 'phixtral-tiny' });
        assert.equal(r.status, 200, JSON.stringify(r.json));
        assert.equal(r.json.content, alone.json.content);
        assert.equal(r.json.model, 'phixtral-tiny');
        // no model named: llama-server's error body, naming the field
        const none = await post(both.base, '/completion', body);
        assert.equal(none.status, 400);
        assert.match(none.json.error.message, /model/);
        const props = await get(both.base, '/props?model=llama-tiny');
        assert.equal(props.status, 200);
        assert.equal(props.json.model_alias, 'llama-tiny');
        const noq = await get(both.base, '/props');
        assert.equal(noq.status, 400);
        assert.match(noq.json.error.message, /\?model=/);
        const slots = await get(both.base, '/slots?model=phixtral-tiny');
        assert.equal(slots.status, 200);
        assert.ok(Array.isArray(slots.json));
        const unknown = await get(both.base, '/slots?model=nope');
        assert.equal(unknown.status, 404);
    });
});

describe('router mode: a Hugging Face hub cache as --models-dir', () => {
    it('models--OWNER--NAME serves its refs/main snapshot as OWNER/NAME, equal to the folder served alone', async () => {
        const hub = join(work, 'hub');
        const entry = join(hub, 'models--local--llama-tiny');
        const snap = join(entry, 'snapshots', '0123456789abcdef');
        mkdirSync(snap, { recursive: true });
        mkdirSync(join(entry, 'refs'), { recursive: true });
        writeFileSync(join(entry, 'refs', 'main'), '0123456789abcdef\n');
        for (const f of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json',
                         'tokenizer_config.json'])
            writeFileSync(join(snap, f), readFileSync(join(LLAMA, f)));
        const body = { max_tokens: 6, temperature: 0, messages: [{ role: 'user', content: 'ROMEO:' }] };
        const one = await serve(['-m', LLAMA]);
        const want = await openai(one.base).chat.completions.create({ ...body, model: 'llama-tiny' });
        await one.stop();
        const r = await serve(['--models-dir', hub]);
        try {
            const m = await get(r.base, '/v1/models');
            assert.deepEqual(m.json.data.map((d) => d.id), ['local/llama-tiny']);
            const got = await openai(r.base).chat.completions.create({ ...body, model: 'local/llama-tiny' });
            assert.equal(got.choices[0].message.content, want.choices[0].message.content);
        } finally {
            await r.stop();
        }
    });
});
