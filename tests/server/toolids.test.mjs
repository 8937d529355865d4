// Tool-call ids a chat template accepts (issue 39 item 3): Mistral's templates demand 9
// alphanumeric ids (raise_exception otherwise), so with such a template the server issues
// them (as vLLM does for Mistral models) and shows the template every id a client sends back
// in that form; the standard OpenAI tool loop (call, then the assistant turn and a tool turn
// with its tool_call_id) then renders. The model: llama-tiny with the project's Mistral v3
// fixture template in a copy of its folder (files copied: links out of a model folder are refused).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, MODEL_DIR, SLOW } from './harness.mjs';

const TOOLS = [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 4 } }, required: ['city'] } } }];
const USER = { role: 'user', content: 'Weather in Oslo?' };

describe('tool-call ids with a Mistral template', { timeout: 120_000 * SLOW }, () => {
    let srv, oa, dir;
    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxcel-toolids-'));
        for (const f of fs.readdirSync(MODEL_DIR)) {
            const src = path.resolve(MODEL_DIR, f);
            if (f === 'tokenizer_config.json') {
                const cfg = JSON.parse(fs.readFileSync(src, 'utf8'));
                cfg.chat_template = fs.readFileSync('tests/fixtures/templates/mistral_v3_tools.jinja', 'utf8');
                fs.writeFileSync(path.join(dir, f), JSON.stringify(cfg));
            } else {
                fs.copyFileSync(src, path.join(dir, f));
            }
        }
        srv = await startServer(['-m', dir]);
        oa = client(srv.base);
    });
    after(async () => {
        if (srv && !srv.stopped) await srv.stop();
        if (dir) fs.rmSync(dir, { recursive: true, force: true });
    });

    it('a forced call gets a 9-alphanumeric id, and the OpenAI tool loop renders with it', async () => {
        const model = path.basename(dir);
        const r = await oa.chat.completions.create({ model, messages: [USER], tools: TOOLS, tool_choice: 'required',
            temperature: 0, max_tokens: 150 });
        const call = r.choices[0].message.tool_calls?.[0];
        assert.ok(call, JSON.stringify(r.choices[0]));
        assert.match(call.id, /^[A-Za-z0-9]{9}$/);
        const loop = (id) => oa.chat.completions.create({ model, tools: TOOLS, max_tokens: 2, temperature: 0,
            messages: [USER, { role: 'assistant', content: null, tool_calls: [{ ...call, id }] },
                { role: 'tool', tool_call_id: id, content: '12 C' }] });
        const next = await loop(call.id);
        assert.equal(next.choices[0].message.role, 'assistant');
        // ids from elsewhere (another server's, an Anthropic client's) are shown to the template shortened
        for (const id of ['call_a1B2c3D4e5F6g7H8i9J0k1L2', 'toolu_01D7FLrfh4GYq7yT1ULFeyMV', 'x']) {
            const n = await loop(id);
            assert.ok(n.usage.prompt_tokens > 0, id);
        }
    });

    it('/apply-template renders the prompt the chat endpoint renders: ids shortened, tools shown', async () => {
        const id = 'call_a1B2c3D4e5F6g7H8i9J0k1L2';
        const messages = [USER, { role: 'assistant', content: null, tool_calls: [{ id, type: 'function',
            function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
        { role: 'tool', tool_call_id: id, content: '12 C' }];
        const r = await fetch(`${srv.base}/apply-template`, { method: 'POST',
            headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages, tools: TOOLS }) });
        const j = await r.json();
        assert.equal(r.status, 200, JSON.stringify(j));
        assert.doesNotMatch(j.prompt, /call_a1B2/, 'the long id reached the template');
        assert.match(j.prompt, /"id": "[A-Za-z0-9]{9}"|"call_id": "[A-Za-z0-9]{9}"/, j.prompt);
        assert.match(j.prompt, /\[AVAILABLE_TOOLS\].*get_weather/s, 'the tools were not rendered');
        // and it is the prompt the chat endpoint counts
        const chat = await oa.chat.completions.create({ model: path.basename(dir), messages, tools: TOOLS, max_tokens: 1 });
        const tok = await (await fetch(`${srv.base}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ content: j.prompt, add_special: true }) })).json();
        assert.equal(tok.tokens.length, chat.usage.prompt_tokens);
    });

    it('stops cleanly', async () => { await srv.stop(); });
});
