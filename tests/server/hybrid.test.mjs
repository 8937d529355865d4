// A hybrid model on `mlxcel serve`: LFM2 (gated short convolutions, whose state is a fixed
// size per sequence, beside attention; ADR 0057), random weights from `mlxcel synth` with the
// llama-tiny tokenizer (an untied head: tied random weights repeat the last token).
// 8 concurrent greedy completions with the prefix cache on (the default) each equal
// `mlxcel generate` of the same prompt alone, and so do 8 that share a long prefix; a second
// round on the same server (slots reused by new sequences, prefix hits restoring snapshots of
// the states: ADR 0129) equals the first.
// A Mamba-2 hybrid (Granite 4 shape: 3 Mamba-2 layers of 8 heads x 32 x 16 and one attention
// layer, dense; residual_multiplier 20 so that the random layers outweigh the embeddings and
// the output follows the whole prompt: a hit that restored a wrong state, or none, changes the
// text, as a build that skips the restore shows) with the prefix cache on: two
// clients one after the other, then 8 concurrent clients sharing a long system prompt, twice;
// each output equals `mlxcel generate` alone, and each of the 8 found cached prompt tokens
// (states kept at the first clients' last full blocks and where their prompts part), as
// /metrics counts.
// With speculative decoding (ADR 0112: the states checkpointed before a drafted step, restored
// after a rejection), the model as its own draft model (its cache hybrid too: every draft
// accepted) and prompt lookup, 8 concurrent greedy completions still equal generate alone, and
// /metrics counts the drafts.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.MLXCEL_BIN;
const work = mkdtempSync(join(tmpdir(), 'mlxcel-hybrid-'));
const modelDir = join(work, 'lfm2');
writeFileSync(join(work, 'config.json'), JSON.stringify({
    architectures: ['Lfm2ForCausalLM'], model_type: 'lfm2', vocab_size: 2048, hidden_size: 128,
    intermediate_size: 256, block_auto_adjust_ff_dim: false, num_hidden_layers: 4,
    num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 512,
    layer_types: ['conv', 'full_attention', 'conv', 'conv'], conv_L_cache: 3,
    tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 0,
}));
if (BIN) {
    execFileSync(BIN, ['synth', '-c', join(work, 'config.json'), '-o', modelDir, '--seed', '7',
        '--tokenizer', 'models/llama-tiny'], { stdio: ['ignore', 'ignore', 'inherit'] });
}
const graniteDir = join(work, 'granite');
writeFileSync(join(work, 'granite.json'), JSON.stringify({
    architectures: ['GraniteMoeHybridForCausalLM'], model_type: 'granitemoehybrid', vocab_size: 2048,
    hidden_size: 128, intermediate_size: 256, shared_intermediate_size: 256, num_local_experts: 0,
    num_hidden_layers: 4, layer_types: ['mamba', 'attention', 'mamba', 'mamba'], num_attention_heads: 4,
    num_key_value_heads: 2, max_position_embeddings: 512, mamba_n_heads: 8, mamba_d_head: 32,
    mamba_d_state: 16, mamba_n_groups: 1, mamba_d_conv: 4, mamba_expand: 2, mamba_chunk_size: 8,
    residual_multiplier: 20.0, embedding_multiplier: 1.0, logits_scaling: 1.0, attention_multiplier: 0.17,
    position_embedding_type: 'rope', tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 0,
}));
if (BIN) {
    execFileSync(BIN, ['synth', '-c', join(work, 'granite.json'), '-o', graniteDir, '--seed', '7',
        '--tokenizer', 'models/llama-tiny'], { stdio: ['ignore', 'ignore', 'inherit'] });
}
process.env.MLXCEL_TEST_MODEL = modelDir;
const { startServer, completeGreedy, withTimeout, get, SLOW } = await import('./harness.mjs');
const metric = (body, name) => Number((body.match(new RegExp(`^${name} (\\d+)$`, 'm')) || [])[1]);

const N = 12;
const PROMPTS = ['ROMEO:', 'JULIET:', 'First Citizen:', 'MENENIUS:', 'GLOUCESTER:', 'LADY ANNE:',
    'BRUTUS:', 'Nurse:'];
const LONG = 'KING RICHARD III: Now is the winter of our discontent made glorious summer by this sun of York; ';
const SHARED = PROMPTS.map((p) => LONG + p);

// `mlxcel generate` alone: the raw prompt (no chat template), greedy, N tokens, text on stdout.
const generateIn = (dir) => (prompt) => execFileSync(BIN, ['generate', '-m', dir, '--no-chat', '-p', prompt,
    '-n', String(N), '--temp', '0'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).replace(/\n$/, '');
const generate = generateIn(modelDir);
const sameAsAlone = (alone, p, t) => (alone.startsWith(p) ? alone === p + t : alone === t);

describe('hybrid model (LFM2) on serve', { timeout: 240_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['--parallel', '8']); });
    after(async () => {
        if (srv && !srv.stopped) await srv.stop();
    });

    it('8 concurrent greedy completions == mlxcel generate alone, twice', async () => {
        for (const set of [PROMPTS, SHARED]) {
            const alone = set.map(generate);
            for (let round = 0; round < 2; round++) {
                const all = await withTimeout(Promise.all(set.map((p) => completeGreedy(srv.base, p, N))),
                    120_000 * SLOW, '8 concurrent completions');
                set.forEach((p, i) => {
                    const t = all[i].choices[0].text;
                    assert.ok(t.length > 0, `empty completion for ${JSON.stringify(p)}`);
                    assert.ok(alone[i].startsWith(p) ? alone[i] === p + t : alone[i] === t,
                        `round ${round} ${JSON.stringify(p)}: served ${JSON.stringify(t)}, generate ${JSON.stringify(alone[i])}`);
                });
            }
        }
    });
});

describe('hybrid Mamba-2 model (Granite 4) on serve: prefix hits through state snapshots', { timeout: 240_000 * SLOW }, () => {
    let srv;
    before(async () => { srv = await startServer(['-m', graniteDir, '--parallel', '8']); });
    after(async () => {
        if (srv && !srv.stopped) await srv.stop();
    });

    it('8 concurrent clients sharing a system prompt: generate alone each, cached prompt tokens > 0', async () => {
        const SYSTEM = LONG + LONG;
        const first = ['Warwick:', 'CLARENCE:'].map((p) => SYSTEM + p);
        const set = PROMPTS.map((p) => SYSTEM + p);
        const alone = set.map(generateIn(graniteDir));
        for (const p of first) {
            const r = await completeGreedy(srv.base, p, N);
            assert.ok(sameAsAlone(generateIn(graniteDir)(p), p, r.choices[0].text), `${JSON.stringify(p)} differs from generate`);
        }
        for (let round = 0; round < 2; round++) {
            const all = await withTimeout(Promise.all(set.map((p) => completeGreedy(srv.base, p, N))),
                120_000 * SLOW, '8 concurrent completions');
            set.forEach((p, i) => {
                const t = all[i].choices[0].text, cached = all[i].usage.prompt_tokens_details.cached_tokens;
                assert.ok(t.length > 0, `empty completion for ${JSON.stringify(p)}`);
                assert.ok(sameAsAlone(alone[i], p, t),
                    `round ${round} ${JSON.stringify(p)}: served ${JSON.stringify(t)}, generate ${JSON.stringify(alone[i])}`);
                // at least the system prompt's first block of 16; below the prompt's last token
                assert.ok(cached >= 16 && cached < all[i].usage.prompt_tokens,
                    `round ${round} ${JSON.stringify(p)}: ${cached} cached of ${all[i].usage.prompt_tokens}`);
            });
        }
        const m = (await get(srv.base, '/metrics')).text;
        assert.ok(metric(m, 'mlxcel_prefix_cache_hit_tokens_total') >= 16 * 16, 'metrics count the hits');
        assert.ok(metric(m, 'mlxcel_prefix_cache_snapshots') > 0, 'metrics count the snapshots');
    });
});

describe('hybrid model (LFM2) on serve with speculative decoding', { timeout: 240_000 * SLOW }, () => {
    after(() => rmSync(work, { recursive: true, force: true }));  /* the last describe: the model goes */

    for (const flags of [['--model-draft', modelDir], ['--spec', 'ngram']]) {
        it(`${flags.join(' ')}: 8 concurrent greedy completions == mlxcel generate alone`, async () => {
            const srv = await startServer(['--parallel', '8', ...flags]);
            try {
                const alone = SHARED.map(generate);
                const all = await withTimeout(Promise.all(SHARED.map((p) => completeGreedy(srv.base, p, N))),
                    120_000 * SLOW, '8 concurrent completions');
                SHARED.forEach((p, i) => {
                    const t = all[i].choices[0].text;
                    assert.ok(alone[i].startsWith(p) ? alone[i] === p + t : alone[i] === t,
                        `${JSON.stringify(p)}: served ${JSON.stringify(t)}, generate ${JSON.stringify(alone[i])}`);
                });
                if (flags[0] === '--model-draft') {
                    /* the 8 share their steps' rows with prompts still being fed, so whether any
                     * of them drafts depends on the timing (a loaded machine: none); a request
                     * alone has the rows and drafts from its first step */
                    const one = await withTimeout(completeGreedy(srv.base, SHARED[0], N), 120_000 * SLOW, 'a lone completion');
                    assert.equal(one.choices[0].text, all[0].choices[0].text, 'alone = among 8');
                }
                const m = (await get(srv.base, '/metrics')).text;
                const drafted = metric(m, 'mlxcel_spec_draft_tokens_total');
                const accepted = metric(m, 'mlxcel_spec_accepted_tokens_total');
                if (flags[0] === '--model-draft') {
                    assert.ok(drafted > 0, `no drafts: ${drafted}`);
                    assert.equal(accepted, drafted, 'the model as its own draft: every draft accepted');
                } else {
                    assert.ok(accepted <= drafted);
                }
            } finally {
                await srv.stop();
            }
        });
    }
});
