// LoRA adapters through the API (issue 46 item 2, ADR 0103, docs/server.md): llama-server's
// GET / POST /lora-adapters and a request's "lora" [{id, scale}] selecting adapters per request
// with the official openai client. Two adapters for models/llama-tiny are written here (a PEFT
// one on q / v / down of every layer and an mlx-lm one on o / up of the last two layers, from a
// fixed PRNG); a server holding both at scale 0 (--lora-init-without-apply) must answer each
// request exactly as a server running only the adapter the request names (--lora PATH), also
// with requests for both adapters and none in flight together (one batch).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, get, post, assertError, withTimeout, SLOW } from './harness.mjs';

// mulberry32: a small fixed PRNG, uniform in [-1, 1)
function prng(seed) {
    let a = seed >>> 0;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 2 - 1;
    };
}

function writeSafetensors(file, tensors) {
    const header = {};
    let off = 0;
    for (const [name, shape, data] of tensors) {
        header[name] = { dtype: 'F32', shape, data_offsets: [off, off + data.length * 4] };
        off += data.length * 4;
    }
    let h = Buffer.from(JSON.stringify(header));
    h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(h.length));
    const body = Buffer.concat(tensors.map(([, , d]) => Buffer.from(Float32Array.from(d).buffer)));
    fs.writeFileSync(file, Buffer.concat([len, h, body]));
}

// llama-tiny: hidden 256, 4 layers, 8 heads of 32, 4 kv heads, intermediate 768
const DIMS = { q_proj: [256, 256], v_proj: [128, 256], o_proj: [256, 256], up_proj: [768, 256],
               down_proj: [256, 768] };
const group = (m) => (m.endsWith('_proj') && ['q_proj', 'k_proj', 'v_proj', 'o_proj'].includes(m) ? 'self_attn' : 'mlp');
const mat = (rnd, n, s) => Array.from({ length: n }, () => rnd() * s);

function peftAdapter(dir) {
    const rnd = prng(46), r = 8, t = [];
    for (let l = 0; l < 4; l++)
        for (const m of ['q_proj', 'v_proj', 'down_proj']) {
            const [out, inp] = DIMS[m];
            const p = `base_model.model.model.layers.${l}.${group(m)}.${m}.`;
            t.push([p + 'lora_A.weight', [r, inp], mat(rnd, r * inp, 1 / Math.sqrt(inp))]);
            t.push([p + 'lora_B.weight', [out, r], mat(rnd, out * r, 0.3)]);
        }
    fs.mkdirSync(dir);
    writeSafetensors(path.join(dir, 'adapter_model.safetensors'), t);
    fs.writeFileSync(path.join(dir, 'adapter_config.json'), JSON.stringify({
        peft_type: 'LORA', r, lora_alpha: 16, target_modules: ['q_proj', 'v_proj', 'down_proj'],
        lora_dropout: 0.05, bias: 'none', task_type: 'CAUSAL_LM' }));
}

function mlxAdapter(dir) {
    const rnd = prng(4646), r = 4, t = [];
    for (let l = 2; l < 4; l++)
        for (const m of ['o_proj', 'up_proj']) {
            const [out, inp] = DIMS[m];
            const p = `model.layers.${l}.${group(m)}.${m}.`;
            t.push([p + 'lora_a', [inp, r], mat(rnd, inp * r, 1 / Math.sqrt(inp))]);
            t.push([p + 'lora_b', [r, out], mat(rnd, r * out, 0.3)]);
        }
    fs.mkdirSync(dir);
    writeSafetensors(path.join(dir, 'adapters.safetensors'), t);
    fs.writeFileSync(path.join(dir, 'adapter_config.json'), JSON.stringify({
        fine_tune_type: 'lora', num_layers: 2,
        lora_parameters: { rank: r, scale: 4.0, dropout: 0.0, keys: ['self_attn.o_proj', 'mlp.up_proj'] } }));
}

const PROMPTS = ['The quick brown fox', 'ROMEO: What light through', 'Once upon a time there'];
const N = 16;

describe('lora adapters', { timeout: 300_000 * SLOW }, () => {
    let tmp, a1, a2, multi, only1, only2, plain;
    before(async () => {
        tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxcel-lora-'));
        a1 = path.join(tmp, 'peft');
        a2 = path.join(tmp, 'mlx');
        peftAdapter(a1);
        mlxAdapter(a2);
        [multi, only1, only2, plain] = await Promise.all([
            startServer(['--lora', a1, '--lora', a2, '--lora-init-without-apply', '--parallel', '4']),
            startServer(['--lora', a1]),
            startServer(['--lora-scaled', a2, '1']),
            startServer([]),
        ]);
    });
    after(async () => {
        for (const s of [multi, only1, only2, plain]) if (s && !s.stopped) await s.stop();
        if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
    });

    const chat = (s, prompt, lora) => client(s.base).chat.completions.create({
        messages: [{ role: 'user', content: prompt }], max_tokens: N, temperature: 0,
        ...(lora ? { lora } : {}),
    }).then((r) => r.choices[0].message.content);

    it('GET /lora-adapters lists the adapters by id with their scales', async () => {
        const r = await get(multi.base, '/lora-adapters');
        assert.equal(r.status, 200);
        // llama-server's entries; task_name and prompt_prefix are GGUF metadata, "" here
        const entry = (id, p, scale) => ({ id, path: p, scale, task_name: '', prompt_prefix: '' });
        assert.deepEqual(r.json, [entry(0, a1, 0), entry(1, a2, 0)]);
        const one = await get(only2.base, '/lora-adapters');
        assert.deepEqual(one.json, [entry(0, a2, 1)]);
        const none = await get(plain.base, '/lora-adapters');
        assert.deepEqual(none.json, []);
    });

    it('a request\'s lora selects its adapter; together in one batch each equals its own server', async () => {
        const want = {};
        for (const p of PROMPTS) {
            want[p] = { base: await chat(plain, p), a1: await chat(only1, p), a2: await chat(only2, p) };
            // the adapters change the output: otherwise this test could not fail
            assert.notEqual(want[p].a1, want[p].base, `${p}: adapter 1 changes nothing`);
            assert.notEqual(want[p].a2, want[p].base, `${p}: adapter 2 changes nothing`);
        }
        const jobs = [];
        for (const p of PROMPTS) {
            jobs.push(chat(multi, p, [{ id: 0, scale: 1 }]).then((t) => [p, 'a1', t]));
            jobs.push(chat(multi, p, [{ id: 1, scale: 1 }]).then((t) => [p, 'a2', t]));
            jobs.push(chat(multi, p).then((t) => [p, 'base', t]));
            jobs.push(chat(multi, p, []).then((t) => [p, 'base', t]));
        }
        const got = await withTimeout(Promise.all(jobs), 180_000 * SLOW, 'concurrent requests');
        for (const [p, k, t] of got) assert.equal(t, want[p][k], `${p} with ${k}`);
    });

    it('the prefix cache never hands one adapter\'s K/V to another', async () => {
        // a long prompt: whole blocks of it are cached by the first request and would be found
        // by the next ones if the cache's keys ignored the adapters
        const long = 'In fair Verona, where we lay our scene, from ancient grudge break to new mutiny. '.repeat(4);
        const order = [['base', undefined], ['a1', [{ id: 0, scale: 1 }]], ['a2', [{ id: 1, scale: 1 }]],
                       ['a1', [{ id: 0, scale: 1 }]], ['base', []]];
        const want = { base: await chat(plain, long), a1: await chat(only1, long), a2: await chat(only2, long) };
        for (const [k, lora] of order) assert.equal(await chat(multi, long, lora), want[k], `${k} after others`);
        const m = await fetch(`${multi.base}/metrics`).then((r) => r.text());
        const hits = Number(/mlxcel_prefix_cache_hit_tokens_total (\d+)/.exec(m)[1]);
        assert.ok(hits > 0, 'the same adapter found its own cached prefix');
    });

    it('the completions endpoint takes lora too', async () => {
        const r = await post(multi.base, '/v1/completions', { prompt: PROMPTS[0], max_tokens: N, temperature: 0,
                                                              lora: [{ id: 0, scale: 1 }] });
        const w = await post(only1.base, '/v1/completions', { prompt: PROMPTS[0], max_tokens: N, temperature: 0 });
        assert.equal(r.status, 200);
        assert.equal(r.json.choices[0].text, w.json.choices[0].text);
    });

    it('llama-server\'s /completion takes lora too', async () => {
        const body = { prompt: PROMPTS[0], n_predict: N, temperature: 0, seed: 1 };
        const r = await post(multi.base, '/completion', { ...body, lora: [{ id: 1, scale: 1 }] });
        const w = await post(only2.base, '/completion', body);
        const b = await post(plain.base, '/completion', body);
        assert.equal(r.status, 200, JSON.stringify(r.json));
        assert.equal(r.json.content, w.json.content);
        assert.notEqual(r.json.content, b.json.content, 'the adapter changes nothing');
        const bad = await post(multi.base, '/completion', { ...body, lora: [{ id: 7, scale: 1 }] });
        assert.equal(bad.status, 400);
        assert.match(bad.json.error.message, /invalid adapter id 7/);
    });

    it('router mode: two models with their own adapters (presets\' lora), interleaved, each equal to its own server', async () => {
        // the same base twice under two names, each with its adapter from the presets file
        const preset = path.join(tmp, 'presets.ini');
        fs.writeFileSync(preset, `[tinyA]\nlora = ${a1}\n\n[tinyB]\nlora = ${a2}:1\n`);
        const router = await startServer(['-m', 'tinyA=models/llama-tiny', '-m', 'tinyB=models/llama-tiny',
                                          '--models-preset', preset]);
        try {
            const ask = (s, model, p) => client(s.base).chat.completions.create({
                model, messages: [{ role: 'user', content: p }], max_tokens: N, temperature: 0,
            }).then((r) => r.choices[0].message.content);
            const want = {};
            for (const p of PROMPTS)
                want[p] = { tinyA: await chat(only1, p), tinyB: await chat(only2, p) };
            const jobs = [];
            for (const p of PROMPTS)
                for (const m of ['tinyA', 'tinyB', 'tinyA', 'tinyB'])
                    jobs.push(ask(router, m, p).then((t) => [p, m, t]));
            const got = await withTimeout(Promise.all(jobs), 180_000 * SLOW, 'interleaved requests');
            for (const [p, m, t] of got) assert.equal(t, want[p][m], `${p} on ${m}`);
            // each model lists its own adapter
            const la = await get(router.base, '/lora-adapters?model=tinyA');
            const lb = await get(router.base, '/lora-adapters?model=tinyB');
            assert.deepEqual(la.json.map((x) => x.path), [a1]);
            assert.deepEqual(lb.json.map((x) => x.path), [a2]);
        } finally {
            await router.stop();
        }
        // a preset naming an adapter that does not fit its model: that model fails to load with
        // the adapter's error, the server keeps serving
        const bad = path.join(tmp, 'bad.ini');
        fs.writeFileSync(bad, `[tinyA]\nlora = ${path.join(tmp, 'nonexistent')}\n`);
        const r2 = await startServer(['-m', 'tinyA=models/llama-tiny', '-m', 'tinyB=models/llama-tiny',
                                      '--models-preset', bad]);
        try {
            const e = await post(r2.base, '/v1/chat/completions', { model: 'tinyA', max_tokens: 2,
                messages: [{ role: 'user', content: 'x' }] });
            assert.ok(e.status >= 400, `status ${e.status}`);
            assert.match(JSON.stringify(e.json), /lora|adapter|nonexistent/i);
            const ok = await post(r2.base, '/v1/chat/completions', { model: 'tinyB', max_tokens: 2,
                messages: [{ role: 'user', content: 'x' }] });
            assert.equal(ok.status, 200);
        } finally {
            await r2.stop();
        }
    });

    it('POST /lora-adapters sets the global scales of requests without lora', async () => {
        const r = await post(multi.base, '/lora-adapters', [{ id: 1, scale: 1 }]);
        assert.equal(r.status, 200);
        assert.deepEqual(r.json, { success: true });
        const l = await get(multi.base, '/lora-adapters');
        assert.deepEqual(l.json.map((a) => a.scale), [0, 1]);
        assert.equal(await chat(multi, PROMPTS[1]), await chat(only2, PROMPTS[1]));
        // a request's own list still wins
        assert.equal(await chat(multi, PROMPTS[1], [{ id: 0, scale: 1 }]), await chat(only1, PROMPTS[1]));
        await post(multi.base, '/lora-adapters', []);
        assert.deepEqual((await get(multi.base, '/lora-adapters')).json.map((a) => a.scale), [0, 0]);
        assert.equal(await chat(multi, PROMPTS[1]), await chat(plain, PROMPTS[1]));
    });

    it('bad ids and bodies answer 400 in the error shape', async () => {
        const body = (lora) => ({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, lora });
        const e = assertError(await post(multi.base, '/v1/chat/completions', body([{ id: 2, scale: 1 }])), 400,
            'id 2', { param: 'lora' });
        assert.match(e.message, /invalid adapter id 2/);
        assertError(await post(plain.base, '/v1/chat/completions', body([{ id: 0, scale: 1 }])), 400, 'no adapters');
        assertError(await post(multi.base, '/v1/chat/completions', body({ id: 0 })), 400, 'not an array',
            { param: 'lora' });
        assertError(await post(multi.base, '/v1/chat/completions', body([{ id: 0, scale: 'x' }])), 400,
            'scale a string', { param: 'lora[0].scale' });
        assertError(await post(multi.base, '/v1/chat/completions', body([{ id: 0, scale: 1e9 }])), 400,
            'scale out of range', { param: 'lora[0].scale' });
        assertError(await post(multi.base, '/lora-adapters', [{ id: 5, scale: 1 }]), 400, 'POST id 5');
        assertError(await post(multi.base, '/lora-adapters', { id: 0 }), 400, 'POST an object');
        assertError(await post(multi.base, '/lora-adapters', '[{"id": 0,'), 400, 'POST bad JSON');
        assertError(await post(multi.base, '/lora-adapters', [{ id: 0, scale: 'big' }]), 400, 'POST scale');
        const r = await request405(multi.base);
        assert.equal(r, 405);
    });

    it('stops cleanly', async () => {
        for (const s of [multi, only1, only2, plain]) await s.stop();
    });
});

const request405 = (base) => fetch(base + '/lora-adapters', { method: 'PUT' }).then((r) => r.status);
