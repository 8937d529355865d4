// `mlxcel serve --spec mtp` (ADR 0108): a tiny DeepSeek-V3 made by `mlxcel synth` with
// llama-tiny's tokenizer, plus a random multi-token-prediction layer (make_mtp_checkpoint.py).
// Greedy answers, 4 at once (requests drafting by the layer in one batch, each in its own
// sequence of the layer's cache), equal a server without speculation; /metrics counts the
// drafts. A checkpoint without the layer is refused at start, naming why. The same with a tiny
// Qwen3-Next (a hybrid: gated DeltaNet + gated attention, experts) and its mtp.* module
// (ADR 0135), whose rejected drafts take the recurrent states back to a checkpoint (ADR 0112).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.MLXCEL_BIN;
const work = mkdtempSync(join(tmpdir(), 'mlxcel-mtp-'));
const base = join(work, 'ds-base');
const dir = join(work, 'ds-mtp');
const cfg = {
    architectures: ['DeepseekV3ForCausalLM'], model_type: 'deepseek_v3', vocab_size: 2048, hidden_size: 64,
    num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 4, max_position_embeddings: 512,
    bos_token_id: 1, eos_token_id: 2, intermediate_size: 128, moe_intermediate_size: 32, n_routed_experts: 4,
    n_shared_experts: 1, num_experts_per_tok: 2, n_group: 1, topk_group: 1, first_k_dense_replace: 1,
    kv_lora_rank: 32, q_lora_rank: 48, qk_nope_head_dim: 16, qk_rope_head_dim: 16, v_head_dim: 16,
    rms_norm_eps: 1e-6, rope_theta: 10000.0, tie_word_embeddings: false, torch_dtype: 'float32',
};
const qbase = join(work, 'qn-base');
const qdir = join(work, 'qn-mtp');
const qcfg = {
    architectures: ['Qwen3NextForCausalLM'], model_type: 'qwen3_next', vocab_size: 2048, hidden_size: 64,
    num_hidden_layers: 2, layer_types: ['linear_attention', 'full_attention'], num_attention_heads: 4,
    num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 512, bos_token_id: 1, eos_token_id: 2,
    intermediate_size: 128, moe_intermediate_size: 32, shared_expert_intermediate_size: 32, num_experts: 4,
    num_experts_per_tok: 2, decoder_sparse_step: 1, mlp_only_layers: [], norm_topk_prob: true,
    linear_conv_kernel_dim: 4, linear_key_head_dim: 16, linear_value_head_dim: 16, linear_num_key_heads: 2,
    linear_num_value_heads: 4, partial_rotary_factor: 0.25, rms_norm_eps: 1e-6, rope_theta: 10000.0,
    tie_word_embeddings: false, torch_dtype: 'float32',
};
if (BIN) {
    for (const [c, b, d, name] of [[cfg, base, dir, 'cfg.json'], [qcfg, qbase, qdir, 'qcfg.json']]) {
        writeFileSync(join(work, name), JSON.stringify(c));
        execFileSync(BIN, ['synth', '-c', join(work, name), '-o', b, '--seed', '3', '--tokenizer', 'models/llama-tiny'],
            { stdio: ['ignore', 'ignore', 'inherit'] });
        execFileSync('python3', ['tests/cli/make_mtp_checkpoint.py', b, d, '7'], { stdio: ['ignore', 'ignore', 'inherit'] });
    }
}
const { startServer, client, get, withTimeout, SLOW } = await import('./harness.mjs');
after(() => rmSync(work, { recursive: true, force: true }));

const PROMPTS = ['ROMEO: what light', 'JULIET: O Romeo, Romeo', 'First Citizen: we are accounted poor', 'Nurse:'];
const req = (prompt, model = 'ds-mtp') => ({ model, messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 24 });
const text = (c) => c.choices[0].message.content;
const metric = (body, name) => Number((body.match(new RegExp(`^${name} (\\d+)$`, 'm')) || [])[1]);

describe('serve --spec mtp', { timeout: 180_000 * SLOW }, () => {
    let plain, spec;
    before(async () => {
        plain = await startServer(['-m', dir, '--parallel', '4']);
        spec = await startServer(['-m', dir, '--parallel', '4', '--spec', 'mtp', '--draft-max', '3']);
    });
    after(async () => {
        if (plain) await plain.stop();
        if (spec) await spec.stop();
    });

    it('4 concurrent greedy answers equal plain decoding; /metrics counts the drafts', async () => {
        const want = [];
        for (const p of PROMPTS) want.push(text(await client(plain.base).chat.completions.create(req(p))));
        for (let round = 0; round < 2; round++) {  // the second round takes over the layer's sequences
            const all = await withTimeout(Promise.all(PROMPTS.map((p) => client(spec.base).chat.completions.create(req(p)))),
                120_000 * SLOW, '4 concurrent requests');
            PROMPTS.forEach((p, i) => assert.equal(text(all[i]), want[i], `round ${round}: ${p}`));
        }
        // a request alone drafts from its first step; whether the 4 sharing their steps draft
        // at all depends on the timing (rows taken by prompts still being fed)
        assert.equal(text(await client(spec.base).chat.completions.create(req(PROMPTS[0]))), want[0], 'alone');
        const m = (await get(spec.base, '/metrics')).text;
        const drafted = metric(m, 'mlxcel_spec_draft_tokens_total');
        assert.ok(drafted > 0, `drafted ${drafted}`);
    });

    it('a checkpoint without the layer is refused at start', async () => {
        await assert.rejects(startServer(['-m', base, '--spec', 'mtp']), /num_nextn_predict_layers' is absent/);
    });
});

describe('serve --spec mtp: Qwen3-Next\'s mtp.* module', { timeout: 180_000 * SLOW }, () => {
    let plain, spec;
    before(async () => {
        plain = await startServer(['-m', qdir, '--parallel', '4']);
        spec = await startServer(['-m', qdir, '--parallel', '4', '--spec', 'mtp', '--draft-max', '3']);
    });
    after(async () => {
        if (plain) await plain.stop();
        if (spec) await spec.stop();
    });

    it('4 concurrent greedy answers equal plain decoding; /metrics counts the drafts', async () => {
        const want = [];
        for (const p of PROMPTS) want.push(text(await client(plain.base).chat.completions.create(req(p, 'qn-mtp'))));
        const all = await withTimeout(Promise.all(PROMPTS.map((p) => client(spec.base).chat.completions.create(req(p, 'qn-mtp')))),
            120_000 * SLOW, '4 concurrent requests');
        PROMPTS.forEach((p, i) => assert.equal(text(all[i]), want[i], p));
        const m = (await get(spec.base, '/metrics')).text;
        assert.ok(metric(m, 'mlxcel_spec_draft_tokens_total') > 0);
    });

    it('a checkpoint without the module is refused at start, naming the tensor', async () => {
        await assert.rejects(startServer(['-m', qbase, '--spec', 'mtp']), /tensor 'mtp.fc.weight' is missing/);
    });
});
