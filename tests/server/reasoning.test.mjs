// Reasoning (docs/server.md): a template that opens <think> in its generation prompt (as Qwen3 and
// the DeepSeek-R1 distills do) starts the output as reasoning, which each dialect reports apart
// from the answer: chat `reasoning_content` (streamed as `delta.reasoning_content`), a Responses
// `reasoning` item, an Anthropic `thinking` block; `chat_template_kwargs` ({"enable_thinking":
// false}) and Anthropic's `thinking: {type: "disabled"}` reach the template and turn it off. The
// model is a copy of llama-tiny whose template does that (it never writes </think>, so all its
// output is reasoning when thinking is on).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, copyFileSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, client, SLOW } from './harness.mjs';

const TEMPLATE = "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}" +
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}" +
    "{% if enable_thinking is not defined or enable_thinking %}{{ '<think>\\n' }}{% endif %}{% endif %}";

describe('reasoning', { timeout: 180_000 * SLOW }, () => {
    let dir, srv, oa, id;
    before(async () => {
        dir = mkdtempSync(join(tmpdir(), 'mlxcel-think-'));
        id = dir.split('/').pop();
        for (const f of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json'])
            copyFileSync(join('models/llama-tiny', f), join(dir, f));
        const cfg = JSON.parse(readFileSync('models/llama-tiny/tokenizer_config.json', 'utf8'));
        cfg.chat_template = TEMPLATE;
        writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
        srv = await startServer(['-m', dir]);
        oa = client(srv.base);
    });
    after(async () => {
        if (srv && !srv.stopped) await srv.stop();
        if (dir) rmSync(dir, { recursive: true, force: true });
    });

    const MSGS = [{ role: 'user', content: 'ROMEO:' }];

    it('chat: the output is reasoning_content, streamed alike; enable_thinking false gives content', async () => {
        const r = await oa.chat.completions.create({ model: id, messages: MSGS, max_tokens: 12, temperature: 0 });
        const m = r.choices[0].message;
        assert.ok(m.reasoning_content && m.reasoning_content.length > 0, JSON.stringify(m));
        assert.equal(m.content, '');
        const stream = await oa.chat.completions.create({ model: id, messages: MSGS, max_tokens: 12, temperature: 0, stream: true });
        let reasoning = '', content = '';
        for await (const ch of stream) {
            const d = ch.choices[0]?.delta || {};
            reasoning += d.reasoning_content || '';
            content += d.content || '';
        }
        assert.equal(reasoning, m.reasoning_content);
        assert.equal(content, '');
        const off = await oa.chat.completions.create({ model: id, messages: MSGS, max_tokens: 12, temperature: 0,
            chat_template_kwargs: { enable_thinking: false } });
        assert.ok(off.choices[0].message.content.length > 0);
        assert.equal(off.choices[0].message.reasoning_content, undefined);
    });

    it('Responses: a reasoning item; Anthropic: a thinking block, and none with thinking disabled', async () => {
        const r = await oa.responses.create({ model: id, input: 'ROMEO:', max_output_tokens: 12, temperature: 0 });
        const item = r.output.find((o) => o.type === 'reasoning');
        assert.ok(item, JSON.stringify(r.output));
        assert.ok(item.content[0].text.length > 0);
        const an = new Anthropic({ baseURL: srv.base, apiKey: 'x', maxRetries: 0 });
        const m = await an.messages.create({ model: id, max_tokens: 12, messages: MSGS, temperature: 0 });
        const th = m.content.find((b) => b.type === 'thinking');
        assert.ok(th && th.thinking.length > 0, JSON.stringify(m.content));
        const off = await an.messages.create({ model: id, max_tokens: 12, messages: MSGS, temperature: 0,
            thinking: { type: 'disabled' } });
        assert.equal(off.content.find((b) => b.type === 'thinking'), undefined, JSON.stringify(off.content));
        assert.ok(off.content.find((b) => b.type === 'text').text.length > 0);
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
