// POST /v1/responses (OpenAI's Responses API) through the official `openai`
// client and raw fetch: the response object (output items, status, usage, the
// echoed request fields), the same text as chat completions for the same
// conversation (string input, instructions + message items, content parts),
// max_output_tokens -> status 'incomplete', streaming (the SDK's stream helper
// and the raw event sequence with its sequence numbers), the stateless refusals
// (previous_response_id), function_call / function_call_output items and flat
// function tools rendered exactly as chat's tool turns and tools (on a copy of
// the model whose chat template renders them), errors naming this API's
// fields, and a bounded hostile-field sweep.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL, MODEL_DIR, SLOW, startServer, client, post, get, assertError } from './harness.mjs';

// usage without the prefix-cache counts, which a repeated prompt changes
const noCache = (u) => { if (!u) return u; const { prompt_tokens_details, input_tokens_details, ...r } = u; return r; };
import { prng } from './fuzzgen.mjs';

let srv;
let api;

const respond = (input, extra = {}) => api.responses.create({
    model: MODEL, input, temperature: 0, max_output_tokens: 16, ...extra,
});
const chat = (messages, extra = {}) => api.chat.completions.create({
    model: MODEL, messages, temperature: 0, max_tokens: 16, ...extra,
});

// Parse a Responses event stream: `event: <type>\ndata: <json>\n\n` events, the
// event name equal to data.type, sequence numbers 0, 1, 2, ...; no [DONE].
function parseTypedSSE(text, what = 'stream') {
    const blocks = text.split('\n\n');
    assert.equal(blocks.pop(), '', `${what}: trailing bytes after the last event`);
    const out = [];
    for (const [i, b] of blocks.entries()) {
        const m = /^event: ([a-z_.]+)\ndata: (.*)$/.exec(b);
        assert.ok(m, `${what}: event ${i} is not 'event: T\\ndata: J': ${JSON.stringify(b.slice(0, 200))}`);
        const data = JSON.parse(m[2]);
        assert.equal(data.type, m[1], `${what}: event ${i}: name vs type`);
        assert.equal(data.sequence_number, i, `${what}: event ${i}: sequence_number`);
        out.push(data);
    }
    return out;
}

// The message item's text and the checks every response object passes.
function checkResponse(r, what = 'response') {
    assert.match(r.id, /^resp_[0-9a-f]+$/, `${what}: id`);
    assert.equal(r.object, 'response');
    assert.ok(Number.isInteger(r.created_at) && r.created_at > 1.6e9, `${what}: created_at`);
    assert.equal(r.model, MODEL);
    assert.equal(r.error, null);
    assert.ok(Array.isArray(r.output) && r.output.length >= 1, `${what}: output ${JSON.stringify(r.output)}`);
    const u = r.usage;
    assert.ok(u && u.input_tokens > 0 && u.output_tokens >= 0, `${what}: usage ${JSON.stringify(u)}`);
    assert.equal(u.total_tokens, u.input_tokens + u.output_tokens, `${what}: usage ${JSON.stringify(u)}`);
    assert.equal(u.input_tokens_details.cached_tokens, 0);
    assert.equal(u.output_tokens_details.reasoning_tokens, 0);
    const msg = r.output.find((o) => o.type === 'message');
    assert.ok(msg, `${what}: no message item`);
    assert.match(msg.id, /^msg_/);
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content.length, 1);
    assert.equal(msg.content[0].type, 'output_text');
    assert.deepEqual(msg.content[0].annotations, []);
    return msg.content[0].text;
}

// A slice of t (3 characters) whose first occurrence starts at index >= 4.
function pickStop(t) {
    for (let p = Math.floor(t.length / 2); p + 3 <= t.length; p++) {
        const s = t.slice(p, p + 3);
        if (p >= 4 && t.indexOf(s) === p && s.trim() === s && s.length === 3) return s;
    }
    return null;
}

describe('responses API', { timeout: 300_000 * SLOW }, () => {
    before(async () => {
        srv = await startServer();
        api = client(srv.base);
    });
    after(async () => { if (srv && !srv.stopped) await srv.stop(); });

    it('a string input: the same text and token counts as chat completions', async () => {
        const r = await respond('Tell me a story');
        const c = await chat([{ role: 'user', content: 'Tell me a story' }]);
        const text = checkResponse(r);
        assert.equal(text, c.choices[0].message.content);
        assert.equal(r.output_text, text, 'the SDK computes output_text');
        assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
        assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
        assert.equal(r.status, c.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
        // the request fields the response repeats
        assert.equal(r.max_output_tokens, 16);
        assert.equal(r.temperature, 0);
        assert.equal(r.instructions, null);
        assert.equal(r.previous_response_id, null);
        assert.deepEqual(r.tools, []);
        assert.equal(r.tool_choice, 'auto');
        assert.deepEqual(r.text, { format: { type: 'text' } });
        assert.equal(r.parallel_tool_calls, true);
        // output_text is the SDK's convenience: the API does not send it
        const raw = await post(srv.base, '/v1/responses', { model: MODEL, input: 'Tell me a story', temperature: 0, max_output_tokens: 16 });
        assert.equal(raw.status, 200, raw.text);
        assert.ok(!('output_text' in raw.json), 'output_text on the wire');
        assert.equal(checkResponse(raw.json, 'raw'), text);
    });

    it('instructions and message items (content parts, developer role) equal the chat conversation', async () => {
        const input = [
            { role: 'developer', content: 'Answer in verse.' },
            { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello' }, { type: 'input_text', text: ' there' }] },
            { type: 'message', role: 'assistant', id: 'msg_1', status: 'completed',
                content: [{ type: 'output_text', text: 'Hi!', annotations: [] }] },
            { role: 'user', content: 'Tell me more' },
        ];
        const r = await respond(input, { instructions: 'You are terse.', metadata: { k: 'v' }, store: true, reasoning: { effort: 'low' } });
        const c = await chat([
            { role: 'system', content: 'You are terse.' },
            { role: 'system', content: 'Answer in verse.' },
            { role: 'user', content: 'Hello there' },
            { role: 'assistant', content: 'Hi!' },
            { role: 'user', content: 'Tell me more' },
        ]);
        assert.equal(checkResponse(r), c.choices[0].message.content);
        assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
        assert.equal(r.instructions, 'You are terse.');
        assert.deepEqual(r.metadata, { k: 'v' });
        assert.equal(r.store, false, 'nothing is stored');
        assert.deepEqual(r.reasoning, { effort: 'low' });
        // reasoning items in the input (a previous output sent back) are dropped
        const r2 = await respond([{ type: 'reasoning', id: 'rs_1', summary: [] }, ...input], { instructions: 'You are terse.' });
        assert.equal(r2.output_text, r.output_text);
        assert.equal(r2.usage.input_tokens, r.usage.input_tokens);
    });

    it('max_output_tokens: status incomplete, reason max_output_tokens, counted tokens', async () => {
        const r = await respond('Once upon a time', { max_output_tokens: 3 });
        checkResponse(r);
        assert.equal(r.status, 'incomplete');
        assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
        assert.equal(r.usage.output_tokens, 3);
        assert.equal(r.output[0].status, 'incomplete');
    });

    it('a stop string (the chat extension): status completed', async () => {
        const first = await respond('Once upon a time', { max_output_tokens: 24 });
        const stop = pickStop(first.output_text);
        assert.ok(stop, `no stop string in ${JSON.stringify(first.output_text)}`);
        const r = await respond('Once upon a time', { max_output_tokens: 24, stop: [stop] });
        checkResponse(r);
        assert.equal(r.status, 'completed');
        assert.equal(r.incomplete_details, null);
        assert.ok(Number.isInteger(r.completed_at));
        assert.equal(r.output_text, first.output_text.slice(0, first.output_text.indexOf(stop)));
        assert.equal(r.output[0].status, 'completed');
    });

    it('streaming through the SDK helper: finalResponse equals the non-streamed response', async () => {
        for (const extra of [{ max_output_tokens: 12 }, { max_output_tokens: 24, stop: [' '] }]) {
            const full = await respond('The king said', extra);
            const stream = api.responses.stream({ model: MODEL, input: 'The king said', temperature: 0, ...extra });
            const types = [];
            let deltas = '';
            stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
            for await (const ev of stream) types.push(ev.type);
            const fin = await stream.finalResponse();
            checkResponse(fin, 'final');
            assert.equal(fin.output_text, full.output_text);
            assert.equal(deltas, full.output_text);
            assert.equal(fin.status, full.status);
            assert.deepEqual(noCache(fin.usage), noCache(full.usage));
            assert.deepEqual(fin.incomplete_details, full.incomplete_details);
            assert.equal(types[0], 'response.created');
            assert.equal(types.at(-1), full.status === 'completed' ? 'response.completed' : 'response.incomplete');
        }
    });

    it('the raw event sequence: created, in_progress, item and part added, deltas, done events, the end', async () => {
        const body = { model: MODEL, input: 'The king said', temperature: 0, max_output_tokens: 10, stream: true };
        const res = await post(srv.base, '/v1/responses', body);
        assert.equal(res.status, 200, res.text);
        assert.match(res.headers.get('content-type'), /text\/event-stream/);
        assert.ok(!res.text.includes('[DONE]'), 'this API sends no [DONE]');
        const ev = parseTypedSSE(res.text);
        const types = ev.map((e) => e.type);
        const nd = types.filter((t) => t === 'response.output_text.delta').length;
        assert.ok(nd >= 1, types.join(' '));
        assert.deepEqual(types, [
            'response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added',
            ...Array(nd).fill('response.output_text.delta'),
            'response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.incomplete',
        ]);
        assert.equal(ev[0].response.status, 'in_progress');
        assert.deepEqual(ev[0].response.output, []);
        const id = ev[2].item.id;
        assert.equal(ev[2].item.type, 'message');
        assert.equal(ev[2].output_index, 0);
        for (const e of ev.slice(3, -2)) {
            assert.equal(e.item_id, id, JSON.stringify(e));
            assert.equal(e.output_index, 0);
            assert.equal(e.content_index, 0);
        }
        const text = ev.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
        assert.equal(ev.at(-4).text, text);
        assert.equal(ev.at(-3).part.text, text);
        assert.equal(ev.at(-2).item.content[0].text, text);
        const last = ev.at(-1).response;
        assert.equal(last.status, 'incomplete');
        assert.deepEqual(last.output, [ev.at(-2).item]);
        const full = await post(srv.base, '/v1/responses', { ...body, stream: false });
        assert.equal(checkResponse(full.json), text);
        assert.deepEqual(last.usage, full.json.usage);
    });

    it('previous_response_id and the other stateful features: 400', async () => {
        const r = await post(srv.base, '/v1/responses', { model: MODEL, input: 'hi', previous_response_id: 'resp_123' });
        const e = assertError(r, 400, 'previous_response_id', { param: 'previous_response_id', type: 'invalid_request_error' });
        assert.equal(e.message, 'previous_response_id is not supported: this server is stateless; send the conversation as input items');
        await assert.rejects(respond('hi', { previous_response_id: 'resp_123' }), (err) => err.status === 400);
        assertError(await post(srv.base, '/v1/responses', { input: 'hi', conversation: 'conv_1' }), 400, 'conversation', { param: 'conversation' });
        assertError(await post(srv.base, '/v1/responses', { input: [{ type: 'item_reference', id: 'msg_1' }] }), 400, 'item_reference', { param: 'input[0]' });
        assertError(await post(srv.base, '/v1/responses', { input: 'hi', background: true }), 400, 'background', { param: 'background' });
        // null counts as absent
        const ok = await post(srv.base, '/v1/responses', { input: 'hi', previous_response_id: null, max_output_tokens: 1 });
        assert.equal(ok.status, 200, ok.text);
    });

    it('errors name this API\'s fields', async () => {
        const bad = async (body, param, status = 400) => {
            const r = await post(srv.base, '/v1/responses', { model: MODEL, max_output_tokens: 1, ...body });
            return assertError(r, status, JSON.stringify(body), { param });
        };
        await bad({ input: undefined }, 'input');
        await bad({ input: 5 }, 'input');
        await bad({ input: [] }, 'input');
        await bad({ input: [5] }, 'input[0]');
        await bad({ input: [{ role: 'tool', content: 'x' }] }, 'input[0].role');
        await bad({ input: [{ role: 'user' }] }, 'input[0].content');
        await bad({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input[0].content[0]');
        await bad({ input: [{ role: 'user', content: [{ type: 'input_text', text: 3 }] }] }, 'input[0].content[0]');
        await bad({ input: [{ type: 'function_call', call_id: 'c', name: 'f' }] }, 'input[0].arguments');
        await bad({ input: [{ type: 'function_call_output', call_id: 'c' }] }, 'input[0].output');
        await bad({ input: [{ type: 'web_search_call', id: 'w' }] }, 'input[0]');
        await bad({ input: 'x', instructions: 3 }, 'instructions');
        await bad({ input: 'x', max_output_tokens: 0 }, 'max_output_tokens');
        await bad({ input: 'x', max_output_tokens: 1.5 }, 'max_output_tokens');
        await bad({ input: 'x', max_output_tokens: 600 }, 'max_output_tokens');
        await bad({ input: 'x', temperature: 3 }, 'temperature');
        await bad({ input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0]');
        await bad({ input: 'x', tools: [{ type: 'function', name: 'a b' }] }, 'tools[0].name');
        await bad({ input: 'x', tools: [{ type: 'function', name: 'f', parameters: 3 }] }, 'tools[0]');
        await bad({ input: 'x', tool_choice: 'sometimes' }, 'tool_choice');
        await bad({ input: 'x', tool_choice: { type: 'function', name: 'g' }, tools: [{ type: 'function', name: 'f' }] }, 'tool_choice');
        await bad({ input: 'x', text: { format: { type: 'xml' } } }, 'text.format.type');
        await bad({ input: 'x', text: { format: { type: 'json_schema', name: 'n' } } }, 'text.format.schema');
        await bad({ input: 'x', store: 'yes' }, 'store');
        await bad({ input: 'x', metadata: [] }, 'metadata');
        const e = await bad({ input: 'x', model: 'other' }, 'model', 404);
        assert.equal(e.code, 'model_not_found');
        const m = await get(srv.base, '/v1/responses');
        assertError(m, 405, 'GET /v1/responses');
        assert.equal(m.headers.get('allow'), 'POST');
    });

    it('flat function tools are echoed as given', async () => {
        const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: true,
            parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
        const r = await respond('Weather in Paris?', { tools, max_output_tokens: 2 });
        checkResponse(r);
        assert.deepEqual(r.tools, tools);
        const r2 = await respond('hi', { tools: [{ type: 'function', name: 'f' }], tool_choice: 'none', max_output_tokens: 1 });
        assert.deepEqual(r2.tools, [{ type: 'function', name: 'f', description: null, parameters: null, strict: null }]);
        assert.equal(r2.tool_choice, 'none');
    });

    it('counts in /metrics as its own endpoint', async () => {
        await respond('hi', { max_output_tokens: 1 });
        const m = await get(srv.base, '/metrics');
        assert.match(m.text, /mlxcel_requests_total\{endpoint="\/v1\/responses",status="200"\} [1-9]/);
        assert.match(m.text, /mlxcel_requests_total\{endpoint="\/v1\/responses",status="400"\} [1-9]/);
    });

    it('hostile field values: 200 or a 4xx in the error shape, and the server lives', async () => {
        const r = prng(Number(process.env.MLXCEL_FUZZ_SEED) || 14);
        const values = [null, true, 0, -1, 1e300, 1.5, '', 'x', 'resp_1', [], [null], [5], {}, { type: 'x' },
            { type: 'function' }, [{ type: 'message' }], [{ role: 'user', content: [] }], [{ role: 'user', content: [{}] }],
            [{ type: 'function_call', call_id: '', name: '', arguments: '' }], 'a'.repeat(3000), [[[[]]]]];
        const base = {
            model: MODEL, input: [{ role: 'user', content: 'hi' }], instructions: 'be', max_output_tokens: 1,
            temperature: 0, top_p: 1, tools: [{ type: 'function', name: 'f', parameters: { type: 'object' } }],
            tool_choice: 'auto', text: { format: { type: 'text' } }, reasoning: {}, stream: false, store: false,
            metadata: {}, parallel_tool_calls: true,
        };
        const keys = Object.keys(base);
        for (let i = 0; i < 120; i++) {
            const body = structuredClone(base);
            for (let k = r.range(1, 3); k > 0; k--) body[r.pick(keys)] = structuredClone(r.pick(values));
            if (r.chance(0.3)) body.input = [r.pick(values)];
            if (r.chance(0.2)) body.stream = true;
            const res = await post(srv.base, '/v1/responses', body);
            if (res.status === 200) continue;
            assert.ok(res.status >= 400 && res.status < 500, `${res.status} for ${JSON.stringify(body).slice(0, 300)}: ${res.text.slice(0, 300)}`);
            assertError(res, res.status, JSON.stringify(body).slice(0, 200));
        }
        srv.assertAlive('after the hostile sweep');
    });
});

// A copy of the model (the loader refuses symlinks out of its folder) whose chat template renders tools, tool calls and tool
// results, so that the prompt shows whether they arrived.
const TOOL_TEMPLATE =
    "{% if tools %}<|tools|>\n{% for t in tools %}{{ t.function.name }}: {{ t.function.description }} {{ t.function.parameters | tojson }}\n{% endfor %}<|end|>\n{% endif %}" +
    "{% for m in messages %}<|{{ m.role }}|>\n{% if m.content %}{{ m.content }}{% endif %}" +
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call {{ c.id }}>{{ c.function.name }}{{ c.function.arguments | tojson }}</call>{% endfor %}{% endif %}" +
    "{% if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}<|end|>\n{% endfor %}" +
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

describe('responses API: tool turns and tools', { timeout: 300_000 * SLOW }, () => {
    let dir;
    let tsrv;
    let tapi;
    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxcel-tools-'));
        const model = path.join(dir, MODEL);
        fs.mkdirSync(model);
        const src = path.resolve(MODEL_DIR);
        for (const f of fs.readdirSync(src)) {
            if (f === 'tokenizer_config.json') continue;
            fs.copyFileSync(path.join(src, f), path.join(model, f));
        }
        const cfg = JSON.parse(fs.readFileSync(path.join(src, 'tokenizer_config.json'), 'utf8'));
        cfg.chat_template = TOOL_TEMPLATE;
        fs.writeFileSync(path.join(model, 'tokenizer_config.json'), JSON.stringify(cfg));
        tsrv = await startServer(['-m', model]);
        tapi = client(tsrv.base);
    });
    after(async () => {
        if (tsrv && !tsrv.stopped) await tsrv.stop();
        if (dir) fs.rmSync(dir, { recursive: true, force: true });
    });

    const weather = { type: 'function', name: 'get_weather', description: 'Weather of a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } } } };
    const chatWeather = { type: 'function', function: { name: weather.name, description: weather.description, parameters: weather.parameters } };

    it('function_call / function_call_output items render as chat\'s tool calls and tool turns', async () => {
        const input = [
            { role: 'user', content: 'Weather in Paris and Rome?' },
            { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Checking.' }] },
            { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
            { type: 'function_call', call_id: 'call_2', name: 'get_weather', arguments: '{"city":"Rome"}', status: 'completed', id: 'fc_2' },
            { type: 'function_call_output', call_id: 'call_1', output: 'sunny' },
            { type: 'function_call_output', call_id: 'call_2', output: [{ type: 'input_text', text: 'rain' }] },
            { type: 'function_call', call_id: 'call_3', name: 'get_weather', arguments: '{"city":"Oslo"}' },
            { type: 'function_call_output', call_id: 'call_3', output: 'snow' },
        ];
        const messages = [
            { role: 'user', content: 'Weather in Paris and Rome?' },
            { role: 'assistant', content: 'Checking.', tool_calls: [
                { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
                { id: 'call_2', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Rome"}' } }] },
            { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
            { role: 'tool', tool_call_id: 'call_2', content: 'rain' },
            { role: 'assistant', content: null, tool_calls: [
                { id: 'call_3', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
            { role: 'tool', tool_call_id: 'call_3', content: 'snow' },
        ];
        const opts = { model: MODEL, temperature: 0 };
        const r = await tapi.responses.create({ ...opts, input, tools: [weather], max_output_tokens: 12 });
        const c = await tapi.chat.completions.create({ ...opts, messages, tools: [chatWeather], max_tokens: 12 });
        assert.equal(checkResponse(r), c.choices[0].message.content);
        assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
        // the prompt really holds them: the template renders the calls, results and tools
        const rendered = await post(tsrv.base, '/apply-template', { messages });
        assert.match(rendered.json.prompt, /<call call_2>get_weather\{"city": ?"Rome"\}<\/call>/);
        const plain = await tapi.responses.create({ ...opts, input: input.slice(0, 2), max_output_tokens: 1 });
        assert.ok(r.usage.input_tokens > plain.usage.input_tokens + 20, JSON.stringify([r.usage, plain.usage]));
        // tools reach the template (and tool_choice 'none' hides them, as in chat)
        const withTools = await tapi.responses.create({ ...opts, input: 'hi', tools: [weather], max_output_tokens: 1 });
        const noTools = await tapi.responses.create({ ...opts, input: 'hi', max_output_tokens: 1 });
        const hidden = await tapi.responses.create({ ...opts, input: 'hi', tools: [weather], tool_choice: 'none', max_output_tokens: 1 });
        assert.ok(withTools.usage.input_tokens > noTools.usage.input_tokens + 5);
        assert.equal(hidden.usage.input_tokens, noTools.usage.input_tokens);
        const chatTools = await tapi.chat.completions.create({ ...opts, messages: [{ role: 'user', content: 'hi' }], tools: [chatWeather], max_tokens: 1 });
        assert.equal(withTools.usage.input_tokens, chatTools.usage.prompt_tokens);
    });
});
