// Differential tests of the serving path: the server's greedy answers must equal `mlxcel generate
// --temp 0` of the same prompt alone, token for token, whatever else the scheduler does in the
// same steps (a bug of this class once fed every multi-image prompt wrong: no single-feature
// test sent two images). For tiny checkpoints (llama-tiny; goldens with sliding windows, MoE,
// MLA, MLX 4/8-bit, Mamba-2 / gated-DeltaNet / short-conv / RG-LRU hybrids):
//  - `--parallel` 1, 3, 4 and 8 with concurrent and staggered requests of different lengths
//    (prefill chunks beside decode rows), `--ubatch-size` 1 to 16 (chunks cutting prompts);
//  - the prefix cache: the same prompts again, the same prompt twice at once, a prompt that is
//    a prefix of another, one extending an earlier prompt and its answer, two sharing a prefix
//    at once, long prompts with a shared 300-id system prompt and the next turn (recurrent
//    snapshots, ADR 0129); `--no-prefix-cache` as the control;
//  - speculative decoding (`--spec ngram`, the model as its own `--model-draft`, `--spec mtp` on
//    DeepSeek-V3 and Qwen3-Next with a random MTP layer) beside other requests;
//  - a small `--ctx-size`, where requests wait, are preempted and resumed;
//  - `--kv-type bf16` / `f16` (against `generate --kv-type`);
//  - a streamed request closed mid-answer, then the same prompt again beside another;
//  - seeded sampling (top-k, top-p, min-p, repetition penalty) with `n` choices: choice i is
//    `generate --seed S+i`, with drafts too (ADR 0116); a greedy request with a repetition
//    penalty; logprobs within float rounding of the solo request's on a plain server.
// The goldens (tests/fixtures/golden, vocab 384, BOS 1, EOS 2) get a WordLevel tokenizer of
// t3 .. t383 so that serve loads them; prompts are token ids (`/completion` with
// `return_tokens`) and the reference is `generate --prompt-ids --output-ids --ignore-eos`.
// Vision (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, LLaVA, Mistral 3, Idefics3, SmolVLM): one
// and two images and a text request at once, twice, then the next turn through the image's
// cached blocks, with chunks cutting through images, without the cache, a small context,
// prompt lookup, a draft model and bf16 K/V, against `generate --image`. Request features
// `generate` lacks (constrained decoding, tools, stop strings, penalties, logit_bias, logprobs,
// n) through the four dialects are held to a plain `--parallel 1` server's answers.
// `serve` has no `-b` (the forward's chunk is the context's fixed n_batch): `-ub` is the knob.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, post, withTimeout, sleep, SLOW } from './harness.mjs';

const BIN = process.env.MLXCEL_BIN;
const work = mkdtempSync(join(tmpdir(), 'mlxcel-diff-'));
process.on('exit', () => rmSync(work, { recursive: true, force: true }));
const G = 'tests/fixtures/golden';

// A servable copy of a golden folder: its weights and config plus a WordLevel tokenizer over
// its vocabulary (<pad> 0, <s> 1, </s> 2, t3 ...), no chat template (prompts go as ids).
function servable(name, config = null) {
    const src = join(G, name), out = join(work, config ? `${name}-long` : name);
    mkdirSync(out, { recursive: true });
    for (const f of readdirSync(src))
        if (f !== 'golden.safetensors' && (f.endsWith('.safetensors') || ['config.json', 'generation_config.json',
            'model.safetensors.index.json'].includes(f)))
            copyFileSync(join(src, f), join(out, f));
    const V = JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')).vocab_size || 384;
    if (config)
        writeFileSync(join(out, 'config.json'), JSON.stringify({ ...JSON.parse(readFileSync(join(src, 'config.json'), 'utf8')), ...config }));
    const special = { '<pad>': 0, '<s>': 1, '</s>': 2 };
    const vocab = { ...special };
    for (let i = 3; i < V; i++) vocab[`t${i}`] = i;
    writeFileSync(join(out, 'tokenizer.json'), JSON.stringify({
        version: '1.0', truncation: null, padding: null, normalizer: null, post_processor: null, decoder: null,
        added_tokens: Object.entries(special).map(([content, id]) => ({ id, content, single_word: false,
            lstrip: false, rstrip: false, normalized: false, special: true })),
        pre_tokenizer: { type: 'Whitespace' }, model: { type: 'WordLevel', vocab, unk_token: '<pad>' },
    }));
    writeFileSync(join(out, 'tokenizer_config.json'), JSON.stringify({ bos_token: '<s>', eos_token: '</s>', pad_token: '<pad>' }));
    return out;
}

// Deterministic prompts: ids in [3, 383] from a small LCG.
function ids(seed, n) {
    let x = (seed * 2654435761) >>> 0;
    const out = [];
    for (let i = 0; i < n; i++) {
        x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
        out.push(3 + (x >>> 8) % 381);
    }
    return out;
}

const refCache = new Map();
// `mlxcel generate` alone: greedy (or seeded sampling), the generated ids; extra: its flags
// (--kv-type, --spec ...) as the server has them.
function generate(dir, prompt, n, { extra = [], seed = null, temp = 0, samp = null } = {}) {
    const key = JSON.stringify([dir, prompt, n, extra, seed, temp, samp]);
    if (refCache.has(key)) return refCache.get(key);
    const args = ['generate', '-m', dir, '--prompt-ids', prompt.join(','), '-n', String(n), '--temp', String(temp),
        '--ignore-eos', '--output-ids', ...extra];
    if (seed !== null || samp) {
        const q = { top_k: 0, top_p: 1, min_p: 0, repeat_penalty: 1, ...samp };
        args.push('--seed', String(seed ?? 1), '--top-k', String(q.top_k), '--top-p', String(q.top_p), '--min-p', String(q.min_p),
            '--repeat-penalty', String(q.repeat_penalty), '--repeat-last-n', '64');
    }
    const r = JSON.parse(execFileSync(BIN, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }));
    refCache.set(key, r);
    return r;
}

// One /completion over ids: greedy unless body says otherwise; returns {tokens, probs, json}.
async function complete(base, prompt, n, extra = {}) {
    const r = await post(base, '/completion', { prompt, n_predict: n, temperature: 0, ignore_eos: true,
        return_tokens: true, ...extra });
    if (r.status !== 200) throw new Error(`/completion of ${prompt.length} ids: ${r.status} ${r.text.slice(0, 300)}`);
    return { tokens: r.json.tokens, probs: r.json.completion_probabilities, json: r.json };
}

const same = (got, want, what) => assert.deepEqual(got, want, `${what}: served ${JSON.stringify(got)}\n  generate ${JSON.stringify(want)}`);

// The workload: prompts of different lengths, two sharing a 24-id prefix, sent at once.
function workload(seed) {
    const shared = ids(seed + 100, 24);
    return [
        { p: ids(seed + 1, 3), n: 14 },
        { p: ids(seed + 2, 11), n: 9 },
        { p: [...shared, ...ids(seed + 3, 7)], n: 12 },
        { p: ids(seed + 4, 37), n: 6 },
        { p: [...shared, ...ids(seed + 5, 15)], n: 11 },
        { p: ids(seed + 6, 58), n: 10 },
        { p: ids(seed + 6, 33), n: 7 },              // a prefix of the one before: a hit at its end
        { p: ids(seed + 2, 11), n: 9 },              // the same prompt twice at once
        { p: ids(seed + 7, 16), n: 13 },             // one block exactly
    ];
}

async function concurrentEqualsGenerate(base, dir, set, what, opts = {}) {
    const got = await withTimeout(Promise.all(set.map((w) => complete(base, w.p, w.n))), 60_000 * SLOW, what);
    set.forEach((w, i) => same(got[i].tokens, generate(dir, w.p, w.n, opts), `${what}: request ${i} (${w.p.length} ids)`));
    return got;
}

// The text models and the server configurations each runs.
const MODELS = [
    ['llama-tiny (dense)', null],
    ['mistral_swa (sliding window 8)', 'mistral_swa'],
    ['gemma3_text (sliding + global)', 'gemma3_text'],
    ['qwen3_moe (MoE)', 'qwen3_moe'],
    ['deepseek_v2 (MLA)', 'deepseek_v2'],
    ['granitemoehybrid (Mamba-2 hybrid)', 'granitemoehybrid'],
    ['nemotron_h (Mamba-2 hybrid)', 'nemotron_h'],
    ['qwen3_next (gated DeltaNet hybrid)', 'qwen3_next'],
    ['qwen3_5_text (gated DeltaNet hybrid)', 'qwen3_5_text'],
    ['lfm2 (short conv hybrid)', 'lfm2'],
    ['recurrent_gemma (RG-LRU hybrid)', 'recurrent_gemma'],
    ['qwen3_moe_mlx_q4 (MLX 4-bit MoE)', 'qwen3_moe_mlx_q4'],
    ['phixtral_mlx_q8 (MLX 8-bit)', 'phixtral_mlx_q8'],
];
const CONFIGS = [
    { name: '--parallel 4 -ub 7', args: ['--parallel', '4', '-ub', '7'] },
    { name: '--parallel 8 --no-prefix-cache', args: ['--parallel', '8', '--no-prefix-cache'] },
    { name: '--parallel 1 -ub 16', args: ['--parallel', '1', '-ub', '16'] },
    { name: '--parallel 8 -ub 2', args: ['--parallel', '8', '-ub', '2'] },
    { name: '--parallel 4 -c 80 (waits, preemption)', args: ['--parallel', '4', '-c', '80', '-ub', '9'] },
    { name: '--spec ngram --parallel 4 -ub 9', args: ['--parallel', '4', '-ub', '9', '--spec', 'ngram', '--draft-max', '4'],
      gen: ['--spec', 'ngram', '--draft-max', '4'] },
    { name: '--model-draft (itself) --parallel 4', args: ['--parallel', '4', '-ub', '11', '--draft-max', '3'], draftSelf: true },
    { name: '--kv-type bf16 --parallel 4 -ub 7', args: ['--parallel', '4', '-ub', '7', '--kv-type', 'bf16'], gen: ['--kv-type', 'bf16'] },
    { name: '--kv-type f16 --spec ngram --parallel 3 -ub 1', args: ['--parallel', '3', '-ub', '1', '--kv-type', 'f16', '--spec', 'ngram'],
      gen: ['--kv-type', 'f16', '--spec', 'ngram'] },
];

// One configuration's round: the workload at once, again (prefix hits) with a seeded sampled
// request of 2 choices beside (choice i: seed + i), then a prompt extending an earlier prompt
// and its answer beside a new one; every greedy answer equals generate's with cfg.gen (its
// --kv-type, its speculation), the sampled ones plain sampling's (ADR 0116).
async function mixedRounds(dir, cfg, seed) {
    const srv = await startServer(['-m', dir, ...cfg.args, ...(cfg.draftSelf ? ['--model-draft', dir] : [])]);
    const extra = [...(cfg.gen || []), ...(cfg.draftSelf ? ['--model-draft', dir, '--draft-max', '3'] : [])];
    const opts = { extra };
    try {
        const set = workload(seed);
        const first = await concurrentEqualsGenerate(srv.base, dir, set, 'round 1', opts);
        // (and a greedy request with a repetition penalty: llama-server's repeat_last_n 64)
        const SAMP = { top_k: 20, top_p: 0.9, min_p: 0.02, repeat_penalty: 1.2 };
        const [again, sampled, penal] = await Promise.all([concurrentEqualsGenerate(srv.base, dir, set, 'round 2', opts),
            post(srv.base, '/completion', { prompt: set[1].p, n_predict: 8, temperature: 0.9, ...SAMP,
                seed: 11, n: cfg.args[1] === '1' ? 1 : 2, ignore_eos: true, return_tokens: true }),
            complete(srv.base, set[3].p, 12, { repeat_penalty: 1.3 })]);
        assert.equal(sampled.status, 200, sampled.text);
        const plainGen = cfg.gen && !cfg.gen.includes('--spec') ? cfg.gen : [];
        for (const c of [sampled.json].flat())
            same(c.tokens, generate(dir, set[1].p, 8, { extra: plainGen, seed: 11 + c.index, temp: 0.9, samp: SAMP }),
                `sampled choice ${c.index}`);
        same(penal.tokens, generate(dir, set[3].p, 12, { extra, samp: { repeat_penalty: 1.3 } }), 'greedy, repeat_penalty 1.3');
        if (!cfg.args.includes('--no-prefix-cache') && !cfg.args.includes('-c'))
            assert.ok(again.some((g) => g.json.tokens_cached > 0), 'round 2 found cached prompt tokens');
        // staggered: each request a few ms after the one before, so prompts arrive while others
        // decode, prefill or draft (the steps' mixes differ from run to run; each answer may not)
        const late = set.map((w, i) => ({ p: [...ids(seed + 20 + i, 2 + 5 * i)], n: 20 + i }));
        const lateGot = await Promise.all(late.map((w, i) => sleep(4 * i).then(() => complete(srv.base, w.p, w.n))));
        late.forEach((w, i) => same(lateGot[i].tokens, generate(dir, w.p, w.n, opts), `staggered request ${i}`));
        const ext = [{ p: [...set[2].p, ...first[2].tokens, ...ids(seed + 9, 5)], n: 8 },
            { p: ids(seed + 10, 20), n: 8 }];
        await concurrentEqualsGenerate(srv.base, dir, ext, 'extension', opts);
        srv.assertAlive();
    } finally { await srv.stop(); }
}

for (const [label, golden] of MODELS) {
    describe(`differential: ${label}`, { timeout: 120_000 * SLOW }, () => {
        let dir;
        before(() => { dir = golden ? servable(golden) : 'models/llama-tiny'; });
        const seed = golden ? golden.length * 31 + golden.charCodeAt(0) : 7;
        for (const cfg of CONFIGS)
            it(`${cfg.name}: concurrent requests, again (prefix hits), an extension of an answer`, () => mixedRounds(dir, cfg, seed));
    });
}

// Long prompts (the goldens' context raised to 1024; their rope does not depend on it): a
// 300-id system prompt, a first turn alone, then the next turn (the first prompt, its answer and
// more) beside other users of the system prompt and a stranger, then all of it again; hits
// reach past SCHED_SNAP_TAIL's blocks and the recurrent states' snapshots (ADR 0129). With a
// cache of 1200 tokens (-c) the cached blocks are evicted and requests wait.
const LONG = [['mistral_swa', 'sliding window'], ['gemma3_text', 'sliding + global'], ['deepseek_v2', 'MLA'],
    ['granitemoehybrid', 'Mamba-2 hybrid'], ['qwen3_next', 'gated DeltaNet hybrid'], ['lfm2', 'short conv hybrid'],
    ['recurrent_gemma', 'RG-LRU hybrid'], ['nemotron_h', 'Mamba-2 hybrid']];
for (const [golden, what] of LONG) {
    describe(`differential: ${golden} (${what}), long prompts`, { timeout: 120_000 * SLOW }, () => {
        let dir;
        before(() => { dir = servable(golden, { max_position_embeddings: 1024 }); });
        for (const args of [['--parallel', '4', '-ub', '48'], ['--parallel', '4', '-c', '1200', '-ub', '512']]) {
            it(`${args.join(' ')}: a shared system prompt, the next turn, again`, async () => {
                const srv = await startServer(['-m', dir, ...args]);
                try {
                    const SYS = ids(901, 300);
                    const t1 = { p: [...SYS, ...ids(902, 20)], n: 12 };
                    const a1 = await concurrentEqualsGenerate(srv.base, dir, [t1], 'first turn');
                    const set = [{ p: [...t1.p, ...a1[0].tokens, ...ids(903, 15)], n: 10 }, { p: [...SYS, ...ids(904, 25)], n: 9 },
                        { p: [...SYS, ...ids(905, 290)], n: 8 }, { p: ids(906, 200), n: 11 }];
                    for (let round = 0; round < 2; round++)
                        await concurrentEqualsGenerate(srv.base, dir, set, `round ${round}`);
                } finally { await srv.stop(); }
            });
        }
    });
}

// Request features `generate` has no flag for (constrained decoding, tool calls, stop strings,
// presence / frequency penalties, logit_bias, n choices, top logprobs), through every dialect,
// on llama-tiny (its tokenizer and chat template): the answers of a plain server (--parallel 1,
// no prefix cache) against servers that batch them together with chunks of 5 rows, prompt
// lookup, the model as its own draft, all at once and twice; plus the chat and completion texts
// against `generate` (chat template / --no-chat).
const PERSON = { type: 'object', additionalProperties: false, required: ['name', 'age'],
    properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer', minimum: 0, maximum: 120 } } };
const TOOLS = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', required: ['city'],
    properties: { city: { type: 'string', maxLength: 12 } } } } }];
const chat = (content, extra = {}) => ['/v1/chat/completions', { max_tokens: 24, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content }], ...extra }];
const FEATURES = [
    chat('ROMEO: what light', {}),
    chat('Give a person.', { response_format: { type: 'json_schema', json_schema: { name: 'p', schema: PERSON } } }),
    chat('Weather in Verona?', { tools: TOOLS, tool_choice: 'required' }),
    chat('JULIET: O Romeo', { stop: ['\n', 'the'], presence_penalty: 0.8, frequency_penalty: 0.5 }),
    chat('First Citizen:', { logit_bias: { 11: 5, 13: -100 }, logprobs: true, top_logprobs: 4 }),
    chat('KING HENRY:', { temperature: 0.8, top_p: 0.9, seed: 5, n: 3 }),
    chat('Nurse: Nurse: Nurse:', { temperature: 1, seed: 9, response_format: { type: 'json_object' } }),
    ['/v1/completions', { prompt: 'MENENIUS: I tell you', max_tokens: 20, temperature: 0, logprobs: 3, echo: true }],
    ['/v1/messages', { model: 'llama-tiny', max_tokens: 20, temperature: 0, system: 'Be brief.', stop_sequences: ['.'],
        messages: [{ role: 'user', content: 'BRUTUS: peace' }] }],
    ['/v1/responses', { max_output_tokens: 20, temperature: 0, instructions: 'Be brief.', input: 'GLOUCESTER: now is' }],
];
// what of an answer must agree: the choices' messages / texts / logprobs, or the dialect's content
const answer = (j) => JSON.stringify(j.choices ? j.choices.map((c) => [c.message ?? c.text, c.logprobs, c.finish_reason])
    : j.content ?? j.output?.map((o) => o.content ?? o.arguments));
const close = (a, b) => {
    // logprobs within float rounding: compare the numbers apart from the rest
    const nums = [], numsB = [];
    const sa = a.replace(/-?\d+\.\d+(e-?\d+)?/g, (m) => (nums.push(Number(m)), '#'));
    const sb = b.replace(/-?\d+\.\d+(e-?\d+)?/g, (m) => (numsB.push(Number(m)), '#'));
    return sa === sb && nums.every((x, i) => near(x, numsB[i]));
};

describe('differential: request features across server configurations (llama-tiny)', { timeout: 120_000 * SLOW }, () => {
    let ref;
    const want = [];
    before(async () => {
        ref = await startServer(['-m', 'models/llama-tiny', '--parallel', '1', '--no-prefix-cache']);
        for (const [path, body] of FEATURES) {
            const r = await post(ref.base, path, body);
            assert.equal(r.status, 200, `${path}: ${r.text}`);
            want.push(answer(r.json));
        }
    });
    after(async () => { await ref?.stop(); });

    it('the chat and completion texts equal generate', async () => {
        for (const t of ['ROMEO: what light', 'JULIET: O Romeo']) {
            const r = await post(ref.base, ...chat(t, { max_tokens: 16 }));
            const g = execFileSync(BIN, ['generate', '-m', 'models/llama-tiny', '-p', t, '--system', 'Be brief.', '-n', '16',
                '--temp', '0'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).replace(/\n$/, '');
            assert.equal(r.json.choices[0].message.content, g, t);
            const c = await post(ref.base, '/v1/completions', { prompt: t, max_tokens: 16, temperature: 0 });
            const gc = execFileSync(BIN, ['generate', '-m', 'models/llama-tiny', '-p', t, '--no-chat', '-n', '16',
                '--temp', '0'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).replace(/\n$/, '');
            assert.equal(c.json.choices[0].text, gc, `${t} (completion)`);
        }
    });

    for (const args of [['--parallel', '4', '-ub', '5'], ['--parallel', '8', '--spec', 'ngram', '--draft-max', '4', '-ub', '9'],
        ['--parallel', '4', '--model-draft', 'models/llama-tiny', '--draft-max', '3'], ['--parallel', '3', '-c', '160', '-ub', '7']]) {
        it(`${args.join(' ')}: every feature at once, twice, as the plain server answers it`, async () => {
            const srv = await startServer(['-m', 'models/llama-tiny', ...args]);
            try {
                for (let round = 0; round < 2; round++) {
                    const got = await withTimeout(Promise.all(FEATURES.map(([path, body]) => post(srv.base, path, body))),
                        60_000 * SLOW, 'feature requests');
                    got.forEach((g, i) => {
                        assert.equal(g.status, 200, `${FEATURES[i][0]}: ${g.text}`);
                        const a = answer(g.json);
                        assert.ok(close(a, want[i]), `round ${round}, ${FEATURES[i][0]} ${JSON.stringify(FEATURES[i][1]).slice(0, 200)}:\n  got  ${a.slice(0, 600)}\n  want ${want[i].slice(0, 600)}`);
                    });
                }
            } finally { await srv.stop(); }
        });
    }
});

// LoRA (ADR 0103): the llama golden with the lora_ref adapters (PEFT and mlx-lm), loaded at
// scale 0; requests naming one adapter, the other, both, or none, at once and again (the
// prefix cache keyed by the scales), with chunks of 6 rows and prompt lookup, each equal to
// `generate --lora-scaled` of its adapters alone.
describe('differential: LoRA adapters per request (llama golden)', { timeout: 120_000 * SLOW }, () => {
    const L = 'tests/fixtures/golden/lora_ref';
    const ADS = [join(L, 'peft_a'), join(L, 'mlx_a')];
    let dir;
    before(() => { dir = servable('llama'); });
    for (const args of [['--parallel', '4', '-ub', '6'], ['--parallel', '4', '-ub', '9', '--spec', 'ngram', '--draft-max', '3']]) {
        it(`${args.join(' ')}: adapters mixed in one batch, twice`, async () => {
            const srv = await startServer(['-m', dir, ...args, ...ADS.flatMap((a) => ['--lora', a]), '--lora-init-without-apply']);
            try {
                const mixes = [[1, 0], [0, 1], [0.5, 2], [0, 0]];
                const P = ids(4242, 19), Q = [...P, ...ids(4243, 14)];
                const reqs = mixes.flatMap((m) => [{ m, p: P, n: 10 }, { m, p: Q, n: 8 }]);
                const want = (r) => generate(dir, r.p, r.n, { extra: r.m.flatMap((sc, i) => (sc ? ['--lora-scaled', ADS[i], String(sc)] : [])) });
                for (let round = 0; round < 2; round++) {
                    const got = await Promise.all(reqs.map((r) => complete(srv.base, r.p, r.n, { lora: r.m.map((scale, id) => ({ id, scale })) })));
                    reqs.forEach((r, i) => same(got[i].tokens, want(r), `round ${round}, scales ${r.m}, ${r.p.length} ids`));
                }
            } finally { await srv.stop(); }
        });
    }
});

// --spec mtp: the golden DeepSeek-V3 (MLA, MoE) and Qwen3-Next (hybrid) with a random MTP layer
// (tests/cli/make_mtp_checkpoint.py; it drafts badly, so rejections and rewinds are many).
for (const golden of ['deepseek_v3', 'qwen3_next']) {
    describe(`differential: ${golden} --spec mtp`, { timeout: 120_000 * SLOW }, () => {
        let dir;
        before(() => {
            dir = join(work, `${golden}-mtp`);
            execFileSync('python3', ['tests/cli/make_mtp_checkpoint.py', servable(golden), dir, '5'], { stdio: ['ignore', 'ignore', 'inherit'] });
            for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(work, golden, f), join(dir, f));
        });
        for (const cfg of [
            { name: '--parallel 4 -ub 6', args: ['--parallel', '4', '-ub', '6', '--spec', 'mtp', '--draft-max', '3'],
              gen: ['--spec', 'mtp', '--draft-max', '3'] },
            { name: '--parallel 2 -c 80', args: ['--parallel', '2', '-c', '80', '--spec', 'mtp', '--draft-max', '2'],
              gen: ['--spec', 'mtp', '--draft-max', '2'] },
        ])
            it(`${cfg.name}: concurrent requests, again, an extension`, () => mixedRounds(dir, cfg, 77));
    });
}

// Logprobs within float rounding of the solo request's on a plain server (the golden suite's
// 1e-3 relative: a chunked delta rule sums in another order than one chunk); a streamed request
// closed mid-answer, then the same prompt again beside another: both as generate alone.
const near = (a, b) => Math.abs(a - b) <= 1e-3 * Math.max(1, Math.abs(b));
for (const [label, golden] of MODELS) {
    describe(`differential: ${label}: logprobs, cancellation`, { timeout: 120_000 * SLOW }, () => {
        let dir, srv, ref;
        const seed = (golden ? golden.length * 31 + golden.charCodeAt(0) : 7) + 500;
        before(async () => {
            dir = golden ? servable(golden) : 'models/llama-tiny';
            srv = await startServer(['-m', dir, '--parallel', '4', '-ub', '5']);
            ref = await startServer(['-m', dir, '--parallel', '1', '--no-prefix-cache']);
        });
        after(async () => { await srv?.stop(); await ref?.stop(); });

        it('n_probs beside other requests equal the solo request\'s', async () => {
            const set = workload(seed).slice(0, 4);
            const got = await Promise.all(set.map((w) => complete(srv.base, w.p, w.n, { n_probs: 3 })));
            for (const [i, w] of set.entries()) {
                const solo = await complete(ref.base, w.p, w.n, { n_probs: 3 });
                same(got[i].tokens, solo.tokens, `request ${i}`);
                got[i].probs.forEach((pr, t) => {
                    const sp = solo.probs[t];
                    assert.equal(pr.id, sp.id);
                    assert.ok(near(pr.logprob, sp.logprob), `request ${i} token ${t}: logprob ${pr.logprob} vs ${sp.logprob}`);
                    // the same ids in order, but where two are within rounding of each other
                    const st = sp.top_logprobs;
                    pr.top_logprobs.forEach((x, k) => assert.ok(x.id === st[k].id || (k > 0 && near(st[k].logprob, st[k - 1].logprob)) ||
                        (k + 1 < st.length && near(st[k].logprob, st[k + 1].logprob)), `request ${i} token ${t}: top ${k} id ${x.id} vs ${st[k].id}`));
                    pr.top_logprobs.forEach((x, k) => assert.ok(near(x.logprob, sp.top_logprobs[k].logprob),
                        `request ${i} token ${t} top ${k}: ${x.logprob} vs ${sp.top_logprobs[k].logprob}`));
                });
            }
        });

        it('a stream closed mid-answer; the same prompt again and a neighbour equal generate', async () => {
            const long = { p: ids(seed + 1, 33), n: 40 };
            const other = { p: ids(seed + 2, 21), n: 30 };
            const ac = new AbortController();
            const res = await fetch(`${srv.base}/completion`, { method: 'POST', signal: ac.signal,
                headers: { 'content-type': 'application/json' },
                body: JSON.stringify({ prompt: long.p, n_predict: long.n, temperature: 0, ignore_eos: true, stream: true }) });
            assert.equal(res.status, 200);
            const neighbour = complete(srv.base, other.p, other.n);
            const reader = res.body.getReader();
            let events = 0, buf = '';
            while (events < 4) {
                const { value, done } = await withTimeout(reader.read(), 30_000 * SLOW, 'stream events');
                if (done) break;
                buf += Buffer.from(value).toString();
                events = buf.split('\n\n').length - 1;
            }
            ac.abort();
            await reader.cancel().catch(() => {});
            same((await neighbour).tokens, generate(dir, other.p, other.n), 'the neighbour of a cancelled stream');
            const [again, again2] = await Promise.all([complete(srv.base, long.p, long.n), complete(srv.base, other.p, other.n)]);
            same(again.tokens, generate(dir, long.p, long.n), 'the cancelled prompt again');
            same(again2.tokens, generate(dir, other.p, other.n), 'its neighbour again');
            srv.assertAlive('after a cancellation');
        });
    });
}

// Vision: one and two images and a text request at once, twice (the second round from the
// prefix cache, keyed by the images), with chunks cutting through the images (-ub 5: a causal
// image is cut between steps, a bidirectional one goes whole past the budget) and without the
// cache; each answer equals `generate --image ... -p TEXT` (the chat template places the
// images before the text, as the messages here do).
const IMG = 'tests/fixtures/images';
const dataUrl = (f) => `data:image/${f.endsWith('.png') ? 'png' : 'jpeg'};base64,${readFileSync(join(IMG, f)).toString('base64')}`;
const VISION = [['qwen2_vl', 'tests/fixtures/golden/qwen2_vl'], ['gemma3 (bidirectional image)', null],
    ['llava', 'tests/fixtures/golden/llava'], ['qwen3_vl (deepstack)', 'tests/fixtures/golden/qwen3_vl'],
    ['qwen2_5_vl (window attention)', 'tests/fixtures/golden/qwen2_5_vl'], ['mistral3 (pixtral)', 'tests/fixtures/golden/mistral3'],
    ['idefics3 (tiles)', 'tests/fixtures/golden/idefics3'], ['smolvlm (tiles)', 'tests/fixtures/golden/smolvlm']];
for (const [label, vdir] of VISION) {
    describe(`differential: vision ${label}`, { timeout: 120_000 * SLOW }, () => {
        let dir;
        before(() => {
            if (vdir) { dir = vdir; return; }
            dir = join(work, 'gemma3v');
            execFileSync('python3', ['tests/cli/make_vision_checkpoint.py', dir], { stdio: ['ignore', 'ignore', 'inherit'] });
        });
        const N = 8;
        const TEXT = vdir ? 'Describe this picture.' : 'w10 w20 w30';
        const REQS = [
            { images: ['vis_photo.jpg'], text: TEXT },
            { images: ['vis_photo.jpg', 'vis_edges.png'], text: TEXT },
            { images: [], text: TEXT },
            { images: ['vis_edges.png'], text: TEXT },
        ];
        const want = (r, gen = []) => {
            r = { ...r, gen };
            const key = JSON.stringify([dir, r]);
            if (!refCache.has(key)) {
                const args = ['generate', '-m', dir, ...r.images.flatMap((f) => ['--image', join(IMG, f)]),
                    ...(r.file ? ['-f', r.file, '--no-chat'] : ['-p', r.text]), '-n', String(N), '--temp', '0', '--ignore-eos', ...(r.gen || [])];
                refCache.set(key, execFileSync(BIN, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).replace(/\n$/, ''));
            }
            return refCache.get(key);
        };
        const userMsg = (r) => ({ role: 'user', content: [...r.images.map((f) => ({ type: 'image_url', image_url: { url: dataUrl(f) } })),
            { type: 'text', text: r.text }] });
        const ask = (base, r) => post(base, '/v1/chat/completions', { max_tokens: N, temperature: 0, ignore_eos: true,
            messages: [userMsg(r)] });
        for (const [args, gen] of [[['--parallel', '4', '-ub', '5']], [['--parallel', '8', '--no-prefix-cache']],
            [['--parallel', '1', '-ub', '3']], [['--parallel', '4', '-ub', '7', '--spec', 'ngram', '--draft-max', '3']],
            [['--parallel', '3', '-c', label.startsWith('idefics3') ? '400' : '160', '-ub', '9']], [['--parallel', '4', '--kv-type', 'bf16'], ['--kv-type', 'bf16']],
            [['--parallel', '4', '-ub', '6', '--model-draft', 'SELF', '--draft-max', '2']]]) {
            it(`${args.join(' ').replace('SELF', '(itself)')}: one image, two images, text, at once, twice; the next turn`, async () => {
                const srv = await startServer(['-m', dir, ...args.map((a) => (a === 'SELF' ? dir : a))]);
                try {
                    for (let round = 0; round < 2; round++) {
                        const got = await withTimeout(Promise.all(REQS.map((r) => ask(srv.base, r))), 60_000 * SLOW, 'vision requests');
                        got.forEach((g, i) => {
                            assert.equal(g.status, 200, g.text);
                            assert.equal(g.json.choices[0].message.content, want(REQS[i], gen),
                                `round ${round}, ${REQS[i].images.length} image(s) ${REQS[i].images.join(' ')}`);
                        });
                    }
                    // the next turn (the image, its answer, more text: a hit through the image's
                    // blocks) beside a new two-image request; generate gets the rendered prompt
                    const first = await ask(srv.base, REQS[1]);
                    const msgs = [userMsg(REQS[1]), { role: 'assistant', content: first.json.choices[0].message.content },
                        { role: 'user', content: REQS[0].text }];
                    const tpl = await post(srv.base, '/apply-template', { messages: msgs });
                    assert.equal(tpl.status, 200, tpl.text);
                    const file = join(work, `turn2-${label.split(' ')[0]}.txt`);
                    writeFileSync(file, tpl.json.prompt);
                    const [t2, other] = await Promise.all([post(srv.base, '/v1/chat/completions', { max_tokens: N, temperature: 0,
                        ignore_eos: true, messages: msgs }), ask(srv.base, { images: ['vis_edges.png', 'vis_photo.jpg'], text: TEXT })]);
                    assert.equal(t2.json.choices[0].message.content, want({ images: REQS[1].images, file }, gen), 'the next turn');
                    assert.equal(other.json.choices[0].message.content,
                        want({ images: ['vis_edges.png', 'vis_photo.jpg'], text: TEXT }, gen), 'beside it');
                } finally { await srv.stop(); }
            });
        }
    });
}

after(() => rmSync(work, { recursive: true, force: true }));
